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
    """setpo_advantages against one torch.bmm forming the Gram matrices, contiguous and shuffled groups."""
    import numpy as np
    import torch

    import setpo

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    shapes = [(8, 4, 32), (16, 8, 64)] if tiny else [(512, 16, 1024), (1024, 64, 4096)]
    rows = []
    for b, g, d in shapes:
        gen = torch.Generator().manual_seed(0)
        emb = torch.randn(b * g, d, generator=gen).to(device)
        rewards = torch.randint(0, 2, (b * g,), generator=gen).float().to(device)
        grouped = emb.view(b, g, d)
        perm = torch.randperm(b * g, generator=gen)
        index = np.repeat(np.arange(b), g)[perm.numpy()]
        e_perm, r_perm = emb[perm.to(device)], rewards[perm.to(device)]
        fns = {"setpo_advantages": lambda: setpo.setpo_advantages(rewards, emb, group_size=g),
               "shuffled uids": lambda: setpo.setpo_advantages(r_perm, e_perm, index),
               "bmm floor": lambda: torch.bmm(grouped, grouped.transpose(1, 2))}
        t = time_interleaved(fns, 5 if tiny else 21, sync)
        rows.append({"B": b, "G": g, "d": d, **{f"{k} (ms)": round(v * 1e3, 3) for k, v in t.items()},
                     "setpo / floor": round(t["setpo_advantages"] / t["bmm floor"], 2),
                     "shuffled / contiguous": round(t["shuffled uids"] / t["setpo_advantages"], 2)})
    return {"rows": rows}


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
