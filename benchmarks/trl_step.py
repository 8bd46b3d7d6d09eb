"""Wall-clock of one TRL training step: SetPO+GRPO (embedder included) against plain GRPO, side by side.

The policy is notebook 03's Countdown model (Qwen2 architecture, ~1M parameters), G = 7 rollouts for 16
prompts per step, KL beta = 0.001, one generation per optimizer step, 1 CPU thread. Two policies:

- "fresh": random weights, so every completion is 24 random tokens and all are distinct: the worst case
  for the embedder (longest texts, nothing for its deduplication to skip);
- "warm": the same model after a short supervised warm start on solver solutions (as in the study), so
  completions are short ``<answer>...</answer>`` expressions, often repeated: the regime the study trains in.

Each configuration is a fresh trainer trained for ``STEPS`` steps; TRL's own ``step_time`` metric
(generation, rewards, advantages, embedding, loss and backward of one optimizer step) is read from the log,
the first ``WARMUP`` steps dropped, and the median taken. Configurations run interleaved (order reversed every
round), ``ROUNDS`` times, in one process; the ratio is median SetPO step time over median GRPO step time.
Target: <= 1.05. Embedders: all-MiniLM-L6-v2 (the default; a 22M-parameter transformer, 20x this policy, so
here it is a visible share of a step, unlike next to a 1.5B-7B policy) and the hashed n-gram embedder.

Usage: ``.venv/bin/python benchmarks/trl_step.py`` (about 4 minutes); the table goes to runs/bench/trl_step.md.
"""

from __future__ import annotations

import copy
import statistics
import tempfile
import time
from pathlib import Path

import torch

from setpo.records import write_bench_report

STEPS, WARMUP, ROUNDS = 8, 2, 2
MAX_RATIO = 1.05  # the target: a SetPO step at most 5% slower than GRPO's
PROMPTS_PER_STEP, G, THREADS = 16, 7, 1


def _trainer(kind: str, model, tok, dataset, out: str, embedder):
    from trl import GRPOConfig, GRPOTrainer

    from setpo.presets import PRESETS
    from setpo.studies.countdown import countdown_reward
    from setpo.trl import TRL_LOSS_TYPE, SetPOTrainer, config_for

    common = dict(output_dir=out, num_generations=G, per_device_train_batch_size=PROMPTS_PER_STEP * G,
                  max_completion_length=24, max_steps=STEPS, logging_steps=1, report_to=[], bf16=False,
                  use_cpu=True, save_strategy="no", beta=0.001, temperature=1.0, seed=0, disable_tqdm=True,
                  learning_rate=1e-4)
    if kind == "grpo":
        # the same loss aggregation as the SetPO preset, so the two differ only by SetPO
        args = GRPOConfig(**common, loss_type=TRL_LOSS_TYPE[PRESETS["countdown"].loss_agg])
        return GRPOTrainer(model=model, reward_funcs=countdown_reward, args=args, train_dataset=dataset,
                           processing_class=tok)
    args = config_for("countdown", **common)
    return SetPOTrainer(model=model, reward_funcs=countdown_reward, args=args, train_dataset=dataset,
                        processing_class=tok, embedder=embedder)


def _time(policy_dir: str, tok, data, embedders: dict, tmp: str) -> dict[str, list[float]]:
    from transformers import AutoModelForCausalLM
    from transformers.trainer_callback import PrinterCallback

    # TRL builds the KL reference model from the policy's name_or_path, so the policy comes from a folder
    base = AutoModelForCausalLM.from_pretrained(policy_dir, local_files_only=True, dtype=torch.float32)
    kinds = ["grpo", *embedders]
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(ROUNDS):
        for kind in kinds if r % 2 == 0 else kinds[::-1]:  # alternate to cancel drift on a shared machine
            tr = _trainer("grpo" if kind == "grpo" else "setpo", copy.deepcopy(base), tok, data, tmp,
                          embedders.get(kind))
            tr.remove_callback(PrinterCallback)
            tr.train()
            times[kind].extend([h["step_time"] for h in tr.state.log_history if "step_time" in h][WARMUP:])
    return times


def main() -> str:
    from datasets import Dataset

    from envs.countdown import generate_instances
    from setpo.embed import HashedNgramEmbedder, default_embedder
    from setpo.studies.countdown import CountdownLMConfig, make_data, rl_rows, run_sft
    from setpo.studies.tiny_models import ModelSize, build_model, build_tokenizer
    from setpo.trl import quiet_libraries

    torch.set_num_threads(THREADS)
    quiet_libraries()
    tok = build_tokenizer()
    data = Dataset.from_list(rl_rows(generate_instances(256, seed=0, number_range=(1, 20), target_range=(1, 50))))
    embedders = {"SetPO+GRPO, MiniLM-L6 embedder": default_embedder(),
                 "SetPO+GRPO, hashed n-gram embedder": HashedNgramEmbedder()}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        fresh = build_model(tok, ModelSize(), seed=0)
        fresh.save_pretrained(f"{tmp}/fresh")
        tok.save_pretrained(f"{tmp}/fresh")
        cfg = CountdownLMConfig(out=tmp, n_train=1500, n_val=4, n_test=4, sft_epochs=2.0, threads=THREADS)
        warm = run_sft(cfg, make_data(cfg), Path(tmp) / "sft", log=lambda *_: None)
        for name, policy in (("fresh", f"{tmp}/fresh"), ("warm", str(warm))):
            results[name] = _time(policy, tok, data, embedders, tmp)
    n_params = sum(p.numel() for p in fresh.parameters()) / 1e6
    lines = [f"One TRL optimizer step (generation, reward, advantages, embedding, loss, backward): Countdown "
             f"policy {n_params:.2f}M params, {PROMPTS_PER_STEP} prompts x G={G}, beta=0.001, {THREADS} CPU "
             f"thread; median over {STEPS - WARMUP} steps x {ROUNDS} interleaved rounds per configuration.", "",
             "| policy | configuration | median step (s) | ratio to GRPO | target | met |", "|---|---|---|---|---|---|"]
    for name, times in results.items():
        med = {k: statistics.median(v) for k, v in times.items()}
        for k in times:
            label = "GRPO (TRL GRPOTrainer)" if k == "grpo" else k
            ratio = med[k] / med["grpo"]
            verdict = "-" if k == "grpo" else ("PASS" if ratio <= MAX_RATIO else "FAIL")
            lines.append(f"| {name} | {label} | {med[k]:.3f} | {ratio:.3f} | "
                         f"{'-' if k == 'grpo' else f'<= {MAX_RATIO:g}'} | {verdict} |")
    table = "\n".join(lines)
    write_bench_report("trl_step", table)
    return table


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"({time.time() - t0:.0f}s)")
