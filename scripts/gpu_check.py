"""GPU check for the math and verl code paths: one script, under 8 minutes on one GPU.

1. The estimator on CUDA equals the CPU result: ``setpo.setpo_advantages`` and ``diversity_marginals`` on
   ragged groups (float32 and float64), and verl's registered ``"setpo"`` estimator fed through
   ``setpo.verl.batch_embeddings`` with CUDA tensors.
2. The embedders on CUDA agree with the CPU: the packaged all-MiniLM-L6-v2 through ``setpo.embed`` and
   through the verl plug-in's ``embedder_from_settings`` (``embedding_device: auto`` must pick the GPU).
3. Notebook 04's training path on CUDA with the tiny random Qwen2 model: GRPO and SetPO+GRPO for a few
   steps with ``generate`` (the trainer, its embedder and the probe sampler on the GPU), avg@k evaluation,
   the trajectory figure; then, when vLLM is installed and time allows, one SetPO run and one evaluation
   through vLLM (each in its own process, as the notebook does).

Usage: ``python scripts/gpu_check.py [--out DIR]`` (DIR defaults to $OUT or runs/gpu_check). Writes
``gpu_check.json`` there and exits non-zero if a check fails. ``--allow-cpu`` runs everything on the CPU (a
dry run of the script itself; the CUDA comparisons then compare the CPU with itself).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

START = time.time()
BUDGET_S = 8 * 60


def elapsed() -> float:
    return time.time() - START


def ragged_batch(seed: int, dtype: torch.dtype, dim: int = 1024):
    """~300 rows in 48 groups of 3..9 rollouts, shuffled; 0/1 rewards; random embeddings."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(3, 10, size=48)
    uids = np.repeat(np.array([f"q{i}" for i in range(len(sizes))], dtype=object), sizes)
    uids = uids[rng.permutation(len(uids))]
    rewards = torch.as_tensor(rng.integers(0, 2, size=len(uids)), dtype=dtype)
    emb = torch.as_tensor(rng.normal(size=(len(uids), dim)), dtype=dtype)
    return uids, rewards, emb


def check_estimator(device: str) -> dict:
    from omegaconf import OmegaConf
    from verl.trainer.ppo import core_algos

    import setpo
    import setpo.verl as sv

    out = {}
    for dtype, tol in ((torch.float32, 1e-5), (torch.float64, 1e-12)):
        uids, r, e = ragged_batch(0, dtype)
        cpu_s = setpo.diversity_marginals(e, uids)
        dev_s = setpo.diversity_marginals(e.to(device), uids)
        cpu_a = setpo.setpo_advantages(r, e, uids, lam=0.05)
        dev_a = setpo.setpo_advantages(r.to(device), e.to(device), uids, lam=0.05)
        assert dev_a.device.type == torch.device(device).type, f"result on {dev_a.device}, not {device}"
        err_s = float((dev_s.cpu() - cpu_s).abs().max())
        err_a = float((dev_a.cpu() - cpu_a).abs().max())
        assert err_s <= tol and err_a <= tol, f"{dtype}: max |cuda - cpu| = {err_s:.2e} (s), {err_a:.2e} (adv)"
        out[str(dtype)] = {"rows": len(uids), "max_err_marginals": err_s, "max_err_advantages": err_a}

    # verl's own estimator, through its registry, with CUDA tensors
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
    out["verl_estimator_max_err"] = err
    return out


def check_embedders(device: str) -> dict:
    import setpo.verl as sv
    from setpo.embed import SentenceTransformerEmbedder, default_model_path

    texts = [f"Step {i}: {i} + {i * 3} = {i * 4}, so the answer is \\boxed{{{i * 4}}}." for i in range(40)]
    cpu = SentenceTransformerEmbedder(default_model_path(), device="cpu")(texts)
    dev = SentenceTransformerEmbedder(default_model_path(), device=device)(texts)
    cos = float(torch.nn.functional.cosine_similarity(cpu, dev, dim=1).min())
    assert cos > 0.999, f"MiniLM on {device} vs CPU: min row cosine {cos:.5f}"
    settings = sv.SetPOVerlSettings(lam=0.05, embedding_model="default", embedding_device="auto")
    resolved = sv.resolve_device("auto")
    assert resolved == ("cuda" if device == "cuda" else "cpu"), f"embedding_device auto resolved to {resolved}"
    plug = sv.embedder_from_settings(settings)(texts)
    cos_plugin = float(torch.nn.functional.cosine_similarity(cpu, plug, dim=1).min())
    assert cos_plugin > 0.999, f"verl plug-in embedder vs CPU: min row cosine {cos_plugin:.5f}"
    return {"min_row_cosine": cos, "plugin_device": resolved, "plugin_min_row_cosine": cos_plugin}


