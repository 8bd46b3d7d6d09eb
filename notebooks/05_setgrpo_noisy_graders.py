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
# # 05 · SetGRPO: GRPO on two noisy graders, calibrated
#
# In rubric-graded RL two graders score every response. GRPO normalises the rewards of each group jointly, so
# when the graders slip, or fill an underspecified rubric with their own taste, the coefficients of the whole
# group move. SetGRPO (Huang et al., 2026) wraps GRPO's coefficients in three modules: (a) a calibrated joint
# set for the coefficients, (b) a recovery that keeps the update safe in the policy's own gradient geometry,
# and (c) a gate whose threshold is chosen so that the updates it lets through rarely reverse direction.
#
# **What is ours.** Only SetGRPO's abstract and figure captions are public; they give no formula. Every
# formula below is this package's design (`setpo.setgrpo`, whose docstring has the details), built on public
# methods: split conformal prediction (Vovk et al. 2005; Lei et al. 2018) for (a), Learn-then-Test
# (Angelopoulos et al. 2021) with fixed-sequence testing and binomial / Hoeffding–Bentkus p-values (Bates
# et al. 2021) for (c). The toy world is ours too (`setpo.envs.rubric`, trained on by `setpo_lab.studies.rubric`).
#
# **The design in four lines** (per group of G responses, two graders A and B):
#
# * (a) $\hat a = (a^A + a^B)/2$ from per-grader GRPO advantages, $\hat\sigma_i$ = the graders' disagreement
#   (floored); on held-out re-graded groups, $\hat q$ = the split-conformal quantile of
#   $\max_i |a^*_i - \hat a_i|/\hat\sigma_i$, so the box $\hat a \pm \hat q\hat\sigma$ holds the reference
#   coefficients $a^*$ with probability $\ge 1-\alpha$.
# * (b) With $K_{ij} = \langle g_i, g_j\rangle$ (gradient features), the box inflated by $\tau$,
#   anchor $c_0$ = its point nearest 0, path $c(\eta) = c_0 + \eta(\hat a - c_0)$ and worst-case agreement
#   $m_\tau(\eta) = \min_{a\in C(\tau)} a^\top K c(\eta)$ (concave), $\eta^*$ = the largest $\eta\in[0,1]$ with
#   $m_\tau \ge 0$. $\tau = 1$ is the calibrated box; $\tau = 0$ is plain GRPO on the two graders.
# * (c) A group passes the gate at $\tau$ when such a non-zero update exists ($\rho \ge \tau$);
#   $\tau$ is chosen strictest-first by fixed-sequence testing so that the direction-reversal rate among
#   accepted groups is $\le \beta$ with probability $\ge 1-\delta$. Rejected groups contribute nothing.
#   Everything is recalibrated every K steps as the policy drifts.
#
# **The toy** (`setpo.envs.rubric`, trained on by `setpo_lab.studies.rubric`): 64 prompts × 16 candidate responses, latent quality $q$, a linear softmax
# policy whose per-response gradient features are exact. Graders add noise and occasional slips (fresh on
# every call) and, on half of the prompts whose rubric is "ambiguous", their own taste (the same on every
# call, different between the two graders). Re-grading averages noise and slips away, not taste; only the
# graders' *disagreement* shows it.

# %% tags=["parameters"]
SMOKE = False           # one seed, few steps, small studies: checks the notebook runs (used by the tests)
OUT_DIR = "../runs/notebooks"  # scratch folder for figures; `make figures` passes ../figures
SEEDS = 5
STEPS = 200

# %%
from pathlib import Path

import torch

from setpo.envs.rubric import RubricToyConfig
from setpo_lab.studies import rubric_results as rr
from setpo_lab.studies.figures import run_record, save_figure, save_table, show, show_table
from setpo_lab.studies.rubric import TrainConfig, compare_methods, coverage_study, format_table, invariance_table, risk_study

torch.set_num_threads(1)
if SMOKE:
    SEEDS, STEPS = 1, 60
out = Path(OUT_DIR)
task_config, train_config = RubricToyConfig(), TrainConfig(steps=STEPS)
record = run_record("notebooks/05_setgrpo_noisy_graders (python -m setpo_lab.cli figures 05_setgrpo_noisy_graders)",
                    config={"task": task_config, "train": train_config}, seeds=range(SEEDS))
train_config

# %% [markdown]
# ## The graders
# On clear prompts the two graders agree up to noise and rare slips; on ambiguous prompts each adds its own
# taste. The table shows the mean gap between the graders and between a grader and the latent quality.

# %%
show_table(rr.graders_table(task_config, seed=0))

# %% [markdown]
# ## GRPO vs SetGRPO on the same graders
# Three runs per seed, same world and first batch: GRPO on the mean of the two graders' scores; GRPO with at
# least SetGRPO's grader budget (each response graded several times per grader, averaged); and SetGRPO
# (recalibrated every 50 steps on 512 fresh groups, each re-graded once per grader for the reference).

