"""Reading a finished Countdown study (notebook 03): the record of every run, paired differences over seeds with
confidence intervals, the results table, and the figures notebook 03 shows (each built once, saved as HTML + PNG
twin + run record).

The study itself (``setpo_lab.studies.countdown``) writes everything under its ``out`` folder; ``summarize`` turns its
evaluations into the record (``results.json``, and ``figures/fig3_countdown_results.json`` through ``make
figures``), and everything else here only reads that record and draws it. ``evaluate_samples`` scores one
evaluation's samples (pass@k, width, average modes), the numbers every row is made of.

Where each row came from and what the record says on the study's questions (``verdict``) are
``countdown_verdict``'s.
"""

from __future__ import annotations

import collections
import json
import math
import statistics
from dataclasses import asdict
from pathlib import Path
from typing import Mapping, Sequence

from setpo.records import read_json, read_records
from setpo_lab import ROOT
from setpo_lab.repro.arithmetic import active_arithmetic
from setpo_lab.studies.countdown_config import REUSE_NEUTRAL_FIELDS, CountdownLMConfig, RLRun
from setpo_lab.repro.agreement import fingerprints, identical_text, machines_used, made_on
from setpo_lab.studies.countdown_verdict import ci_text, in_main_cell, verdict, verdict_markdown
from setpo_lab.studies.figures import (
    BASELINE_COLOUR,
    SETPO_COLOURS,
    embedder_name,
    metric_curves,
    pass_at_k_curves,
    project_frame,
    run_record,
    save_table,
)
from setpo_lab.studies.figures import trajectory_figure as shared_trajectory_figure
from setpo_lab.studies.intervals import mean_ci, paired_ci, t975
from setpo_lab.studies.judging import JUDGED_COLUMN, judged_cell, judged_note, without_judge


def _embedder_label(spec: str) -> str:
    """An embedder spec by its real name ("centered:<spec>": that model, centred on the warm-start completions)."""
    if spec.startswith("centered:"):
        return f"{embedder_name(spec.partition(':')[2])}, centred on the warm-start completions"
    return embedder_name(spec)


def _ks(n: int) -> list[int]:
    return [k for k in (1, 2, 4, 8, 16, 32, 64, 128, 256) if k <= n]


def summarize(cfg: CountdownLMConfig, runs: Sequence[RLRun], chosen: Mapping[str, RLRun] | RLRun, results: dict,
              selection: dict, diagnostics: dict, timings: dict | None = None) -> dict:
    """The study's record: one row per (run, seed, temperature) with pass@k as fractions, width and average
    modes, ``primary`` on the SetPO+GRPO chosen on validation, ``threads``; the paired differences of the main
    cell against GRPO (``paired``) and of the chosen SetPO against each baseline (``versus``); the grid
    (``grid``); the noise of the headline and what more seeds or problems would buy (``noise``); the validation
    searches, the embedder diagnostics and where the time went (``timings``). chosen: the run each search
    chose ({"setpo": ..., "pairwise": ..., ...}; a lone RLRun: the SetPO one)."""
    chosen = {"setpo": chosen} if isinstance(chosen, RLRun) else dict(chosen)
    primary = chosen["setpo"]
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
                         "embedder": _embedder_label(run.embedder) if run is not None and run.needs_embeddings else None,
                         "units": d.get("units"), "term": d.get("term"), "seed": d.get("seed"), "T": temp,
                         "primary": run is not None and run.with_seed(primary.seed) == primary,
                         "role": _role(run, chosen), "threads": cfg.threads, "replication": 0,
                         "pass_at_k": {str(k): r["pass_at_k"][k - 1] for k in _ks(n)}, "pass_curve": r["pass_at_k"],
                         "width": r["diversity_width"], "avg_modes": r["average_modes"],
                         "n_problems": len(r["correct"]), "run": d or None, **made_on(Path(cfg.out), name, r),
                         **fingerprints(Path(cfg.out), name, r)})
    summary = {"config": json.loads(json.dumps(without_judge(asdict(cfg)))), "chosen": primary.variant,
               "chosen_by_search": {k: r.variant for k, r in chosen.items()}, "runs": rows,
               "paired": _paired_differences(cfg, rows), "versus": _versus_baselines(cfg, rows),
               "grid": _grid_differences(cfg, rows), "noise": _headline_noise(cfg, rows, results),
               "selection": selection, "diagnostics": diagnostics, "machines": machines_used(rows)}
    if timings is not None:
        summary["timings"] = timings
    return summary


