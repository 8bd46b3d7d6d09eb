"""What a finished Countdown study's record says on the study's questions, decided by fixed rules from its numbers
(``verdict``), so that the docs and notebook 03 state conclusions the record can check. Where each row came from
and whether two studies made the same thing is ``setpo_lab.repro.agreement``; ``countdown_results`` writes the
record and its tables."""


from __future__ import annotations

import statistics
from typing import Mapping

from setpo_lab.repro.agreement import identical_text
from setpo_lab.studies.intervals import interval_side, interval_text

# --------------------------------------------------------------------------------------------------
# What the record says: the study's questions answered by fixed rules from its numbers
# --------------------------------------------------------------------------------------------------


def in_main_cell(row: dict, cfg) -> bool:
    """Whether a record row's run has the main cell's G and β; cfg: the config or its record (a dict). The warm
    start's row (no G) is in no cell."""
    g, beta = ((cfg["main_group_size"], cfg["main_beta"]) if isinstance(cfg, Mapping)
               else (cfg.main_group_size, cfg.main_beta))
    return row["G"] == g and row["beta"] == beta


def ci_text(d: dict, scale: float = 100.0, digits: int = 1) -> str:
    """A mean with its 95% interval, as points (``scale``): "+1.2 [+0.3, +2.1]", or "+1.2 (1 seed)"."""
    return interval_text(d, f"{{:+.{digits}f}}", scale=scale, alone=" (1 seed)")


PASS1_LOSS_BAR = 0.02  # the headline's bar: its pass@n interval above 0 with a mean pass@1 loss ≤ 2 points


def _headline_bar(head: dict | None) -> bool | None:
    """Whether a headline (chosen SetPO+GRPO − GRPO, a ``paired`` entry) meets the study's bar: pass@n interval
    above 0 and mean pass@1 at most ``PASS1_LOSS_BAR`` below GRPO's (None: no headline or no interval)."""
    if head is None or interval_side(head["passn"]) is None:
        return None
    return interval_side(head["passn"]) == "above 0" and head["pass1"]["mean"] >= -PASS1_LOSS_BAR


