"""Figure helpers: 2-D projections, and figures written as interactive HTML plus a static PNG twin.

HTML comes from plotly with ``include_plotlyjs="directory"`` (one shared plotly.min.js beside the figures, so
they open offline and stay small); the PNG twin is drawn with matplotlib, which needs no browser.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def static_figure(**kwargs):
    """A matplotlib Figure drawn without pyplot, so saving PNGs never switches a notebook's backend."""
    from matplotlib.figure import Figure

    return Figure(**kwargs)


def save_static(fig, path: Path, title: str = "", dpi: int = 110, tight: bool = True) -> Path:
    """Give a static figure its title, lay it out and write it as ``path`` (.png); returns the path."""
    if title:
        fig.suptitle(title, fontsize=10)
    if tight:
        fig.tight_layout()
    path = Path(path).with_suffix(".png")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    return path


STAGE_COLOURS = ["#440154", "#3b528b", "#21918c", "#5ec962", "#fde725", "#f89540", "#cc4778"]


def project_2d(x: np.ndarray, method: str = "umap", seed: int = 0) -> np.ndarray:
    """(n, D) -> (n, 2). UMAP (umap-learn) by default; "pca" is the fast, dependency-light fallback."""
    x = np.asarray(x, dtype=np.float64)
    if method == "pca":
        centred = x - x.mean(0)
        _, _, vt = np.linalg.svd(centred, full_matrices=False)
        return centred @ vt[:2].T
    if method == "umap":
        import umap  # imported here: it compiles with numba on first use, which takes a while

        reducer = umap.UMAP(n_components=2, n_neighbors=15, min_dist=0.3, metric="cosine", random_state=seed,
                            n_jobs=1)
        return reducer.fit_transform(x)
    raise ValueError(f"unknown projection {method!r}; use 'umap' or 'pca'")


def save_plotly(fig, path: Path) -> Path:
    """Write ``fig`` to ``path`` (.html) with the shared plotly.min.js beside it."""
    path = Path(path).with_suffix(".html")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.write_html(str(path), include_plotlyjs="directory", full_html=True)
    return path


