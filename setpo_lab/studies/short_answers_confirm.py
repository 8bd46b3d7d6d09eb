"""The confirmatory test of the cure: does the gated answer key keep more right answers than GRPO on fresh seeds,
at no pass@1 cost, on the hard set and on kinds it never trained on? Decided by the plan committed before its first
run (results/short_answers/confirm/PLAN.md; docs/studies/short_answers.md, "The confirmatory test").

The stages, in order, each resumable (a finished piece is never redone):

- the plan: the record pins the plan's SHA-256 at its first run (``plan.json``) and refuses to run when the file
  differs (``_check_plan``);
- the held-out kinds: the base model on ``heldout_select_per_kind`` train prompts of each candidate kind
  (``heldout_selection/``), and the kinds the plan's rule keeps (``heldout_kinds.json``), before any training;
- the cure study's ``train`` and ``evaluate`` (``short_answers.run_study``): every (arm, seed) run, each model on the
  test prompts (``eval/``), the pass@k set (``eval_hard/``) and the kept held-out kinds (``eval_heldout/``);
- ``evaluate``, after the study's own evaluations: every model of the exploratory record (``EXPLORATORY_RECORD``, the cure study, the runs it reuses
  included) on the held-out kinds too, as the plan says (evaluation only): a model git keeps only as records is
  trained again first and must give its recorded weights bit for bit (``short_answers.train_run``), else it is
  refused and left out; ``eval_heldout/exploratory_<label>.json``;
- ``report``: the plan's reading (``confirm_reading``): ``results.json`` and ``results.md``.

    python -m setpo_lab run short_answers_confirm --preset confirm --out results/short_answers/confirm
    python -m setpo_lab run short_answers_confirm --preset confirm --out results/short_answers/confirm \\
        --rerun key_gated_s100
"""

from __future__ import annotations

import hashlib
import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path

from setpo.envs.short_answers import sample_tasks, task_from_id, text_after_answer
from setpo.metrics import hill_number, rarefied_distinct
from setpo.records import read_json, write_json
from setpo_lab.studies.arguments import StudyCommand, run_command
from setpo_lab.studies.intervals import fixed_sequence, holm, paired_bootstrap, paired_t_test, sign_flip_p, t_interval
from setpo_lab.studies.short_answers import (
    base_model_folder,
    evaluate_answers,
    rerun_status,
    run_study,
    train_run,
)
from setpo_lab.studies.short_answers_config import (
    REUSE_NEUTRAL_FIELDS,
    ConfirmStudyConfig,
    CureStudyConfig,
)
from setpo_lab.studies.stages import chosen_stages, claim_folder, print_flushed, refusal, write_report

PROG = ConfirmStudyConfig.COMMAND
#: the primary hypotheses in the plan's fixed sequence: name -> (metric, margin: H0 is mean d <= -margin)
SEQUENCE = {"H1": ("distinct_right", 0.0), "H2": ("pass@1", 0.05), "H4": ("hard_pass@n", 0.0),
            "H3": ("heldout_distinct_right", 0.0)}
#: the secondary family (the peers against GRPO on their seeds), Holm-corrected
SECONDARY = {"S1": ("fgrpo", "distinct_right", 0.0), "S2": ("obe_batch", "distinct_right", 0.0),
             "S3": ("fgrpo", "pass@1", 0.05), "S4": ("obe_batch", "pass@1", 0.05)}
ALPHA = 0.05
#: the smallest effect of interest of H1 and H3 (distinct right answers per prompt): below it, "refuted"
SMALLEST_EFFECT = 0.5
#: rarefied distinct right answers: among this many right samples of a prompt
RAREFY_TO = 8
#: the exploratory record whose models the plan evaluates on the held-out kinds too
EXPLORATORY_RECORD = "results/short_answers/cure"
#: the stages, in order: the short-answer study's (its evaluate also evaluates the exploratory models on the held-out
#: kinds)
STAGES = ("train", "evaluate", "report")


