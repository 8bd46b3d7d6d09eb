"""Reading the math study (notebook 04): its figures and tables, each drawn from what the runs wrote (probe
records, ``log_history.json``, evaluation results), with the shared builders of ``setpo.studies.figures``.

- ``pass_at_k_figure`` / ``pass_at_k_table``: the large-budget pass@k comparison against the base model;
- ``training_figure``: reward, within-group similarity and distinct correct responses over training;
- ``trajectory_figure``: where the responses to fixed prompts go over training (``read_probes``);
- ``results_table``: Pass@1 as avg@k per run and data source (and the judged diversity, with a judge);
  ``figure_record``: the record beside a figure; ``results_record`` / ``write_results``: the record beside the
  results table, and the table and record of ``python -m setpo.studies.math`` (``run_dir/results.md``, ``.json``).
"""

from __future__ import annotations

import html
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

from setpo.repro.records import markdown_table, read_json, read_records
from setpo.studies.figures import (
    embedder_name,
    metric_curves,
    pass_at_k_curves,
    project_frame,
    run_colour,
    run_record,
    save_table,
    trajectory_figure as shared_trajectory_figure,
)
from setpo.studies.judging import JUDGED_COLUMN, judged_cell, judged_note, without_judge
from setpo.studies.math_config import MathRunConfig, uses_vllm


def pass_at_k_figure(results: Mapping[str, dict], title: str = ""):
    """pass@k against k (log scale, powers of two marked) for each model, the base model in grey, dashed."""
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


def pass_at_k_table(results: Mapping[str, dict], ks: Sequence[int] = (1, 4, 16, 64, 256)) -> str:
    """pass@k in % per model (rows) at the given k (columns, those within the sampled n), as markdown."""
    k_max = min(len(r["pass_at_k"]) for r in results.values())
    ks = [k for k in ks if k <= k_max] or [k_max]
    return markdown_table([{"model": label, **{f"pass@{k}": f"{100 * r['pass_at_k'][k - 1]:.1f}" for k in ks}}
                           for label, r in results.items()])


