"""Wall-clock of one TRL training step: SetPO+GRPO (embedder included) against plain GRPO, side by side.

The policy is notebook 03's Countdown model (Qwen2 architecture, ~1M parameters), G = 7 rollouts for 16
prompts per step, KL beta = 0.001, one generation per optimizer step, 1 CPU thread. Two policies:

- "fresh": random weights, so every completion is 24 random tokens and all are distinct: the worst case
  for the embedder (longest texts, nothing for its deduplication to skip);
- "warm": the same model after a short supervised warm start on solver solutions (as in the study), so
  completions are short ``<answer>...</answer>`` expressions, often repeated: the regime the study trains in.

Each configuration is a fresh trainer trained for ``COUNTDOWN.steps`` steps; TRL's own ``step_time`` metric
(generation, rewards, advantages, embedding, loss and backward of one optimizer step) is read from the log,
the first ``COUNTDOWN.warmup`` steps dropped, and the median taken. Configurations run interleaved (order reversed every
round), ``COUNTDOWN.rounds`` times, in one process; the ratio is median SetPO step time over median GRPO step time.
Target: <= 1.05. Embedders: all-MiniLM-L6-v2 (the default; a 22M-parameter transformer, 20x this policy, so
here it is a visible share of a step, unlike next to a 1.5B-7B policy) and the hashed n-gram embedder.

The paper's size ratios. The rows above put a ~1M-parameter policy next to a 22M-parameter
embedder, the opposite of the paper (Qwen2.5-Math-1.5B or 7B policy, Qwen3-Embedding-0.6B embedder: 2.6:1 and
12.8:1 in parameters, nominally 2.5:1 and 11.7:1). Two more rows keep those ratios with randomly initialised
models scaled down to what two CPU cores run in minutes (``benchmarks/paper_shapes.py``: the paper's configs'
proportions at a smaller width, a 2048-word vocabulary; random weights cost the compute of trained ones):
a Qwen3-shaped embedder of ~1.05M parameters beside Qwen2-shaped policies of ~2.6M and ~12.3M, responses of
``PAPER_RESPONSE_TOKENS`` tokens (random weights rarely stop early), 4 prompts x G = 6 per step, KL 1e-4, λ =
0.05, one CPU thread (as above: a second OpenMP thread waiting for a busy core on a shared machine makes a
small model's decoding many times slower), GRPO and SetPO interleaved in one process. Targets: ratio <= 1.10
at 2.5:1 and <= 1.05 at 11.7:1. The JSON also records the embedder's time alone on one step's responses
(``embed_s_alone``).

Every configuration is one row of ``runs/bench/trl_step.json`` (``policy_params``, ``embedder_params``,
``grpo_s``, ``setpo_s``, ``ratio``); the table with PASS / FAIL goes to runs/bench/trl_step.md.

Usage: ``.venv/bin/python benchmarks/trl_step.py`` (about 8 minutes), ``--only paper`` for the paper-ratio
rows alone (about 3 minutes), ``--only countdown`` for the others; ``--smoke``: every row at tiny sizes (2 prompts,
one measured step, one round, policies of a few thousand parameters), ``--out DIR``.
"""

from __future__ import annotations

import copy
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

import paper_shapes as ps  # benchmarks/, beside this script
from harness import options, report
from setpo.records import markdown_table

MAX_RATIO = 1.05  # the target: a SetPO step at most 5% slower than GRPO's
G, THREADS = 7, 1


@dataclass(frozen=True)
class CountdownSizes:
    """What the Countdown rows train: ``steps`` optimizer steps per trainer (the first ``warmup`` dropped),
    ``rounds`` interleaved rounds, and the warm start's supervised data."""

    steps: int = 8
    warmup: int = 2
    rounds: int = 2
    prompts_per_step: int = 16
    completion_tokens: int = 24
    n_train: int = 1500
    sft_epochs: float = 2.0


COUNTDOWN = CountdownSizes()
SMOKE_COUNTDOWN = CountdownSizes(steps=2, warmup=1, rounds=1, prompts_per_step=2, completion_tokens=8, n_train=48,
                                 sft_epochs=1.0)