def verdict(summary: dict) -> list[dict]:
    """What the record says on each of the study's questions, decided by fixed rules from its numbers, so that
    the docs and notebook 03 state conclusions the record can check: [{"question", "answer", "holds", "evidence"}]
    (holds: True / False, or None where the record cannot tell). The questions: the headline against the bar;
    width and average modes (interval above 0); the grid (holds: every other cell's pass@n interval above 0;
    fails: any below 0); the perfect-kernel ceiling (how much of its pass@n gain the chosen embedder reaches;
    whether its mean pass@n gets back to the warm start's); SetPO against each baseline (better / worse: the
    paired interval above / below 0, else not separable); and whether the replication agrees (both studies
    meet the bar or both miss it, with the same sign of the pass@n effect); and whether one processor made the
    whole record (``machines``: holds when every row was trained and evaluated by the same one)."""
    n = str(summary["config"]["eval_samples"])
    head = next((p for p in summary["paired"] if p["primary"]), None)
    out = []

    def add(question, answer, holds, evidence):
        out.append({"question": question, "answer": answer, "holds": holds, "evidence": evidence})

    def diff_text(d: dict) -> str:
        return (f"Δ pass@1 {ci_text(d['pass1'])}, Δ pass@{n} {ci_text(d['passn'])}, "
                f"Δ avg modes {ci_text(d['avg_modes'], 1.0, 2)}, Δ width {ci_text(d['width'], 1.0, 1)} ({len(d['seeds'])} seeds)")

    if head is not None:
        bar = _headline_bar(head)
        add(f"Does the chosen SetPO+GRPO beat GRPO at pass@{n} in the main cell (interval above 0, pass@1 loss ≤ "
            f"{100 * PASS1_LOSS_BAR:.0f} points)?",
            "yes" if bar else "no" if bar is False else "cannot tell", bar,
            f"{head['variant']} − GRPO, T = 1: {diff_text(head)}")
        for key, label in (("width", "diversity width"), ("avg_modes", "average modes")):
            side = interval_side(head[key]) or "no interval"
            add(f"Does it keep more distinct solutions ({label})?", side, {"above 0": True, "below 0": False}.get(side),
                f"Δ {label} {ci_text(head[key], 1.0, 2 if key == 'avg_modes' else 1)}")
    main_cell = (summary["config"]["main_group_size"], summary["config"]["main_beta"])
    grid = [c for c in summary.get("grid", []) if (c["G"], c["beta"]) != main_cell or c["T"] != 1.0]
    if grid:
        sides = [(interval_side(c["difference"]["passn"]) or "no interval") for c in grid]
        positive = sum(c["difference"]["passn"]["mean"] > 0 for c in grid)
        add(f"Does the pass@{n} effect hold over the grid (the other G, β, T)?",
            f"mean above 0 in {positive} of {len(grid)} cells, interval above 0 in {sides.count('above 0')}, "
            f"below 0 in {sides.count('below 0')}",
            True if sides.count("above 0") == len(grid) else False if "below 0" in sides else None,
            "; ".join(f"G={c['G']}, β={c['beta']:g}, T={c['T']:g}: Δ pass@{n} {ci_text(c['difference']['passn'])}"
                      for c in grid))
    versus = {v["role"]: v for v in summary.get("versus", [])}
    ceiling = next((p for p in summary["paired"] if p.get("role") == "ceiling"), None)
    sft = next((r for r in summary["runs"] if r["name"] == "sft" and r["T"] == 1.0), None)
    if ceiling is not None and head is not None:
        # On the ceiling's own seeds: the headline may have more (headline_seeds), and another seed set would
        # compare two different samples. chosen − GRPO there = (chosen − ceiling) + (ceiling − GRPO).
        same = "ceiling" in versus and versus["ceiling"]["seeds"] == ceiling["seeds"]
        gain = versus["ceiling"]["passn"]["mean"] + ceiling["passn"]["mean"] if same else head["passn"]["mean"]
        reach = gain / ceiling["passn"]["mean"] if ceiling["passn"]["mean"] > 0 else None
        ceiling_passn = statistics.mean(r["pass_at_k"][n] for r in summary["runs"] if r.get("role") == "ceiling"
                                        and r["T"] == 1.0 and in_main_cell(r, summary["config"]))
        add("How much of the perfect kernel's effect does the chosen embedder reach?",
            "-" if reach is None else f"{100 * reach:.0f}% of its pass@{n} gain over GRPO"
            + (f" (on its {len(ceiling['seeds'])} seeds)" if same else ""), None,
            f"ceiling ({ceiling['variant']}) − GRPO: Δ pass@{n} {ci_text(ceiling['passn'])}; chosen − GRPO: "
            f"{ci_text(head['passn'])}"
            + (f"; chosen − ceiling: {ci_text(versus['ceiling']['passn'])}" if "ceiling" in versus else ""))
        if sft is not None:
            back = ceiling_passn >= sft["pass_at_k"][n]
            add(f"Does the perfect kernel bring SetPO+GRPO back to the warm start's pass@{n}?", "yes" if back else "no",
                back,
                f"ceiling pass@{n} {ceiling_passn:.3f} (mean over seeds), warm start {sft['pass_at_k'][n]:.3f}")
    for role, name in (("pairwise", "the pairwise penalty"), ("dra", "DRA-GRPO"), ("passk", "Pass@k training"),
                       ("paper", "the paper-faithful setting")):
        v = versus.get(role)
        if v is not None:
            side = interval_side(v["passn"]) or "no interval"
            add(f"Chosen SetPO+GRPO against {name} ({v['baseline']}) at pass@{n}?",
                {"above 0": "better", "below 0": "worse"}.get(side, "not separable"),
                {"above 0": True, "below 0": False}.get(side), f"chosen − {v['baseline']}: {diff_text(v)}")
    agreement = summary.get("agreement")
    if agreement:
        heads = {k: a["headline"] for k, a in agreement.items()}
        bars = {k: _headline_bar(h) for k, h in heads.items()}
        signs = {k: None if h is None else h["passn"]["mean"] > 0 for k, h in heads.items()}
        agree = None if None in bars.values() else len(set(bars.values())) == 1 and len(set(signs.values())) == 1
        add("Does the replication (the whole study at another thread count) agree?",
            "yes" if agree else "no" if agree is False else "cannot tell", agree,
            "; ".join(f"{k} ({a['threads']} thread(s), chosen {a['chosen']}): "
                      + ("-" if a["headline"] is None else f"Δ pass@1 {ci_text(a['headline']['pass1'])}, Δ pass@{n} "
                         f"{ci_text(a['headline']['passn'])}, bar {'met' if bars[k] else 'not met'}")
                      for k, a in agreement.items()) + identical_text(summary.get("identical")))
    machines = summary.get("machines")
    if machines:
        made = sorted(set(machines["trained"]) | set(machines["evaluated"]))
        add("Was the record made on one processor (one machine's kernels; another's give other weights in the last "
            "bits)?", "yes" if len(made) == 1 else f"no: {len(made)}", len(made) == 1,
            f"trained: {', '.join(f'{m} ({n} rows)' for m, n in machines['trained'].items())}; evaluated: "
            + ", ".join(f"{m} ({n} rows)" for m, n in machines["evaluated"].items()))
    return out


def verdict_markdown(summary: dict) -> list[str]:
    """``verdict`` as a table: question, answer, evidence."""
    rows = verdict(summary)
    if not rows:
        return []
    return (["What the record says (the study's questions, decided by `countdown_results.verdict`'s fixed rules):", "",
             "| question | answer | evidence |", "|---|---|---|"]
            + [f"| {v['question']} | {v['answer']} | {v['evidence']} |" for v in rows] + [""])
