"""The figures and tables of notebook 02 (the SetPO marginal explained): points on the unit circle, their
marginals s_i, how s_i moves with a point, and how λ trades diversity against reward.

Every figure is a plotly Figure for ``setpo_lab.studies.figures.save_figure`` (HTML, PNG twin, run record).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

import setpo
from setpo.diversity import marginals_by_definition
from setpo.records import markdown_table
from setpo_lab.studies.figures import line_grid


def on_circle(degrees: Sequence[float]) -> torch.Tensor:
    """(n, 2) float64 unit vectors at the given angles."""
    a = torch.tensor(list(degrees), dtype=torch.float64) * math.pi / 180
    return torch.stack([a.cos(), a.sin()], -1)


def _spread(angles: Sequence[float], min_gap: float) -> list[float]:
    """Label angles at least ``min_gap`` degrees apart, each as close to its point's angle as that allows."""
    order = np.argsort(angles)
    placed = np.asarray(angles, dtype=float)[order].copy()
    for _ in range(50):  # push neighbours apart, then re-centre each crowded run on its points
        moved = False
        for i in range(1, len(placed)):
            if placed[i] - placed[i - 1] < min_gap - 1e-9:
                mid = (placed[i] + placed[i - 1]) / 2
                placed[i - 1], placed[i] = mid - min_gap / 2, mid + min_gap / 2
                moved = True
        if not moved:
            break
    out = np.empty_like(placed)
    out[order] = placed
    return out.tolist()


def colour_range(cluster: Sequence[float], angles: Sequence[float]) -> float:
    """The largest |s_i| of any point while one more point moves over ``angles`` next to ``cluster``: one fixed,
    symmetric colour scale (±this) for every position, so that a colour means the same marginal throughout."""
    return max(float(setpo.diversity_marginals(on_circle(list(cluster) + [a])).abs().max()) for a in angles)


def marginals_on_circle_figure(degrees: Sequence[float], title: str = "", colour_limit: float | None = None):
    """Points on the unit circle coloured by their marginal s_i, each labelled o_i: s_i outside the circle (labels
    fanned out so that close points do not overlap, with a thin leader to their point). colour_limit: the colour
    scale spans ±colour_limit (``colour_range``); by default ±the largest |s_i| of these points."""
    import plotly.graph_objects as go

    e = on_circle(degrees)
    s = setpo.diversity_marginals(e).numpy()
    limit = colour_limit if colour_limit is not None else float(np.abs(s).max()) or 1.0
    xy = e.numpy()
    fig = go.Figure()
    t = np.linspace(0, 2 * np.pi, 200)
    fig.add_trace(go.Scatter(x=np.cos(t), y=np.sin(t), mode="lines", line=dict(color="lightgrey", width=1),
                             hoverinfo="skip", showlegend=False))
    label_at = on_circle(_spread(list(degrees), 13.0)).numpy() * 1.3
    for (x0, y0), (x1, y1) in zip(xy, label_at, strict=True):
        fig.add_trace(go.Scatter(x=[x0, x1 / 1.3 * 1.18], y=[y0, y1 / 1.3 * 1.18], mode="lines", showlegend=False,
                                 line=dict(color="grey", width=0.6), hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=label_at[:, 0], y=label_at[:, 1], mode="text", showlegend=False, hoverinfo="skip",
                             text=[f"o_{i}: {v:+.3f}" for i, v in enumerate(s)], textposition="middle center",
                             textfont=dict(size=11)))
    fig.add_trace(go.Scatter(
        x=xy[:, 0], y=xy[:, 1], mode="markers", showlegend=False,
        marker=dict(size=14, color=s, colorscale="RdBu", cmin=-limit, cmax=limit, showscale=True,
                    colorbar=dict(title="s_i")),
        hovertext=[f"o_{i}: {d}°, s = {v:+.4f}" for i, (d, v) in enumerate(zip(degrees, s, strict=True))],
        hoverinfo="text"))
    fig.update_layout(title=title or f"Marginals s_i of five rollouts; D(Ω) = {setpo.set_diversity(e):.4f}",
                      width=600, height=560, template="plotly_white",
                      xaxis=dict(range=[-1.6, 1.6], title_text="e_i[0]"),
                      yaxis=dict(range=[-1.6, 1.6], scaleanchor="x", title_text="e_i[1]"))
    return fig


def marginal_vs_angle_figure(cluster: Sequence[float], angles: Sequence[float]):
    """s of a point moved from 0° to the largest angle, next to a fixed cluster (the last point's marginal)."""
    curve = [float(setpo.diversity_marginals(on_circle(list(cluster) + [a]))[-1]) for a in angles]
    n = len(cluster)
    return line_grid([{"title": "", "lines": [{"x": list(angles), "y": curve, "name": f"s_{n}", "markers": True,
                                               "color": "#1f77b4"}]}], cols=1, x_title=f"angle of o_{n} (degrees)",
                     y_title=f"s_{n}", panel_px=(620, 300),
                     title=f"Marginal of o_{n} as it moves past a cluster at {', '.join(f'{c:g}°' for c in cluster)}")