#: (label, policy (hidden, layers, heads), target ratio): the paper's two policy:embedder parameter ratios
PAPER_ROWS = [("2.5:1 (1.5B : 0.6B)", (128, 7, 4), 1.10), ("11.7:1 (7B : 0.6B)", (288, 7, 6), 1.05)]
PAPER_VOCAB, PAPER_RESPONSE_TOKENS = 2048, 128
PAPER_EMBEDDER = ps.QWEN3_EMBEDDING_0_6B.scaled(hidden=128, layers=4, heads=4, kv_heads=2, vocab=PAPER_VOCAB)
PAPER_STEP = ps.StepSetting(prompts_per_step=4, num_generations=6, micro_batch=24,
                            max_completion_length=PAPER_RESPONSE_TOKENS, prompt_length=32, steps=2, warmup=1,
                            rounds=2, beta=1e-4, lam=0.05, threads=THREADS)
#: the smoke run's paper rows: the same code at a few thousand parameters (the ratios then mean nothing)
SMOKE_PAPER_ROWS = [("2.5:1 (1.5B : 0.6B)", (32, 1, 2), 1.10), ("11.7:1 (7B : 0.6B)", (64, 1, 2), 1.05)]
SMOKE_PAPER_VOCAB = 256
SMOKE_PAPER_EMBEDDER = ps.QWEN3_EMBEDDING_0_6B.scaled(hidden=32, layers=1, heads=2, kv_heads=2,
                                                      vocab=SMOKE_PAPER_VOCAB)
SMOKE_PAPER_STEP = ps.StepSetting(prompts_per_step=2, num_generations=3, micro_batch=6, max_completion_length=8,
                                  prompt_length=8, steps=1, warmup=1, rounds=1, beta=1e-4, lam=0.05,
                                  threads=THREADS)