def _role(run: RLRun | None, chosen: Mapping[str, RLRun]) -> str:
    """What a run is in the study: "warm start", "grpo", "paper", or the search that chose it."""
    if run is None:
        return "warm start"
    if run.variant == "GRPO":
        return "grpo"
    for key, c in chosen.items():
        if run.in_cell(c.group_size, c.beta, c.seed) == c:
            return key
    return "paper" if run.lam and run.units == "absolute" else "other"


def finished_summary(out: str | Path) -> dict | None:
    """The record of a finished study (``<out>/results.json``), to draw from without running anything; None
    unless it is the study that ``<out>/config.json`` now describes (a grown ``headline_seeds`` makes it stale)
    and, where that study has a replication, holds it too. Drawing so needs none of the study's code to match
    it (a resume does): the code that made it is named in ``<out>/identity.json``, which the figures' record
    repeats (``figure_record``'s ``study_code``)."""
    out = Path(out)
    if not (out / "results.json").exists() or not (out / "config.json").exists():
        return None
    summary = read_json(out / "results.json", "delete it; make countdown writes it again (quick when done)")
    config = read_json(out / "config.json", f"restore it or delete {out} to start over")
    settings = lambda c: {k: v for k, v in c.items() if k not in REUSE_NEUTRAL_FIELDS}  # noqa: E731
    if settings(summary.get("config", {})) != settings(config):
        return None
    if config.get("replication_threads") and "agreement" not in summary:
        return None
    return summary


def _every_row(summary: dict) -> list[dict]:
    """The primary's rows and the replication's (if any): every run of the record."""
    return summary["runs"] + summary.get("replication", {}).get("runs", [])


def _paired(pairs: Sequence[tuple[dict, dict]], n: str) -> dict:
    """a - b over (a, b) rows of the same seed: pass@1, pass@n, average modes, width, each with its interval."""
    return {"seeds": [a["seed"] for a, _ in pairs], "pass1": paired_ci(pairs, lambda r: r["pass_at_k"]["1"]),
            "passn": paired_ci(pairs, lambda r: r["pass_at_k"][n]),
            "avg_modes": paired_ci(pairs, lambda r: r["avg_modes"]), "width": paired_ci(pairs, lambda r: r["width"])}


def _cell_rows(rows: Sequence[dict], g, beta, temp: float) -> list[dict]:
    return [r for r in rows if r["seed"] is not None and r["G"] == g and r["beta"] == beta and r["T"] == temp]


def _paired_differences(cfg: CountdownLMConfig, rows: Sequence[dict]) -> list[dict]:
    """Main cell, T = 1: every variant minus GRPO of the same seed (same warm start), for pass@1, pass@n,
    average modes and width, each as a mean with its 95% t-interval over seeds; and how much of GRPO's pass@n
    loss against the warm start the variant wins back (``gap_closed``: 1 = all of it)."""
    n = str(cfg.eval_samples)
    main = [r for r in _cell_rows(rows, cfg.main_group_size, cfg.main_beta, 1.0) if r["run"]["preset"] == "grpo"]
    grpo = {r["seed"]: r for r in main if r["variant"] == "GRPO"}
    sft = next((r for r in rows if r["name"] == "sft" and r["T"] == 1.0), None)
    out = []
    for variant in dict.fromkeys(r["variant"] for r in main if r["variant"] != "GRPO"):
        pairs = [(r, grpo[r["seed"]]) for r in main if r["variant"] == variant and r["seed"] in grpo]
        if not pairs:
            continue
        entry = {"variant": variant, "primary": pairs[0][0]["primary"], "role": pairs[0][0].get("role"),
                 **_paired(pairs, n)}
        if sft is not None:
            gap = sft["pass_at_k"][n] - statistics.mean(b["pass_at_k"][n] for _, b in pairs)
            entry["gap_closed"] = entry["passn"]["mean"] / gap if gap > 0 else None
        out.append(entry)
    return out