# %%
rows = compare_methods(range(SEEDS), task_config, train_config, verbose=False, keep_history=True)
show_table(format_table(rows))

# %% [markdown]
# ## Training dynamics (the paper's Figures 3 and 5 in miniature)
# True-quality reward over training (exact expectation, not a grader's score), SetGRPO's accepted-group
# ratio and mean recovery ratio η* over accepted groups, and the RMS coefficient per step. Lines are means
# over seeds, bands one standard error.

# %%
fig = rr.setgrpo_training_figure(rows, smooth=1 if SMOKE else 9)
html, png = save_figure(fig, out / "05_setgrpo_training", record)
show(fig, png)

# %% [markdown]
# Reading the curves: GRPO learns the graders' taste on ambiguous prompts along with the quality on clear
# ones, and since the policy is shared, the taste costs quality everywhere; averaging more gradings does not
# help, because re-grading reproduces taste. SetGRPO's box is wide where the graders disagree, so those groups
# fail the gate more often, and the policy follows the clear prompts. The accepted ratio falls as training
# goes on: groups hold fewer distinct responses, closer in quality, so more of them could reverse; where no
# threshold can be certified at a recalibration, SetGRPO pauses (accepts nothing) until the next one. Its
# coefficient norm is lower because rejected groups contribute zero, and it stays bounded (Figure 5's point).
# The mean recovery ratio stays near 1: in this toy a group that passes the gate can usually keep its whole
# centre â, and partial recovery (0 < η* < 1) is the exception.

# %% [markdown]
# ## Coverage and risk (the paper's Figure 9 in miniature)
# Left: the joint box's empirical coverage over many independent calibrations (39 calibration groups each)
# against the target 1 − α and the finite-sample ceiling 1 − α + 1/(n+1). Right: on fresh groups from a
# partly trained policy, the direction-reversal rate of plain two-grader GRPO, of the groups SetGRPO
# accepts, and of those it rejects (what their centre would have done), against β.

# %%
cov = coverage_study(trials=60 if SMOKE else 400)
risks = [risk_study(seed=s, theta_scale=4.0, n_fresh=500 if SMOKE else 2000) for s in range(1 if SMOKE else 3)]
fig = rr.coverage_risk_figure(cov, risks)
html, png = save_figure(fig, out / "05_setgrpo_coverage_risk", {**record, "risk_seeds": list(range(len(risks)))})
show(fig, png)

# %% [markdown]
# ## Positive-affine invariance (the paper's Table 7)
# Scores r and a·r + b (a > 0) on the same responses, calibration included: GRPO advantages are invariant,
# so SetGRPO's box, gate and recovery are too (up to the ε in std + ε).

# %%
table = rr.invariance_markdown(invariance_table())
show_table(table)
_ = save_table(table, out / "05_setgrpo_invariance", record)

# %% [markdown]
# ## On a language model
# The same estimator runs inside TRL: `setpo.trl.SetGRPOTrainer` is TRL's `GRPOTrainer` with two reward
# functions acting as the graders. Each generation batch costs one extra no-grad forward pass for the
# per-response gradient features (`lm_head_gradient_features`: the output layer's gradient of the
# length-normalised log-probability, randomly projected), and calibration batches are re-graded by calling the
# reward functions again. Until the first calibration completes it keeps TRL's own advantages.
#
# ```python
# from trl import GRPOConfig
# from setpo.setgrpo import SetGRPOConfig
# from setpo.trl import SetGRPOTrainer
#
# trainer = SetGRPOTrainer(model=model, reward_funcs=[judge_a, judge_b], args=GRPOConfig(...),
#                          train_dataset=dataset, processing_class=tokenizer,
#                          setgrpo=SetGRPOConfig(recalibrate_every=50), calibration_groups=512,
#                          n_regrades=1, feature_dims=(16, 16))
# trainer.train()
# ```

# %% [markdown]
# ## What this toy does and does not show
# * The gain comes from grader *disagreement*: SetGRPO's box is wide where the graders' tastes differ, and
#   the risk gate turns that into fewer updates from those groups. With taste switched off
#   (`RubricToyConfig(ambiguous_fraction=0)`, only noise and slips), re-grading already removes what SetGRPO
#   could detect and SetGRPO ends slightly *below* GRPO in this toy (it skips groups GRPO learns from).
# * The guarantees are relative to the reference. The default reference, the mean of re-gradings by the same
#   graders, carries their shared biases; `TrainConfig(reference="expert")` plugs in a careful third grader
#   on the calibration groups.
# * The risk test needs data: with β = 0.08 and δ = 0.1 at least ⌈log δ / log(1 − β)⌉ = 28 accepted
#   calibration groups without a single reversal, more with any. SetGRPO's calibration costs grader calls
#   (counted in the table above), which is why the budget-matched GRPO run is there.
