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
# # 03 · Countdown on a laptop: GRPO vs SetPO+GRPO, pass@k and distinct solutions
#
# The SetPO paper's Countdown study trains Qwen2.5-3B with GRPO and with SetPO+GRPO (λ = 0.5) and reports
# **pass@k** from 64 samples (k = 1..64, temperature 0.5 and 1.0, top-p 0.9) for group sizes G ∈ {3, 7} and
# KL weights β ∈ {0.001, 0.005}, plus two diversity numbers at T = 1.0: the **diversity width** (problems
# with at least two distinct correct solutions) and the **average modes** (distinct correct solutions per
# solved problem). SetPO's claim: at large k it solves more problems, because it keeps several solutions alive
# where GRPO sharpens onto one.
#
# Here the same study runs at a size two CPU cores finish (the run that made the committed figures keeps its
# measured time per stage in `figures/fig3_countdown_results.json`), on the engine that trains real models, TRL
# (`setpo.trl.SetPOTrainer`, a `GRPOTrainer` that adds λ·s_i after TRL's own normalisation):
#
# - a ~1M-parameter Qwen2-architecture model with an expression-level tokenizer, from scratch;
# - a warm start by supervised fine-tuning on solver solutions, several distinct ones per problem;
# - first, *choosing an embedder*: how well each candidate tells two solutions apart (below);
# - validation searches, on the validation split over two seeds of their own (never a seed the test split reports):
#   SetPO's embedder and λ, and each baseline's own
#   setting — the local pairwise penalty SetPO argues against, DRA-GRPO's reward rescaling (the closest prior
#   art: rewards divided by 1 + the similarity to the rest of the group) and Pass@k Training's group advantage
#   (the other way to keep solutions alive);
# - a *perfect-kernel ceiling*: SetPO with the verifier's kernel (1 for the same solution, else 0), which says
#   how much the embedders leave on the table;
# - then, in the paper's main cell (G = 7, β = 0.001), all of them over 5 paired seeds from the same warm start
#   (GRPO and the chosen SetPO+GRPO over 12: the first 5's noise said how many the headline needs),
#   and the paper's grid (G ∈ {3, 7} × β ∈ {0.001, 0.005}, T ∈ {0.5, 1.0}) for GRPO and the chosen SetPO+GRPO;
# - evaluation on held-out test problems exactly as in the paper, once, at the end;
# - and the whole study again at another thread count, the replication (meant as another floating-point path,
#   like another seed; on the pinned kernels at this size it turned out to change no bit, see below).
#
# Every run records its identity (threads, the code it ran, package versions), and a run made at another is
# never reused. All of it is `setpo_lab.studies.countdown`; the study is one command, `make countdown` (resumable), which
# runs `python -m setpo_lab.studies.countdown --full --set 'headline_seeds=[5,...,11]' --out results/countdown` on the
# pinned floating-point path (`setpo_lab.repro.arithmetic`: torch, MKL and oneDNN kept to their AVX2 kernels, so that parts
# of the study made on an AVX2 machine and on an AVX-512 one are one experiment). This notebook draws it from its
# record once it has finished (or resumes it where that command left it, at the settings the folder records); it
# runs on that path too (`make lab`, `make figures`).

# %% tags=["parameters"]
SMOKE = False                  # toy-size study in a temp folder, to check the notebook runs
OUT_DIR = "../runs/notebooks"  # scratch folder for figures; `make figures` passes ../figures
RUN_DIR = "../results/countdown"  # the full study's folder, started by the command above
PROJECTION = "pca"             # 2-D projection of the embedding trajectories: "pca" or "umap"

# %%
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from setpo_lab.repro.arithmetic import require_pinned
from setpo_lab.studies import countdown_results as cr
from setpo_lab.studies.countdown import CountdownLMConfig, load_config, resolve_embedder, run_study
from setpo_lab.studies.countdown_data import warm_start_texts
from setpo_lab.studies.figures import save_figure, show, show_table

torch.set_num_threads(1)
if SMOKE:
    cfg = CountdownLMConfig.smoke(out=tempfile.mkdtemp(prefix="countdown_smoke_"), threads=1)
else:
    require_pinned("notebook 03's Countdown study")  # its parts were made on the pinned path: resume on it
    if not (Path(RUN_DIR) / "config.json").exists():
        raise FileNotFoundError(f"{RUN_DIR} holds no Countdown study: start it with `make countdown` (hours on 2 "
                                "cores, resumable, docs/studies/countdown.md), then run this notebook")
    cfg = replace(load_config(RUN_DIR), out=RUN_DIR)  # its own settings (make countdown's headline seeds too)
out = Path(cfg.out)
t0 = time.time()
# A finished study is drawn from its record as it stands (so figures can be redrawn after the code has moved on;
# the record names the commit that made it); otherwise the study resumes where it stopped.
summary = None if SMOKE else cr.finished_summary(cfg.out)
if summary is None:
    summary = run_study(cfg, log=print).summary
    study_seconds = time.time() - t0
    print(f"study: {study_seconds / 60:.1f} min of training and evaluation in this session")
else:
    study_seconds = time.time() - t0
    print(f"study: drawn from the finished record in {RUN_DIR} (nothing trained or evaluated in this session; "
          "the time each stage took is in the table below)")
record = cr.figure_record(summary, cr.study_command(str(cfg.out), SMOKE, cfg.headline_seeds), folder=cfg.out,
                          study_seconds_this_session=round(study_seconds))

