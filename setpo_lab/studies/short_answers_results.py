"""The short-answer study's report: what each model's test samples and each run's training logs say, with 95%
intervals paired over seeds (``setpo_lab.studies.intervals.mean_ci``), and its figures.

Per model (the base model and every trained run), over the test prompts of ``eval/<label>.json``:

- ``pass@k`` (k = 1, 2, 4, …, eval_n) on the one-answer prompts: the unbiased estimator (``setpo.metrics.pass_at_k``);
- ``reward``: the mean 0/1 reward of all samples (pass@1 over every prompt);
- ``distinct_right``: distinct right answers per many-answer prompt among its eval_n samples (what mode
  collapse takes away);
- ``similarity``: the mean pairwise similarity of one prompt's samples (SetPO's kernel, the study's embedder);
- ``after_answer``: the share of samples with text after the answer line (``setpo.envs.short_answers.text_after_answer``):
  text the reward never reads but the embedder, which sees whole completions, does.

Per run, from ``log_history.json`` and ``probes.jsonl``: the training reward per step and its rise (mean of the
last third of the steps minus the first third), the mean completion length per step, and the distinct right
answers per probe prompt over training (the real-model Figure 1). A paired difference is taken seed by seed
(SetPO+GRPO minus GRPO of the same seed, or a run minus the base model) and its mean gets a t-interval over the
seeds.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path

from setpo.envs.short_answers import task_from_id, text_after_answer
from setpo.metrics import pass_at_k
from setpo.records import read_json, read_records
from setpo_lab.studies.figures import powers_of_two
from setpo_lab.studies.intervals import interval_side, interval_text, mean_ci, paired_ci
from setpo_lab.studies.short_answers_config import ShortAnswerStudyConfig
from setpo_lab.studies.stages import print_flushed, write_report

#: the quantities a paired difference is reported for: key -> (label, format of a value)
PAIRED_METRICS = {"pass@1": ("pass@1 (one-answer)", "{:.3f}"), "pass@max": ("pass@k_max (one-answer)", "{:.3f}"),
                  "reward": ("reward (all test prompts)", "{:.3f}"),
                  "distinct_right": ("distinct right answers / prompt", "{:.2f}"),
                  "similarity": ("within-prompt similarity", "{:.3f}"),
                  "after_answer": ("samples with text after the answer line", "{:.3f}"),
                  "reward_rise": ("training reward rise", "{:.3f}")}


def _model_metrics(evaluation: Mapping) -> dict:
    """The metrics of one ``eval/<label>.json`` (module docstring)."""
    tasks = [task_from_id(t) for t in evaluation["task_ids"]]
    answers = evaluation["answers"]
    n = len(answers[0])
    right = [[task.is_right(a) for a in row] for task, row in zip(tasks, answers, strict=True)]
    one = [i for i, t in enumerate(tasks) if not t.many_answers]
    many = [i for i, t in enumerate(tasks) if t.many_answers]
    passk = {k: _mean([pass_at_k(n, sum(right[i]), k) for i in one]) for k in powers_of_two(n)}
    distinct = [len({a for a, ok in zip(answers[i], right[i]) if ok}) for i in many]
    return {"pass_at_k": passk, "pass@1": passk.get(1), "pass@max": passk.get(max(passk)) if passk else None,
            "reward": _mean([sum(r) / n for r in right]), "distinct_right": _mean(distinct),
            "similarity": _mean(evaluation["similarity"]),  # a prompt of one sample has None, left out
            "after_answer": _mean([sum(bool(text_after_answer(t)) for t in row) / n for row in evaluation["texts"]]),
            "answered": _mean([sum(a is not None for a in row) / n for row in answers]), "n": n, "prompts": len(tasks)}


def training_series(run_dir: Path) -> dict:
    """One run's training curves: {"step", "reward", "similarity", "length" (mean completion tokens),
    "probe_step", "probe_distinct", "probe_reward", "reward_rise"} (probe values: means over the probe prompts)."""
    history = [h for h in read_json(run_dir / "log_history.json", "rerun the train stage") if "reward" in h]
    steps = [h["step"] for h in history]
    reward = [h["reward"] for h in history]
    third = max(1, len(reward) // 3)
    probes = read_records(run_dir / "probes.jsonl")
    by_step = {step: [r for r in probes if r["step"] == step] for step in sorted({r["step"] for r in probes})}
    # a probe prompt's distinct right answers at a step (0 when none of its samples was right)
    distinct = [_mean([len({r["answer"] for r in rows if r["probe"] == j and r["reward"]})
                       for j in {r["probe"] for r in rows}]) for rows in by_step.values()]
    return {"step": steps, "reward": reward, "similarity": [h.get("setpo/pairwise_similarity") for h in history],
            "length": [h.get("completions/mean_length") for h in history],
            "probe_step": list(by_step), "probe_distinct": distinct,
            "probe_reward": [_mean([r["reward"] for r in rows]) for rows in by_step.values()],
            "reward_rise": _mean(reward[-third:]) - _mean(reward[:third])}


def report(cfg: ShortAnswerStudyConfig, log=print_flushed) -> dict:
    """Read every evaluation and run of the study, write ``results.json`` and ``results.md`` into its folder and
    log where; returns the results record (``results_markdown`` renders its tables; the command line prints them)."""
    root = Path(cfg.run_dir)
    labels = cfg.run_labels()
    models = {label: _model_metrics(read_json(root / "eval" / f"{label}.json", "run the evaluate stage"))
              for label in ["base", *labels]}
    runs = {label: training_series(root / "train" / label) for label in labels}

    def value(label: str, key: str) -> float:
        return runs[label][key] if key == "reward_rise" else models[label][key]

    def of_seed(method: str, seed: int, key: str) -> float:
        """A method's run of one seed (the base model: the same for every seed)."""
        return models["base"][key] if method == "base" else value(
            next(label for label, (m, s) in labels.items() if m == method and s == seed), key)

    by_method = {}
    for method in cfg.methods():
        mine = [label for label, (m, _) in labels.items() if m == method]
        by_method[method] = {**{key: mean_ci([value(label, key) for label in mine]) for key in PAIRED_METRICS},
                             "pass_at_k": {k: mean_ci([models[label]["pass_at_k"][k] for label in mine])
                                           for k in models["base"]["pass_at_k"]}}
    grpo, setpo = cfg.methods()
    paired = [{"metric": key, "a": a, "b": b,
               **paired_ci([(of_seed(a, s, key), of_seed(b, s, key)) for s in cfg.seeds], differences="per_seed")}
              for key in PAIRED_METRICS for a, b in ((setpo, grpo), (grpo, "base"), (setpo, "base"))
              if not (b == "base" and key == "reward_rise")]  # the base model was not trained
    record = {"config": json.loads(json.dumps(asdict(cfg))),
              "command": cfg.command(),
              "models": models, "by_method": by_method, "paired": paired, "runs": runs}
    log(f"report: {write_report(root, record, results_markdown(record))} and results.json")
    return record


