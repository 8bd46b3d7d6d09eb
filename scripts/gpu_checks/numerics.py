"""The estimator, verl's registered estimator and the embedders on the device, each against the CPU."""

from __future__ import annotations

from gpu_checks.ray_stub import stub_missing_ray


def ragged_batch(seed: int, dtype, dim: int = 1024, groups: int = 48):
    """~300 rows in 48 groups of 3..9 rollouts, shuffled; 0/1 rewards; random embeddings."""
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    sizes = rng.integers(3, 10, size=groups)
    uids = np.repeat(np.array([f"q{i}" for i in range(len(sizes))], dtype=object), sizes)
    uids = uids[rng.permutation(len(uids))]
    rewards = torch.as_tensor(rng.integers(0, 2, size=len(uids)), dtype=torch.float32 if dtype == torch.bfloat16
                              else dtype)
    emb = torch.as_tensor(rng.normal(size=(len(uids), dim)), dtype=torch.float32).to(dtype)
    return uids, rewards, emb


def check_estimator(device: str) -> dict:
    import torch

    import setpo

    out = {}
    for dtype, tol in ((torch.float32, 1e-5), (torch.float64, 1e-12), (torch.bfloat16, 1e-5)):
        uids, r, e = ragged_batch(0, dtype)
        cpu_s = setpo.diversity_marginals(e, uids)
        dev_s = setpo.diversity_marginals(e.to(device), uids)
        cpu_a = setpo.setpo_advantages(r, e, uids, lam=0.05)
        dev_a = setpo.setpo_advantages(r.to(device), e.to(device), uids, lam=0.05)
        assert dev_a.device.type == torch.device(device).type, f"result on {dev_a.device}, not {device}"
        if dtype == torch.bfloat16:  # bf16 embeddings: the advantages (and s) are float32
            assert dev_a.dtype == torch.float32 and dev_s.dtype == torch.float32, (dev_a.dtype, dev_s.dtype)
        err_s = float((dev_s.cpu() - cpu_s).abs().max())
        err_a = float((dev_a.cpu() - cpu_a).abs().max())
        assert err_s <= tol and err_a <= tol, f"{dtype}: max |cuda - cpu| = {err_s:.2e} (s), {err_a:.2e} (adv)"
        # contiguous groups on the device take the reshape path: the same numbers
        n = (len(uids) // 6) * 6
        cont = float((setpo.diversity_marginals(e[:n].to(device), group_size=6).cpu()
                      - setpo.diversity_marginals(e[:n], group_size=6)).abs().max())
        assert cont <= tol, f"{dtype}: contiguous groups, max |cuda - cpu| = {cont:.2e}"
        out[str(dtype)] = {"rows": len(uids), "max_err_marginals": err_s, "max_err_advantages": err_a,
                           "max_err_contiguous": cont, "advantage_dtype": str(dev_a.dtype)}
    return out


def check_verl(device: str) -> dict:
    import torch

    stubbed = stub_missing_ray()
    from omegaconf import OmegaConf
    from verl.trainer.ppo import core_algos

    import setpo
    import setpo.verl as sv

    uids, r, e = ragged_batch(1, torch.float32)
    length = 12
    mask = torch.ones(len(uids), length)
    token_rewards = torch.zeros(len(uids), length)
    token_rewards[:, -1] = r
    fn = core_algos.get_adv_estimator_fn("setpo")
    cfg = OmegaConf.create({"setpo": {"lam": 0.1}})
    with sv.batch_embeddings(e.to(device), uids=uids):
        adv, _ = fn(token_level_rewards=token_rewards.to(device), response_mask=mask.to(device), index=uids, config=cfg)
    expected = setpo.setpo_advantages(r, e, uids, lam=0.1)
    err = float((adv[:, -1].cpu() - expected).abs().max())
    assert adv.device.type == torch.device(device).type and err <= 1e-5, f"verl estimator: max err {err:.2e}"
    return {"verl_estimator_max_err": err, "ray": "stubbed (not installed)" if stubbed else "installed"}


def tiny_embedder_shape():
    import paper_shapes as ps

    return ps.QWEN3_EMBEDDING_0_6B.scaled(hidden=64, layers=2, heads=4, kv_heads=2, vocab=512)


def minilm_path():
    """The packaged all-MiniLM-L6-v2 folder, or None when its package is not installed (the bare machine)."""
    from setpo.embed import default_model_path

    try:
        return default_model_path()
    except (ValueError, FileNotFoundError, ImportError):
        return None


def check_embedders(device: str) -> dict:
    import paper_shapes as ps
    import torch

    stub_missing_ray()  # setpo.verl imports verl
    import setpo.verl as sv
    from setpo.embed import SentenceTransformerEmbedder

    texts = [" ".join(f"w{(i * 7 + j * 13) % 500 + 3}" for j in range(10 + i)) for i in range(40)]
    path = minilm_path()
    if path is not None:
        name = "all-MiniLM-L6-v2"
        cpu = SentenceTransformerEmbedder(path, device="cpu")(texts)
        dev = SentenceTransformerEmbedder(path, device=device)(texts)
        threshold = 0.999
    else:  # bare machine: no model files; the same code path with a random Qwen3-shaped encoder
        name = "random Qwen3-shaped encoder (bf16 on CUDA vs float32 on the CPU)"
        cpu = ps.RandomEmbedder(tiny_embedder_shape(), device="cpu")(texts)
        dev = ps.RandomEmbedder(tiny_embedder_shape(), device=device, init_device="cpu")(texts)
        threshold = 0.99
    cos = float(torch.nn.functional.cosine_similarity(cpu, dev, dim=1).min())
    assert cos > threshold, f"{name} on {device} vs CPU: min row cosine {cos:.5f}"
    resolved = sv.resolve_device("auto")
    assert resolved == ("cuda" if device == "cuda" else "cpu"), f"embedding_device auto resolved to {resolved}"
    settings = sv.SetPOVerlSettings(lam=0.05, embedding_model="default" if path else "hash", embedding_device="auto")
    plug = sv.embedder_from_settings(settings)(texts)
    assert plug.shape[0] == len(texts) and bool(torch.isfinite(plug).all())
    return {"embedder": name, "min_row_cosine": cos, "plugin_device": resolved,
            "plugin_embedder": settings.embedding_model}