# ---- the plan, pinned ---------------------------------------------------------------------------------------------

def _check_plan(cfg: ConfirmStudyConfig) -> dict | None:
    """Pin the plan's SHA-256 in ``plan.json`` at the first run; refuse (naming the file and what to do) when the
    plan differs from the one pinned. None when the config names no plan."""
    if cfg.plan is None:
        return None
    plan = Path(cfg.plan)
    if not plan.is_file():
        raise refusal("is not there, and the study runs only under the plan it pins", plan,
                      "run from the repository's root, where results/short_answers/confirm/PLAN.md lives")
    now = {"plan": cfg.plan, "sha256": hashlib.sha256(plan.read_bytes()).hexdigest()}
    path = Path(cfg.run_dir) / "plan.json"
    if path.exists():
        pinned = read_json(path, "delete it only if no run was made under it")
        if pinned["sha256"] != now["sha256"]:
            raise refusal(f"pins the plan at SHA-256 {pinned['sha256'][:12]}…, but {cfg.plan} now hashes to "
                          f"{now['sha256'][:12]}…: a plan changed after the first run is a deviation", path,
                          "restore the pinned plan (git log -- " + cfg.plan + "), or write the change as a new "
                          "version of the plan in a new record folder and say so")
        return pinned
    write_json(path, now)
    return now


# ---- the held-out kinds, chosen on the base model's train split ---------------------------------------------------

def _select_heldout(cfg: ConfirmStudyConfig, embedder, log=print_flushed) -> dict:
    """Measure the base model on ``heldout_select_per_kind`` train prompts of each candidate kind (``eval_n``
    samples each) and keep the kinds the plan's rule admits; written to ``heldout_kinds.json`` (made once)."""
    path = Path(cfg.run_dir) / "heldout_kinds.json"
    if path.exists():
        return read_json(path, "delete it and rerun to measure the candidates again")
    base = base_model_folder(cfg.model_path)
    measured = {}
    for kind in cfg.heldout_candidates:
        tasks = sample_tasks([kind], "train", cfg.heldout_select_per_kind, seed=0)
        record = evaluate_answers(cfg, f"base_{kind}", base, embedder, log, tasks=tasks, folder="heldout_selection")
        right = [[task_from_id(t).is_right(a) for a in row] for t, row in zip(record["task_ids"], record["answers"],
                                                                              strict=True)]
        share = sum(map(sum, right)) / sum(map(len, right))
        distinct = statistics.mean(_per_prompt(record, "heldout_distinct_right"))  # every prompt of the kind
        kept = cfg.heldout_min_right <= share <= cfg.heldout_max_right and distinct >= cfg.heldout_min_distinct
        measured[kind] = {"right_share": share, "distinct_right": distinct, "kept": kept}
    kept = [k for k, m in measured.items() if m["kept"]]
    out = {"rule": {"prompts": cfg.heldout_select_per_kind, "samples": cfg.eval_n, "split": "train",
                    "right_share": [cfg.heldout_min_right, cfg.heldout_max_right],
                    "min_distinct_right": cfg.heldout_min_distinct},
           "candidates": measured, "kept": kept}
    write_json(path, out)
    log(f"held-out kinds kept: {', '.join(kept) or 'none'} " + ", ".join(
        f"{k}: right {m['right_share']:.2f}, distinct {m['distinct_right']:.1f}" for k, m in measured.items()))
    if len(kept) < 2 and cfg.plan is not None:
        raise refusal(f"keeps {len(kept)} held-out kind(s), and the plan needs at least 2", path,
                      "revise the plan's candidates before the first training run (the plan says so)")
    return out


# ---- the exploratory record's models on the held-out kinds ------------------------------------------------------

