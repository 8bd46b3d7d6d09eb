"""Reading a finished Countdown study (notebook 03): its summary, training curves, probe embeddings, pass@k, and
the figures and table notebook 03 shows (each built once, saved as HTML + PNG twin + run record).

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
    (``setpo.studies.figures.project_texts``) is fitted on all points, so panels and steps share coordinates.
    """
    import pandas as pd

    from setpo.studies.figures import project_texts

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
    xy = project_texts(df["text"].tolist(), embedder, method=method, seed=seed)  # the kernel's cosine geometry
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


def figure_record(cfg: CountdownLMConfig, command: str, **extra) -> dict:
    """The run record of a notebook-03 figure: the study's command and whole config, and the embedder by name."""
    from setpo.studies.figures import embedder_name, run_record

    return run_record(command, config=cfg, seeds=[getattr(cfg, "seed", 0)],
                      uses={"embedder": embedder_name(cfg.embedder), "study folder": str(cfg.out)}, **extra)


def study_command(cfg: CountdownLMConfig, smoke: bool) -> str:
    return ("python -m setpo.studies.countdown --smoke" if smoke else
            f"python -m setpo.studies.countdown --full --out {cfg.out}") + ", then notebooks/03_countdown_pass_at_k"


def write_results(cfg: CountdownLMConfig, summary: dict, out_dir: str | Path, record: dict) -> tuple[str, Path]:
    """The results table (``results_markdown``, with the embedder's real name) as ``fig3_countdown_results.md``
    and its run record. Returns (markdown, path)."""
    from setpo.studies.countdown import results_markdown
    from setpo.studies.figures import embedder_name, save_table

    real_name = f"embedder {embedder_name(cfg.embedder)}."
    table = results_markdown(cfg, summary).replace(f"embedder {cfg.embedder}.", real_name)
    path = save_table(table, Path(out_dir) / "fig3_countdown_results",
                      {**record, "results": summary},
                      note=f"Made by `{record['command']}`; configuration, seeds and versions in "
                           "`fig3_countdown_results.json` beside this file.")
    return table, path


def _lam_colours(cfg: CountdownLMConfig) -> dict:
    from setpo.studies.figures import BASELINE_COLOUR, SETPO_COLOURS

    return {0.0: BASELINE_COLOUR, **dict(zip(sorted(cfg.setpo_lambdas), SETPO_COLOURS))}


def pass_at_k_figure(cfg: CountdownLMConfig, summary: dict, cols: int = 3):
    """pass@k (%) against k on a log axis (ticks 1, 2, 4, ..., n), one panel per (setting, temperature), rows of
    ``cols`` panels, temperatures in turn. Dashed: the baseline, named by its method (GRPO, GSPO, DAPO);
    solid: SetPO, one colour per λ; dotted grey: the warm start."""
    from setpo.studies.figures import line_grid

    colours, panels = _lam_colours(cfg), []
    by_temp = sorted(pass_at_k_panels(cfg, summary), key=lambda p: cfg.eval_temperatures.index(p["T"]))
    for p in by_temp:
        lines = []
        for line in p["lines"]:
            style = ({"color": "grey", "dash": "dot", "name": "warm start (SFT)"} if line["kind"] == "sft" else
                     {"color": colours[line["lam"] or 0.0], "dash": "dash" if line["kind"] == "baseline" else "solid",
                      "name": line["label"]})
            lines.append({**style, "x": line["k"], "y": [100 * v for v in line["pass"]],
                          "hover": [f"k={k}: {100 * v:.1f}%" for k, v in zip(line["k"], line["pass"])]})
        panels.append({"title": f"{p['setting']}, T={p['T']:g}", "lines": lines})
    ticks = [k for k in (1, 2, 4, 8, 16, 32, 64, 128, 256) if k <= cfg.eval_samples]
    return line_grid(panels, cols=cols, log_x=True, x_ticks=ticks, x_title="k", y_title="pass@k (%)",
                     title=f"Countdown test split: pass@k from n = {cfg.eval_samples} samples per problem "
                           "(dashed: baseline, solid: SetPO, dotted: warm start)", panel_px=(360, 260))


TRAINING_METRICS = (("reward", "mean reward"), ("distinct_correct", "distinct correct / group"),
                    ("pairwise_similarity", "pairwise similarity"))


def training_figure(cfg: CountdownLMConfig, curves, runs: Sequence[RLRun],
                    metrics: Sequence[tuple[str, str]] = TRAINING_METRICS, window: int = 5):
    """Training metrics of ``runs`` (``training_curves``), ``window``-step rolling means: a row per group size,
    a column per metric, one line per run coloured by λ."""
    from setpo.studies.figures import line_grid

    colours = _lam_colours(cfg)
    gs = sorted({r.group_size for r in runs})
    panels = [{"title": f"{label}, G={g}", "lines": []} for g in gs for _, label in metrics]
    for run in runs:
        d = curves[curves.run == run.name] if len(curves) else curves
        if d.empty:
            continue
        smooth = d.set_index("step")[[m for m, _ in metrics]].rolling(window, min_periods=1).mean()
        for j, (m, _) in enumerate(metrics):
            panels[gs.index(run.group_size) * len(metrics) + j]["lines"].append(
                {"x": smooth.index.tolist(), "y": smooth[m].tolist(), "name": run.method, "color": colours[run.lam]})
    betas = sorted({r.beta for r in runs})
    return line_grid(panels, cols=len(metrics), x_title="step", panel_px=(380, 270),
                     title=f"Training curves, {' vs '.join(dict.fromkeys(r.method for r in runs))}, "
                           f"β={', '.join(f'{b:g}' for b in betas)} ({window}-step rolling mean)")


def trajectory_runs(cfg: CountdownLMConfig) -> tuple[RLRun, RLRun]:
    """The pair the trajectory figure shows: GRPO at the largest G and smallest β (the most rollouts per group
    to collapse), and its SetPO run with the largest λ of the study."""
    base = next(r for r in cfg.runs() if not r.lam and r.preset == "grpo" and r.group_size == max(cfg.group_sizes)
                and r.beta == min(cfg.kl_betas))
    return base, max((r for r in cfg.runs() if r.lam and r.baseline == base), key=lambda r: r.lam)


def trajectory_figure(cfg: CountdownLMConfig, embedder, runs: Sequence[RLRun] | None = None, problem: int = 0,
                      method: str = "pca", seed: int = 0):
    """Where one validation problem's probe samples go over training (``probe_frame``), drawn by the shared
    ``setpo.studies.figures.trajectory_figure``: a panel per run, colour = step, filled = correct, size = number
    of identical samples. Returns (figure, frame)."""
    from setpo.studies.figures import embedder_short_name
    from setpo.studies.figures import trajectory_figure as build

    runs = list(runs or trajectory_runs(cfg))
    df = probe_frame(cfg.out, runs, embedder, problem=problem, method=method, seed=seed)
    frame = df.assign(panel=df["method"], group=problem,
                      hover=[f"{e}<br>×{c}, reward {r:g}" for e, c, r in zip(df.expression, df["count"], df.reward)])
    inst = df.iloc[0]
    title = (f"Samples for {' '.join(map(str, inst.numbers))} → {inst.target} over training "
             f"(G={runs[-1].group_size}, β={runs[-1].beta:g}; {method.upper()} of "
             f"{embedder_short_name(cfg.embedder)} embeddings; size: identical samples)")
    return build(frame, title=title, group_name="problem"), frame
