"""Reading a finished Countdown study (notebook 03): the record of every run, paired differences over seeds with
confidence intervals, the results table, and the figures notebook 03 shows (each built once, saved as HTML + PNG
twin + run record).

The study itself (``setpo.studies.countdown``) writes everything under its ``out`` folder; ``summarize`` turns its
evaluations into the record (``results.json``, and ``figures/fig3_countdown_results.json`` through ``make
figures``), and everything else here only reads that record and draws it. ``evaluate_samples`` scores one
evaluation's samples (pass@k, width, average modes), the numbers every row is made of.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict
from pathlib import Path
from typing import Mapping, Sequence

from envs.countdown import CountdownInstance, distinct_correct_solutions, score_answer
from setpo.metrics import diversity_width_and_average_modes, pass_at_k
from setpo.records import read_json, read_records
from setpo.studies.countdown_config import CountdownLMConfig, RLRun
from setpo.studies.judging import JUDGED_COLUMN, judged_cell, judged_note, without_judge
from setpo.studies.figures import (
    BASELINE_COLOUR,
    SETPO_COLOURS,
    embedder_name,
    metric_curves,
    pass_at_k_curves,
    project_frame,
    run_record,
    save_table,
)
from setpo.studies.figures import trajectory_figure as shared_trajectory_figure

# two-sided 95% Student t quantiles by degrees of freedom (seeds - 1); a normal 1.96 beyond the table
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         15: 2.131, 20: 2.086, 30: 2.042}


def embedder_label(spec: str) -> str:
    """An embedder spec by its real name ("centered:<spec>": that model, centred on the warm-start completions)."""
    if spec.startswith("centered:"):
        return f"{embedder_name(spec.partition(':')[2])}, centred on the warm-start completions"
    return embedder_name(spec)


def _ks(n: int) -> list[int]:
    return [k for k in (1, 2, 4, 8, 16, 32, 64, 128, 256) if k <= n]


def mean_ci(values: Sequence[float]) -> dict:
    """Mean and its 95% t-interval over seeds: {"mean", "lo", "hi", "n"} (no interval from one value)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return {"mean": mean, "lo": None, "hi": None, "n": n}
    half = _T975.get(n - 1, 1.96 if n > 31 else _T975[max(k for k in _T975 if k <= n - 1)])
    half *= statistics.stdev(values) / math.sqrt(n)
    return {"mean": mean, "lo": mean - half, "hi": mean + half, "n": n}


def evaluate_samples(instances: Sequence[CountdownInstance], samples: Sequence[Sequence[str]]) -> dict:
    """pass@k (k = 1..n), accuracy and the diversity numbers from n samples per problem.

    Returns {"n", "correct" (per problem), "distinct" (per problem), "pass_at_k" (list, k = 1..n, mean over
    problems), "accuracy" (mean fraction correct = pass@1), "diversity_width", "average_modes",
    "average_modes_all" (over all problems, unsolved counting 0)}.
    """
    n = len(samples[0]) if samples else 0
    if len(samples) != len(instances) or any(len(s) != n for s in samples) or n == 0:
        raise ValueError("samples must hold the same number (>= 1) of completions for every instance")
    correct, distinct = [], []
    for inst, texts in zip(instances, samples):
        correct.append(sum(score_answer(t, inst.numbers, inst.target) == 1.0 for t in texts))
        distinct.append(len(distinct_correct_solutions(texts, inst.numbers, inst.target)))
    curve = [sum(pass_at_k(n, c, k) for c in correct) / len(correct) for k in range(1, n + 1)]
    width, modes = diversity_width_and_average_modes(distinct)
    _, modes_all = diversity_width_and_average_modes(distinct, over="all")
    return {"n": n, "correct": correct, "distinct": distinct, "pass_at_k": curve, "accuracy": curve[0],
            "diversity_width": width, "average_modes": modes, "average_modes_all": modes_all}


