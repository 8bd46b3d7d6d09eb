"""Static PNG twins of this package's plotly figures, drawn with matplotlib (no browser, unlike kaleido).

``plotly_to_png(fig, path)`` reads the Figure's data and layout, so the PNG shows exactly the data of the
HTML. It covers what the package's figures use: scatter traces (lines with dash styles; markers with
per-point size, colour, symbol and open variants; text labels; filled bands), grouped bars, subplot grids
(with row heights and shared axes), log axes with explicit ticks, equal aspect, colour bars, horizontal-line
shapes, subplot titles and one legend outside the panels (matplotlib's constrained layout keeps axis labels,
legend and colour bar from being cut off or overlapping). Anything else raises a ValueError, so a new kind of
figure cannot silently lose part of its twin.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import numpy as np

_DASH = {None: "-", "solid": "-", "dash": "--", "dot": ":", "dashdot": "-.", "longdash": "--", "longdashdot": "-."}
_SYMBOL = {"circle": "o", "square": "s", "diamond": "D", "triangle-up": "^", "triangle-down": "v", "pentagon": "p",
           "hexagon": "h", "star": "*", "x": "x", "cross": "P"}
_LINE_MARKERS = {"x"}  # matplotlib draws these as strokes: no face to fill or leave open
_PLOTLY_COLOURWAY = ["#636efa", "#EF553B", "#00cc96", "#ab63fa", "#FFA15A", "#19d3f3", "#FF6692", "#B6E880",
                     "#FF97FF", "#FECB52"]


def static_figure(**kwargs):
    """A matplotlib Figure drawn without pyplot, so saving PNGs never switches a notebook's backend."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(**kwargs)
    FigureCanvasAgg(fig)  # a renderer to measure text with (``_fitted_title``); PNGs are drawn by Agg anyway
    return fig


def _text(s) -> str:
    s = str(s or "").replace("<br>", "\n").replace("$", r"\$")
    return re.sub(r"<[^>]+>", "", s)


def _colour(c):
    if isinstance(c, str) and c.startswith("rgb"):
        vals = [float(v) for v in c[c.index("(") + 1:c.index(")")].split(",")]
        return tuple([v / 255 for v in vals[:3]] + vals[3:4])
    return c


def _as_list(v, n):
    if v is None or isinstance(v, (str, int, float)):
        return [v] * n
    v = list(v)
    return v if len(v) == n else (v * n)[:n]


def _axes_grid(out, layout, pairs):
    """One matplotlib Axes per (xref, yref) pair, placed on a grid read from the plotly axis domains."""
    from matplotlib.gridspec import GridSpec

    def dom(ref, kind):
        a = layout[f"{kind}axis{ref[1:]}"]
        return tuple(round(v, 4) for v in (a.domain or (0, 1)))

    xs = sorted({dom(x, "x") for x, _ in pairs})
    ys = sorted({dom(y, "y") for _, y in pairs}, reverse=True)
    gs = GridSpec(len(ys), len(xs), figure=out, width_ratios=[b - a for a, b in xs],
                  height_ratios=[b - a for a, b in ys])
    axes = {(x, y): out.add_subplot(gs[ys.index(dom(y, "y")), xs.index(dom(x, "x"))]) for x, y in pairs}
    by_ref = {ref: ax for (x, y), ax in axes.items() for ref in (x, y)}
    for (x, y), ax in axes.items():
        ax.plotly_anchor = (sum(dom(x, "x")) / 2, dom(y, "y")[1])  # where a subplot title sits
        for ref, kind in ((x, "x"), (y, "y")):
            a = layout[f"{kind}axis{ref[1:]}"]
            if a.matches and a.matches in by_ref and by_ref[a.matches] is not ax:
                (ax.sharex if kind == "x" else ax.sharey)(by_ref[a.matches])
            if a.title.text:
                (ax.set_xlabel if kind == "x" else ax.set_ylabel)(_text(a.title.text))
            log = a.type == "log"
            if log:
                (ax.set_xscale if kind == "x" else ax.set_yscale)("log")
            if a.range:
                lo, hi = (10 ** v for v in a.range) if log else a.range
                (ax.set_xlim if kind == "x" else ax.set_ylim)(lo, hi)
            axis = ax.xaxis if kind == "x" else ax.yaxis
            if a.tickvals is not None:
                from matplotlib.ticker import NullLocator

                axis.set_ticks(list(a.tickvals), labels=[_text(t) for t in (a.ticktext or a.tickvals)])
                axis.set_minor_locator(NullLocator())
            if a.showticklabels is False:
                axis.set_ticks([])
        if layout[f"yaxis{y[1:]}"].scaleanchor:
            ax.set_aspect("equal", adjustable="box")
        ax.grid(alpha=0.3)
    return axes