def plotly_to_png(fig, path: Path, dpi: int = 110) -> Path:
    """Static PNG twin of a plotly figure made of scatter/line traces, drawn with matplotlib.

    Each subplot's axes are placed from the layout's axis domains, so subplot grids keep their shape. Meant
    for this package's own figures (scatter, lines, markers with text); not a general plotly renderer.
    """
    layout = fig.layout
    width, height = (layout.width or 700) / 100, (layout.height or 450) / 100
    out = static_figure(figsize=(width, height))
    axes = {}

    def axis_for(xref: str, yref: str):
        key = (xref, yref)
        if key not in axes:
            xa = layout[f"xaxis{xref[1:]}"] if xref != "x" else layout.xaxis
            ya = layout[f"yaxis{yref[1:]}"] if yref != "y" else layout.yaxis
            (x0, x1), (y0, y1) = xa.domain or (0, 1), ya.domain or (0, 1)
            ax = out.add_axes([0.08 + 0.84 * x0, 0.1 + 0.78 * y0, 0.84 * (x1 - x0), 0.78 * (y1 - y0)])
            ax.plotly_title_anchor = ((x0 + x1) / 2, y1)  # where make_subplots puts this panel's title
            ax.set_xlabel(xa.title.text or "")
            ax.set_ylabel(ya.title.text or "")
            if xa.range:
                ax.set_xlim(xa.range)
            if ya.range:
                ax.set_ylim(ya.range)
            axes[key] = ax
        return axes[key]

    for trace in fig.data:
        if trace.type not in ("scatter", "scattergl"):
            continue
        ax = axis_for(trace.xaxis or "x", trace.yaxis or "y")
        x, y, mode = np.asarray(trace.x, dtype=float), np.asarray(trace.y, dtype=float), trace.mode or "lines"
        label = trace.name if trace.showlegend is not False else None
        if "lines" in mode:
            ax.plot(x, y, color=trace.line.color, label=label)
            label = None
        if "markers" in mode:
            colour = trace.marker.color
            numeric = colour is not None and not isinstance(colour, str) and np.issubdtype(np.asarray(colour).dtype, np.number)
            size = np.asarray(trace.marker.size if trace.marker.size is not None else 6, dtype=float)
            ax.scatter(x, y, s=size ** 2 / 2, c=colour if colour is not None else None,
                       cmap="RdBu" if numeric else None, alpha=trace.marker.opacity or 1.0, label=label,
                       edgecolors="none")
        if "text" in mode and trace.text is not None:
            for xi, yi, t in zip(x, y, trace.text):
                ax.annotate(str(t), (xi, yi), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
    for ax in axes.values():
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    for note in layout.annotations or []:  # subplot titles: give each to the panel it sits above
        if note.text and axes:
            ax = min(axes.values(), key=lambda a: abs(a.plotly_title_anchor[0] - note.x) + abs(a.plotly_title_anchor[1] - note.y))
            ax.set_title(note.text, fontsize=9)
    title = layout.title.text if layout.title and layout.title.text else ""
    return save_static(out, path, title, dpi=dpi, tight=False)  # axes were placed by hand from the domains


def save_figure(fig, path: Path) -> tuple[Path, Path]:
    """Write a plotly figure as interactive HTML and its static PNG twin; returns (html, png)."""
    return save_plotly(fig, path), plotly_to_png(fig, path)


def toy_trajectory_figure(runs: dict, method: str = "umap", seed: int = 0, prompt: int = 0):
    """Figure 1: sampled trajectory embeddings over training, one panel per run, stars at correct modes.

    runs: {label: ToyRun} trained on the same world. The projection is fitted once on the embeddings of every
    possible trajectory for ``prompt`` (the grey background), so panels and stages share coordinates; a sample
    is drawn at its trajectory's point plus a little jitter, so that density shows. A star sits at the mean
    position of its mode's trajectories. Returns (plotly figure, data for the static twin).
    """
    import plotly.graph_objects as go
    import torch
    from plotly.subplots import make_subplots

    from envs.bandit import MultiModalBandit

    world = MultiModalBandit(next(iter(runs.values())).config.bandit)
    c = world.config
    grid = torch.cartesian_prod(*[torch.arange(c.vocab_size)] * c.traj_len).reshape(-1, c.traj_len)
    grid_prompts = torch.full((len(grid),), prompt)
    grid_modes = world.modes(grid_prompts, grid).numpy()
    xy_all = project_2d(world.embeddings(grid_prompts, grid).numpy(), method=method, seed=seed)
    stars = np.stack([xy_all[grid_modes == m].mean(0) for m in range(c.num_modes)])
    correct = set(world.correct_modes)
    jitter_scale = 0.015 * np.ptp(xy_all, axis=0)
    rng = np.random.default_rng(seed)

    labels = list(runs)
    fig = make_subplots(rows=1, cols=len(labels), subplot_titles=labels, shared_xaxes=True, shared_yaxes=True)
    steps = sorted({snap["step"] for run in runs.values() for snap in run.snapshots})
    rows = []
    for col, label in enumerate(labels, start=1):
        fig.add_trace(go.Scatter(x=xy_all[:, 0], y=xy_all[:, 1], mode="markers", name="all trajectories",
                                 legendgroup="all", showlegend=col == 1, hoverinfo="skip",
                                 marker=dict(size=4, color="lightgrey")), row=1, col=col)
        for si, snap in enumerate(runs[label].snapshots):
            keep = snap["prompts"] == prompt
            tokens, modes = snap["tokens"][keep], snap["modes"][keep].numpy()
            pts = xy_all[world.sequence_id(tokens).numpy()] + rng.normal(size=(len(tokens), 2)) * jitter_scale
            colour = STAGE_COLOURS[steps.index(snap["step"]) % len(STAGE_COLOURS)]
            fig.add_trace(go.Scatter(
                x=pts[:, 0], y=pts[:, 1], mode="markers", name=f"step {snap['step']}", legendgroup=f"s{snap['step']}",
                showlegend=col == 1, marker=dict(size=5, color=colour, opacity=0.6),
                text=[f"{label}<br>step {snap['step']}<br>mode {m}{' (correct)' if m in correct else ''}"
                      f"<br>tokens {' '.join(map(str, t.tolist()))}" for m, t in zip(modes, tokens)],
                hoverinfo="text"), row=1, col=col)
            rows += [(label, snap["step"], colour, x, y) for x, y in pts]
        fig.add_trace(go.Scatter(
            x=stars[:, 0], y=stars[:, 1], mode="markers+text", name="mode centres",
            legendgroup="centres", showlegend=col == 1, text=[str(m) for m in range(c.num_modes)],
            textposition="top center",
            marker=dict(symbol=["star" if m in correct else "x" for m in range(c.num_modes)], size=16,
                        color=["gold" if m in correct else "grey" for m in range(c.num_modes)],
                        line=dict(width=1, color="black")),
            hovertext=[f"mode {m} ({'correct' if m in correct else 'wrong'})" for m in range(c.num_modes)],
            hoverinfo="text"), row=1, col=col)
    fig.update_layout(title=f"Sampled trajectory embeddings over training ({method.upper()}); stars: correct modes",
                      height=480, width=460 * len(labels) + 120, template="plotly_white")
    return fig, {"rows": rows, "stars": stars, "correct": correct, "labels": labels, "steps": steps,
                 "background": xy_all}


def toy_trajectory_png(data: dict, mode_curves: dict, path: Path) -> Path:
    """Static twin of Figure 1 (matplotlib): the projection panels, then mode mass over training per run."""
    labels = data["labels"]
    fig = static_figure(figsize=(5.2 * len(labels), 9))
    axes = fig.subplots(2, len(labels), squeeze=False)
    for col, label in enumerate(labels):
        ax = axes[0, col]
        ax.scatter(data["background"][:, 0], data["background"][:, 1], s=5, color="lightgrey")
        for si, step in enumerate(data["steps"]):
            r = [row for row in data["rows"] if row[0] == label and row[1] == step]
            ax.scatter([x[3] for x in r], [x[4] for x in r], s=7, alpha=0.55, color=r[0][2] if r else None,
                       label=f"step {step}")
        for m, (x, y) in enumerate(data["stars"]):
            ok = m in data["correct"]
            if ok:
                ax.scatter([x], [y], marker="*", s=260, color="gold", edgecolors="black", linewidths=0.8, zorder=5)
            else:
                ax.scatter([x], [y], marker="x", s=60, color="grey", zorder=5)
        ax.set_title(label)
        ax.set_xticks([])
        ax.set_yticks([])
        if col == 0:
            ax.legend(loc="best", fontsize=7, markerscale=2)
        ax = axes[1, col]
        steps, masses = mode_curves[label]
        masses = np.asarray(masses)
        for m in sorted(data["correct"]):
            ax.plot(steps, masses[:, m], label=f"correct mode {m}")
        ax.plot(steps, masses[:, len(data["correct"]):].sum(1), "k--", label="wrong modes")
        ax.axhline(0.05, color="grey", lw=0.7, ls=":")
        ax.set_ylim(0, 1)
        ax.set_xlabel("training step")
        ax.set_ylabel("policy mass")
        if col == 0:
            ax.legend(fontsize=7)
    return save_static(fig, path)