def summarize(cfg: CountdownLMConfig, runs: Sequence[RLRun], chosen: RLRun, results: dict, selection: dict,
              diagnostics: dict) -> dict:
    """The study's record: one row per (run, seed, temperature) with pass@k as fractions, width and average
    modes, ``primary`` on the SetPO+GRPO chosen on validation; the paired differences of the main cell; the
    validation search and the embedder diagnostics."""
    n = cfg.eval_samples
    rows = []
    for run in [None, *runs]:
        name = "sft" if run is None else run.name
        for temp in cfg.eval_temperatures:
            r = results.get(f"{name}_T{temp:g}")
            if r is None:
                continue
            d = asdict(run) if run is not None else {}
            rows.append({"name": name, "method": "warm start (SFT)" if run is None else run.method,
                         "variant": "warm start (SFT)" if run is None else run.variant,
                         "G": d.get("group_size"), "beta": d.get("beta"), "lam": d.get("lam"),
                         "embedder": embedder_label(run.embedder) if run is not None and run.lam else None,
                         "units": d.get("units"), "term": d.get("term"), "seed": d.get("seed"), "T": temp,
                         "primary": run is not None and RLRun(**{**d, "seed": chosen.seed}) == chosen,
                         "pass_at_k": {str(k): r["pass_at_k"][k - 1] for k in _ks(n)}, "pass_curve": r["pass_at_k"],
                         "width": r["diversity_width"], "avg_modes": r["average_modes"],
                         "n_problems": len(r["correct"]), "run": d or None})
    return {"config": json.loads(json.dumps(without_judge(asdict(cfg)))), "chosen": chosen.variant, "runs": rows,
            "paired": paired_differences(cfg, rows), "selection": selection, "diagnostics": diagnostics}


def _in_main_cell(row: dict, cfg: CountdownLMConfig | Mapping) -> bool:
    """Whether a record row's run has the main cell's G and β; cfg: the config or its record (a dict). The warm
    start's row (no G) is in no cell."""
    g, beta = ((cfg["main_group_size"], cfg["main_beta"]) if isinstance(cfg, Mapping)
               else (cfg.main_group_size, cfg.main_beta))
    return row["G"] == g and row["beta"] == beta


def paired_differences(cfg: CountdownLMConfig, rows: Sequence[dict]) -> list[dict]:
    """Main cell, T = 1: every variant minus GRPO of the same seed (same warm start), for pass@1, pass@n,
    average modes and width, each as a mean with its 95% t-interval over seeds; and how much of GRPO's pass@n
    loss against the warm start the variant wins back (``gap_closed``: 1 = all of it)."""
    n = str(cfg.eval_samples)
    main = [r for r in rows
            if r["seed"] is not None and _in_main_cell(r, cfg) and r["T"] == 1.0 and r["method"].endswith("GRPO")]
    grpo = {r["seed"]: r for r in main if r["lam"] == 0}
    sft = next((r for r in rows if r["name"] == "sft" and r["T"] == 1.0), None)
    out = []
    for variant in dict.fromkeys(r["variant"] for r in main if r["lam"]):
        pairs = [(r, grpo[r["seed"]]) for r in main if r["variant"] == variant and r["seed"] in grpo]
        if not pairs:
            continue
        diff = lambda f: mean_ci([f(a) - f(b) for a, b in pairs])  # noqa: E731
        entry = {"variant": variant, "primary": pairs[0][0]["primary"], "seeds": [a["seed"] for a, _ in pairs],
                 "pass1": diff(lambda r: r["pass_at_k"]["1"]), "passn": diff(lambda r: r["pass_at_k"][n]),
                 "avg_modes": diff(lambda r: r["avg_modes"]), "width": diff(lambda r: r["width"])}
        if sft is not None:
            gap = sft["pass_at_k"][n] - statistics.mean(b["pass_at_k"][n] for _, b in pairs)
            entry["gap_closed"] = entry["passn"]["mean"] / gap if gap > 0 else None
        out.append(entry)
    return out


def _ci(d: dict, scale: float = 100.0, digits: int = 1) -> str:
    if d["lo"] is None:
        return f"{scale * d['mean']:+.{digits}f} (1 seed)"
    return f"{scale * d['mean']:+.{digits}f} [{scale * d['lo']:+.{digits}f}, {scale * d['hi']:+.{digits}f}]"