def _colour_map(marker):
    from matplotlib.colors import LinearSegmentedColormap, Normalize

    scale = marker.colorscale or ((0, "#440154"), (1, "#fde725"))
    cmap = LinearSegmentedColormap.from_list("plotly", [(float(f), _colour(c)) for f, c in scale])
    vals = np.asarray(marker.color, dtype=float)
    lo = marker.cmin if marker.cmin is not None else np.nanmin(vals)
    hi = marker.cmax if marker.cmax is not None else np.nanmax(vals)
    if marker.cmid is not None:
        half = max(abs(hi - marker.cmid), abs(lo - marker.cmid)) or 1.0
        lo, hi = marker.cmid - half, marker.cmid + half
    return cmap, Normalize(lo, hi)


def _scatter(ax, tr, default_colour, colourbars):
    x, y = (np.asarray([np.nan if v is None else v for v in (values if values is not None else [])], dtype=float)
            for values in (tr.x, tr.y))
    n = len(x)
    mode = tr.mode or ("lines+markers" if n < 20 else "lines")
    opacity = 1.0 if tr.opacity is None else tr.opacity
    line_colour = _colour(tr.line.color) or default_colour
    if tr.fill not in (None, "none", "toself"):
        raise ValueError(f"static twin: fill={tr.fill!r} is not supported")
    if tr.fill == "toself":
        ax.fill(x, y, color=_colour(tr.fillcolor) or line_colour, alpha=opacity, linewidth=0)
    if "lines" in mode and tr.line.width != 0:
        ax.plot(x, y, color=line_colour, linestyle=_DASH[tr.line.dash], linewidth=0.75 * (tr.line.width or 2),
                alpha=opacity)
    style = {"colour": line_colour, "line": "lines" in mode, "dash": _DASH[tr.line.dash], "symbol": None}
    if "markers" in mode:
        m = tr.marker
        numeric = m.color is not None and not isinstance(m.color, str) and \
            np.issubdtype(np.asarray(m.color).dtype, np.number)
        if numeric:
            cmap, norm = _colour_map(m)
            colours = [cmap(norm(v)) for v in np.asarray(m.color, dtype=float)]
            if m.showscale:
                colourbars.append((cmap, norm, _text(m.colorbar.title.text)))
        else:
            colours = [_colour(c) or line_colour for c in _as_list(m.color, n)]
        sizes = np.asarray(_as_list(m.size if m.size is not None else 6, n), dtype=float)
        symbols = [s or "circle" for s in _as_list(m.symbol, n)]
        single_edge = m.line and m.line.color and not isinstance(m.line.color, (list, tuple))
        edge = _colour(m.line.color) if single_edge else None
        alpha = (1.0 if m.opacity is None else m.opacity) * opacity
        for sym in dict.fromkeys(symbols):
            idx = [i for i, s in enumerate(symbols) if s == sym]
            base, is_open = sym.removesuffix("-open"), sym.endswith("-open")
            if base not in _SYMBOL:
                raise ValueError(f"static twin: marker symbol {sym!r} is not supported")
            mk, c = _SYMBOL[base], [colours[i] for i in idx]
            kw = dict(s=(0.75 * sizes[idx]) ** 2, marker=mk, alpha=alpha, zorder=3)
            if mk in _LINE_MARKERS:
                kw.update(c=c, linewidths=1.5)
            elif is_open:
                kw.update(facecolors="none", edgecolors=c, linewidths=1.2)
            else:
                kw.update(c=c, edgecolors=edge or c, linewidths=0.6)
            ax.scatter(x[idx], y[idx], **kw)
        first = symbols[0] if symbols else "circle"
        style.update(symbol=_SYMBOL[first.removesuffix("-open")], open=first.endswith("-open"),
                     colour=colours[0] if colours and not style["line"] else line_colour)
    if "text" in mode and tr.text is not None:
        size = 0.75 * (tr.textfont.size or 11)
        for xi, yi, t, pos in zip(x, y, _as_list(tr.text, n), _as_list(tr.textposition or "top center", n),
                                  strict=False):
            v, _, h = (pos or "top center").partition(" ")
            dx = {"left": -6, "right": 6}.get(h, 0)
            dy = {"top": 6, "bottom": -6}.get(v, 0)
            ax.annotate(_text(t), (xi, yi), textcoords="offset points", xytext=(dx, dy), fontsize=size,
                        ha={"left": "right", "right": "left"}.get(h, "center"),
                        va={"top": "bottom", "bottom": "top"}.get(v, "center"))
    return style


def _bars(ax, traces, colourway):
    cats = list(dict.fromkeys(c for tr, _ in traces for c in tr.x))
    width = 0.8 / len(traces)
    for k, (tr, i) in enumerate(traces):
        pos = np.array([cats.index(c) for c in tr.x]) + (k - (len(traces) - 1) / 2) * width
        ax.bar(pos, list(tr.y), width=width, color=_colour(tr.marker.color) or colourway[i % len(colourway)],
               label=tr.name)
    ax.set_xticks(range(len(cats)), [_text(c) for c in cats])