def check_training(device: str, run_root: Path) -> dict:
    from setpo.embed import load_embedder
    from setpo.studies import math as ml
    from setpo.trl import quiet_libraries

    quiet_libraries()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    cfg = ml.MathRunConfig.cpu_demo(run_dir=str(run_root / "generate"), use_vllm=False, max_steps=3, save_steps=2,
                                    probe_every=2, max_completion_length=48, eval_k=4, eval_limit=8)
    train, val = ml.load_study_problems(cfg)
    embedder = load_embedder(cfg.embedder, device=device)
    t0 = time.time()
    finals = ml.train_runs(cfg, train, val[:cfg.n_probe], embedder=embedder)
    out: dict = {"generate": {"train_s": time.time() - t0}}
    for label, final in finals.items():
        done = json.loads((final / "done.json").read_text())
        assert done["steps"] == 3, f"{label} ran {done['steps']} steps"
        history = json.loads((final.parent / "log_history.json").read_text())
        assert any("setpo/s_mean" in h for h in history), f"{label}: no SetPO metrics logged"
        res = ml.evaluate_avg_at_k(cfg, final, val)
        out["generate"][label] = {"steps": done["steps"], "avg_at_k": res["avg_at_k"], "eval_s": res["seconds"]}
    if device == "cuda":
        peak = torch.cuda.max_memory_allocated()
        assert peak > 0, "nothing was allocated on the GPU: training did not run there"
        out["generate"]["peak_gpu_mib"] = peak / 2**20
    probes = {label: ml.read_probes(f.parent / "probes.jsonl") for label, f in finals.items()}
    fig, data = ml.trajectory_figure(probes, embedder, method="pca")
    assert data["steps"] == [0, 2, 3], data["steps"]
    out["generate"]["trajectory_points"] = sum(len(v["xy"]) for v in data["points"].values())

    if device != "cuda" or not ml._vllm_available():
        out["vllm"] = "skipped: " + ("no CUDA" if device != "cuda" else "vllm is not installed")
    elif elapsed() > BUDGET_S - 240:
        out["vllm"] = f"skipped: {elapsed():.0f} s used, not enough time left for vLLM start-up"
    else:
        vcfg = ml.MathRunConfig.cpu_demo(run_dir=str(run_root / "vllm"), use_vllm=True, max_steps=2, save_steps=2,
                                         probe_every=2, max_completion_length=48, eval_k=4, eval_limit=8,
                                         vllm_gpu_memory_utilization=0.2)
        t0 = time.time()
        final = ml.in_fresh_process(ml.train_run, vcfg, "SetPO+GRPO", vcfg.lam_value, list(train), list(val[:2]))
        train_s = time.time() - t0
        res = ml.evaluate_avg_at_k(vcfg, final, val)
        steps = json.loads((final / "done.json").read_text())["steps"]
        assert steps == 2, f"vLLM run ran {steps} steps"
        out["vllm"] = {"train_s": train_s, "steps": steps, "avg_at_k": res["avg_at_k"], "eval_s": res["seconds"],
                       "example": res["examples"][0][:1]}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "runs" / "gpu_check"),
                    help="folder for gpu_check.json and the tiny runs (default: $OUT or runs/gpu_check)")
    ap.add_argument("--allow-cpu", action="store_true",
                    help="run every check on the CPU (a dry run of the script; CUDA comparisons compare CPU with CPU)")
    args = ap.parse_args(argv)
    if torch.cuda.is_available():
        device = "cuda"
    elif args.allow_cpu:
        device = "cpu"
    else:
        print("no CUDA device; pass --allow-cpu for a dry run", file=sys.stderr)
        return 2
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    report: dict = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
                    "torch": torch.__version__, "checks": {}}
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, fn in (("estimator", lambda: check_estimator(device)),
                         ("embedders", lambda: check_embedders(device)),
                         ("training", lambda: check_training(device, Path(tmp)))):
            t0 = time.time()
            try:
                result = fn()
                report["checks"][name] = {"ok": True, "seconds": round(time.time() - t0, 1), **result}
            except Exception as err:  # noqa: BLE001 - report every check, then fail
                failed.append(name)
                report["checks"][name] = {"ok": False, "seconds": round(time.time() - t0, 1), "error": repr(err),
                                          "traceback": traceback.format_exc()[-4000:]}
            print(f"[{elapsed():6.1f} s] {name}: {'ok' if name not in failed else 'FAILED'}", flush=True)
    report["total_s"] = round(elapsed(), 1)
    (out_dir / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    print(json.dumps(report, indent=1, default=str)[-6000:])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
