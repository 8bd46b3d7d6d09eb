# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 · Countdown on a laptop: GRPO vs SetPO+GRPO, pass@k and distinct solutions
#
# The SetPO paper's Countdown study trains Qwen2.5-3B with GRPO and with SetPO+GRPO (λ = 0.5) and reports
# **pass@k** from 64 samples (k = 1..64, temperature 0.5 and 1.0, top-p 0.9) for group sizes G ∈ {3, 7} and
# KL weights β ∈ {0.001, 0.005}, plus two diversity numbers at T = 1.0: the **diversity width** (problems
# with at least two distinct correct solutions) and the **average modes** (distinct correct solutions per
# solved problem). SetPO's claim: at large k it solves more problems, because it keeps several solutions alive
# where GRPO sharpens onto one.
#
# Here the same study runs at a size two CPU cores finish in one sitting (the run that made the committed
# figures prints its measured time below the first cell and keeps it in `figures/fig3_countdown_results.json`),
# on the engine that trains real models, TRL (`setpo.trl.SetPOTrainer`, a `GRPOTrainer` that adds λ·s_i after TRL's own normalisation):
#
# - a ~1M-parameter Qwen2-architecture model with an expression-level tokenizer, from scratch;
# - a warm start by supervised fine-tuning on solver solutions, several distinct ones per problem;
# - then GRPO and SetPO+GRPO from that same warm start, for every (G, β), and the GSPO and DAPO presets;
# - evaluation on held-out test problems exactly as in the paper.
#
# All of it is `setpo.studies.countdown`; the study is one command,
# `.venv/bin/python -m setpo.studies.countdown --full --out runs/countdown` (resumable). This notebook runs it (or
# finds it already done) and draws the figures.

# %% tags=["parameters"]
SMOKE = False                  # toy-size study in a temp folder (seconds), to check the notebook runs
OUT_DIR = "../runs/notebooks"  # scratch folder for figures; `make figures` passes ../figures
RUN_DIR = "../runs/countdown"  # the full study's folder (made by the command above, or by this notebook)
PROJECTION = "pca"             # 2-D projection of the embedding trajectories: "pca" or "umap"

# %%
import tempfile
import time
from pathlib import Path

import torch

from setpo.embed import load_embedder
from setpo.studies import countdown_results as cr
from setpo.studies.countdown import CountdownLMConfig, run_study
from setpo.studies.figures import save_figure, show, show_table

torch.set_num_threads(1)
if SMOKE:
    cfg = CountdownLMConfig.smoke(out=tempfile.mkdtemp(prefix="countdown_smoke_"), threads=1)
else:
    cfg = CountdownLMConfig(out=RUN_DIR)
out = Path(cfg.out)
t0 = time.time()
run_study(cfg, log=print)  # instant when the study is already complete; otherwise resumes where it stopped
study_seconds = time.time() - t0
print(f"study: {study_seconds / 60:.1f} min in this session (0 when it was already complete)")
summary = cr.load_summary(out)
record = cr.figure_record(cfg, cr.study_command(cfg, SMOKE), study_seconds_this_session=round(study_seconds))
cfg

# %% [markdown]
# ## The Table 3 analogue and pass@k
# Diversity width and average modes at T = 1.0, then pass@k (in %) for every run, and the difference SetPO
# makes to its own baseline (same preset, G and β; same warm start, seed and prompts).

# %%
table, table_path = cr.write_results(cfg, summary, OUT_DIR, record)
show_table(table)

# %% [markdown]
# ## pass@k curves
# One panel per setting and temperature. Solid: SetPO (one colour per λ); dashed: the baseline (GRPO, or the
# GSPO / DAPO preset without SetPO, named in the legend); dotted grey: the warm start.
# pass@1 is accuracy; pass@64 is "solved by at least one of 64 samples", the number diversity should lift.

# %%
fig = cr.pass_at_k_figure(cfg, summary)
html, png = save_figure(fig, Path(OUT_DIR) / "fig3_countdown_pass_at_k", record)
show(fig, png)

# %% [markdown]
# ## During training
# What the trainer logs every step (`setpo/*` metrics from `SetPOTrainer`, also computed for the GRPO
# baselines): the reward, the number of distinct correct solutions per group of G, and the mean pairwise
# similarity of a group's responses under the embedder (lower is more diverse). Shown for GRPO at the smaller
# β; every run's curves are in `runs/countdown/rl/<run>/log_history.json`.

# %%
shown_runs = [r for r in cfg.runs() if r.preset == "grpo" and r.beta == min(cfg.kl_betas)]
fig = cr.training_figure(cfg, cr.training_curves(out, shown_runs), shown_runs)
html, png = save_figure(fig, Path(OUT_DIR) / "fig3_countdown_training", record)
show(fig, png)

# %% [markdown]
# ## Where the samples go: embedding trajectories
# Every few steps each run samples 16 completions for a few fixed validation problems (`probes.jsonl`). Below,
# those samples for one problem, embedded with the study's embedder and projected to 2-D once for all runs
# and steps, so panels share coordinates: GRPO at the largest G and smallest β, where it has the most rollouts
# per group to collapse, against SetPO with the study's largest λ. Colour is the training step, marker size
# the number of identical samples, filled markers are correct and open ones wrong; hover shows the expression.
# A collapsing policy ends as a few large dots.

# %%
fig, frame = cr.trajectory_figure(cfg, load_embedder(cfg.embedder), problem=0, method=PROJECTION)
html, png = save_figure(fig, Path(OUT_DIR) / "fig3_countdown_trajectories", {**record, "projection": PROJECTION})
show(fig, png)

# %% [markdown]
# ## Reading the result
# The pairs table above is the test of the paper's claim at this scale: SetPO+GRPO's pass@k at k ≥ 16
# against GRPO's, its average modes against GRPO's, and pass@1 within a couple of points. The README records
# the numbers of the committed full run and what they do and do not show. Every setting of the study is in
# the run record `fig3_countdown_results.json` beside the figures (and `runs/countdown/config.json`); the splits
# are in `runs/countdown/data.json`; nothing was tuned on the test split.