def plotly_to_png(fig, path: Path, dpi: int = 100) -> Path:
    """Static PNG twin of a plotly figure (``path`` with .png); pixel size = the layout's width and height."""
    from matplotlib.lines import Line2D

    layout = fig.layout
    width, height = (layout.width or 700), (layout.height or 450)
    out = static_figure(figsize=(width / dpi, height / dpi), layout="constrained")
    pairs = list(dict.fromkeys((tr.xaxis or "x", tr.yaxis or "y") for tr in fig.data))
    pairs += [("x" + key[5:], layout[key].anchor) for key in layout.to_plotly_json()
              if key.startswith("xaxis") and layout[key].anchor]
    pairs = list(dict.fromkeys(pairs or [("x", "y")]))
    axes = _axes_grid(out, layout, pairs)
    colourway = list(layout.template.layout.colorway or _PLOTLY_COLOURWAY) if layout.template else _PLOTLY_COLOURWAY
    handles, colourbars, used, bars = {}, [], set(), {}
    for i, tr in enumerate(fig.data):
        ax = axes[(tr.xaxis or "x", tr.yaxis or "y")]
        used.add(ax)
        if tr.type == "bar":
            bars.setdefault(ax, []).append((tr, i))
            style = {"bar": _colour(tr.marker.color) or colourway[i % len(colourway)]}
        elif tr.type in ("scatter", "scattergl"):
            style = _scatter(ax, tr, colourway[i % len(colourway)], colourbars)
        else:
            raise ValueError(f"static twin: trace type {tr.type!r} is not supported")
        if tr.name and tr.showlegend is not False and tr.name not in handles:
            if "bar" in style:
                from matplotlib.patches import Patch

                handles[tr.name] = Patch(color=style["bar"])
            else:
                sym = style["symbol"]
                handles[tr.name] = Line2D(
                    [], [], color=style["colour"], linestyle=style["dash"] if style["line"] else "none",
                    marker=sym or "", markersize=6, markerfacecolor="none" if style.get("open") else style["colour"])
    for ax, traces in bars.items():
        _bars(ax, traces, colourway)
    for shape in layout.shapes or []:
        if shape.type == "line" and "domain" in str(shape.xref) and shape.y0 == shape.y1:
            yref = shape.yref or "y"
            for (_x, y), ax in axes.items():
                if y == yref:
                    ax.axhline(shape.y0, color=_colour(shape.line.color) or "black", linestyle=_DASH[shape.line.dash],
                               linewidth=0.75 * (shape.line.width or 2))
        else:
            raise ValueError("static twin: only horizontal-line shapes (add_hline) are supported")
    for note in layout.annotations or []:
        if note.xref in (None, "paper") and note.text:  # a subplot title: give it to the panel it sits above
            ax = min(axes.values(), key=lambda a: abs(a.plotly_anchor[0] - note.x) + abs(a.plotly_anchor[1] - note.y))
            ax.set_title(_text(note.text), fontsize=9)
        elif note.text:
            axes[(note.xref, note.yref)].annotate(_text(note.text), (note.x, note.y), fontsize=8)
    for ax in [a for a in axes.values() if a not in used]:
        ax.set_axis_off()
    for cmap, norm, label in colourbars[:1]:
        from matplotlib.cm import ScalarMappable

        out.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=list(axes.values()), label=label, shrink=0.9)
    if layout.showlegend is True or (layout.showlegend is None and len(handles) >= 2):
        title = layout.legend.title.text if layout.legend and layout.legend.title else None
        # below the panels, in columns as wide as the longest name (about 5.5 px a character at 8 pt, and the
        # line sample): never on the title, a colour bar or the data, and never wider than the figure
        widest = max(len(_text(k)) for k in handles) * 5.5 + 40
        ncol = max(1, min(len(handles), int(width // max(190, widest))))
        out.legend(list(handles.values()), [_text(k) for k in handles], loc="outside lower center", fontsize=8,
                   title=_text(title) if title else None, frameon=False, ncol=ncol)
    if layout.title and layout.title.text:
        _fitted_title(out, _text(layout.title.text))
    path = Path(path).with_suffix(".png")
    path.parent.mkdir(parents=True, exist_ok=True)
    out.savefig(path, dpi=dpi)
    return path


def _fitted_title(fig, text: str, fontsize: float = 11) -> None:
    """The figure's title, wrapped so that every line fits inside the figure: the rendered width is measured
    (a character count cannot know the font), and the text is wrapped tighter until it fits."""
    width_px = fig.get_figwidth() * fig.dpi
    chars = max(20, len(text))
    title = fig.suptitle(text, fontsize=fontsize)
    renderer = fig.canvas.get_renderer()
    while chars > 20 and title.get_window_extent(renderer).width > 0.96 * width_px:
        chars = int(chars * 0.9)
        title.set_text("\n".join(part for line in text.split("\n") for part in textwrap.wrap(line, chars)))