def _evaluate_exploratory(cfg: ConfirmStudyConfig, exploratory: str | Path, embedder, log=print_flushed) -> dict:
    """Every run of the exploratory record in ``exploratory`` (its ``config.json``: the runs it reuses from another
    folder too) on the held-out kinds, ``eval_n`` samples each, by the study's sampler and evaluation seed:
    ``eval_heldout/exploratory_<label>.json``. A model that is not here is trained again to its recorded weights
    first (``train_run``); one that comes back with other weights is refused (``RestoreMismatch``), logged and left
    out. Returns {label: evaluation} of those evaluated; {} when there is no record or no held-out kind."""
    from setpo_lab.studies.stages import RestoreMismatch

    config = Path(exploratory) / "config.json"
    heldout = cfg.heldout_tasks()
    if not config.is_file() or not heldout:
        why = f"no {config}" if not config.is_file() else "no held-out kind"
        log(f"[exploratory] nothing to evaluate ({why})")
        return {}
    cure = CureStudyConfig.from_record(read_json(config, "the exploratory record's config; restore it from git"))
    out = {}
    for label in cure.run_labels():
        name = f"exploratory_{label}"
        final = cure.run_folder(label) / "final"
        try:
            if not cfg.eval_path(name, "eval_heldout").exists():
                # the loaded embedder only if it is the one the record's runs name (else the trainer loads theirs)
                final = train_run(cure, label, embedder=embedder if cure.embedder == cfg.embedder else None, log=log)
            out[label] = evaluate_answers(cfg, name, final, embedder, log, tasks=heldout, n=cfg.eval_n,
                                          folder="eval_heldout")
        except RestoreMismatch as refused:
            log(f"[exploratory] {label} left out: {refused}")
    return out


# ---- the plan's reading -------------------------------------------------------------------------------------------

def _read(cfg: ConfirmStudyConfig, label: str, folder: str) -> Mapping | None:
    path = cfg.eval_path(label, folder)
    return read_json(path, f"delete {path} and rerun to evaluate {label} again") if path.exists() else None


def _modal_answer(answers: Sequence) -> int | None:
    """The most frequent numeric answer (ties: the smaller), None without one: the near-miss guesser's center."""
    counts = Counter(a for a in answers if a is not None)
    return min(counts, key=lambda a: (-counts[a], a)) if counts else None


def _near_miss_pass_at_k(center: int | None, answers: Sequence, target: int, k: int) -> float | None:
    """pass@k of a guesser that draws integers around ``center`` (GRPO's most frequent answer to the prompt, same
    seed) with the spread of an arm's own numeric ``answers`` to it: a normal of that standard deviation, rounded to
    the nearest integer, so one draw hits ``target`` with q = Φ((t − c + ½)/σ) − Φ((t − c − ½)/σ) and k draws with
    1 − (1 − q)^k. σ = 0 (one answer only) draws the center itself. None without a center or numeric answers. An
    arm whose pass@k is no higher than its guesser's sprays near GRPO's answer rather than knowing the target."""
    values = [a for a in answers if a is not None]
    if center is None or not values:
        return None
    mean = sum(values) / len(values)
    sigma = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    if sigma == 0:
        q = float(center == target)
    else:
        phi = lambda x: 0.5 * (1 + math.erf(x / math.sqrt(2)))  # noqa: E731 - the standard normal CDF
        q = phi((target - center + 0.5) / sigma) - phi((target - center - 0.5) / sigma)
    return 1.0 - (1.0 - q) ** k


def _distinct_near(answers: Sequence, target: int, within: int = 10) -> int:
    """Distinct numeric answers within ±``within`` of the target (what spraying near it produces)."""
    return len({a for a in answers if a is not None and abs(a - target) <= within})