def _mean(values: Sequence[float]) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def results_markdown(record: Mapping) -> str:
    """Two tables: each method's mean over seeds (the base model's value beside it), and the paired
    differences, each with its 95% interval over the seeds."""
    cfg, base = record["config"], record["models"]["base"]
    methods = list(record["by_method"])
    k_max = max(int(k) for k in base["pass_at_k"])
    lines = [f"Short-answer study: {len(cfg['seeds'])} paired seeds, {cfg['steps']} steps of "
             f"{cfg['prompts_per_step']} prompts × G = {cfg['group_size']}; test: {base['prompts']} prompts × "
             f"{base['n']} samples at T = {cfg['temperature']}; SetPO λ = {cfg['lam']:g}"
             f"{'σ' if cfg['lam_units'] == 'term_std' else ''}. Mean [95% interval over seeds]. "
             f"Made by `{record['command']}`.", "",
             "| metric | base model | " + " | ".join(methods) + " |", "|---|---|" + "---|" * len(methods)]
    for key, (name, fmt) in PAIRED_METRICS.items():
        name = name.replace("k_max", str(k_max))
        b = "–" if key == "reward_rise" else fmt.format(base[key]) if base[key] is not None else "–"
        lines.append(f"| {name} | {b} | " + " | ".join(interval_text(record["by_method"][m][key], fmt)
                                                       for m in methods) + " |")
    lines += ["", "| paired difference | mean [95% interval over seeds] |", "|---|---|"]
    for p in record["paired"]:
        name, fmt = PAIRED_METRICS[p["metric"]]
        lines.append(f"| {name.replace('k_max', str(k_max))}: {p['a']} − {p['b']} | {interval_text(p, '{:+.3f}')} |")
    return "\n".join(lines) + "\n"


def training_figure(cfg: ShortAnswerStudyConfig, record: Mapping, title: str = "GRPO vs SetPO+GRPO",
                    similarity: str = "within-group similarity"):
    """Training reward, distinct right answers per probe prompt, within-group similarity and completion length
    over training, one colour per method (``cfg.methods()``: the extended study's arms too): the mean over seeds
    with its 95% band, or, with fewer than 3 seeds (where a t-interval is many times the data's range), each seed
    as a thin line under the mean."""
    from setpo_lab.studies.figures import line_grid, run_colour, seed_band

    panels = [{"title": "training reward", "lines": []},
              {"title": "distinct right answers per probe prompt", "lines": []},
              {"title": similarity, "lines": []},
              {"title": "completion length (tokens)", "lines": []}]
    labels = cfg.run_labels()
    few_seeds = len(cfg.seeds) < 3
    for i, method in enumerate(cfg.methods()):
        runs = [record["runs"][label] for label, (m, _) in labels.items() if m == method]
        for panel, (x, y) in zip(panels, (("step", "reward"), ("probe_step", "probe_distinct"),
                                          ("step", "similarity"), ("step", "length"))):
            if any(v is None for r in runs for v in r[y]):  # a TRL version that does not log this quantity
                continue
            _, mean, (lo, hi) = seed_band([r[y] for r in runs])
            line = {"x": runs[0][x][:len(mean)], "y": mean, "name": method, "color": run_colour(i)}
            if few_seeds:  # the mean first, so the legend shows its solid line
                panel["lines"] += [line, *({**line, "y": r[y][:len(mean)], "width": 1, "dash": "dot"} for r in runs)]
            else:
                panel["lines"].append({**line, "band": (lo, hi)})
    spread = "each seed (dotted) and their mean" if few_seeds else "mean and 95% band"
    return line_grid(panels, cols=2, x_title="step",
                     title=f"SmolLM2-135M on short answers: {title} ({len(cfg.seeds)} seed"
                           f"{'s' if len(cfg.seeds) > 1 else ''}, {spread})")


