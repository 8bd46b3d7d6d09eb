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
OUT_DIR = "../figures"

# %%
import math

import numpy as np
import plotly.graph_objects as go
import torch
from IPython.display import Markdown, display

import setpo
from setpo.diversity import marginals_by_definition
from setpo.studies.figures import save_figure
from setpo.records import markdown_table


def on_circle(degrees):
    a = torch.tensor(degrees, dtype=torch.float64) * math.pi / 180
    return torch.stack([a.cos(), a.sin()], -1)


def marginal_plot(degrees, title=""):
    e = on_circle(degrees)
    s = setpo.diversity_marginals(e).numpy()
    xy = e.numpy()
    fig = go.Figure(go.Scatter(
        x=xy[:, 0], y=xy[:, 1], mode="markers+text", text=[f"{v:+.3f}" for v in s], textposition="top center",
        marker=dict(size=14, color=s, colorscale="RdBu", cmid=0, showscale=True, colorbar=dict(title="s_i")),
        hovertext=[f"o_{i}: {d}°, s = {v:+.4f}" for i, (d, v) in enumerate(zip(degrees, s))], hoverinfo="text"))
    fig.update_layout(title=title or f"D(Ω) = {setpo.set_diversity(e):.4f}", width=520, height=500,
                      xaxis=dict(range=[-1.4, 1.4]), yaxis=dict(range=[-1.4, 1.4], scaleanchor="x"),
                      template="plotly_white")
    return fig


# %% [markdown]
# ## A crowded cluster and a loner
# Four rollouts within 20° of each other and one at 80°. The loner adds the most diversity and gets the
# largest marginal; the cluster members share the blame for being redundant. (Angles beyond 90° are
# orthogonal or opposite: the kernel clamps negative cosines to 0, "unrelated".)

# %%
points = [0, 5, 10, 20, 80]
fig = marginal_plot(points)
fig.show()
save_figure(fig, f"{OUT_DIR}/fig2_marginals_on_circle")

# %% [markdown]
# ## Move a point
# Drag the slider: as $o_4$ approaches the cluster its marginal falls (the paper's $\partial s_i/\partial k_{it} < 0$).
# Without a live kernel (e.g. when run headless) the cell below draws the same curve as a static sweep.

# %%
angles = np.linspace(0, 120, 9 if SMOKE else 61)
curve = [float(setpo.diversity_marginals(on_circle(points[:4] + [a]))[-1]) for a in angles]
sweep = go.Figure(go.Scatter(x=angles, y=curve, mode="lines+markers"))
sweep.update_layout(xaxis_title="angle of o_4 (degrees)", yaxis_title="s_4", height=320, template="plotly_white")
sweep.show()
save_figure(sweep, f"{OUT_DIR}/fig2_marginal_vs_angle")

try:
    import ipywidgets as widgets

    widgets.interact(lambda angle: marginal_plot(points[:4] + [angle]).show(),
                     angle=widgets.IntSlider(value=80, min=0, max=180, step=5))
except ImportError:
    pass

# %% [markdown]
# ## Closed form versus the definition
# The definition recomputes $D$ on each of the $G$ reduced sets: $O(G^3)$ per group. The closed form uses
# $R_j = \sum_{z\neq j} k_{jz}$: after removing $o_i$, $o_j$'s mass is $(R_j - k_{ji})/(G-2)$, so every
# reduced set's diversity comes from one $G\times G$ matrix, $O(G^2)$. They agree to rounding:

# %%
gen = torch.Generator().manual_seed(0)
rows = []
for G in (3, 8, 16) if SMOKE else (3, 8, 16, 64):
    e = torch.randn(G, 32, generator=gen, dtype=torch.float64) + 0.5
    gap = float((setpo.diversity_marginals(e) - marginals_by_definition(e)).abs().max())
    rows.append({"G": G, "max abs difference": f"{gap:.1e}"})
display(Markdown(markdown_table(rows)))

# %% [markdown]
# ## A duplicated rollout
# Two identical responses split the credit for their region and each gets less than a distinct response
# would; the set's diversity barely changes when one of them is dropped.

# %%
dup = [0, 0, 45, 90, 135]
s = setpo.diversity_marginals(on_circle(dup))
display(Markdown(markdown_table([{"rollout": f"o_{i}", "angle": f"{a}°", "s_i": f"{v:+.4f}"}
                                 for i, (a, v) in enumerate(zip(dup, s.tolist()))])))

# %% [markdown]
# ## The effect of λ
# SetPO adds $\lambda s_i$ to the base advantage, unscaled. With rewards (1, 1, 0, 1, 0) on the set above,
# GRPO gives the two correct duplicates the same advantage as the distinct correct rollout; as λ grows, the
# distinct one pulls ahead, and at large λ diversity can outweigh correctness, which is why λ stays small.

# %%
rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0], dtype=torch.float64)
lam_fig = go.Figure()
lams = np.linspace(0, 2, 5 if SMOKE else 41)
adv = np.stack([setpo.setpo_advantages(rewards, on_circle(dup), lam=float(l)).numpy() for l in lams])
for i in range(len(dup)):
    lam_fig.add_trace(go.Scatter(x=lams, y=adv[:, i], name=f"o_{i} ({dup[i]}°, r={int(rewards[i])})"))
lam_fig.update_layout(xaxis_title="λ", yaxis_title="Â_i = Ā_i + λ s_i", height=360, template="plotly_white")
lam_fig.show()
save_figure(lam_fig, f"{OUT_DIR}/fig2_advantage_vs_lambda")
