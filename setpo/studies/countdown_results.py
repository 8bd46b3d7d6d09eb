"""Reading a finished Countdown study (notebook 03): its summary, training curves, probe embeddings, pass@k panels.

The study itself (``setpo.studies.countdown``) writes everything under its ``out`` folder; these functions only
read it and draw it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from setpo.studies.countdown import CountdownLMConfig, RLRun


def load_summary(out: str | Path) -> dict:
    """``results.json`` of a finished study."""
    path = Path(out) / "results.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run `python -m setpo.studies.countdown --full --out {out}` first")
    with open(path) as f:
        return json.load(f)


def training_curves(out: str | Path, runs: Sequence[RLRun]):
    """Per-step training metrics of the given runs as a pandas DataFrame (one row per logged step).

    Columns: run, method, G, beta, step, reward, distinct_correct, pairwise_similarity, s_mean, s_std,
    entropy, kl.
    """
    import pandas as pd

    rows = []
    for run in runs:
        path = Path(out) / "rl" / run.name / "log_history.json"
        if not path.exists():
            continue
        with open(path) as f:
            hist = json.load(f)
        for h in hist:
            if "reward" not in h:
                continue  # the second mini-batch of a generation batch logs no rollout metrics
            rows.append({"run": run.name, "method": run.method, "G": run.group_size, "beta": run.beta,
                         "step": h["step"], "reward": h["reward"],
                         "distinct_correct": h.get("setpo/distinct_correct"),
                         "pairwise_similarity": h.get("setpo/pairwise_similarity"),
                         "s_mean": h.get("setpo/s_mean"), "s_std": h.get("setpo/s_std"),
                         "entropy": h.get("entropy"), "kl": h.get("kl")})
    return pd.DataFrame(rows)


def probe_frame(out: str | Path, runs: Sequence[RLRun], embedder, problem: int = 0, method: str = "pca",
                seed: int = 0):
    """Probe samples of the given runs on one validation problem, embedded and projected to 2-D together.

    embedder: texts -> (N, d) (the study's embedder, so the picture shows what SetPO's kernel sees).
    Returns a pandas DataFrame with one row per distinct (run, step, text): run, method, step, text,
    expression, reward, correct, canonical, count (how many of that step's samples were this text: a
    collapsing policy shows as few points with large counts), x, y. One projection
    (``setpo.studies.figures.project_2d``) is fitted on all points, so panels and steps share coordinates.
    """
    import pandas as pd

    from setpo.studies.figures import project_2d

    rows = []
    for run in runs:
        path = Path(out) / "rl" / run.name / "probes.jsonl"
        if not path.exists():
            continue
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                if r["problem"] == problem:
                    rows.append({"run": run.name, "method": run.method, **r})
    df = pd.DataFrame(rows)
    if df.empty:
        raise ValueError(f"no probe samples for problem {problem} in {out} for runs {[r.name for r in runs]}")
    counts = df.groupby(["run", "step", "text"]).size().rename("count")
    df = df.drop_duplicates(subset=["run", "step", "text"]).join(counts, on=["run", "step", "text"])
    df = df.reset_index(drop=True)
    emb = embedder(df["text"].tolist()).numpy()
    emb = emb / (((emb ** 2).sum(1, keepdims=True)) ** 0.5 + 1e-12)  # cosine geometry, as the kernel sees it
    xy = project_2d(emb, method=method, seed=seed)
    df["x"], df["y"] = xy[:, 0], xy[:, 1]
    df["correct"] = df["reward"] == 1.0
    return df


def pass_at_k_panels(cfg: CountdownLMConfig, summary: dict) -> list[dict]:
    """One panel per (setting, temperature): the warm start, the baseline and its SetPO runs.

    Returns [{"setting", "T", "lines": [{"label", "kind" ("sft" | "baseline" | "setpo"), "lam", "k", "pass"}]}],
    settings in study order, temperatures inner; ``pass`` is pass@k in [0, 1] for k = 1..n.
    """
    by = {(r["run"], r["T"]): r for r in summary["rows"]}
    baselines = [r for r in cfg.runs() if not r.lam]
    panels = []
    for base in baselines:
        for temp in cfg.eval_temperatures:
            lines = []
            members = [("sft", "warm start", "sft", None), (base.name, base.method, "baseline", 0.0)]
            members += [(r.name, r.method, "setpo", r.lam) for r in cfg.runs() if r.lam and r.baseline == base]
            for name, label, kind, lam in members:
                row = by.get((name, temp))
                if row is not None:
                    curve = row["pass_curve"]
                    lines.append({"label": label, "kind": kind, "lam": lam, "k": list(range(1, len(curve) + 1)),
                                  "pass": curve})
            panels.append({"setting": base.setting, "T": temp, "lines": lines})
    return panels


def pass_at_k_png(panels: list[dict], path: str | Path, title: str = "") -> Path:
    """Static pass@k figure (matplotlib): a grid of panels (rows: temperature), log-scale k."""
    from setpo.studies.figures import save_static, static_figure

    temps = sorted({p["T"] for p in panels})
    settings = list(dict.fromkeys(p["setting"] for p in panels))
    fig = static_figure(figsize=(3.3 * len(settings), 3.0 * len(temps) + 0.6))
    axes = fig.subplots(len(temps), len(settings), sharex=True, sharey="row", squeeze=False)
    reds = ["#d62728", "#ff7f0e", "#9467bd", "#8c564b"]
    for p in panels:
        ax = axes[temps.index(p["T"])][settings.index(p["setting"])]
        n_setpo = 0
        for line in p["lines"]:
            if line["kind"] == "sft":
                style = dict(color="grey", linestyle=":")
            elif line["kind"] == "baseline":
                style = dict(color="#1f77b4", linestyle="--")
            else:
                style = dict(color=reds[n_setpo % len(reds)], linestyle="-")
                n_setpo += 1
            ax.plot(line["k"], [100 * v for v in line["pass"]], label=line["label"], **style)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{p['setting']}, T={p['T']:g}", fontsize=8)
        ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("k")
    for row in axes:
        row[0].set_ylabel("pass@k (%)")
    axes[0][0].legend(fontsize=6)
    return save_static(fig, path, title)


def training_png(curves, runs: Sequence[RLRun], metrics: Sequence[tuple[str, str]], path: str | Path,
                 title: str = "", window: int = 5) -> Path:
    """Static training-curve figure (matplotlib): rows = group sizes, columns = metrics, one line per run
    (colour by lambda), ``window``-step rolling means. ``curves`` from ``training_curves``."""
    from setpo.studies.figures import save_static, static_figure

    gs = sorted({r.group_size for r in runs})
    lams = sorted({r.lam for r in runs})
    colours = dict(zip(lams, ["#1f77b4", "#d62728", "#ff7f0e", "#9467bd", "#8c564b"]))
    fig = static_figure(figsize=(4.2 * len(metrics), 3.0 * len(gs) + 0.6))
    axes = fig.subplots(len(gs), len(metrics), sharex=True, squeeze=False)
    for run in runs:
        d = curves[curves.run == run.name]
        if d.empty:
            continue
        smooth = d.set_index("step")[[m for m, _ in metrics]].rolling(window, min_periods=1).mean()
        for j, (m, label) in enumerate(metrics):
            ax = axes[gs.index(run.group_size)][j]
            ax.plot(smooth.index, smooth[m], color=colours[run.lam], label=run.method)
            ax.set_title(f"{label}, G={run.group_size}", fontsize=9)
            ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("step")
    axes[0][0].legend(fontsize=7)
    return save_static(fig, path, title)


def probe_png(df, runs: Sequence[RLRun], path: str | Path, title: str = "") -> Path:
    """Static twin of the embedding-trajectory figure (matplotlib): one panel per run, colour = step,
    size = number of identical samples, o correct, x wrong. ``df`` from ``probe_frame``."""
    from setpo.studies.figures import save_static, static_figure

    fig = static_figure(figsize=(5.5 * len(runs), 4.8))
    axes = fig.subplots(1, len(runs), sharex=True, sharey=True, squeeze=False)
    lo, hi = df.step.min(), df.step.max()
    for ax, run in zip(axes[0], runs):
        for ok, marker in ((True, "o"), (False, "x")):
            d = df[(df.run == run.name) & (df.correct == ok)]
            sc = ax.scatter(d.x, d.y, s=12 + 10 * d["count"], c=d.step, cmap="viridis", vmin=lo, vmax=hi,
                            marker=marker, alpha=0.7, label="correct" if ok else "wrong")
        ax.set_title(run.method)
        ax.set_xticks([])
        ax.set_yticks([])
    axes[0][0].legend(fontsize=8)
    fig.colorbar(sc, ax=axes[0].tolist(), label="step")
    return save_static(fig, path, title, tight=False)  # the shared colour bar does not fit tight_layout