def _plan_metrics(cfg: ConfirmStudyConfig, label: str, grpo_label: str | None = None) -> dict[str, float | None]:
    """One model's value of each metric of the plan, each the mean over its prompts (None where a set is missing)."""
    out: dict[str, float | None] = {}
    test = _read(cfg, label, "eval")
    if test is not None:
        tasks = [task_from_id(t) for t in test["task_ids"]]
        many = [(t, row) for t, row in zip(tasks, test["answers"], strict=True) if t.many_answers]
        rights = [[a for a in row if t.is_right(a)] for t, row in many]
        out["distinct_right"] = statistics.mean(len(set(r)) for r in rights)
        out["pass@1"] = statistics.mean(_per_prompt(test, "pass@1"))
        rarefied = [x for x in (rarefied_distinct(r, RAREFY_TO) for r in rights) if x is not None]
        out[f"rarefied_distinct_right@{RAREFY_TO}"] = statistics.mean(rarefied) if rarefied else None
        out[f"prompts_under_{RAREFY_TO}_right"] = len(rights) - len(rarefied)  # left out of the rarefied mean
        hill = [x for x in map(hill_number, rights) if x is not None]
        out["right_answer_hill"] = statistics.mean(hill) if hill else None
        texts = [x for row in test["texts"] for x in row]
        out["after_answer"] = sum(bool(text_after_answer(x)) for x in texts) / len(texts)
        out["length"] = sum(map(len, texts)) / len(texts)
    hard = _read(cfg, label, "eval_hard")
    if hard is not None:
        tasks = [task_from_id(t) for t in hard["task_ids"]]
        n = len(hard["answers"][0])
        out["hard_pass@n"] = statistics.mean(any(map(t.is_right, row)) for t, row in zip(tasks, hard["answers"]))
        out["hard_distinct_near"] = statistics.mean(_distinct_near(row, t.low)
                                                    for t, row in zip(tasks, hard["answers"]))
        grpo = _read(cfg, grpo_label, "eval_hard") if grpo_label else None
        if grpo is not None:
            guess = [_near_miss_pass_at_k(_modal_answer(g), row, t.low, n)
                     for t, row, g in zip(tasks, hard["answers"], grpo["answers"], strict=True)]
            guess = [g for g in guess if g is not None]
            out["hard_near_miss_guesser"] = statistics.mean(guess) if guess else None
    heldout = _read(cfg, label, "eval_heldout")
    if heldout is not None:
        out["heldout_distinct_right"] = statistics.mean(_per_prompt(heldout, "heldout_distinct_right"))
    return out


def _per_prompt(evaluation: Mapping, metric: str) -> list[float]:
    """One evaluation record's values of a tested metric, one per prompt it applies to (their mean is the model's
    value); "heldout_distinct_right": the distinct right answers of every prompt of the record."""
    rows = [(task_from_id(t), row) for t, row in zip(evaluation["task_ids"], evaluation["answers"], strict=True)]
    if metric == "pass@1":
        return [sum(map(t.is_right, row)) / len(row) for t, row in rows if not t.many_answers]
    if metric == "hard_pass@n":
        return [float(any(map(t.is_right, row))) for t, row in rows]
    return [len({a for a in row if t.is_right(a)}) for t, row in rows
            if t.many_answers or metric == "heldout_distinct_right"]


def _prompt_values(cfg: ConfirmStudyConfig, label: str, metric: str) -> list[float] | None:
    """One model's ``_per_prompt`` values of a tested metric, for the bootstrap the plan keeps as description; None
    where the evaluation is missing."""
    evaluation = _read(cfg, label, {"distinct_right": "eval", "pass@1": "eval", "hard_pass@n": "eval_hard",
                                    "heldout_distinct_right": "eval_heldout"}[metric])
    return None if evaluation is None else _per_prompt(evaluation, metric)


