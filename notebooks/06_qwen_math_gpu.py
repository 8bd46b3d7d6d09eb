# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 06 · Qwen2.5-Math on a GPU: GRPO against SetPO+GRPO at the paper's settings
#
# The paper's run: set `MODEL_PATH` to Qwen2.5-Math-1.5B (and `TRAIN_FILE`, `VAL_FILE`, `PASSK_FILE`). The
# paper's settings (`setpo.presets.PAPER_RUN`: G = 6, T = 0.9, 756 tokens, KL 1e-4, 64 prompts per step,
# 2 epochs) with vLLM generation; the base model's pass@k at large budgets, training curves, pass@k after
# training, and the embedding trajectories of the responses. For many GPUs use verl: `scripts/run_setpo.sh`.
#
# Without `MODEL_PATH` its cells do nothing: the real model on the CPU is notebook 04. `GSM8K_CPU = True` runs
# this notebook with SmolLM2-135M-Instruct on GSM8K on the CPU (hours): GSM8K is beyond a 135M model (a reward in
# 0 of 384 GRPO rollouts; docs/studies/math.md keeps that record, whose figures are `figures/04_math_*`, made when
# this notebook was notebook 04). `SMOKE = True` swaps in a tiny random model of the same architecture and a few
# steps: it checks that every cell runs (the tests use it); its numbers mean nothing.

# %% tags=["parameters"]
SMOKE = False                      # tiny random model, two steps, one evaluation: checks the notebook runs (tests)
OUT_DIR = "../runs/notebooks"      # figures and tables (scratch)
GSM8K_CPU = False                  # True: SmolLM2 on GSM8K on the CPU (hours; a model's limit)
MODEL_PATH = None                  # e.g. "/models/Qwen2.5-Math-1.5B" (a GPU); None: the cells do nothing
EMBEDDING_MODEL_PATH = "default"   # e.g. "/models/Qwen3-Embedding-0.6B" (paper); "default": all-MiniLM-L6-v2
TRAIN_FILE = None                  # with MODEL_PATH: e.g. "gsm8k:train" (data/gsm8k) or a .parquet file
VAL_FILE = None                    # with MODEL_PATH: e.g. "gsm8k:test" or MATH500
PASSK_FILE = None                  # with MODEL_PATH: e.g. ".../aime24.parquet" (AIME-style: problem, answer)
ALGO = "grpo"                      # "grpo" | "gspo" | "dapo": the one switch to the other algorithms
SETPO_LAMBDA = None                # None: the preset's λ
RUN_DIR = None                     # models, checkpoints, evaluations (resumable); None: ../runs/qwen_math[_cpu]
PROJECTION = "umap"                # "umap" or "pca"
JUDGE_URL = None                   # e.g. "http://127.0.0.1:8001/v1" (`vllm serve MODEL --port 8001`); None: no judge
JUDGE_MODEL = None                 # the model name the judge server serves, e.g. "Qwen/Qwen2.5-7B-Instruct"
JUDGE_PATH = None                  # or a local chat model folder, run in-process as the judge

# %%
import tempfile
from pathlib import Path

import torch
from IPython.display import Markdown, display

from setpo.embed import load_embedder
from setpo.envs.math import qwen_math_messages
from setpo_lab.studies import judging
from setpo_lab.studies import math as ml
from setpo_lab.studies import math_results as mr
from setpo_lab.studies.figures import (models_pass_at_k_figure, probe_trajectory_figure, read_probes, save_figure,
                                       save_table, show, show_table, trainer_log_figure)
from setpo_lab.studies.toolkit import chat_prompts
from setpo.trl import quiet_libraries

quiet_libraries()
CUDA = torch.cuda.is_available()
if not CUDA:
    torch.set_num_threads(2)
out = Path(OUT_DIR)
NOTE = " · tiny random model: numbers mean nothing" if SMOKE else ""

# %% [markdown]
# ## The run's settings
# It runs with `MODEL_PATH` set (a GPU), with `GSM8K_CPU = True`, or in `SMOKE`; otherwise its cells do nothing.

# %%
MATH = SMOKE or MODEL_PATH is not None or GSM8K_CPU
JUDGE = dict(judge_url=JUDGE_URL, judge_model=JUDGE_MODEL, judge_path=JUDGE_PATH)  # all None: no judge
if not MATH:
    cfg = None
