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
# # 04 · Qwen2.5-Math on one GPU: GRPO vs SetPO+GRPO
#
# The top of the ladder: the paper's math setting (SetPO, arXiv 2602.01062) on one GPU node with TRL and
# vLLM. Qwen2.5-Math-1.5B (or 7B) is trained on the GSM8K train split with G = 6 rollouts per prompt,
# rollout temperature 0.9, responses up to 756 tokens, KL 1e-4 to the base model, 64 prompts per step,
# 2 epochs, and the learning rate, clip range and λ of the chosen algorithm (`setpo.presets`):
#
# | algorithm | ratio | clip | lr | λ |
# |---|---|---|---|---|
# | GRPO | token | 0.2 / 0.2 | 3e-6 | 0.05 |
# | GSPO | sequence | 3e-4 / 4e-4 | 1e-6 | 0.1 |
# | DAPO | token | 0.2 / 0.28 | 1e-6 | 0.2 |
#
# Two runs share everything but λ: the baseline (λ = 0) and SetPO, whose advantage is
# $\hat A_i = \bar A_i + \lambda s_i$ with $s_i$ the leave-one-out diversity marginal of response $i$ in its
# group (`setpo.trl.SetPOTrainer`). Pass@1 is reported as avg@k at T = 0.5, top-p 0.9 (the paper's k is 64),
# and the responses to a few fixed prompts are embedded over training to show where each policy's samples go.
#
# **Paths, not downloads.** Set `MODEL_PATH`, `EMBEDDING_MODEL_PATH`, `TRAIN_FILE`, `VAL_FILE` (the names of
# the paper's launcher) to local files, e.g. GSM8K from `huggingface-cli download --repo-type dataset
# openai/gsm8k`. Without `MODEL_PATH` the notebook builds a **tiny randomly initialised Qwen2 model** and
# trains it on generated arithmetic word problems on the CPU: every step of the pipeline runs, and **every
# number it prints means nothing**. Runs checkpoint as they go; rerunning the notebook resumes them.
#
# For many GPUs or nodes use verl instead: `scripts/run_setpo.sh` (same settings, `setpo.verl`).

# %% tags=["parameters"]
SMOKE = False                      # tiny model, two steps, one evaluation: checks the notebook runs (tests)
OUT_DIR = "../runs/notebooks"      # figures and the results table (scratch; `make figures` passes ../figures)
MODEL_PATH = None                  # e.g. "/models/Qwen2.5-Math-1.5B"; None: tiny random Qwen2 (CPU demo)
EMBEDDING_MODEL_PATH = "default"   # e.g. "/models/Qwen3-Embedding-0.6B" (paper); "default": all-MiniLM-L6-v2
TRAIN_FILE = None                  # e.g. ".../gsm8k/main/train-00000-of-00001.parquet"; None: generated problems
VAL_FILE = None                    # e.g. ".../gsm8k/main/test-00000-of-00001.parquet" or MATH500
ALGO = "grpo"                      # "grpo" | "gspo" | "dapo": the one switch to the other algorithms
SETPO_LAMBDA = None                # None: the preset's λ
RUN_DIR = "../runs/qwen_math"      # models, checkpoints, logs, evaluations (resumable)
MAX_STEPS = -1                     # > 0 stops each run early
EVAL_K = 64                        # Pass@1 is reported as avg@EVAL_K
EVAL_LIMIT = None                  # evaluate the first N validation problems only
PROJECTION = "umap"                # "umap" or "pca"
PASSK_FILE = None                  # e.g. ".../aime24.parquet" (AIME-style: problem, answer); None: generated problems
PASSK_MAX = 256                    # pass@k up to this k, from PASSK_MAX samples per problem
JUDGE_URL = None                   # e.g. "http://127.0.0.1:8001/v1" (`vllm serve MODEL --port 8001`); None: no judge
JUDGE_MODEL = None                 # the model name the judge server serves, e.g. "Qwen/Qwen2.5-7B-Instruct"
JUDGE_PATH = None                  # or a local chat model folder, run in-process as the judge

# %%
import tempfile
from pathlib import Path