def _described(cfg: ConfirmStudyConfig, arm: str, metric: str, seeds: Sequence[int], d: list[float],
               test: dict) -> dict:
    """What the plan reports beside a test: the 90% t-interval of mean d (the test's own bound is its lower end),
    the exact sign-flip p and whether it agrees with the t-test at α, and the paired bootstrap over seeds ×
    prompts (the cure record's 95% interval; description)."""
    import numpy as np

    flip = sign_flip_p(d, margin=test["margin"]) if len(d) <= 20 else None
    values = {side: [_prompt_values(cfg, f"{side}_s{s}", metric) for s in seeds] for side in (arm, "grpo")}
    boot = paired_bootstrap(np.array(values[arm], dtype=float), np.array(values["grpo"], dtype=float))
    agrees = None if flip is None or math.isnan(test["p"]) else (flip < ALPHA) == (test["p"] < ALPHA)
    return {"ci90": t_interval(d, 0.90), "sign_flip_p": flip, "sign_flip_agrees": agrees,
            "bootstrap": {k: boot[k] for k in ("mean", "lo", "hi", "seeds", "prompts")}}


def _verdict(name: str, test: dict, tested: bool, ci90: list[float] | None) -> str:
    """The plan's words for one hypothesis: "refuted" where the 90% interval's upper end is below the smallest effect
    of interest, which the plan sets in distinct right answers (H1, H3) only."""
    if not tested:
        return "not tested (the sequence stopped before it)"
    if test["p"] < ALPHA:
        return "confirmed"
    if name in ("H1", "H3") and ci90 is not None and not math.isnan(ci90[1]) and ci90[1] < SMALLEST_EFFECT:
        return f"refuted (90% interval's upper end {ci90[1]:+.2f} below +{SMALLEST_EFFECT})"
    return "not confirmed"


def confirm_reading(cfg: ConfirmStudyConfig, exploratory_record: str | Path | None = None) -> dict:
    """Every model's metrics per seed, the primary hypotheses by the plan's fixed sequence (one-sided paired t over
    seeds, the exact sign-flip p beside it), the secondary family by Holm, and the reading in the plan's words.
    ``exploratory_record``: the exploratory record's folder, to say which of its models are not evaluated yet."""
    labels = cfg.run_labels()
    per_seed = {label: _plan_metrics(cfg, label, f"grpo_s{seed}") for label, (_, seed) in labels.items()}
    per_seed["base"] = _plan_metrics(cfg, "base")
    exploratory = {}
    for path in sorted((Path(cfg.run_dir) / "eval_heldout").glob("exploratory_*.json")):
        exploratory[path.stem.removeprefix("exploratory_")] = statistics.mean(_per_prompt(
            read_json(path, f"delete {path} and rerun --stages evaluate"), "heldout_distinct_right"))

    def diffs(arm: str, metric: str, seeds: Sequence[int]) -> list[float] | None:
        values = [(per_seed.get(f"{arm}_s{s}", {}).get(metric), per_seed.get(f"grpo_s{s}", {}).get(metric))
                  for s in seeds]
        return None if any(a is None or b is None for a, b in values) else [a - b for a, b in values]

    def tested(head: dict, arm: str, metric: str, margin: float, seeds: Sequence[int], missing: str) -> dict:
        """One hypothesis, ``arm`` against GRPO over ``seeds``: the record's entry (``head`` first) before its
        verdict; ``missing`` is its verdict where a run or an evaluation is missing."""
        d = diffs(arm, metric, seeds)
        if d is None:
            return {**head, "verdict": missing}
        test = paired_t_test(d, margin=margin)
        return {**head, "margin": margin, "differences": d, **test,
                **_described(cfg, arm, metric, seeds, d, {**test, "margin": margin})}

    primary = {name: tested({"metric": metric}, "key_gated", metric, margin, cfg.seeds,
                            "not measured (runs or evaluations missing)")
               for name, (metric, margin) in SEQUENCE.items()}
    for name, h in fixed_sequence({name: primary[name].get("p") for name in SEQUENCE}, ALPHA).items():
        if "p" in primary[name]:
            primary[name]["verdict"] = _verdict(name, primary[name], h["tested"], primary[name]["ci90"])
    secondary = {name: tested({"arm": arm, "metric": metric}, arm, metric, margin, cfg.peer_seeds, "not measured")
                 for name, (arm, metric, margin) in SECONDARY.items() if arm in cfg.arms}
    secondary_p = {name: h["p"] for name, h in secondary.items() if "p" in h}
    for name, h in holm(secondary_p, ALPHA).items():
        secondary[name].update(holm_adjusted=h["adjusted"], verdict="confirmed" if h["reject"] else "not confirmed")
    h1, h2 = primary["H1"].get("verdict"), primary["H2"].get("verdict")
    headline = ("the cure is confirmed on the trained kinds" if h1 == h2 == "confirmed"
                else "more right answers, but a pass@1 cost of up to 0.05 is not excluded" if h1 == "confirmed"
                else f"the cure is {h1} on the trained kinds")
    config = Path(exploratory_record) / "config.json" if exploratory_record is not None else None
    expected = (list(CureStudyConfig.from_record(read_json(config)).run_labels())
                if config is not None and config.is_file() else None)
    return {"per_seed": per_seed, "primary": primary, "secondary": secondary, "headline": headline,
            "exploratory_heldout_distinct_right": exploratory,
            "exploratory_record": None if expected is None else str(exploratory_record),
            "exploratory_not_evaluated": None if expected is None else [x for x in expected if x not in exploratory]}


