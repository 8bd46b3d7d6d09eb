"""Static PNG twins of plotly figures: subplot grids, per-point marker sizes, titles on the right panels."""

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from setpo.studies.figures import plotly_to_png, project_2d, save_figure


def test_png_twin_of_a_subplot_grid(tmp_path):
    fig = make_subplots(rows=2, cols=2, subplot_titles=["a", "b", "c", "d"])
    for i, (r, c) in enumerate([(1, 1), (1, 2), (2, 1), (2, 2)]):
        fig.add_trace(go.Scatter(x=[0, 1, 2], y=[i, i + 1, i], mode="markers+text", text=["p", "q", "r"],
                                 marker=dict(size=[4, 8, 12], color=[0.1, 0.5, 0.9])), row=r, col=c)
    fig.add_trace(go.Scatter(x=[0, 1], y=[1, 0], mode="lines", name="line"), row=2, col=2)
    html, png = save_figure(fig, tmp_path / "grid")
    assert html.exists() and png.exists() and png.stat().st_size > 1000
    assert (tmp_path / "plotly.min.js").exists()  # shared, so the html opens offline


def test_titles_follow_their_panels(tmp_path, monkeypatch):
    import matplotlib.axes

    seen = {}
    orig = matplotlib.axes.Axes.set_title

    def spy(self, label, *a, **k):
        seen[label] = self.plotly_title_anchor
        return orig(self, label, *a, **k)

    monkeypatch.setattr(matplotlib.axes.Axes, "set_title", spy)
    fig = make_subplots(rows=2, cols=2, subplot_titles=["top-left", "top-right", "bottom-left", "bottom-right"])
    for r in (1, 2):
        for c in (1, 2):
            fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1]), row=r, col=c)
    plotly_to_png(fig, tmp_path / "titles")
    assert seen["top-left"][0] < seen["top-right"][0] and seen["top-left"][1] > seen["bottom-left"][1]
    assert seen["bottom-right"][0] > seen["bottom-left"][0] and seen["bottom-right"][1] < seen["top-right"][1]


def test_pca_projection_keeps_the_main_axis():
    rng = np.random.default_rng(0)
    x = np.outer(rng.normal(size=200), [3.0, 0, 0, 0]) + 0.01 * rng.normal(size=(200, 4))
    xy = project_2d(x, method="pca")
    assert xy.shape == (200, 2)
    assert abs(np.corrcoef(xy[:, 0], x[:, 0])[0, 1]) > 0.99