def _trainer(kind: str, model, tok, dataset, out: str, embedder, sizes: CountdownSizes):
    from trl import GRPOConfig, GRPOTrainer

    from setpo.presets import PRESETS
    from setpo.trl.rewards import countdown_reward
    from setpo.trl import TRL_LOSS_TYPE, SetPOTrainer, config_for

    common = dict(output_dir=out, num_generations=G, per_device_train_batch_size=sizes.prompts_per_step * G,
                  max_completion_length=sizes.completion_tokens, max_steps=sizes.steps, logging_steps=1, report_to=[], bf16=False,
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


def _time(policy_dir: str, tok, data, embedders: dict, tmp: str, sizes: CountdownSizes) -> dict[str, list[float]]:
    from transformers import AutoModelForCausalLM
    from transformers.trainer_callback import PrinterCallback

    # TRL builds the KL reference model from the policy's name_or_path, so the policy comes from a folder
    base = AutoModelForCausalLM.from_pretrained(policy_dir, local_files_only=True, dtype=torch.float32)
    kinds = ["grpo", *embedders]
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(sizes.rounds):
        for kind in kinds if r % 2 == 0 else kinds[::-1]:  # alternate to cancel drift on a shared machine
            print(f"  round {r + 1}/{sizes.rounds}: {kind} ...", flush=True)  # each trainer runs for a while
            tr = _trainer("grpo" if kind == "grpo" else "setpo", copy.deepcopy(base), tok, data, tmp,
                          embedders.get(kind), sizes)
            tr.remove_callback(PrinterCallback)
            tr.train()
            times[kind].extend([h["step_time"] for h in tr.state.log_history if "step_time" in h][sizes.warmup:])
    return times


def countdown_rows(sizes: CountdownSizes = COUNTDOWN) -> tuple[list[dict], float]:
    from datasets import Dataset

    from setpo.envs.countdown import generate_instances
    from setpo.embed import HashedNgramEmbedder, default_embedder
    from setpo_lab.studies.countdown import CountdownLMConfig, make_data, train_sft
    from setpo_lab.studies.countdown_data import rl_rows
    from setpo.trl.tiny_models import ModelSize, build_model, build_tokenizer
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
        cfg = CountdownLMConfig(out=tmp, n_train=sizes.n_train, n_val=4, n_test=4, sft_epochs=sizes.sft_epochs,
                                threads=THREADS, replication_threads=0)  # a warm start, not a study: no replication
        warm = train_sft(cfg, make_data(cfg), Path(tmp) / "sft", log=lambda *_: None)
        for name, policy in (("fresh", f"{tmp}/fresh"), ("warm", str(warm))):
            results[name] = _time(policy, tok, data, embedders, tmp, sizes)
    policy_params = ps.n_params(fresh)
    emb_params = {"SetPO+GRPO, MiniLM-L6 embedder": ps.n_params(embedders["SetPO+GRPO, MiniLM-L6 embedder"].model),
                  "SetPO+GRPO, hashed n-gram embedder": 0}
    rows = []
    for name, times in results.items():
        med = {k: statistics.median(v) for k, v in times.items()}
        for k in times:
            if k == "grpo":
                continue
            rows.append({"configuration": f"Countdown policy ({name}), {k}", "policy_params": policy_params,
                         "embedder_params": emb_params[k], "param_ratio": None, "grpo_s": round(med["grpo"], 4),
                         "setpo_s": round(med[k], 4), "ratio": round(med[k] / med["grpo"], 4),
                         "target": MAX_RATIO})
    return rows, policy_params / 1e6


def paper_rows(smoke: bool = False) -> list[dict]:
    """SetPO/GRPO step time at the paper's policy:embedder parameter ratios, scaled down (module docstring)."""
    vocab = SMOKE_PAPER_VOCAB if smoke else PAPER_VOCAB
    step = SMOKE_PAPER_STEP if smoke else PAPER_STEP
    tok = ps.word_tokenizer(vocab)
    embedder = ps.RandomEmbedder(SMOKE_PAPER_EMBEDDER if smoke else PAPER_EMBEDDER, device="cpu", micro_batch=24)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, (hidden, layers, heads), target in SMOKE_PAPER_ROWS if smoke else PAPER_ROWS:
            shape = ps.QWEN25_MATH_1_5B.scaled(hidden=hidden, layers=layers, heads=heads, kv_heads=2, vocab=vocab)
            print(f"  paper ratio {label}: building the policy and timing GRPO and SetPO ...", flush=True)
            folder = Path(tmp) / f"policy_{hidden}x{layers}"
            ps.build_policy(shape, tok, folder, save_dtype=torch.float32)
            res = ps.step_times(folder, tok, embedder, step, device="cpu")
            embed_s = ps.embed_seconds(embedder, step.prompts_per_step * step.num_generations,
                                       step.max_completion_length, vocab)
            rows.append({"configuration": f"paper ratio {label}", "policy_params": res["policy_params"],
                         "embedder_params": embedder.params,
                         "param_ratio": round(res["policy_params"] / embedder.params, 2),
                         "grpo_s": res["grpo_s"], "setpo_s": res["setpo_s"], "ratio": res["ratio"],
                         "embed_s_alone": round(embed_s, 4), "target": target,
                         "grpo_steps": res["grpo_steps"], "setpo_steps": res["setpo_steps"]})
    return rows


def main(argv=None) -> str:
    args = options(__doc__, argv, lambda ap: ap.add_argument("--only", choices=["countdown", "paper"],
                                                             help="run one family of rows"))
    rows, header = [], []
    if args.only != "paper":
        sz = SMOKE_COUNTDOWN if args.smoke else COUNTDOWN
        countdown, m_params = countdown_rows(sz)
        rows += countdown
        header.append(f"Countdown rows: notebook 03's policy ({m_params:.2f}M params), {sz.prompts_per_step} prompts "
                      f"x G={G}, {sz.completion_tokens}-token completions, beta=0.001, {THREADS} CPU thread; median "
                      f"over {sz.steps - sz.warmup} steps x {sz.rounds} interleaved rounds per configuration.")
    if args.only != "countdown":
        rows += paper_rows(args.smoke)
        st = SMOKE_PAPER_STEP if args.smoke else PAPER_STEP
        header.append(f"Paper-ratio rows: random Qwen2-shaped policies beside a random Qwen3-shaped embedder "
                      f"(benchmarks/paper_shapes.py), {st.prompts_per_step} prompts x G={st.num_generations}, "
                      f"{st.max_completion_length}-token responses, beta={st.beta}, lambda={st.lam}, "
                      f"{st.threads} CPU thread; median over {st.steps} steps x {st.rounds} interleaved rounds.")
    for r in rows:
        r["met"] = "PASS" if r["ratio"] <= r["target"] else "FAIL"
    shown = [{"configuration": r["configuration"], "policy params": f"{r['policy_params'] / 1e6:.2f}M",
              "embedder params": f"{r['embedder_params'] / 1e6:.2f}M", "GRPO step (s)": f"{r['grpo_s']:.3f}",
              "SetPO step (s)": f"{r['setpo_s']:.3f}", "ratio": f"{r['ratio']:.3f}", "target": f"<= {r['target']:g}",
              "met": r["met"]} for r in rows]
    table = "\n".join([*header, "", "One TRL optimizer step (generation, reward, advantages, embedding, loss, backward).",
                       "", markdown_table(shown)])
    report(args, "trl_step", table, {"rows": rows})
    return table


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"({time.time() - t0:.0f}s)")
