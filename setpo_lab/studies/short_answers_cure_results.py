"""The extended short-answer study's report: per-prompt metrics that do not use SetPO's kernel, paired bootstrap
intervals over seeds and prompts, a guessing baseline beside pass@k, and a reading written by rule.

Per model and test prompt (``eval/<label>.json``), on the many-answer prompts: ``distinct_right`` and
``distinct_all`` (distinct parsed answers, right and all), ``answer_entropy`` (Shannon entropy, in nats, of the
parsed answers; no-answer samples left out); on the one-answer prompts ``pass@1``; on every prompt
``after_answer`` (share of samples with text after the answer line), ``length`` (characters of a completion),
``similarity`` (within-prompt similarity of whole completions, the study's embedder, as recorded) and
``answer_similarity`` (the same on the answer lines alone, by MiniLM, to ``SIMILARITY_DECIMALS``). On the pass@k prompts
(``eval_hard/<label>.json``): pass@k, k = 1, 2, 4, …, hard_n, and the guessing baseline: a guesser that draws i.i.d.
from the base model's pooled answers to every prompt of the same kind is right with probability q (the share of
the pool that is this prompt's answer), so its pass@k is 1 − (1 − q)^k.

A comparison (an arm minus GRPO, or minus the base model) is a paired bootstrap (``paired_bootstrap``):
seeds and prompts are resampled together for both sides, and the 95% interval is the 2.5 and 97.5 percentiles of
the resampled mean difference; a mean of values inside a metric's range stays inside it. Every comparison reported
is counted (``comparisons``); the intervals are 95% each, not corrected for their number, which the tables say.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np

from setpo.envs.short_answers import task_from_id, text_after_answer
from setpo.metrics import answer_entropy, pass_at_k
from setpo.records import read_json
from setpo_lab.studies.figures import powers_of_two
from setpo_lab.studies.intervals import RESAMPLES, interval_side, interval_text, paired_bootstrap
from setpo_lab.studies.short_answers_config import CureStudyConfig
from setpo_lab.studies.short_answers_results import training_series
from setpo_lab.studies.stages import print_flushed, write_report

#: per-prompt metrics: key -> (name, which prompts: "many" | "one" | "all", format)
METRICS = {"distinct_right": ("distinct right answers / many-answer prompt", "many", "{:.2f}"),
           "distinct_all": ("distinct answers / many-answer prompt", "many", "{:.2f}"),
           "answer_entropy": ("answer entropy (nats) / many-answer prompt", "many", "{:.2f}"),
           "pass@1": ("pass@1 (one-answer)", "one", "{:.3f}"),
           "after_answer": ("samples with text after the answer line", "all", "{:.3f}"),
           "length": ("completion length (characters)", "all", "{:.1f}"),
           "similarity": ("within-prompt similarity, whole completions", "all", "{:.3f}"),
           "answer_similarity": ("within-prompt similarity, answer lines (MiniLM)", "all", "{:.3f}")}


#: decimals kept of a prompt's answer-line similarity: MiniLM's kernels give other last bits on another processor
#: (AVX2 against AVX-512, ~1e-9), which made a report remade elsewhere differ from the committed one; four decimals
#: (the tables print three) give the same record on any machine but at a rounding tie, ~3e-5 per value
SIMILARITY_DECIMALS = 4


def _answer_similarity(answers: Sequence, embedder) -> float | None:
    from setpo.metrics import mean_pairwise_similarity

    lines = [f"Answer: {a}" for a in answers if a is not None]
    return round(mean_pairwise_similarity(embedder(lines)), SIMILARITY_DECIMALS) if len(lines) > 1 else None


def _prompt_metrics(evaluation: Mapping, embedder) -> dict[str, list]:
    """Each metric of ``METRICS`` per prompt of one evaluation (None where it does not apply)."""
    tasks = [task_from_id(t) for t in evaluation["task_ids"]]
    out: dict[str, list] = {key: [] for key in METRICS}
    for task, answers, texts, sim in zip(tasks, evaluation["answers"], evaluation["texts"],
                                         evaluation["similarity"], strict=True):
        n, many = len(answers), task.many_answers
        right = [task.is_right(a) for a in answers]
        out["distinct_right"].append(len({a for a, ok in zip(answers, right) if ok}) if many else None)
        out["distinct_all"].append(len({a for a in answers if a is not None}) if many else None)
        out["answer_entropy"].append(answer_entropy(answers) if many else None)
        out["pass@1"].append(None if many else sum(right) / n)
        out["after_answer"].append(sum(bool(text_after_answer(t)) for t in texts) / n)
        out["length"].append(sum(len(t) for t in texts) / n)
        out["similarity"].append(sim)
        out["answer_similarity"].append(_answer_similarity(answers, embedder))
    return out


def _hard_pass_at_k(evaluation: Mapping) -> dict[int, list[float]]:
    """k -> pass@k of each pass@k prompt (unbiased, from the evaluation's samples)."""
    tasks = [task_from_id(t) for t in evaluation["task_ids"]]
    n = len(evaluation["answers"][0])
    right = [sum(t.is_right(a) for a in row) for t, row in zip(tasks, evaluation["answers"], strict=True)]
    return {k: [pass_at_k(n, c, k) for c in right] for k in powers_of_two(n)}


def _guessing_pass_at_k(base: Mapping, ks: Sequence[int]) -> dict[int, list[float]]:
    """k -> the guessing baseline's pass@k per prompt (module docstring), from the base model's evaluation."""
    tasks = [task_from_id(t) for t in base["task_ids"]]
    pools: dict[str, Counter] = {}
    for task, row in zip(tasks, base["answers"], strict=True):
        pools.setdefault(task.kind, Counter()).update(a for a in row if a is not None)
    shares = [pools[t.kind][t.low] / max(1, sum(pools[t.kind].values())) for t in tasks]  # q of each prompt
    return {k: [1.0 - (1.0 - q) ** k for q in shares] for k in ks}


# ---- metrics the gated kernel does not pay for directly (the confirmatory plan, results/short_answers/confirm) ----


def _nanmean(x: np.ndarray) -> float:
    """The mean of the values that apply (NaN: none does, e.g. a many-answer metric without such prompts)."""
    x = x[~np.isnan(x)]
    return float(x.mean()) if x.size else float("nan")


def _matrix(per_label: Mapping[str, Mapping[str, list]], labels: Sequence[str], key: str) -> np.ndarray:
    return np.array([[np.nan if v is None else v for v in per_label[label][key]] for label in labels], dtype=float)


def report(cfg: CureStudyConfig, log=print_flushed) -> dict:
    """Read every evaluation and run, write ``results.json`` and ``results.md``; returns the record."""
    from setpo.embed import load_embedder

    minilm = load_embedder("default")
    labels = cfg.run_labels()
    methods = list(cfg.methods())
    by_method = {m: [label for label, (mm, _) in labels.items() if mm == m] for m in methods}
    per_prompt = {label: _prompt_metrics(read_json(cfg.eval_path(label), "run the evaluate stage"), minilm)
                  for label in ["base", *labels]}
    grpo = next((m for m in methods if cfg.arm_of(m) == "grpo"), None)
    comparisons = [{"metric": key, "a": m, "b": other,
                    **paired_bootstrap(_matrix(per_prompt, by_method[m], key),
                                       _matrix(per_prompt, ["base"] if other == "base" else by_method[other], key))}
                   for m in methods for other in ([grpo] if grpo and m != grpo else []) + ["base"] for key in METRICS]

    def means_of(group: Sequence[str]) -> dict[str, float]:
        return {key: _nanmean(_matrix(per_prompt, group, key)) for key in METRICS}

    means = {**{m: means_of(by_method[m]) for m in methods}, "base model": means_of(["base"])}
    hard = _hard(cfg, by_method)
    if hard:
        comparisons += hard.pop("comparisons")
    runs = {label: training_series(cfg.run_folder(label)) for label in labels}
    record = {"config": json.loads(json.dumps(asdict(cfg))), "command": cfg.command(), "means": means,
              "per_seed": {label: means_of([label]) for label in labels},
              "comparisons": comparisons, "hard": hard, "runs": runs, "reading": None}
    record["reading"] = cure_reading(record)
    if cfg.lam_grid:
        record["pilot_choice"] = _pilot_choice(record, cfg)
        record["reading"] += "- Pilot's λ per arm (most distinct right answers at a pass@1 within 0.05 of GRPO's): " \
            + ", ".join(f"{a}: {lam if lam is not None else 'none qualifies'}"
                        for a, lam in record["pilot_choice"].items()) + ".\n"
    log(f"report: {write_report(cfg.run_dir, record, results_markdown(record))} and results.json")
    return record


def _hard(cfg: CureStudyConfig, by_method: Mapping[str, list[str]]) -> dict:
    """pass@k on the pass@k prompts: per method (mean over seeds and prompts), the base model, the guesser, and
    each method's pass@k_max against GRPO and the base model."""
    folder = Path(cfg.run_dir) / "eval_hard"
    if not cfg.hard_kinds or not (folder / "base.json").exists():
        return {}
    base = read_json(folder / "base.json", "run the evaluate stage")
    base_k = _hard_pass_at_k(base)
    ks = list(base_k)
    guess = _guessing_pass_at_k(base, ks)
    curves = {"base model": {k: float(np.mean(v)) for k, v in base_k.items()},
              "guessing": {k: float(np.mean(v)) for k, v in guess.items()}}
    per_method = {}
    for m, labels in by_method.items():
        rows = [_hard_pass_at_k(read_json(folder / f"{label}.json", "run the evaluate stage")) for label in labels
                if (folder / f"{label}.json").exists()]
        if rows:
            per_method[m] = rows
            curves[m] = {k: float(np.mean([r[k] for r in rows])) for k in ks}
    k_max = ks[-1]
    grpo = next((m for m in per_method if cfg.arm_of(m) == "grpo"), None)
    at_max = {m: np.array([r[k_max] for r in rows]) for m, rows in per_method.items()}  # seeds × prompts
    others = {**({grpo: at_max[grpo]} if grpo else {}), "base": np.array([base_k[k_max]]),
              "guessing": np.array([guess[k_max]])}
    # GRPO only where its seeds match the method's; the base model and the guesser (one row each) against any
    comparisons = [{"metric": f"pass@{k_max} (pass@k prompts)", "a": m, "b": other, **paired_bootstrap(a, b)}
                   for m, a in at_max.items() for other, b in others.items()
                   if other != m and (len(b) == 1 or b.shape == a.shape)]
    return {"k": ks, "curves": curves, "prompts": len(base["task_ids"]), "n": len(base["answers"][0]),
            "comparisons": comparisons}


def _find(record: Mapping, metric: str, a: str, b: str) -> Mapping | None:
    return next((c for c in record["comparisons"] if c["metric"] == metric and c["a"] == a and c["b"] == b), None)


def cure_reading(record: Mapping) -> str:
    """The outcome, by rule: for each arm other than GRPO, whether it keeps more distinct right answers than
    GRPO (interval above 0; fewer: below 0) at a pass@1 within 0.05 of GRPO's (interval's lower end ≥ −0.05), and where its
    pass@k_max lands against GRPO, the base model and the guesser."""
    methods = [m for m in record["means"] if m != "base model"]
    grpo = next((m for m in methods if m.startswith("GRPO")), None)
    if grpo is None:
        return "- No GRPO arm: nothing to compare against.\n"
    lines = []
    for m in methods:
        if m == grpo:
            continue
        d, p = _find(record, "distinct_right", m, grpo), _find(record, "pass@1", m, grpo)
        if d is None or p is None or d["mean"] is None or p["mean"] is None:
            continue
        more, fewer, within = d["lo"] > 0, d["hi"] < 0, p["lo"] >= -0.05
        verdict = ("keeps more right answers at a pass@1 within 0.05 of GRPO's." if more and within else
                   "keeps more distinct right answers (interval above 0), but its pass@1 is not shown to be within "
                   "0.05 of GRPO's (its interval reaches below −0.05)." if more else
                   ("keeps fewer distinct right answers (interval below 0)" if fewer else
                    "does not keep detectably more distinct right answers (its interval reaches 0)")
                   + ("." if within else ", and its pass@1 is not shown to be within 0.05 of GRPO's."))
        lines.append(f"- **{m}** vs {grpo}: distinct right answers {interval_text(d, '{:+.2f}')}, "
                     f"pass@1 {interval_text(p)}: {verdict}")
    for c in record["comparisons"]:
        if c["metric"].startswith("pass@") and "pass@k prompts" in c["metric"]:
            side = {"above 0": "above", "below 0": "below"}.get(interval_side(c), "not apart from") \
                if c["mean"] is not None else "–"
            lines.append(f"- {c['metric']}: {c['a']} − {c['b']} {interval_text(c)} ({side} 0).")
    lines.append(f"- {len(record['comparisons'])} comparisons, each with its own 95% interval (paired bootstrap over "
                 f"seeds and prompts, {RESAMPLES} resamples); not corrected for their number: expect about one in "
                 f"twenty to exclude 0 by chance.")
    return "\n".join(lines) + "\n"


def _pilot_choice(record: Mapping, cfg: CureStudyConfig, tolerance: float = 0.05) -> dict[str, float | None]:
    """The pilot's λ for each arm with a λ grid: the λ whose run keeps the most distinct right answers among
    those whose pass@1 is within ``tolerance`` of GRPO's (on the pilot's validation prompts); None when no λ
    qualifies (then the arm's λ needs another look, not a default)."""
    grpo = next(m for m in record["means"] if m != "base model" and cfg.arm_of(m) == "grpo")
    out: dict[str, float | None] = {}
    for arm, lam in cfg.arm_lams():
        if arm == "grpo":
            continue
        m = record["means"][cfg.method_name(arm, lam)]
        if m["pass@1"] >= record["means"][grpo]["pass@1"] - tolerance:
            best = out.get(arm)
            if best is None or m["distinct_right"] > record["means"][cfg.method_name(arm, best)]["distinct_right"]:
                out[arm] = lam
        else:
            out.setdefault(arm, None)
    return out


def arms_training_figure(record: Mapping):
    """Every arm's training curves from the record (``short_answers_results.training_figure``): reward, distinct
    right answers per probe prompt (the real-model Figure 1), within-group similarity (as each run logged it: under
    its own kernel, so not comparable across arms) and completion length."""
    from setpo_lab.studies.short_answers_results import training_figure as curves

    return curves(CureStudyConfig.from_record(record["config"]), record, title="every arm",
                  similarity="within-group similarity (each arm's own kernel)")


def hard_pass_at_k_figure(record: Mapping):
    """pass@k on the harder one-answer prompts: the base model (dotted), the guesser (dashed) and each arm (the
    mean over its seeds); None when the record has no pass@k prompts."""
    from setpo_lab.studies.figures import pass_at_k_curves, run_colour

    hard = record.get("hard") or {}
    if not hard:
        return None
    ks = [int(k) for k in hard["k"]]
    methods = [m for m in record["means"] if m != "base model"]  # each arm keeps its training figure's colour
    lines = []
    for name, curve in hard["curves"].items():
        style = {"base model": {"color": "#555555", "dash": "dot"}, "guessing": {"color": "#000000", "dash": "dash"}
                 }.get(name) or {"color": run_colour(methods.index(name))}
        lines.append({"x": ks, "y": [curve[str(k)] if str(k) in curve else curve[k] for k in ks],
                      "name": "guessing from the base model's answers" if name == "guessing" else name, **style})
    return pass_at_k_curves([{"title": f"{hard['prompts']} harder one-answer test prompts × {hard['n']} samples",
                              "lines": lines}], max(ks),
                            title="pass@k where there is room to move: base model, guesser and every arm")


def results_markdown(record: Mapping) -> str:
    """The means per method, every comparison with its interval, and the reading."""
    cfg = record["config"]
    methods = list(record["means"])
    lines = [f"Short-answer study, extended: {len(cfg['seeds'])} paired seeds, {cfg['steps']} steps of "
             f"{cfg['prompts_per_step']} prompts × G = {cfg['group_size']}, λ in units of the term's spread "
             f"({cfg['lam_units']}). Made by `{record['command']}`.", "",
             "| metric | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]
    for key, (name, _, fmt) in METRICS.items():
        lines.append(f"| {name} | " + " | ".join(fmt.format(record["means"][m][key])
                                                 if not math.isnan(record["means"][m][key]) else "–"
                                                 for m in methods) + " |")
    hard = record.get("hard") or {}
    if hard:
        names = list(hard["curves"])
        lines += ["", f"pass@k on {hard['prompts']} harder one-answer test prompts × {hard['n']} samples "
                      f"(the guesser draws from the base model's pooled answers of the prompt's kind):", "",
                  "| k | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        for k in hard["k"]:
            lines.append(f"| {k} | " + " | ".join(f"{c[str(k)] if str(k) in c else c[k]:.3f}"
                                                  for c in hard["curves"].values()) + " |")
    lines += ["", "| comparison | mean [95% interval] | seeds × prompts |", "|---|---|---|"]
    for c in record["comparisons"]:
        name = METRICS[c["metric"]][0] if c["metric"] in METRICS else c["metric"]
        lines.append(f"| {name}: {c['a']} − {c['b']} | {interval_text(c)} | {c['seeds']} × {c['prompts']} |")
    lines += ["", record["reading"]]
    return "\n".join(lines) + "\n"