def _versus_baselines(cfg: CountdownLMConfig, rows: Sequence[dict]) -> list[dict]:
    """Main cell, T = 1: the chosen SetPO+GRPO minus each other variant (the baselines at their chosen settings,
    the paper-faithful run, the perfect-kernel ceiling) of the same seed, with 95% t-intervals."""
    n = str(cfg.eval_samples)
    main = _cell_rows(rows, cfg.main_group_size, cfg.main_beta, 1.0)
    setpo = {r["seed"]: r for r in main if r["primary"]}
    out = []
    for variant in dict.fromkeys(r["variant"] for r in main if not r["primary"] and r["variant"] != "GRPO"):
        pairs = [(setpo[r["seed"]], r) for r in main if r["variant"] == variant and r["seed"] in setpo]
        if pairs:
            out.append({"baseline": variant, "role": pairs[0][1].get("role"), **_paired(pairs, n)})
    return out


def _grid_differences(cfg: CountdownLMConfig, rows: Sequence[dict]) -> list[dict]:
    """Every cell of the grid (G, β) at every evaluated T: the chosen SetPO+GRPO minus GRPO of the same seed,
    with the two methods' means beside it (the paper's Table 3, with intervals)."""
    n = str(cfg.eval_samples)
    cells = [(cfg.main_group_size, cfg.main_beta), *cfg.other_cells]
    out = []
    for g, beta in cells:
        for temp in cfg.eval_temperatures:
            here = _cell_rows(rows, g, beta, temp)
            grpo = {r["seed"]: r for r in here if r["variant"] == "GRPO"}
            pairs = [(r, grpo[r["seed"]]) for r in here if r.get("role") == "setpo" and r["seed"] in grpo]
            if not pairs:
                continue
            means = {side: {"pass1": statistics.mean(p[i]["pass_at_k"]["1"] for p in pairs),
                            "passn": statistics.mean(p[i]["pass_at_k"][n] for p in pairs),
                            "avg_modes": statistics.mean(p[i]["avg_modes"] for p in pairs),
                            "width": statistics.mean(p[i]["width"] for p in pairs)}
                     for i, side in enumerate(("setpo", "grpo"))}
            out.append({"G": g, "beta": beta, "T": temp, **means, "difference": _paired(pairs, n)})
    return out


def _headline_noise(cfg: CountdownLMConfig, rows: Sequence[dict], results: Mapping[str, dict]) -> dict | None:
    """The noise in the headline (main cell, T = 1, chosen SetPO+GRPO minus GRPO, pass@n), split in two:

    - evaluation: the standard error of one run's pass@n over the test problems (per-problem "any of n samples
      correct" indicators), and of one seed's paired difference (per-problem differences of the two runs);
    - training: the seed-to-seed variance of the paired difference beyond what evaluation explains.

    ``projection`` is the 95% half-width the headline would have with s seeds and m test problems (evaluation
    variance scales as 1/m, training variance does not), so that more problems and more RL runs can be
    weighed against each other; ``target`` is ±3 points."""
    n = str(cfg.eval_samples)
    main = _cell_rows(rows, cfg.main_group_size, cfg.main_beta, 1.0)
    grpo = {r["seed"]: r for r in main if r["variant"] == "GRPO"}
    pairs = [(r, grpo[r["seed"]]) for r in main if r["primary"] and r["seed"] in grpo]
    if len(pairs) < 2:
        return None
    hits = lambda row: [int(c > 0) for c in results[f"{row['name']}_T1"]["correct"]]  # noqa: E731
    problems = len(hits(pairs[0][0]))
    se = lambda xs: statistics.stdev(xs) / math.sqrt(len(xs))  # noqa: E731
    run_se = [se(hits(row)) for pair in pairs for row in pair]
    pair_se = [se([a - b for a, b in zip(hits(x), hits(y))]) for x, y in pairs]
    diffs = [x["pass_at_k"][n] - y["pass_at_k"][n] for x, y in pairs]
    headline = mean_ci(diffs)
    eval_var = statistics.mean(v * v for v in pair_se)
    train_var = max(0.0, statistics.variance(diffs) - eval_var)
    projection = {}
    for s in (len(pairs), 5, 8, 10, 15):
        for m in (problems, 2 * problems, 5 * problems):
            projection[f"{s} seeds, {m} problems"] = t975(s - 1) * math.sqrt((train_var + eval_var * problems / m) / s)
    return {"problems": problems, "seeds": len(pairs), "run_se_mean": statistics.mean(run_se),
            "pair_se_mean": math.sqrt(eval_var), "diff_sd_over_seeds": statistics.stdev(diffs),
            "train_sd": math.sqrt(train_var),
            "seed_sd": {"GRPO": statistics.stdev(y["pass_at_k"][n] for _, y in pairs),
                        "SetPO": statistics.stdev(x["pass_at_k"][n] for x, _ in pairs)},
            "half_width": headline["hi"] - headline["mean"], "target": 0.03, "projection": projection}


