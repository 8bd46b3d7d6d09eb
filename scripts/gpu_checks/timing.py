"""Timings: the estimator against its floor (``check_floor``) and SetPO's step-time overhead over GRPO at the
paper's shapes (``check_overhead``)."""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from gpu_checks import BUDGET_S, elapsed
from gpu_checks.numerics import tiny_embedder_shape


def time_interleaved(fns: dict, repeats: int, sync) -> dict:
    """Median seconds of each function (name -> fn), after one warm-up call each, alternating their order from
    one repeat to the next so that drift in the machine's speed falls on all of them alike."""
    for fn in fns.values():
        fn()
    sync()
    times = {k: [] for k in fns}
    for r in range(repeats):
        for k in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            t0 = time.perf_counter()
            fns[k]()
            sync()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def check_floor(device: str, tiny: bool) -> dict:
    """setpo_advantages against one torch.bmm forming the Gram matrices, contiguous and shuffled groups; the host
    reads (GPU synchronisations) of each call; and the contiguous path compiled whole (torch.compile(fullgraph=True)
    of ``unchecked_setpo_advantages``, its validity flag read once per call as setpo_advantages reads it)."""
    import numpy as np
    import torch

    import setpo
    from setpo.advantages import unchecked_setpo_advantages

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    shapes = [(8, 4, 32), (16, 8, 64)] if tiny else [(512, 16, 1024), (1024, 64, 4096)]
    compiled = torch.compile(unchecked_setpo_advantages, fullgraph=True, dynamic=False)
    rows = []
    for b, g, d in shapes:
        gen = torch.Generator().manual_seed(0)
        emb = torch.randn(b * g, d, generator=gen).to(device)
        rewards = torch.randint(0, 2, (b * g,), generator=gen).float().to(device)
        grouped = emb.view(b, g, d)
        perm = torch.randperm(b * g, generator=gen)
        index = np.repeat(np.arange(b), g)[perm.numpy()]
        e_perm, r_perm = emb[perm.to(device)], rewards[perm.to(device)]
        fns = {"setpo_advantages": lambda rewards=rewards, emb=emb, g=g: setpo.setpo_advantages(
                   rewards, emb, group_size=g),
               "shuffled uids": lambda r_perm=r_perm, e_perm=e_perm, index=index: setpo.setpo_advantages(
                   r_perm, e_perm, index),
               "bmm floor": lambda grouped=grouped: torch.bmm(grouped, grouped.transpose(1, 2))}
        reads = {k: host_reads(fns[k]) for k in ("setpo_advantages", "shuffled uids")}
        t0 = time.perf_counter()
        try:
            adv, _, ok = compiled(rewards, emb, group_size=g, lam=0.05)
            sync()
            compile_s, compile_error = time.perf_counter() - t0, None
            if not bool(ok):
                raise AssertionError("the compiled flag says the valid input is not")
            agrees = bool(torch.allclose(adv, setpo.setpo_advantages(rewards, emb, group_size=g, lam=0.05),
                                         rtol=1e-4, atol=1e-5))
            fns["compiled"] = lambda rewards=rewards, emb=emb, g=g: bool(
                compiled(rewards, emb, group_size=g, lam=0.05)[2])
        except Exception as err:  # noqa: BLE001 - a compiler missing on the machine is a finding, not a failure
            compile_s, compile_error, agrees = time.perf_counter() - t0, repr(err)[:300], None
        t = time_interleaved(fns, 5 if tiny else 21, sync)
        row = {"B": b, "G": g, "d": d, **{f"{k} (ms)": round(v * 1e3, 3) for k, v in t.items()},
               "setpo / floor": round(t["setpo_advantages"] / t["bmm floor"], 2),
               "shuffled / contiguous": round(t["shuffled uids"] / t["setpo_advantages"], 2),
               "host reads per call": reads["setpo_advantages"], "host reads, shuffled": reads["shuffled uids"],
               "compile (s)": round(compile_s, 1), "compiled agrees": agrees}
        if "compiled" in t:
            row["compiled / floor"] = round(t["compiled"] / t["bmm floor"], 2)
        if compile_error:
            row["compile error"] = compile_error
        rows.append(row)
    return {"rows": rows}


def host_reads(fn) -> int:
    """Host reads of one call of fn (after a warm-up): the ATen operations whose answer the host waits for."""
    from torch.utils._python_dispatch import TorchDispatchMode

    reads = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique", "_unique2", "unique_dim",
             "unique_consecutive", "equal", "is_nonzero"}

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += func.overloadpacket.__name__ in reads
            return func(*args, **(kwargs or {}))

    fn()
    with Count():
        fn()
    return Count.n


def check_overhead(device: str, tiny: bool) -> dict:
    """SetPO+GRPO over GRPO step time (TRL, interleaved) with paper-shaped random models."""
    import paper_shapes as ps
    import torch

    if tiny:
        vocab = 512
        policy = ps.QWEN25_MATH_1_5B.scaled(hidden=64, layers=2, heads=4, kv_heads=2, vocab=vocab)
        embedder_shape = tiny_embedder_shape()
        st = ps.StepSetting(prompts_per_step=2, num_generations=3, micro_batch=6, max_completion_length=12,
                            prompt_length=8, steps=1, warmup=1, rounds=1)
    else:
        vocab = ps.QWEN25_MATH_1_5B.vocab
        policy, embedder_shape = ps.QWEN25_MATH_1_5B, ps.QWEN3_EMBEDDING_0_6B
        st = ps.StepSetting(prompts_per_step=8, num_generations=6, micro_batch=24, max_completion_length=756,
                            prompt_length=128, steps=2, warmup=1, rounds=1)
    left = BUDGET_S - elapsed()
    if not tiny and left < 200:
        return {"skipped": f"{elapsed():.0f} s used, {left:.0f} s left: not enough for the paper-shaped steps"}
    tok = ps.word_tokenizer(vocab)
    embedder = ps.RandomEmbedder(embedder_shape, device=device, micro_batch=32)
    with tempfile.TemporaryDirectory() as tmp:
        ps.build_policy(policy, tok, Path(tmp) / "policy", device=device)
        res = ps.step_times(Path(tmp) / "policy", tok, embedder, st, device=device)
    embed_s = ps.embed_seconds(embedder, st.prompts_per_step * st.num_generations, st.max_completion_length, vocab)
    res["embed_s_alone"] = round(embed_s, 4)
    res["shapes"] = {"policy": vars(policy), "embedder": vars(embedder_shape)}
    del embedder
    if device == "cuda":
        torch.cuda.empty_cache()
    return res