def results_markdown(summary: dict) -> str:
    """The tables of the README and notebook 03, all from the record: the main cell (mean over seeds), the paired
    differences with 95% intervals, the other cells, the validation search and the embedder diagnostics; with
    a judge (``summary["judged"]``, stage "judge"), the main cell's judged diversity column and what it is."""
    cfg = summary["config"]
    n = str(cfg["eval_samples"])
    rows = summary["runs"]
    judged = summary.get("judged")
    lines = [f"Countdown test split: {cfg['n_test']} problems, n = {n} samples each, top-p {cfg['eval_top_p']}. "
             f"Chosen on validation: {summary['chosen']}.", "",
             f"Main cell (G = {cfg['main_group_size']}, β = {cfg['main_beta']:g}), T = 1, mean over seeds:", "",
             f"| method | seeds | pass@1 | pass@{n} | avg modes | width |" + (f" {JUDGED_COLUMN} |" if judged else ""),
             "|---|---|---|---|---|---|" + ("---|" if judged else "")]
    groups: dict = {}
    for r in rows:
        if r["T"] == 1.0 and (r["name"] == "sft" or _in_main_cell(r, cfg)):
            groups.setdefault(r["variant"] + (" ★" if r["primary"] else ""), []).append(r)
    for label, rs in groups.items():
        m = lambda f: statistics.mean(f(r) for r in rs)  # noqa: E731
        lines.append(f"| {label} | {len(rs) if rs[0]['seed'] is not None else '-'} | {m(lambda r: r['pass_at_k']['1']):.3f} "
                     f"| {m(lambda r: r['pass_at_k'][n]):.3f} | {m(lambda r: r['avg_modes']):.2f} | {m(lambda r: r['width']):.1f} |"
                     + (f" {judged_cell(judged['methods'].get(rs[0]['variant']))} |" if judged else ""))
    if judged:
        lines += ["", judged_note(judged) + " Seeds pooled."]
    lines += ["", "Paired differences against GRPO of the same seed (points for pass@k; 95% t-interval over seeds):", "",
              f"| method | pass@1 | pass@{n} | avg modes | width | share of GRPO's pass@{n} loss won back |",
              "|---|---|---|---|---|---|"]
    for p in summary["paired"]:
        gap = "-" if p.get("gap_closed") is None else f"{100 * p['gap_closed']:.0f}%"
        lines.append(f"| {p['variant']}{' ★' if p['primary'] else ''} | {_ci(p['pass1'])} | {_ci(p['passn'])} | "
                     f"{_ci(p['avg_modes'], 1.0, 2)} | {_ci(p['width'], 1.0, 1)} | {gap} |")
    others = [r for r in rows if r["seed"] is not None and not _in_main_cell(r, cfg)]
    if others:
        lines += ["", "Other cells (one seed, T = 1):", "", f"| method | G | β | pass@1 | pass@{n} | avg modes | width |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['variant']} | {r['G']} | {r['beta']:g} | {r['pass_at_k']['1']:.3f} | {r['pass_at_k'][n]:.3f} | "
                  f"{r['avg_modes']:.2f} | {r['width']} |" for r in others if r["T"] == 1.0]
    sel = summary["selection"]
    lines += ["", f"Validation search ({sel['rule']}; GRPO: pass@1 {sel['grpo']['pass1']:.3f}, pass@{n} "
              f"{sel['grpo']['passn']:.3f}):", "", f"| candidate | pass@1 | pass@{n} | avg modes | qualifies |", "|---|---|---|---|---|"]
    for block in (sel["candidates"], sel.get("pairwise", {}).get("candidates", {})):
        lines += [f"| {c['variant']} | {c['pass1']:.3f} | {c['passn']:.3f} | {c['average_modes']:.2f} | "
                  f"{'yes' if c['qualifies'] else 'no'} |" for c in block.values()]
    lines += ["", "Kernel diagnostics (validation solutions; AUC: same solution more similar than different ones; "
              "spread: max s - min s in a group of 4 copies + 3 other solutions):", "",
              "| embedder | cos same | cos different (mean / 5%) | AUC | spread of s |", "|---|---|---|---|---|"]
    for spec, d in summary["diagnostics"].items():
        lines.append(f"| {embedder_label(spec)} | {d['same_mean']:.3f} | {d['different_mean']:.3f} / "
                     f"{d['different_p5']:.3f} | {d['auc']:.3f} | {d['collapsed_spread']:.4f} |")
    return "\n".join(lines) + "\n"


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
        hist = read_json(path, "delete the run folder and rerun to train it again")
        for h in hist:
            if "reward" not in h:
                continue  # the second mini-batch of a generation batch logs no rollout metrics
            rows.append({"run": run.name, "method": run.variant, "G": run.group_size, "beta": run.beta,
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

    rows = [{"run": run.name, "method": run.variant, **r} for run in runs
            for r in read_records(Path(out) / "rl" / run.name / "probes.jsonl") if r["problem"] == problem]
    df = pd.DataFrame(rows)
    if df.empty:
        raise ValueError(f"no probe samples for problem {problem} in {out} for runs {[r.name for r in runs]}")
    counts = df.groupby(["run", "step", "text"]).size().rename("count")
    df = df.drop_duplicates(subset=["run", "step", "text"]).join(counts, on=["run", "step", "text"])
    df = project_frame(df.reset_index(drop=True), embedder, method=method, seed=seed)  # the kernel's cosine geometry
    df["correct"] = df["reward"] == 1.0
    return df


def _colour(variant: str, variants: Sequence[str]) -> str:
    others = [v for v in variants if v not in ("GRPO", "warm start (SFT)")]
    if variant == "GRPO":
        return BASELINE_COLOUR
    if variant == "warm start (SFT)":
        return "grey"
    return SETPO_COLOURS[others.index(variant) % len(SETPO_COLOURS)]


def pass_at_k_figure(summary: dict, cols: int = 3):
    """pass@k (%) against k on a log axis (ticks 1, 2, 4, ..., n): the main cell at T = 1 (mean over seeds,
    band: lowest to highest seed), the main cell's first seed at the other temperatures, and the other cells;
    dotted grey: the warm start."""
    cfg = summary["config"]
    rows = summary["runs"]
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    panels = []

    def panel(title: str, members: Sequence[dict]) -> dict:
        lines = []
        for variant in dict.fromkeys(r["variant"] for r in members):
            curves = [r["pass_curve"] for r in members if r["variant"] == variant]
            k = list(range(1, len(curves[0]) + 1))
            mean = [100 * statistics.mean(c[i] for c in curves) for i in range(len(k))]
            band = None if len(curves) < 2 else ([100 * min(c[i] for c in curves) for i in range(len(k))],
                                                 [100 * max(c[i] for c in curves) for i in range(len(k))])
            lines.append({"x": k, "y": mean, "band": band, "name": variant, "color": _colour(variant, variants),
                          "dash": "dot" if variant.startswith("warm") else "solid",
                          "hover": [f"k={i}: {v:.1f}%" for i, v in zip(k, mean)]})
        return {"title": title, "lines": lines}

    main = lambda r: r["name"] == "sft" or _in_main_cell(r, cfg)  # noqa: E731
    panels.append(panel(f"G={cfg['main_group_size']}, β={cfg['main_beta']:g}, T=1 ({len(cfg['rl_seeds'])} seeds)",
                        [r for r in rows if main(r) and r["T"] == 1.0]))
    for temp in cfg["eval_temperatures"]:
        if temp != 1.0:
            panels.append(panel(f"G={cfg['main_group_size']}, β={cfg['main_beta']:g}, T={temp:g} (seed {cfg['rl_seeds'][0]})",
                                [r for r in rows if main(r) and r["T"] == temp]))
    for g, beta in cfg["other_cells"]:
        members = [r for r in rows if (r["name"] == "sft" or (r["G"] == g and r["beta"] == beta)) and r["T"] == 1.0]
        panels.append(panel(f"G={g}, β={beta:g}, T=1 (1 seed)", members))
    one = len(panels) == 1  # a lone panel gets the room its title and legend need
    return pass_at_k_curves(panels, cfg["eval_samples"], cols=cols, x_title="k", y_title="pass@k (%)",
                            title=f"Countdown test split: pass@k, n = {cfg['eval_samples']} samples per problem"
                                  + ("<br>" if one else " ") + "(bands: range over seeds; dotted: warm start)",
                            panel_px=(720, 380) if one else (360, 260))


TRAINING_METRICS = (("reward", "mean reward"), ("distinct_correct", "distinct correct / group"),
                    ("pairwise_similarity", "pairwise similarity"))


def main_cell_runs(summary: dict, seed: int | None = None) -> list[RLRun]:
    """The main cell's runs of the record (one seed, or all)."""
    cfg = summary["config"]
    out = []
    for r in summary["runs"]:
        if r["seed"] is None or r["T"] != 1.0 or not _in_main_cell(r, cfg):
            continue
        if seed is None or r["seed"] == seed:
            out.append(run_of(r))
    return list(dict.fromkeys(out))


def run_of(row: dict) -> RLRun:
    """The RLRun a record row came from."""
    return RLRun(**row["run"])


def training_figure(curves, runs: Sequence[RLRun], metrics: Sequence[tuple[str, str]] = TRAINING_METRICS,
                    window: int = 5):
    """Training metrics of ``runs`` (``training_curves``), ``window``-step rolling means: a column per metric,
    one line per run (``setpo.studies.figures.metric_curves``)."""
    variants = [r.variant for r in runs]
    series = []
    for run in runs:
        d = curves[curves.run == run.name] if len(curves) else curves
        if d.empty:
            continue
        smooth = d.set_index("step")[[m for m, _ in metrics]].rolling(window, min_periods=1).mean()
        series.append((run.variant, _colour(run.variant, variants),
                       {m: (smooth.index.tolist(), smooth[m].tolist()) for m, _ in metrics}))
    return metric_curves(series, metrics, panel_px=(380, 270),
                         title=f"Training curves, G={runs[0].group_size}, β={runs[0].beta:g}, seed {runs[0].seed} "
                               f"({window}-step rolling mean)")


def trajectory_runs(summary: dict) -> tuple[RLRun, RLRun]:
    """The pair the trajectory figure shows: GRPO and the SetPO+GRPO chosen on validation, main cell, first seed."""
    runs = main_cell_runs(summary, seed=summary["config"]["rl_seeds"][0])
    base = next(r for r in runs if not r.lam)
    rows = {r["name"]: r for r in summary["runs"]}
    chosen = next(r for r in runs if r.lam and rows[r.name]["primary"])
    return base, chosen


def trajectory_figure(summary: dict, embedder, runs: Sequence[RLRun] | None = None, problem: int = 0,
                      method: str = "pca", seed: int = 0):
    """Where one validation problem's probe samples go over training (``probe_frame``), drawn by the shared
    ``setpo.studies.figures.trajectory_figure``: a panel per run, colour = step, filled = correct, size = number
    of identical samples. embedder: the one the chosen run used (what its kernel saw). Returns (figure, frame)."""
    runs = list(runs or trajectory_runs(summary))
    df = probe_frame(summary["config"]["out"], runs, embedder, problem=problem, method=method, seed=seed)
    frame = df.assign(panel=df["method"], group=problem,
                      hover=[f"{e}<br>×{c}, reward {r:g}" for e, c, r in zip(df.expression, df["count"], df.reward)])
    inst = df.iloc[0]
    title = (f"Samples for {' '.join(map(str, inst.numbers))} → {inst.target} over training "
             f"(G={runs[-1].group_size}, β={runs[-1].beta:g}; {method.upper()} of {embedder_label(runs[-1].embedder)} "
             "embeddings; size: identical samples)")
    return shared_trajectory_figure(frame, title=title, group_name="problem"), frame


def figure_record(summary: dict, command: str, **extra) -> dict:
    """The run record of a notebook-03 figure or table: the study's command and whole config, the embedders by
    their real names, and the record's rows (so README numbers trace back here)."""
    cfg = summary["config"]
    chosen = next((r for r in summary["runs"] if r["primary"]), None)
    uses = {"paper-faithful embedder": embedder_label(cfg["paper_embedder"]),
            "chosen embedder": chosen["embedder"] if chosen else None, "study folder": cfg["out"]}
    return run_record(command, config=cfg, seeds=cfg["rl_seeds"], uses=uses, **extra)


def study_command(out: str, smoke: bool) -> str:
    return ("python -m setpo.studies.countdown --smoke" if smoke else
            f"python -m setpo.studies.countdown --full --out {out}") + ", then notebooks/03_countdown_pass_at_k"


def write_results(summary: dict, out_dir: str | Path, record: dict) -> tuple[str, Path]:
    """``fig3_countdown_results.md`` (``results_markdown``) and ``fig3_countdown_results.json``: the run record
    with every row (``runs``), the paired differences, the validation search and the diagnostics. Returns
    (markdown, path of the .md)."""
    table = results_markdown(summary)
    path = save_table(table, Path(out_dir) / "fig3_countdown_results",
                      {**record, **{k: summary[k] for k in ("chosen", "runs", "paired", "selection", "diagnostics",
                                                            "judged") if k in summary}},
                      note=f"Made by `{record['command']}`; every row, seed and setting in "
                           "`fig3_countdown_results.json` beside this file.")
    return table, path