def pass_at_k_figure(cfg: ShortAnswerStudyConfig, record: Mapping):
    """pass@k of the one-answer test prompts: the base model and each method (mean over seeds, 95% band)."""
    from setpo_lab.studies.figures import pass_at_k_curves, run_colour

    base = record["models"]["base"]["pass_at_k"]
    ks = [int(k) for k in base]
    lines = [{"x": ks, "y": [base[k] for k in base], "name": "base model", "color": "#555555", "dash": "dot"}]
    for i, (method, stats) in enumerate(record["by_method"].items()):
        curve = [stats["pass_at_k"][k] for k in stats["pass_at_k"]]
        lines.append({"x": ks, "y": [c["mean"] for c in curve], "name": method, "color": run_colour(i),
                      "band": ([c["lo"] if c["lo"] is not None else c["mean"] for c in curve],
                               [c["hi"] if c["hi"] is not None else c["mean"] for c in curve])})
    return pass_at_k_curves([{"title": "one-answer test prompts", "lines": lines}], max(ks),
                            title="pass@k on held-out prompts: base model, GRPO, SetPO+GRPO")


def write_figures(cfg: ShortAnswerStudyConfig, record: Mapping, folder: Path, command: str) -> list[Path]:
    """``04_short_answers_training``, ``04_short_answers_pass_at_k`` (HTML + PNG + record) and
    ``04_short_answers_results.md`` under ``folder``."""
    from setpo_lab.studies.figures import run_record, save_figure, save_table

    rec = run_record(command, config=record["config"], seeds=cfg.seeds)
    return [*save_figure(training_figure(cfg, record), folder / "04_short_answers_training", rec),
            *save_figure(pass_at_k_figure(cfg, record), folder / "04_short_answers_pass_at_k", rec),
            save_table(results_markdown(record), folder / "04_short_answers_results", rec)]


def _paired(record: Mapping, metric: str, a: str, b: str) -> Mapping:
    return next(p for p in record["paired"] if p["metric"] == metric and p["a"] == a and p["b"] == b)


def _verdict(d: Mapping) -> str:
    """Where a paired difference's 95% interval lies, in the reading's words."""
    side = interval_side(d)
    return {None: "one seed, no interval", "spans 0": "its interval spans 0"}.get(side, side)


def reading(record: Mapping) -> str:
    """What the numbers say, as markdown bullets written from the record (so the text cannot drift from them):
    did GRPO's training reward rise, what did training do to pass@1, pass@k_max and the distinct right answers
    against the base model, and SetPO+GRPO against GRPO on each."""
    grpo, setpo = list(record["by_method"])
    k_max = max(int(k) for k in record["models"]["base"]["pass_at_k"])
    rise = record["by_method"][grpo]["reward_rise"]
    lines = [f"- **{grpo}'s training reward** rose by {interval_text(rise, '{:+.3f}')} from the first third of the "
             f"steps to the last ({_verdict(rise)}; 95% interval over {rise['n']} seeds)."]
    for metric, name in (("pass@1", "pass@1"), ("pass@max", f"pass@{k_max}"),
                         ("distinct_right", "distinct right answers per many-answer prompt"),
                         ("similarity", "within-prompt similarity"),
                         ("after_answer", "samples with text after the answer line")):
        g, s, d = (_paired(record, metric, grpo, "base"), _paired(record, metric, setpo, "base"),
                   _paired(record, metric, setpo, grpo))
        lines.append(f"- **{name}:** {grpo} − base {interval_text(g, '{:+.3f}')} ({_verdict(g)}); {setpo} − base "
                     f"{interval_text(s, '{:+.3f}')} ({_verdict(s)}); {setpo} − {grpo} {interval_text(d, '{:+.3f}')} "
                     f"({_verdict(d)}).")
    similarity, after, distinct = (_paired(record, m, setpo, grpo) for m in ("similarity", "after_answer",
                                                                             "distinct_right"))
    if _verdict(similarity) == "below 0" and _verdict(after) == "above 0" and _verdict(distinct) != "above 0":
        mine, theirs = (record["by_method"][m]["after_answer"]["mean"] for m in (setpo, grpo))
        lines.append(f"- **Where {setpo}'s diversity went:** {mine:.1%} of its test samples carry text after the "
                     f"answer line ({theirs:.1%} of {grpo}'s). The reward reads only that line; the embedder reads "
                     f"the whole completion. So the diversity term was paid for by the text after the answer, "
                     f"which costs no reward, and its lower similarity did not become detectably more distinct "
                     f"right answers.")
    return "\n".join(lines) + "\n"