import torch
from IPython.display import Markdown, display

from setpo.embed import load_embedder
from setpo.studies import judging
from setpo.studies import math as ml
from setpo.studies import math_results as mr
from setpo.studies.figures import save_figure, save_table, show, show_table
from setpo.trl import quiet_libraries

quiet_libraries()
CUDA = torch.cuda.is_available()
if not CUDA:
    torch.set_num_threads(2)
JUDGE = dict(judge_url=JUDGE_URL, judge_model=JUDGE_MODEL, judge_path=JUDGE_PATH)  # all None: no judge
if SMOKE:
    # a fresh run folder every time, so the smoke run really trains instead of resuming a finished one
    cfg = ml.MathRunConfig.cpu_demo(smoke=True, algo=ALGO, lam=SETPO_LAMBDA, run_dir=tempfile.mkdtemp(), **JUDGE)
    PROJECTION = "pca"
elif MODEL_PATH is None:
    cfg = ml.MathRunConfig.cpu_demo(algo=ALGO, lam=SETPO_LAMBDA, embedder=EMBEDDING_MODEL_PATH,
                                    train_file=TRAIN_FILE, val_file=VAL_FILE, run_dir=RUN_DIR,
                                    passk_file=PASSK_FILE, **JUDGE)
else:
    cfg = ml.MathRunConfig(model_path=MODEL_PATH, embedder=EMBEDDING_MODEL_PATH, train_file=TRAIN_FILE,
                           val_file=VAL_FILE, algo=ALGO, lam=SETPO_LAMBDA, max_steps=MAX_STEPS, eval_k=EVAL_K,
                           eval_limit=EVAL_LIMIT, run_dir=RUN_DIR, passk_file=PASSK_FILE, passk_max=PASSK_MAX,
                           **JUDGE)
TINY = cfg.model_path is None
if TINY:
    display(Markdown(
        "> **Tiny random model on generated problems.** This run exercises the pipeline end to end "
        f"({'CPU' if not CUDA else 'GPU'}); its rewards, Pass@1 and trajectories **mean nothing**. "
        "Set `MODEL_PATH` (and the data paths) on a GPU machine for the real experiment."))
elif not CUDA:
    display(Markdown("> **No GPU found.** A Qwen2.5-Math model on the CPU will take days; use a GPU."))
cfg

# %% [markdown]
# ## Data and prompt
# Each question becomes a Qwen2.5-Math chain-of-thought prompt (system: *Please reason step by step, and
# put your final answer within \boxed{}.*). The reward is 1 when the last `\boxed{}` of the response equals
# the reference answer by `math-verify`, else 0 (`envs.math.math_reward`; model text is parsed as
# LaTeX, never executed).

# %%
train, val = ml.load_study_problems(cfg)
probes = val[:cfg.n_probe]
model_path = ml.resolve_model_path(cfg)
tokenizer = ml.load_tokenizer(model_path)
print(f"{len(train)} training and {len(val)} validation problems; model: {model_path}")
print(ml.chat_prompts(tokenizer, [train[0].question])[0] + "…", "\nreference answer:", train[0].answer)

# %% [markdown]
# ## Train the baseline and SetPO
# Same base model, seed, prompts and settings; only λ differs. Generation uses vLLM (colocated with the
# trainer) when a GPU and vLLM are there, `generate` otherwise; with vLLM each run trains in its own
# process, so that one engine's GPU memory is gone before the next starts. The embedder (response text only,
# prompt excluded) runs on the trainer's device. The policy trains in float32 with bf16 autocast on a GPU
# (an update at lr 1e-6 is below bf16's resolution), which fits the 1.5B model on one 80 GB GPU; for 7B use
# verl. A run that stops part-way continues from its last checkpoint when this cell runs again; a finished
# run is loaded, not retrained.

# %%
embedder = load_embedder(cfg.embedder, device="cuda" if CUDA else "cpu")
finals = ml.train_runs(cfg, train, probes, embedder=embedder)
run_dirs = {label: Path(cfg.run_dir) / label.replace("+", "_") for label in finals}

