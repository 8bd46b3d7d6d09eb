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
# # 02 · The SetPO marginal $s_i$, explained
#
# For a set of rollouts $\Omega = \{o_1,\dots,o_G\}$ with embeddings $e_i$ (SetPO, arXiv 2602.01062):
#
# | | |
# |---|---|
# | kernel | $k(o_i,o_j) = \mathrm{clamp}(\cos(e_i,e_j), 0, 1)$ |
# | local mass | $\hat m(y;S) = \frac{1}{\lvert S\rvert-1}\sum_{z\in S,\,z\neq y} k(y,z)$ |
# | set diversity | $D(S) = \frac{1}{\lvert S\rvert}\sum_{y\in S} g(\hat m(y;S)),\quad g(x) = -\log(1+x)$ |
# | marginal | $s_i = D(\Omega) - D(\Omega\setminus\{o_i\})$ |
#
# The whole estimator is `setpo.diversity.kernel_marginals` (a dozen lines); this notebook pokes at it.
# Points live on the unit circle here, so an angle is all it takes to place one.

# %% tags=["parameters"]
SMOKE = False
OUT_DIR = "../runs/notebooks"  # scratch folder for figures; `make figures` passes ../figures

# %%
from pathlib import Path

import numpy as np

from setpo_lab.studies import explain
from setpo_lab.studies.figures import run_record, save_figure, show, show_table, static_mode

record = run_record("notebooks/02_estimator_explained (make figures)", config={"SMOKE": SMOKE})
out = Path(OUT_DIR)

# %% [markdown]
# ## A crowded cluster and a loner
# Four rollouts within 20° of each other and one at 80°. The loner adds the most diversity and gets the
# only positive marginal; the cluster members share the blame for being redundant, with negative ones.
# (Angles beyond 90° are orthogonal or opposite: the kernel clamps negative cosines to 0, "unrelated".) The colour scale is fixed at ± the largest |s_i| any point reaches while o_4 moves below, so a
# colour means the same marginal in every picture.

# %%
points = [0, 5, 10, 20, 80]
angles = np.linspace(0, 180, 13 if SMOKE else 37)  # where o_4 goes below, every 5°: the curve and the slider
limit = explain.colour_range(points[:4], angles)
fig = explain.marginals_on_circle_figure(points, colour_limit=limit)
show(fig, save_figure(fig, out / "fig2_marginals_on_circle", {**record, "points_degrees": points})[1])

# %% [markdown]
# ## Move a point
# As $o_4$ approaches the cluster from outside, its marginal falls (the paper's
# $\partial s_i/\partial k_{it} < 0$): it is largest, and flat, from 110° on, where the kernel calls it
# unrelated to every member, and falls to about 0 as $o_4$ reaches the cluster. Inside the cluster (0–20°) it
# stays near 0: a step towards one member is a step away from another. In JupyterLab the slider below the
# curve moves the point live over the same angles (it needs a running kernel and ipywidgets).

# %%
sweep = explain.marginal_vs_angle_figure(points[:4], angles)
show(sweep, save_figure(sweep, out / "fig2_marginal_vs_angle", {**record, "cluster_degrees": points[:4]})[1])

try:
    import ipywidgets as widgets
except ImportError:
    widgets = None
if widgets is not None and not static_mode():  # a live slider; a headless run has nobody to move it
    step = round(float(angles[1] - angles[0]))
    widgets.interact(lambda angle: show(explain.marginals_on_circle_figure(points[:4] + [angle], colour_limit=limit)),
                     angle=widgets.IntSlider(value=80, min=round(angles[0]), max=round(angles[-1]), step=step))

# %% [markdown]
# ## Closed form versus the definition
# The definition recomputes $D$ on each of the $G$ reduced sets: $O(G^3)$ per group. The closed form uses
# $R_j = \sum_{z\neq j} k_{jz}$: after removing $o_i$, $o_j$'s mass is $(R_j - k_{ji})/(G-2)$, so every
# reduced set's diversity comes from one $G\times G$ matrix, $O(G^2)$. They agree to rounding:

# %%
show_table(explain.closed_form_table((3, 8, 16) if SMOKE else (3, 8, 16, 64)))

# %% [markdown]
# ## A duplicated rollout
# $o_0$ and $o_1$ are the same response. Each gets a negative marginal, −0.0214 in the table below: dropping
# either copy would raise the set's diversity. That is less than the distinct rollouts at 90° and 135° get,
# but the marginal is no duplicate detector: $o_2$ at 45° is similar to three of the other four (the pair and
# $o_3$, cosine 0.71 each) and, more crowded still, gets the lowest marginal, −0.0707.

# %%
dup = [0, 0, 45, 90, 135]
show_table(explain.marginals_table(dup))

# %% [markdown]
# ## The effect of λ
# SetPO adds $\lambda s_i$ to the base advantage, unscaled. With rewards (1, 1, 0, 1, 0) on the set above,
# GRPO gives the two correct duplicates the same advantage as the distinct correct rollout $o_3$; as λ grows,
# the duplicates fall and $o_3$ stays on top. The wrong, distinct $o_4$ rises, and at a large enough λ
# diversity outweighs correctness: the line under the figure says where (`explain.lambda_crossings` solves
# $\bar A_i + \lambda s_i$ for the crossings). The paper's λ (0.05 to 0.5) is far to the left of both.
# (o_0 and o_1 are the same rollout, so their lines coincide: o_0 is the wide line, o_1 the dashes on it.)

# %%
rewards = [1.0, 1.0, 0.0, 1.0, 0.0]
crossings = explain.lambda_crossings(rewards, dup)
lams = np.linspace(0, 20, 5 if SMOKE else 41)
lam_fig = explain.advantage_vs_lambda_figure(rewards, dup, lams)
show(lam_fig, save_figure(lam_fig, out / "fig2_advantage_vs_lambda", {**record, "points_degrees": dup})[1])
pos, over = crossings["positive"], crossings["overtakes"]
print(f"o_{pos['rollout']} (wrong) gets a positive advantage from λ = {pos['lam']:.2f} on, and overtakes the "
      f"correct {' and '.join(f'o_{j}' for j in over['overtaken'])} at λ = {over['lam']:.2f}.")