elif SMOKE:
    # a fresh run folder every time, so the smoke run really trains instead of resuming a finished one
    cfg = ml.MathRunConfig.cpu_demo(smoke=True, algo=ALGO, lam=SETPO_LAMBDA, run_dir=tempfile.mkdtemp(), **JUDGE)
    PROJECTION = "pca"
elif MODEL_PATH is None:
    cfg = ml.MathRunConfig.cpu_real(algo=ALGO, lam=SETPO_LAMBDA, embedder=EMBEDDING_MODEL_PATH,
                                    run_dir=RUN_DIR or "../runs/qwen_math_cpu", **JUDGE)
else:
    cfg = ml.MathRunConfig(model_path=MODEL_PATH, embedder=EMBEDDING_MODEL_PATH, train_file=TRAIN_FILE,
                           val_file=VAL_FILE, algo=ALGO, lam=SETPO_LAMBDA, run_dir=RUN_DIR or "../runs/qwen_math",
                           passk_file=PASSK_FILE, **JUDGE)
if cfg is None:
    display(Markdown("> Skipped: set `MODEL_PATH` (a GPU) or `GSM8K_CPU = True` to run this notebook; "
                     "the real model on the CPU is notebook 04."))
elif cfg.tiny:
    display(Markdown("> **Tiny random model (`SMOKE`).** Every cell runs; the rewards, pass@k and trajectories "
                     "**mean nothing**."))
elif MODEL_PATH is not None and not CUDA:
    display(Markdown("> **No GPU found.** A Qwen2.5-Math model on the CPU will take days; use a GPU, or leave "
                     "`MODEL_PATH = None` for the CPU setting."))
cfg

# %% [markdown]
# ## Data, prompt and reward
# Each question becomes the Qwen2.5-Math chain-of-thought prompt (system: *Please reason step by step, and
# put your final answer within \boxed{}.*), rendered by the model's own chat template. The reward is 1 when the
# response's final answer (the last `\boxed{}`, else a stated "the answer is …") equals the reference by
# `math-verify`, else 0 (`setpo.envs.math.math_reward`; model text is parsed, never executed).

# %%
if MATH:
    train, val = ml.load_study_problems(cfg)
    probes = val[:cfg.n_probe]
    model_path = ml.resolve_model_path(cfg)
    tokenizer = ml.load_tokenizer(model_path, tiny=cfg.tiny)
    print(f"{len(train)} training and {len(val)} validation problems; model: {model_path}")
    print(chat_prompts(tokenizer, [train[0].question], qwen_math_messages)[0] + "…", "\nreference answer:",
          train[0].answer)

# %% [markdown]
# ## The base model at large sampling budgets
# RL with a 0/1 reward tends to sharpen what the base model already does: pass@1 rises while pass@k at large
# k can fall *below* the base model's, because the policy stops producing its rarer solutions (Yue et al. 2025).
# So the base model comes first: n = `passk_max` samples per problem at T = 0.5, top-p 0.9 (the paper's
# evaluation sampling), and pass@k at every k ≤ n by the unbiased estimator (Chen et al. 2021). Progress is
# printed at least every 10 s; the samples are cached, so this runs once.

# %%
if MATH:
    passk_problems = ml.load_passk_problems(cfg)
    passk = ml.evaluate_pass_at_k(cfg, {"base model": model_path}, passk_problems, cache_dir=cfg.run_dir)
    show_table(mr.pass_at_k_table(passk))

# %% [markdown]
# ## Train GRPO and SetPO+GRPO
# Same base model, seed, prompts and settings; only λ differs. Generation uses vLLM (colocated with the
# trainer) when a GPU and vLLM are there, `generate` otherwise. The embedder (response text only, prompt
# excluded) runs on the trainer's device. A run that stops part-way continues from its last checkpoint when
# this cell runs again; a finished run is loaded, not retrained.

# %%
if MATH:
    embedder = load_embedder(cfg.embedder, device="cuda" if CUDA else "cpu")
    finals = ml.train_runs(cfg, train, probes, embedder=embedder)
    run_dirs = {label: Path(final).parent for label, final in finals.items()}