# %% [markdown]
# ## Training curves
# Reward, the mean within-group similarity of the rollouts (lower = more diverse groups) and the number of
# distinct correct responses per group, as logged by `SetPOTrainer` for both runs.

# %%
out = Path(OUT_DIR)
record = mr.figure_record(cfg)
NOTE = " · tiny random model: numbers mean nothing" if TINY else ""
fig = mr.training_figure(run_dirs, title=f"{ALGO.upper()} vs SetPO+{ALGO.upper()} during training{NOTE}")
html, png = save_figure(fig, out / "qwen_math_training", record)
show(fig, png)

# %% [markdown]
# ## Pass@1 as avg@k
# k samples per validation problem at T = 0.5, top-p 0.9; Pass@1 is the mean fraction correct (the
# paper's avg@64). With several validation sources (e.g. GSM8K and MATH500) the table splits by source.
#
# **Judged diversity** (with `JUDGE_URL` and `JUDGE_MODEL`, or `JUDGE_PATH`): the paper's LLM-based
# diversity score. A judge model reads each validation problem with the first 8 of the responses each run
# sampled for it and rates how many genuinely different approaches they take, 1-10 (`setpo.judge`, prompt
# version in the note under the table); the column is the mean over problems with its 95% interval, and the
# sets the judge gave no valid score are counted as missing, never filled in. Verdicts are cached in `RUN_DIR`,
# so a rerun asks again only what is missing. Without a judge the table is as it always was; no judged result
# is shown on the CPU (no capable judge model can be had offline).

# %%
results = ml.evaluate_runs(cfg, finals, val)  # with a judge, each run's responses are kept for it
judged = ml.judge_runs(cfg, finals, val) if judging.judge_configured(cfg) else None
table = mr.results_table(results, cfg.eval_k, note="Tiny random model: these numbers mean nothing." if TINY else "",
                         judged=judged)
show_table(table)
save_table(table, out / "qwen_math_results", mr.results_record(record, results, judged))

# %% [markdown]
# ## Pass@k at large budgets, against the base model
# RL with a 0/1 reward tends to sharpen what the base model already does: pass@1 rises while pass@k at large
# k can fall *below* the base model's, because the policy stops producing the rarer solutions. The paper
# reports that on AIME24 SetPO stays above the base model even at large sampling budgets. Here each of the
# three models (the base model, the baseline, SetPO) draws n = `PASSK_MAX` (256) samples per problem of an
# AIME-style file (`PASSK_FILE`; 30 problems for AIME24) at T = 0.5, top-p 0.9, and pass@k is the unbiased
# estimator (Chen et al. 2021) at every k ≤ n from those samples. The tiny CPU demo runs the same code on
# generated problems with a small n.

# %%
passk_problems = ml.load_passk_problems(cfg)
passk = ml.evaluate_pass_at_k(cfg, {"base model": model_path, **finals}, passk_problems, cache_dir=cfg.run_dir)
passk_fig = mr.pass_at_k_figure(passk, title=f"Base model vs {ALGO.upper()} vs SetPO+{ALGO.upper()}{NOTE}")
html, png = save_figure(passk_fig, out / "qwen_math_pass_at_k",
                        {**record, "pass_at_k": {k: r["pass_at_k"] for k, r in passk.items()}})
show(passk_fig, png)
show_table(mr.pass_at_k_table(passk))

# %% [markdown]
# ## Where the responses go
# The responses sampled for the same few validation prompts at successive training steps, embedded with
# the SetPO embedder and projected together (UMAP by default). Colour is the step; each marker shape is one
# prompt; filled markers are correct. Hover over a point to read the response. A collapsing policy's
# responses to a prompt shrink to one spot; SetPO's should stay spread over several.

# %%
probes_by_run = {label: mr.read_probes(d / "probes.jsonl") for label, d in run_dirs.items()}
traj, traj_data = mr.trajectory_figure(probes_by_run, embedder, method=PROJECTION, seed=cfg.seed, title_note=NOTE)
html, png = save_figure(traj, out / "qwen_math_trajectories", {**record, "projection": PROJECTION})
show(traj, png)