def results_markdown(record: Mapping) -> str:
    lines = [f"# The confirmatory test: {record['headline']}", "", f"Made by `{record['command']}` under the plan "
             f"`{record['plan']['plan'] if record.get('plan') else '(none)'}`"
             + (f" (SHA-256 {record['plan']['sha256'][:12]}…)." if record.get("plan") else "."), "",
             "| hypothesis | metric | mean d [90% t-interval] | t | p (one-sided) | sign-flip p | bootstrap 95% "
             "(seeds × prompts) | verdict |", "|---|---|---|---|---|---|---|---|"]
    for family in ("primary", "secondary"):
        for name, h in record[family].items():
            if "p" not in h:
                lines.append(f"| {name} | {h['metric']} | – | – | – | – | – | {h['verdict']} |")
                continue
            lines.append(f"| {name} | {h.get('arm', 'key_gated')} − grpo, {h['metric']} | {_with_interval(h)} | "
                         f"{h['t']:.2f} | {_p_value(h['p'])} | {_number(h.get('sign_flip_p'), '{:.4f}')} | "
                         f"{_with_interval(h.get('bootstrap'), ('lo', 'hi'))} | {h['verdict']} |")
    lines += ["", *_decision_notes(record), *_cost_line(record.get("cost"))]
    lines += ["", "Every metric, each arm's mean over its seeds (description; `per_seed` in results.json holds each "
              "model's value):", ""]
    means = _arm_means(record["per_seed"])
    metrics = list(dict.fromkeys(m for values in means.values() for m in values if m != "seeds"))
    lines += ["| arm | seeds | " + " | ".join(metrics) + " |", "|---" * (len(metrics) + 2) + "|"]
    for arm, values in means.items():
        cells = ["–" if values.get(m) is None else f"{values[m]:.3f}" for m in metrics]
        lines.append(f"| {arm} | {values['seeds']} | " + " | ".join(cells) + " |")
    exploratory = record.get("exploratory_heldout_distinct_right") or {}
    if exploratory:
        by_arm = _arm_means({label: {"heldout_distinct_right": v} for label, v in exploratory.items()})
        lines += ["", "The exploratory record's models on the held-out kinds (evaluation only): distinct right answers "
                  "per held-out prompt, each arm's mean over its seeds (per model in results.json):", "",
                  "| arm | seeds | distinct right, held-out kinds |", "|---|---|---|"]
        lines += [f"| {arm} | {v['seeds']} | {v['heldout_distinct_right']:.3f} |" for arm, v in by_arm.items()]
    missing = record.get("exploratory_not_evaluated")
    if missing:
        lines += ["", f"Not evaluated yet: {len(missing)} of the exploratory record's {len(missing) + len(exploratory)} "
                  f"models ({', '.join(missing)}); the stage `evaluate` resumes with the record's command."]
    return "\n".join(lines) + "\n"