def _machines_markdown(summary: dict) -> list[str]:
    """One line naming the processors that trained and evaluated the record's rows (none before the record kept
    them)."""
    used = summary.get("machines")
    if not used:
        return []
    text = lambda d: ", ".join(f"{label} ({n} rows)" for label, n in d.items())  # noqa: E731
    return [f"Made on: trained by {text(used['trained'])}; evaluated by {text(used['evaluated'])}.", ""]


def results_markdown(summary: dict) -> str:
    """The tables of the docs (docs/studies/countdown.md) and notebook 03, all from the record: the main cell (mean over
    seeds), the paired differences against GRPO and of the chosen SetPO against each baseline, the grid, the noise of
    the headline, the replication, the validation searches, the embedder diagnostics and where the time went; with a
    judge (``summary["judged"]``, stage "judge"), the main cell's judged diversity column and what it is."""
    cfg = summary["config"]
    n = str(cfg["eval_samples"])
    rows = summary["runs"]
    judged = summary.get("judged")
    lines = [f"Countdown test split: {cfg['n_test']} problems, n = {n} samples each, top-p {cfg['eval_top_p']}, "
             f"{cfg['threads']} thread(s). Chosen on validation: {summary['chosen']}.", "",
             *_machines_markdown(summary), *verdict_markdown(summary),
             f"Main cell (G = {cfg['main_group_size']}, β = {cfg['main_beta']:g}), T = 1, mean over seeds:", "",
             f"| method | seeds | pass@1 | pass@{n} | avg modes | width |" + (f" {JUDGED_COLUMN} |" if judged else ""),
             "|---|---|---|---|---|---|" + ("---|" if judged else "")]
    groups: dict = {}
    for r in rows:
        if r["T"] == 1.0 and (r["name"] == "sft" or in_main_cell(r, cfg)):
            groups.setdefault(r["variant"] + (" ★" if r["primary"] else ""), []).append(r)
    for label, rs in groups.items():
        m = lambda f: statistics.mean(f(r) for r in rs)  # noqa: E731, B023 (called in this iteration)
        lines.append(f"| {label} | {len(rs) if rs[0]['seed'] is not None else '-'} | {m(lambda r: r['pass_at_k']['1']):.3f} "
                     f"| {m(lambda r: r['pass_at_k'][n]):.3f} | {m(lambda r: r['avg_modes']):.2f} | {m(lambda r: r['width']):.1f} |"
                     + (f" {judged_cell(judged['methods'].get(rs[0]['variant']))} |" if judged else ""))
    if judged:
        lines += ["", judged_note(judged) + " Seeds pooled."]
    lines += ["", "Paired differences against GRPO of the same seed (points for pass@k; 95% t-interval over seeds):", "",
              f"| method | seeds | pass@1 | pass@{n} | avg modes | width | share of GRPO's pass@{n} loss won back |",
              "|---|---|---|---|---|---|---|"]
    for p in summary["paired"]:
        gap = "-" if p.get("gap_closed") is None else f"{100 * p['gap_closed']:.0f}%"
        lines.append(f"| {p['variant']}{' ★' if p['primary'] else ''} | {len(p['seeds'])} | {ci_text(p['pass1'])} | {ci_text(p['passn'])} | "
                     f"{ci_text(p['avg_modes'], 1.0, 2)} | {ci_text(p['width'], 1.0, 1)} | {gap} |")
    if summary.get("versus"):
        lines += ["", "The chosen SetPO+GRPO minus each other method, same seed (points; 95% t-interval):", "",
                  f"| minus | role | seeds | pass@1 | pass@{n} | avg modes | width |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {v['baseline']} | {v.get('role', '')} | {len(v['seeds'])} | {ci_text(v['pass1'])} | {ci_text(v['passn'])} | "
                  f"{ci_text(v['avg_modes'], 1.0, 2)} | {ci_text(v['width'], 1.0, 1)} |" for v in summary["versus"]]
    if summary.get("grid"):
        lines += ["", "The grid: GRPO and the chosen SetPO+GRPO in every cell (means over seeds; difference SetPO − "
                  "GRPO with its 95% t-interval, points):", "",
                  f"| G | β | T | seeds | GRPO pass@1 / pass@{n} / modes / width | SetPO pass@1 / pass@{n} / modes / width "
                  f"| Δ pass@1 | Δ pass@{n} | Δ width |", "|---|---|---|---|---|---|---|---|---|"]
        for c in summary["grid"]:
            fmt = lambda d: f"{d['pass1']:.3f} / {d['passn']:.3f} / {d['avg_modes']:.2f} / {d['width']:.1f}"  # noqa: E731
            diff = c["difference"]
            lines.append(f"| {c['G']} | {c['beta']:g} | {c['T']:g} | {len(diff['seeds'])} | {fmt(c['grpo'])} | "
                         f"{fmt(c['setpo'])} | {ci_text(diff['pass1'])} | {ci_text(diff['passn'])} | {ci_text(diff['width'], 1.0, 1)} |")
    noise = summary.get("noise")
    if noise:
        lines += ["", f"Noise of the headline (pass@{n}, chosen SetPO − GRPO, main cell, T = 1): one run's standard error "
                  f"over the {noise['problems']} test problems {100 * noise['run_se_mean']:.1f} points, one seed's paired "
                  f"difference {100 * noise['pair_se_mean']:.1f}; the difference varies by {100 * noise['diff_sd_over_seeds']:.1f} "
                  f"points (SD) over {noise['seeds']} seeds, {100 * noise['train_sd']:.1f} of them from training (GRPO's "
                  f"pass@{n} SD {100 * noise['seed_sd']['GRPO']:.1f}, SetPO's {100 * noise['seed_sd']['SetPO']:.1f}). "
                  f"95% half-width now ±{100 * noise['half_width']:.1f} (target ±{100 * noise['target']:.0f}); projected:", "",
                  "| seeds, test problems | 95% half-width (points) |", "|---|---|"]
        lines += [f"| {k} | ±{100 * v:.1f} |" for k, v in noise["projection"].items()]
    agreement = summary.get("agreement")
    if agreement:
        lines += ["", "Replication (the whole study again at another thread count), headline of each:", "",
                  f"| study | threads | chosen on validation | Δ pass@1 | Δ pass@{n} | Δ avg modes | Δ width |",
                  "|---|---|---|---|---|---|---|"]
        for key, a in agreement.items():
            h = a["headline"]
            lines.append(f"| {key} | {a['threads']} | {a['chosen']} | " + (" | ".join(
                [ci_text(h['pass1']), ci_text(h['passn']), ci_text(h['avg_modes'], 1.0, 2), ci_text(h['width'], 1.0, 1)]) if h else "- | - | - | -") + " |")
        if summary.get("identical"):
            lines += ["", "Both studies" + identical_text(summary["identical"]).removeprefix(";") + "."]
    sel = summary["selection"]
    lines += ["", f"Validation searches ({sel['rule']}; GRPO: pass@1 {sel['grpo']['pass1']:.3f}, pass@{n} "
              f"{sel['grpo']['passn']:.3f}):", "",
              f"| search | candidate | pass@1 | pass@{n} | pass@{n} spread over seeds | avg modes | qualifies |",
              "|---|---|---|---|---|---|---|"]
    blocks = [("setpo", sel)] + [(k, sel[k]) for k in ("pairwise", "dra", "passk", "ceiling") if k in sel]
    for key, block in blocks:
        lines += [f"| {key}{' ✓' if name == block['chosen'] else ''} | {c['variant']} | {c['pass1']:.3f} | {c['passn']:.3f} | "
                  f"{100 * c.get('passn_spread', 0.0):.1f} | {c['average_modes']:.2f} | {'yes' if c['qualifies'] else 'no'} |"
                  for name, c in block["candidates"].items()]
    lines += ["", "Kernel diagnostics (validation solutions; AUC: same solution more similar than different ones; "
              "spread: max s - min s in a group of 4 copies + 3 other solutions):", "",
              "| embedder | cos same | cos different (mean / 5%) | AUC | spread of s |", "|---|---|---|---|---|"]
    for spec, d in summary["diagnostics"].items():
        lines.append(f"| {_embedder_label(spec)} | {d['same_mean']:.3f} | {d['different_mean']:.3f} / "
                     f"{d['different_p5']:.3f} | {d['auc']:.3f} | {d['collapsed_spread']:.4f} |")
    totals = summary.get("timings", {}).get("totals")
    if totals:
        lines += ["", "Where the time went (seconds, this study; RL phases summed over its runs' last invocations):", "",
                  "| " + " | ".join(totals) + " |", "|" + "---|" * len(totals),
                  "| " + " | ".join("-" if v is None else f"{v:.0f}" for v in totals.values()) + " |"]
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


