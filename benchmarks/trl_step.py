"""Wall-clock of one TRL training step: SetPO+GRPO (embedder included) against plain GRPO, side by side.

The policy is notebook 03's Countdown model (Qwen2 architecture, ~1M parameters, fresh weights so every
completion is full length and distinct: the worst case for the embedder's deduplication), G = 7 rollouts
for 16 prompts per step, KL beta = 0.001, one generation per optimizer step. Each configuration is a
fresh trainer trained for ``STEPS`` steps; TRL's own ``step_time`` metric (generation, rewards, advantages,
embedding, loss and backward of one optimizer step) is read from the log, the first ``WARMUP`` steps
dropped, and the median taken. Configurations run in an interleaved order, ``ROUNDS`` times, in one
process; the ratio is median SetPO step time over median GRPO step time. Target: <= 1.05.

Two embedders are timed: the default all-MiniLM-L6-v2 (a 22M-parameter transformer, 20x the policy, so
on this toy the embedder is a visible share of a step; on a 1.5B-7B policy it is not) and the hashed
n-gram embedder (no network, microseconds). Usage: ``.venv/bin/python benchmarks/trl_step.py``.
"""

from __future__ import annotations

import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STEPS, WARMUP, ROUNDS = 8, 2, 3
PROMPTS_PER_STEP, G, THREADS = 16, 7, 1


def _trainer(kind: str, model, tok, dataset, out: str, embedder):
    from trl import GRPOConfig, GRPOTrainer

    from setpo.countdown_lm import countdown_reward
    from setpo.trl import SetPOTrainer, config_for

    common = dict(output_dir=out, num_generations=G, per_device_train_batch_size=PROMPTS_PER_STEP * G,
                  max_completion_length=24, max_steps=STEPS, logging_steps=1, report_to=[], bf16=False,
                  use_cpu=True, save_strategy="no", beta=0.001, temperature=1.0, seed=0, disable_tqdm=True,
                  learning_rate=1e-4)
    if kind == "grpo":
        args = GRPOConfig(**{**common, "loss_type": config_for("grpo", output_dir=out).loss_type})
        return GRPOTrainer(model=model, reward_funcs=countdown_reward, args=args, train_dataset=dataset,
                           processing_class=tok)
    args = config_for("countdown", **common)
    return SetPOTrainer(model=model, reward_funcs=countdown_reward, args=args, train_dataset=dataset,
                        processing_class=tok, embedder=embedder)


def main() -> str:
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback

    from envs.countdown import generate_instances
    from setpo.countdown_lm import ModelSize, build_model, build_tokenizer, quiet_libraries, rl_rows
    from setpo.embed import HashedNgramEmbedder, default_embedder

    torch.set_num_threads(THREADS)
    quiet_libraries()
    tok = build_tokenizer()
    base = build_model(tok, ModelSize(), seed=0)
    data = Dataset.from_list(rl_rows(generate_instances(256, seed=0, number_range=(1, 20), target_range=(1, 50))))
    embedders = {"SetPO+GRPO, MiniLM-L6 embedder": default_embedder(), "SetPO+GRPO, hashed n-gram embedder":
                 HashedNgramEmbedder()}
    kinds = ["grpo", *embedders]
    times: dict[str, list[float]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(ROUNDS):
            order = kinds if r % 2 == 0 else kinds[::-1]  # alternate to cancel drift on a shared machine
            for kind in order:
                tr = _trainer("grpo" if kind == "grpo" else "setpo", copy.deepcopy(base), tok, data, tmp,
                              embedders.get(kind))
                tr.remove_callback(PrinterCallback)
                tr.train()
                steps = [h["step_time"] for h in tr.state.log_history if "step_time" in h]
                times[kind].extend(steps[WARMUP:])
    med = {k: statistics.median(v) for k, v in times.items()}
    lines = [f"One TRL optimizer step (generation, reward, advantages, embedding, loss, backward): Countdown "
             f"policy {sum(p.numel() for p in base.parameters()) / 1e6:.2f}M params, {PROMPTS_PER_STEP} prompts "
             f"x G={G}, beta=0.001, {THREADS} CPU thread(s); median of {len(times['grpo'])} steps each, "
             f"{ROUNDS} interleaved rounds.", "",
             "| configuration | median step (s) | ratio to GRPO | target |", "|---|---|---|---|"]
    for k in kinds:
        name = "GRPO (TRL GRPOTrainer)" if k == "grpo" else k
        ratio = med[k] / med["grpo"]
        lines.append(f"| {name} | {med[k]:.3f} | {ratio:.3f} | {'-' if k == 'grpo' else '<= 1.05'} |")
    table = "\n".join(lines) + "\n"
    out = ROOT / "runs" / "bench" / "trl_step.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table)
    print(table)
    return table


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"({time.time() - t0:.0f}s)")