def lambda_crossings(rewards: Sequence[float], degrees: Sequence[float]) -> dict:
    """Where diversity starts to outweigh correctness as λ grows, from SetPO's own advantages: Â_i = Ā_i + λ s_i
    is a line in λ (Ā_i from ``setpo.group_advantages``, s_i from ``setpo.diversity_marginals``), so each crossing
    is solved exactly.

    Returns {"positive": {"lam", "rollout"}}: the first λ at which a rollout with the lowest reward gets a positive
    advantage (it is reinforced for its diversity alone), and {"overtakes": {"lam", "rollout", "overtaken"}}: the
    first λ at which such a rollout overtakes rollouts with a higher reward (all those it passes at that λ); each
    None when it never happens."""
    r = torch.tensor(list(rewards), dtype=torch.float64)
    base = setpo.group_advantages(r).tolist()
    s = setpo.diversity_marginals(on_circle(degrees)).tolist()
    low = [i for i, v in enumerate(r.tolist()) if v == min(r.tolist())]
    positive = min(((-base[i] / s[i], i) for i in low if base[i] < 0 < s[i]), default=None)
    passes = [((base[j] - base[i]) / (s[i] - s[j]), i, j) for i in low for j in range(len(s))
              if r[j] > r[i] and s[i] > s[j]]
    first = min(passes, default=None)
    return {"positive": positive and {"lam": positive[0], "rollout": positive[1]},
            "overtakes": first and {"lam": first[0], "rollout": first[1],
                                    "overtaken": [j for lam, i, j in passes
                                                  if i == first[1] and abs(lam - first[0]) < 1e-9]}}


def advantage_vs_lambda_figure(rewards: Sequence[float], degrees: Sequence[float], lams: Sequence[float]):
    """Â_i = Ā_i + λ s_i of each rollout against λ. Identical rollouts have identical lines: the first of them is
    drawn wide, the others dashed on top, so every one stays visible."""
    r = torch.tensor(list(rewards), dtype=torch.float64)
    adv = np.stack([setpo.setpo_advantages(r, on_circle(degrees), lam=float(lam)).numpy() for lam in lams])
    colours = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2"]
    keys = [(d, float(v)) for d, v in zip(degrees, r.tolist(), strict=True)]
    lines, first_at = [], {}
    for i, (d, key) in enumerate(zip(degrees, keys, strict=True)):
        dup = key in first_at
        first_at.setdefault(key, i)
        name = f"o_{i} ({d}°, r={int(r[i])})" + (f", same as o_{first_at[key]}" if dup else "")
        style = {"dash": "dash", "width": 2} if dup else {"width": 6 if keys.count(key) > 1 else 2}
        lines.append({"x": list(lams), "y": adv[:, i].tolist(), "name": name, "color": colours[i % len(colours)],
                      **style})
    zero = [{"y": 0.0, "name": "Â = 0", "color": "grey", "dash": "dot"}]
    return line_grid([{"title": "", "lines": lines, "hlines": zero}], cols=1, x_title="λ",
                     y_title="Â_i = Ā_i + λ s_i", panel_px=(620, 340),
                     title=f"Advantages with SetPO as λ grows (rewards {', '.join(f'{v:g}' for v in rewards)})")


def closed_form_table(sizes: Sequence[int], dim: int = 32, seed: int = 0) -> str:
    """Largest |closed form − definition| of s_i on random groups of each size, as markdown."""
    gen = torch.Generator().manual_seed(seed)
    gaps = [_closed_form_gap(torch.randn(g, dim, generator=gen, dtype=torch.float64) + 0.5) for g in sizes]
    return markdown_table([{"G": g, "max abs difference": f"{gap:.1e}"} for g, gap in zip(sizes, gaps, strict=True)])


def _closed_form_gap(e: torch.Tensor) -> float:
    """Largest |closed form − definition| of the marginals s_i of the group ``e``."""
    return float((setpo.diversity_marginals(e) - marginals_by_definition(e)).abs().max())


def marginals_table(degrees: Sequence[float]) -> str:
    """Each rollout's angle and marginal s_i, as markdown."""
    s = setpo.diversity_marginals(on_circle(degrees))
    return markdown_table([{"rollout": f"o_{i}", "angle": f"{a}°", "s_i": f"{v:+.4f}"}
                           for i, (a, v) in enumerate(zip(degrees, s.tolist(), strict=True))])