def _probe_frame(out: str | Path, runs: Sequence[RLRun], embedder, problem: int = 0, method: str = "pca",
                 seed: int = 0):
    """Probe samples of the given runs on one validation problem, embedded and projected to 2-D together.

    embedder: texts -> (N, d) (the study's embedder, so the picture shows what SetPO's kernel sees).
    Returns a pandas DataFrame with one row per distinct (run, step, text): run, method, step, text,
    expression, reward, correct, canonical, count (how many of that step's samples were this text: a
    collapsing policy shows as few points with large counts), x, y. One projection
    (``setpo_lab.studies.figures.project_texts``) is fitted on all points, so panels and steps share coordinates.
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


# the main cell draws six methods besides GRPO: the shared four colours, then four more, so no two share one
STUDY_COLOURS = [*SETPO_COLOURS, "#2ca02c", "#e377c2", "#17becf", "#bcbd22"]


def _colour(variant: str, variants: Sequence[str]) -> str:
    others = [v for v in variants if v not in ("GRPO", "warm start (SFT)")]
    if variant == "GRPO":
        return BASELINE_COLOUR
    if variant == "warm start (SFT)":
        return "grey"
    return STUDY_COLOURS[others.index(variant) % len(STUDY_COLOURS)]


def grid_pass_at_k_figure(summary: dict, cols: int = 3):
    """pass@k (%) against k on a log axis (ticks 1, 2, 4, ..., n): the main cell at T = 1 with every method, then
    one panel per cell of the grid and temperature with GRPO and the chosen SetPO+GRPO (mean over seeds, band:
    lowest to highest seed); dotted grey: the warm start at that temperature."""
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

    def seeds(members: Sequence[dict]) -> str:
        """"12 seeds", or "5–12 seeds" where the methods have different numbers; "" without any."""
        per_method = collections.defaultdict(set)
        for r in members:
            if r["seed"] is not None:
                per_method[r["variant"]].add(r["seed"])
        counts = sorted({len(v) for v in per_method.values()})
        return "" if not counts else f"{counts[0]}{'' if len(counts) == 1 else f'–{counts[-1]}'} seeds"

    main = [r for r in rows if r["T"] == 1.0 and (r["name"] == "sft" or in_main_cell(r, cfg))]
    panels.append(panel(f"G={cfg['main_group_size']}, β={cfg['main_beta']:g}, T=1, every method ({seeds(main)})",
                        main))
    for g, beta in [(cfg["main_group_size"], cfg["main_beta"]), *map(tuple, cfg["other_cells"])]:
        for temp in cfg["eval_temperatures"]:
            members = [r for r in rows if r["T"] == temp and (r["name"] == "sft" or (
                r["G"] == g and r["beta"] == beta and r.get("role") in ("setpo", "grpo")))]
            if seeds(members):
                panels.append(panel(f"G={g}, β={beta:g}, T={temp:g} ({seeds(members)})", members))
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
        if r["seed"] is None or r["T"] != 1.0 or not in_main_cell(r, cfg):
            continue
        if seed is None or r["seed"] == seed:
            out.append(_run_of(r))
    return list(dict.fromkeys(out))


def _run_of(row: dict) -> RLRun:
    """The RLRun a record row came from."""
    return RLRun(**row["run"])


def training_curves_figure(curves, runs: Sequence[RLRun], metrics: Sequence[tuple[str, str]] = TRAINING_METRICS,
                           window: int = 5):
    """Training metrics of ``runs`` (``training_curves``), ``window``-step rolling means: a column per metric,
    one line per run (``setpo_lab.studies.figures.metric_curves``)."""
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
                      method: str = "pca", seed: int = 0, out: str | Path | None = None):
    """Where one validation problem's probe samples go over training (``_probe_frame``), drawn by the shared
    ``setpo_lab.studies.figures.trajectory_figure``: a panel per run, colour = step, filled = correct, size = number
    of identical samples. embedder: the one the chosen run used (what its kernel saw). out: the study's folder
    as seen from here (default: the one the record names, relative to where the study ran). Returns (figure,
    frame)."""
    runs = list(runs or trajectory_runs(summary))
    df = _probe_frame(out or summary["config"]["out"], runs, embedder, problem=problem, method=method, seed=seed)
    frame = df.assign(panel=df["method"], group=problem,
                      hover=[f"{e}<br>×{c}, reward {r:g}" for e, c, r in zip(df.expression, df["count"], df.reward)])
    inst = df.iloc[0]
    title = (f"Samples for {' '.join(map(str, inst.numbers))} → {inst.target} over training "
             f"(G={runs[-1].group_size}, β={runs[-1].beta:g}; {method.upper()} of {_embedder_label(runs[-1].embedder)} "
             "embeddings; size: identical samples)")
    return shared_trajectory_figure(frame, title=title, group_name="problem"), frame


def figure_record(summary: dict, command: str, folder: str | Path | None = None, **extra) -> dict:
    """The run record of a notebook-03 figure or table: the study's command and whole config, the embedders by
    their real names, the commit that made the study (``study_code``, from ``<folder>/identity.json``; folder:
    the study's, default its recorded ``out``), and the record's rows (so the docs' numbers trace back here)."""
    cfg = summary["config"]
    chosen = next((r for r in summary["runs"] if r["primary"]), None)
    uses = {"paper-faithful embedder": _embedder_label(cfg["paper_embedder"]),
            "chosen embedder": chosen["embedder"] if chosen else None, "study folder": cfg["out"]}
    identity = Path(folder if folder is not None else cfg["out"]) / "identity.json"
    code = read_json(identity, "restore it from git").get("code", {}) if identity.exists() else {}
    return run_record(command, config=cfg, seeds=[*cfg["rl_seeds"], *cfg.get("headline_seeds", [])], uses=uses,
                      arithmetic=active_arithmetic(),
                      study_code={k: code.get(k) for k in ("commit", "dirty")} if code else None, **extra)


def study_command(out: str, smoke: bool, headline_seeds: Sequence[int] = ()) -> str:
    """How the study behind a record was made: the full study on the pinned floating-point path
    (``setpo_lab.repro.arithmetic``; ``make countdown`` for results/countdown), with its ``headline_seeds`` if any, then
    notebook 03. out: the study's folder, named from the repository root (where ``make`` runs) when it is inside
    it, so notebook 03's "../results/countdown" reads as results/countdown."""
    folder = Path(out).resolve()
    out = folder.relative_to(ROOT).as_posix() if folder.is_relative_to(ROOT) else str(out)
    grown = f" --set 'headline_seeds={json.dumps(list(headline_seeds), separators=(',', ':'))}'" if headline_seeds else ""
    return ("python -m setpo_lab run countdown --smoke" if smoke else
            f"python -m setpo_lab.cli countdown --full{grown} --out {out}") + ", then notebooks/03_countdown_pass_at_k"


def write_results(summary: dict, out_dir: str | Path, record: dict) -> tuple[str, Path]:
    """``fig3_countdown_results.md`` (``results_markdown``) and ``fig3_countdown_results.json``: the run record
    with every row of the study and its replication (``runs``, each with ``threads`` and ``replication``), the
    paired differences, the grid, the noise, the replication's agreement, the validation searches, the
    diagnostics and the timings. Returns (markdown, path of the .md)."""
    table = results_markdown(summary)
    path = save_table(table, Path(out_dir) / "fig3_countdown_results",
                      {**record, "runs": _every_row(summary), "verdict": verdict(summary),
                       **{k: summary[k] for k in ("chosen", "chosen_by_search", "paired", "versus", "grid", "noise",
                                                  "agreement", "selection", "diagnostics", "timings", "judged")
                          if k in summary}},
                      note=f"Made by `{record['command']}`; every row, seed and setting in "
                           "`fig3_countdown_results.json` beside this file.")
    return table, path