#: the plan's budget for the new runs and their evaluations, on 2 cores
BUDGET_HOURS = 6.0


def _cost(cfg: ConfirmStudyConfig) -> dict:
    """Where the record's time went, in hours of wall clock as each piece recorded it (``seconds`` of a training run's
    ``done.json`` and of each evaluation): the new runs' training, each evaluation set (the base model's included),
    the held-out kinds' choice, and the exploratory models' held-out evaluations (their retraining, when a model had
    to be made again, is not timed in this record)."""
    root = Path(cfg.run_dir)

    def hours(paths) -> float:
        return sum(read_json(p)["seconds"] for p in paths) / 3600

    sets = {"eval": "test set", "eval_hard": "hard set", "eval_heldout": "held-out kinds"}
    exploratory = sorted((root / "eval_heldout").glob("exploratory_*.json"))
    parts = {"training": hours(sorted((root / "train").glob("*/final/done.json"))),
             **{f"evaluation, {name}": hours(p for p in sorted((root / folder).glob("*.json")) if p not in exploratory)
                for folder, name in sets.items()},
             "choosing the held-out kinds": hours(sorted((root / "heldout_selection").glob("*.json")))}
    new = sum(parts.values())
    parts["the exploratory models on the held-out kinds"] = hours(exploratory)
    return {"hours": parts, "new_runs_hours": new, "budget_hours": BUDGET_HOURS,
            "runs": len(list((root / "train").glob("*/final/done.json")))}


def _cost_line(cost: Mapping | None) -> list[str]:
    if not cost:
        return []
    parts = "; ".join(f"{name} {h:.1f} h" for name, h in cost["hours"].items())
    over = cost["new_runs_hours"] - cost["budget_hours"]
    return ["", f"Cost, wall clock on 2 cores as each piece recorded it: {parts}. The {cost['runs']} new runs with "
            f"their evaluations took {cost['new_runs_hours']:.1f} h against the plan's {cost['budget_hours']:g} h "
            "budget" + (f" ({over:.1f} h over: reported, not cut, as the plan says)." if over > 0 else ".")
            + " Runs made while other work shared the machine took longer than they would alone."]


def _p_value(p: float) -> str:
    """A p-value to four decimals; one below 0.0001 as "< 0.0001" (0.0000 would read as p = 0)."""
    return "< 0.0001" if p < 0.0001 else _number(p, "{:.4f}")


def _number(x, fmt: str) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def _with_interval(h: Mapping | None, ends: tuple[str, str] | None = None) -> str:
    """``+1.234 [+0.567, +1.901]``: a mean and its interval (the 90% t-interval ``ci90``, or the keys ``ends``)."""
    if not h or h.get("mean") is None:
        return "–"
    lo, hi = (h.get("ci90") or [None, None]) if ends is None else (h.get(ends[0]), h.get(ends[1]))
    interval = f" [{_number(lo, '{:+.3f}')}, {_number(hi, '{:+.3f}')}]" if lo is not None else ""
    return f"{_number(h['mean'], '{:+.3f}')}{interval}"


def _decision_notes(record: Mapping) -> list[str]:
    """The rules the verdicts follow, and where the sign-flip test and the t-test disagree at α."""
    tested = {name: h for family in ("primary", "secondary") for name, h in record[family].items()
              if h.get("sign_flip_agrees") is not None}
    disagree = [name for name, h in tested.items() if not h["sign_flip_agrees"]]
    rules = (f"Primary: one-sided paired t over seeds, fixed sequence {' → '.join(SEQUENCE)} at α = {ALPHA} (each "
             "tested only if every one before it was confirmed); secondary: the same test, Holm over "
             f"{', '.join(SECONDARY)} at α = {ALPHA}. \"refuted\": the 90% t-interval's upper end below "
             f"+{SMALLEST_EFFECT} distinct right answers, the plan's smallest effect of interest, so H1 and H3 only. "
             "The bootstrap resamples seeds and prompts together (description, not a test).")
    agreement = (f"The exact sign-flip test disagrees with the t-test at α = {ALPHA} on {', '.join(disagree)}; the "
                 "t-test decides, as the plan says." if disagree else f"The exact sign-flip test agrees with the "
                 f"t-test at α = {ALPHA} on every hypothesis with a test ({len(tested)}).")
    return [rules, "", agreement]