# %% [markdown]
# ## Training curves
# Reward, the mean within-group similarity of the rollouts (lower = more diverse groups) and the number of
# distinct correct responses per group, as logged by `SetPOTrainer` for every run.

# %%
if MATH:
    record = mr.config_record(cfg)
    fig = trainer_log_figure(run_dirs, title=f"{ALGO.upper()} vs SetPO+{ALGO.upper()} during training{NOTE}")
    html, png = save_figure(fig, out / "06_math_training", record)
    show(fig, png)

# %% [markdown]
# ## After training: pass@1 and pass@k against the base model
# Each trained run draws the same n samples per problem as the base model did. Pass@1 is avg@n (the mean
# fraction correct). The comparison is paired over problems: per problem, a model's pass@k minus another's,
# averaged, with its 95% t-interval over problems.
#
# **Judged diversity** (with `JUDGE_URL` and `JUDGE_MODEL`, or `JUDGE_PATH`): a judge model reads each
# evaluated problem with the first 8 responses each run sampled for it and rates how many genuinely different
# approaches they take, 1-10 (`setpo.judge`); no judged result is shown without a judge.

# %%
if MATH:
    passk.update(ml.evaluate_pass_at_k(cfg, finals, passk_problems, cache_dir=cfg.run_dir))
    results = ml.evaluate_runs(cfg, finals, val)  # the pass@k samples again when they coincide (shares_samples)
    judged = ml.judge_runs(cfg, finals, val) if judging.judge_configured(cfg) else None
    table = mr.results_table(results, cfg.eval_k, note="Tiny random model: these numbers mean nothing." if cfg.tiny
                             else "", judged=judged)
    show_table(table)
    save_table(table, out / "06_math_results", mr.results_record(record, results, judged))
    pairs = [(label, "base model") for label in finals] + [(label, ALGO.upper()) for label in list(finals)[1:]]
    diffs = mr.paired_differences(passk, pairs)
    show_table(mr.paired_table(diffs))
    save_table(mr.paired_table(diffs), out / "06_math_paired", {**record, "paired": diffs})
    passk_fig = models_pass_at_k_figure(passk, title=f"Base model vs {ALGO.upper()} vs SetPO+{ALGO.upper()}{NOTE}")
    html, png = save_figure(passk_fig, out / "06_math_pass_at_k",
                            {**record, "pass_at_k": {k: r["pass_at_k"] for k, r in passk.items()}})
    show(passk_fig, png)
    show_table(mr.pass_at_k_table(passk))

# %% [markdown]
# ## Where the responses go
# The responses sampled for the same few validation prompts at successive training steps, embedded with the
# SetPO embedder and projected together (UMAP by default). Colour is the step; each marker shape is one prompt;
# filled markers are correct. A collapsing policy's responses to a prompt shrink to one spot; SetPO's should
# stay spread over several. Under the figure: the mean cosine similarity of the responses to one prompt, at the
# first and the last probe of each run (lower is more diverse).

# %%
if MATH:
    probes_by_run = {label: read_probes(d / "probes.jsonl") for label, d in run_dirs.items()}
    traj, traj_data = probe_trajectory_figure(probes_by_run, embedder, method=PROJECTION, seed=cfg.seed, title_note=NOTE)
    similarity = mr.probe_similarity(probes_by_run, embedder)
    html, png = save_figure(traj, out / "06_math_trajectories", {**record, "projection": PROJECTION,
                                                                 "probe_similarity": similarity})
    show(traj, png)
    show_table(mr.similarity_table(similarity))

# %% [markdown]
# ## What this rung shows, and what it cannot
# The list below is written from the numbers above by `math_results.math_reading`, so it cannot drift from them.
#
# What it cannot show: SmolLM2-135M-Instruct gets a few percent of GSM8K samples right, far from the paper's
# math models, and 24 steps of 4 prompts see 96 of GSM8K's 7,473 training problems where the paper trains two epochs.
# With 8 problems the intervals are wide: a change smaller than they are would go unseen. What it does show is
# the whole pipeline on a real model, its real tokenizer and chat template, and the base model's coverage at
# large k, the quantity RL with verifiable rewards is said to shrink.

# %%
if MATH:
    display(Markdown(mr.math_reading(cfg, passk, diffs, similarity, run_dirs)))