# %% [markdown]
# ## Choosing an embedder, and the results
# SetPO's credit is only as good as its kernel. The last table below measures each candidate embedder on
# validation problems whose solutions are known: the cosine between two writings of the *same* solution and
# between *different* solutions, how often the kernel ranks a same-solution pair above a different-solution
# pair (AUC; 0.5 = blind), and how big the spread of s is in a collapsed group (4 copies of one solution and 3
# others) — the size of the push SetPO can give where GRPO's advantage is zero.
#
# Above it: the main cell (mean over seeds; ★ = chosen on validation), the paired differences against GRPO of
# the same seed with 95% t-intervals, the chosen SetPO+GRPO against each baseline and the ceiling, the grid, the
# noise of the headline (how much of it is evaluation, how much training, and what more seeds or test problems
# would buy), the replication, the validation searches, and where the time went.

# %%
table, table_path = cr.write_results(summary, OUT_DIR, record)
show_table(table)

# %% [markdown]
# ## pass@k curves
# The main cell at T = 1 with every method (mean over seeds; bands span the seeds), then every cell of the grid at
# T = 0.5 and T = 1 with GRPO and the chosen SetPO+GRPO; dotted grey: the warm start. pass@1 is accuracy; pass@64
# is "solved by at least one of 64 samples", the number diversity should lift.

# %%
fig = cr.grid_pass_at_k_figure(summary)
html, png = save_figure(fig, Path(OUT_DIR) / "fig3_countdown_pass_at_k", record)
show(fig, png)

# %% [markdown]
# ## During training
# What the trainer logs every step (`setpo/*` metrics from `SetPOTrainer`, also for the baselines): the reward,
# the number of distinct correct solutions per group of G, and the mean pairwise similarity of a group's
# responses under each run's embedder (lower is more diverse). The main cell, first seed; every run's curves are
# in `results/countdown/rl/<run>/log_history.json`, with `setpo/flat_group_fraction`, the share of groups whose
# rewards are all equal (where s is the only signal).

# %%
shown_runs = cr.main_cell_runs(summary, seed=cfg.rl_seeds[0])
fig = cr.training_curves_figure(cr.training_curves(out, shown_runs), shown_runs)
html, png = save_figure(fig, Path(OUT_DIR) / "fig3_countdown_training", record)
show(fig, png)

# %% [markdown]
# ## Where the samples go: embedding trajectories
# Every few steps each run samples 16 completions for a few fixed validation problems (`probes.jsonl`). Below,
# those samples for one problem, embedded with the chosen run's embedder and projected to 2-D once for all
# runs and steps, so panels share coordinates: GRPO against the SetPO+GRPO chosen on validation, first seed.
# Colour is the training step, marker size the number of identical samples, filled markers are correct and open
# ones wrong (in a live run and in the HTML twin, hovering a point shows its expression). A collapsing policy
# ends as a few large dots.

# %%
base, chosen = cr.trajectory_runs(summary)
embedder = resolve_embedder(chosen.embedder, warm_start_texts(cfg), {})
fig, frame = cr.trajectory_figure(summary, embedder, runs=(base, chosen), problem=0, method=PROJECTION, out=out)
html, png = save_figure(fig, Path(OUT_DIR) / "fig3_countdown_trajectories", {**record, "projection": PROJECTION})
show(fig, png)

# %% [markdown]
# ## Reading the result
# The paired-differences table is the test of the paper's claim at this scale: the chosen SetPO+GRPO's pass@64
# against GRPO's of the same seed, with an interval that should exclude 0; pass@1 within two points; higher
# average modes and width. "What the record says", at the top of the table, answers each of these by fixed rules
# (`countdown_results.verdict`). For the committed record (`make countdown`: the main study at 2 threads,
# replicated at 1) it says:
#
# - **The headline misses the bar on pass@1.** Chosen SetPO+GRPO (hashed n-grams, λ = 0.15σ) minus GRPO over 12
#   paired seeds: pass@64 +8.0 points [+5.4, +10.7], pass@1 −3.0 [−3.9, −2.0], more than the 2 points allowed.
# - **Width and average modes are the robust part**: +25.7 problems [+22.5, +28.8] with at least two distinct
#   correct solutions, +0.19 [+0.15, +0.22] distinct correct solutions per solved problem; width's interval is
#   above 0 in every cell of the grid.
# - **Over the grid** the mean pass@64 is above GRPO's in all 7 other cells, with the interval above 0 in 4: it
#   spans 0 in three of the four G = 3 cells (3 seeds each; the fourth, β = 0.001 at T = 0.5, is above 0);
#   pass@1 is lower in every cell, by 1.0–4.3 points.
# - **The perfect kernel is no ceiling**: the verifier's kernel gains +4.9 [+0.2, +9.5] pass@64 over GRPO, no
#   more than the hashed n-grams (chosen − ceiling +2.1 [−2.3, +6.5]), and neither gets back to the warm start
#   (0.588 against 0.772): the embedder is not what limits SetPO here.
# - **Against the baselines**: the pairwise penalty reaches the same pass@64 (+0.9 [−0.4, +2.3]) at 1.9 points
#   more pass@1 cost; Pass@k training (k = 4) the same pass@64 (+0.3 [−2.2, +2.7]) with no pass@1 cost;
#   DRA-GRPO collapsed (pass@1 0.021; SetPO +35.2 pass@64).
# - **The replication agrees, bit for bit**: at 1 thread, every model (90) and every evaluation (121) it shares
#   with the 2-thread study is identical. On the pinned kernels at this size the thread count changes nothing,
#   so it shows that the command gives its record again; the 12 seeds carry the variation.
#
# docs/studies/countdown.md has the whole reading. Every row, seed and setting is in `fig3_countdown_results.json` beside the
# figures (and `results/countdown/config.json`, `selection.json`, `diagnostics.json`); nothing was tuned on the
# test split.