def _arm_means(per_seed: Mapping[str, Mapping]) -> dict[str, dict]:
    """Each arm's mean of every metric over the seeds that have it ({arm: {"seeds": n, metric: mean or None}});
    labels are ``<arm>_s<seed>``, and "base" is an arm of one model."""
    arms: dict[str, list[Mapping]] = {}
    for label, values in per_seed.items():
        arms.setdefault(label.rsplit("_s", 1)[0] if label != "base" else "base", []).append(values)
    out = {}
    for arm, rows in arms.items():
        metrics = dict.fromkeys(m for row in rows for m in row)
        out[arm] = {"seeds": len(rows), **{m: (statistics.mean(v) if (v := [r[m] for r in rows
                                                                            if r.get(m) is not None]) else None)
                                           for m in metrics}}
    return out


def report(cfg: ConfirmStudyConfig, log=print_flushed, exploratory: str | Path | None = None) -> dict:
    record = {"command": cfg.command(), "plan": _check_plan(cfg), "config": asdict(cfg),
              **confirm_reading(cfg, exploratory), "cost": _cost(cfg)}
    write_report(cfg.run_dir, record, results_markdown(record))
    log(f"[report] {record['headline']}")
    return record


def _run_confirm(cfg: ConfirmStudyConfig, stages: Sequence[str] | str | None = None, *, log=print_flushed,
                 exploratory: str | Path | None = None) -> dict:
    """The plan pinned, the held-out kinds chosen, then the study's stages (``run_study``), the models of the
    exploratory record in ``exploratory`` on the held-out kinds (``_evaluate_exploratory``; None: none, the
    command's ``--preset confirm`` gives ``EXPLORATORY_RECORD``) and the plan's reading."""
    from setpo.embed import load_embedder

    chosen = chosen_stages(stages, STAGES)
    claim_folder(cfg.run_dir, asdict(cfg), REUSE_NEUTRAL_FIELDS, record="config.json", results=cfg.RESULTS,
                 remedy="use another --out, or delete that folder and rerun")
    _check_plan(cfg)
    embedder = load_embedder(cfg.embedder) if cfg.heldout_candidates or "evaluate" in chosen else None
    if cfg.heldout_candidates:
        _select_heldout(cfg, embedder, log)
    study = [s for s in chosen if s in ("train", "evaluate")]
    if study:
        run_study(cfg, study, log=log)
    if "evaluate" in chosen and exploratory is not None:
        _evaluate_exploratory(cfg, exploratory, embedder, log)
    return report(cfg, log, exploratory) if "report" in chosen else {}


def _run(cfg: ConfirmStudyConfig, stages: Sequence[str], args) -> int:
    if args.rerun:
        return rerun_status(cfg, args.rerun)
    # the committed study evaluates the committed exploratory record's models; a smoke run evaluates none
    record = _run_confirm(cfg, stages, exploratory=EXPLORATORY_RECORD if args.preset in (None, "confirm") else None)
    if record:
        print(results_markdown(record), flush=True)
    return 0


#: ``python -m setpo_lab run short_answers_confirm --preset confirm --out DIR``
COMMAND = StudyCommand("short_answers_confirm", ConfirmStudyConfig.presets(), STAGES, _run, default_preset="confirm",
                       fields=frozenset(ConfirmStudyConfig.__dataclass_fields__), options=("model_path", "rerun"),
                       doc=__doc__)

if __name__ == "__main__":
    raise SystemExit(run_command(COMMAND))