def read_probes(path: str | Path) -> list[dict]:
    """The records a run's probe callback wrote (``probes.jsonl``; a last line cut short by a kill is dropped,
    ``setpo.repro.records.read_records``)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"no probe file at {p}; train the run first")
    return read_records(p)


def trajectory_figure(probes_by_run: Mapping[str, Sequence[dict]], embedder, method: str = "umap", seed: int = 0,
                      title_note: str = ""):
    """Embedding trajectories of the responses to fixed prompts over training, one panel per run.

    probes_by_run: run label -> probe records (``read_probes``). All responses of all runs are embedded with
    ``embedder`` and projected together (``setpo.studies.figures.project_texts``), so panels share one map; the
    figure is the shared ``setpo.studies.figures.trajectory_figure``: colour is the training step, marker shape
    the probe prompt, filled = correct; hovering shows the response.
    Returns (plotly Figure, {"points": {label: {"xy", "step"}}, "steps", "method", "frame"}).
    """
    import pandas as pd  # a notebook (lab) dependency, imported when a figure is drawn

    labels = list(probes_by_run)
    records = [(label, r) for label in labels for r in probes_by_run[label]]
    if not records:
        raise ValueError("no probe records to plot")
    frame = project_frame(pd.DataFrame([{"panel": label, "step": r["step"], "text": r["text"],
                                         "correct": bool(r["reward"]), "group": r["probe"],
                                         "hover": _hover_text(r["text"])} for label, r in records]),
                          embedder, method=method, seed=seed)
    xy = frame[["x", "y"]].to_numpy()
    fig = shared_trajectory_figure(frame, group_name="prompt", panel_px=(520, 470),
                title="Responses to fixed prompts over training "
                      f"({method.upper()} of their embeddings; shape: prompt, filled: correct){title_note}")
    points = {label: {"xy": xy[frame.panel == label].tolist(), "step": frame.step[frame.panel == label].tolist()}
              for label in labels}
    return fig, {"points": points, "steps": sorted(set(frame.step)), "method": method, "frame": frame}


TRAINING_KEYS = (("reward", "mean reward"), ("setpo/pairwise_similarity", "within-group similarity"),
                 ("setpo/distinct_correct", "distinct correct per group"))


def training_figure(run_dirs: Mapping[str, str | Path], title: str = ""):
    """Reward, within-group similarity and distinct correct responses per group over training, as logged by
    ``SetPOTrainer`` (``log_history.json`` of each run): a panel per metric, a line per run
    (``setpo.studies.figures.metric_curves``)."""
    series = []
    for i, (label, d) in enumerate(run_dirs.items()):
        history = read_json(Path(d) / "log_history.json", "delete the run folder and rerun to train it again")
        points = {key: [(h["step"], h[key]) for h in history if h.get(key) is not None] for key, _ in TRAINING_KEYS}
        series.append((label, run_colour(i), {key: tuple(zip(*pts)) for key, pts in points.items() if pts}))
    return metric_curves(series, TRAINING_KEYS, title=title, markers=True, panel_px=(380, 280))


def results_table(results: Mapping[str, dict], eval_k: int, note: str = "", judged: Mapping | None = None) -> str:
    """Pass@1 as avg@k per run (rows) and data source (columns), in %, as markdown. judged: stage "judge"'s
    record (``math.judge_runs``), which adds the judged diversity column (mean [95% CI], missing count) and
    a line naming the judge and prompt version; None: the table without them."""
    sources = sorted({s for r in results.values() for s in r["per_source"]})
    rows = [{"run": label, **{s: f"{100 * r['per_source'][s]:.1f}" for s in sources},
             f"all (avg@{eval_k})": f"{100 * r['avg_at_k']:.1f}"} for label, r in results.items()]
    if judged is not None:
        for row in rows:
            row[JUDGED_COLUMN] = judged_cell(judged["methods"].get(row["run"]))
        note = " ".join(filter(None, [judged_note(judged), note]))
    return markdown_table(rows) + (f"\n\n*{note}*" if note else "")


def figure_record(cfg: MathRunConfig, command: str = "notebooks/04_qwen_math_gpu", **extra) -> dict:
    """The run record of a notebook-04 figure: config, seed, model, embedder and data by name."""
    uses = {"embedder": embedder_name(cfg.embedder),
            "model": cfg.model_path or "tiny random Qwen2 (setpo.trl.tiny_models; numbers mean nothing)",
            "train data": cfg.train_file or "generated (envs.math.smoke_problems)",
            "validation data": cfg.val_file or "generated (envs.math.smoke_problems)",
            "pass@k data": cfg.passk_file or "generated (envs.math.smoke_problems)",
            "generation": "vLLM" if uses_vllm(cfg) else "transformers generate"}
    return run_record(command, config=without_judge(vars(cfg)), seeds=[cfg.seed], uses=uses, **extra)


def results_record(record: Mapping, results: Mapping[str, dict], judged: Mapping | None = None, **extra) -> dict:
    """The record beside the results table: ``record`` (``figure_record``), every run's evaluation without its
    example texts, and the judged summaries when there is a judge (no judge: no judge key at all)."""
    out = {**record, "results": {k: {kk: vv for kk, vv in r.items() if kk != "examples"} for k, r in results.items()},
           **extra}
    if judged is not None:
        out["judged"] = dict(judged)
    return out


def write_results(cfg: MathRunConfig, out: Mapping, command: str) -> tuple[str, Path]:
    """``run_dir/results.md`` (``results_table``) and ``run_dir/results.json`` (its record, ``results_record``,
    with the pass@k curves when stage "eval" ran) from ``math.run_study``'s output. Returns (table, path)."""
    tiny = cfg.model_path is None
    table = results_table(out["results"], cfg.eval_k, judged=out.get("judged"),
                          note="Tiny random model: these numbers mean nothing." if tiny else "")
    extra = {"pass_at_k": {k: r["pass_at_k"] for k, r in out["pass_at_k"].items()}} if "pass_at_k" in out else {}
    record = results_record(figure_record(cfg, command), out["results"], out.get("judged"), **extra)
    return table, save_table(table, Path(cfg.run_dir) / "results", record)


def _hover_text(text: str, width: int = 80, max_lines: int = 12) -> str:
    lines = textwrap.wrap(text.replace("\n", " ⏎ "), width) or ["(empty)"]
    if len(lines) > max_lines:
        lines = lines[:max_lines] + ["…"]
    return "<br>".join(html.escape(line) for line in lines)
