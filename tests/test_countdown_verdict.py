"""countdown_results.verdict: the study's questions answered from the record by fixed rules (the headline's bar,
the grid, the ceiling, the baselines, the replication), on hand-made records whose answers are known."""

import pytest

from setpo_lab.studies import countdown_verdict
from setpo_lab.studies.countdown_verdict import verdict, verdict_markdown


def ci(mean, half=None, n=5):
    return {"mean": mean, "lo": None if half is None else mean - half, "hi": None if half is None else mean + half,
            "n": n}


def diff(passn, pass1=(0.0, 0.01), width=(5.0, 2.0), modes=(0.1, 0.05), seeds=5):
    return {"seeds": list(range(seeds)), "pass1": ci(*pass1, seeds), "passn": ci(*passn, seeds),
            "avg_modes": ci(*modes, seeds), "width": ci(*width, seeds)}


def record(head=(0.05, 0.02), pass1=(-0.01, 0.01), grid=((0.04, 0.02), (0.03, 0.02)), ceiling=(0.10, 0.03),
           versus=None, agreement=None):
    cfg = {"eval_samples": 64, "main_group_size": 7, "main_beta": 0.001, "n_test": 400, "eval_top_p": 0.9,
           "threads": 2}
    row = lambda name, role, passn: {"name": name, "role": role, "T": 1.0, "G": 7 if role else None,  # noqa: E731
                                     "beta": 0.001 if role else None, "pass_at_k": {"64": passn}, "seed": 0}
    summary = {"config": cfg, "chosen": "SetPO", "runs": [row("sft", None, 0.76), row("c0", "ceiling", 0.70)],
               "paired": [{"variant": "SetPO", "primary": True, "role": "setpo", **diff(head, pass1)},
                          {"variant": "ceiling", "primary": False, "role": "ceiling", **diff(ceiling)}],
               "grid": [{"G": 3, "beta": 0.005, "T": t, "difference": diff(g, seeds=3)}
                        for t, g in zip((0.5, 1.0), grid, strict=True)],
               "versus": versus or [], "selection": None, "diagnostics": {}}
    if agreement is not None:
        summary["agreement"] = agreement
    return summary


def answers(summary):
    return {v["question"].split(" (")[0].split("?")[0]: v["holds"] for v in verdict(summary)}


def test_the_headline_bar_needs_the_interval_above_zero_and_at_most_two_points_of_pass1():
    bar = countdown_verdict._headline_bar
    assert bar({"passn": ci(0.05, 0.02), "pass1": ci(-0.019, 0.01)}) is True
    assert bar({"passn": ci(0.05, 0.02), "pass1": ci(-0.021, 0.01)}) is False  # too much pass@1 lost
    assert bar({"passn": ci(0.01, 0.02), "pass1": ci(0.0, 0.01)}) is False  # interval spans 0
    assert bar({"passn": ci(0.05), "pass1": ci(0.0)}) is None  # one seed: no interval
    assert bar(None) is None


def test_a_clear_positive_record_answers_yes_everywhere():
    got = answers(record())
    assert got["Does the chosen SetPO+GRPO beat GRPO at pass@64 in the main cell"] is True
    assert got["Does it keep more distinct solutions"] is True
    assert got["Does the pass@64 effect hold over the grid"] is True
    assert got["Does the perfect kernel bring SetPO+GRPO back to the warm start's pass@64"] is False  # 0.70 < 0.76
    reach = next(v for v in verdict(record()) if v["question"].startswith("How much"))
    assert reach["answer"].startswith("50%")  # 5 of the ceiling's 10 points


def test_the_ceilings_reach_is_measured_on_the_ceilings_own_seeds():
    """The headline may run on more seeds than the ceiling (headline_seeds); the share it reaches is taken on
    the seeds both have: chosen − GRPO there is (chosen − ceiling) + (ceiling − GRPO) = −0.03 + 0.10."""
    summary = record(head=(0.02, 0.01), versus=[{"role": "ceiling", "baseline": "ceiling", **diff((-0.03, 0.02))}])
    summary["paired"][0]["seeds"] = list(range(12))  # the headline over 12 seeds, the ceiling over 5
    reach = next(v for v in verdict(summary) if v["question"].startswith("How much"))
    assert reach["answer"] == "70% of its pass@64 gain over GRPO (on its 5 seeds)"


def test_a_cell_below_zero_fails_the_grid_and_a_spanning_one_leaves_it_open():
    assert answers(record(grid=((0.04, 0.02), (-0.05, 0.02))))["Does the pass@64 effect hold over the grid"] is False
    assert answers(record(grid=((0.04, 0.02), (0.01, 0.05))))["Does the pass@64 effect hold over the grid"] is None


@pytest.mark.parametrize("passn, answer", [((0.04, 0.02), "better"), ((-0.04, 0.02), "worse"),
                                           ((0.01, 0.03), "not separable")])
def test_each_baseline_is_better_worse_or_not_separable_by_its_paired_interval(passn, answer):
    versus = [{"baseline": "DRA-GRPO (hash)", "role": "dra", **diff(passn)}]
    row = next(v for v in verdict(record(versus=versus)) if "DRA-GRPO" in v["question"])
    assert row["answer"] == answer


def test_the_replication_agrees_only_when_both_studies_reach_the_same_conclusion():
    meets = {"threads": 2, "chosen": "SetPO", "headline": {"passn": ci(0.05, 0.02), "pass1": ci(0.0, 0.01)}}
    misses = {"threads": 1, "chosen": "SetPO", "headline": {"passn": ci(0.01, 0.03), "pass1": ci(0.0, 0.01)}}
    question = "Does the replication"
    assert answers(record(agreement={"primary": meets, "replication": {**meets, "threads": 1}}))[question] is True
    assert answers(record(agreement={"primary": meets, "replication": misses}))[question] is False
    table = "\n".join(verdict_markdown(record(agreement={"primary": meets, "replication": misses})))
    assert table.startswith("What the record says") and "| Does the replication" in table and "| no |" in table


def test_the_replication_counts_what_both_studies_made_bit_for_bit(tmp_path):
    """bitwise_agreement compares the digests of every model and evaluation two study folders both made; one
    differing weight or count, or a missing digest, is not identical; what only one made is not shared; the
    verdict's replication line repeats the counts."""
    import json

    from setpo_lab.repro.agreement import bitwise_agreement

    def study(root, models, evaluations):
        for name, digest in models.items():
            folder = root / ("sft" if name == "sft" else f"rl/{name}") / "final"
            folder.mkdir(parents=True)
            (folder / "done.json").write_text(json.dumps({} if digest is None else {"weights_sha256": digest}))
        for name, correct in evaluations.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / f"{name}.json").write_text(json.dumps({"correct": correct, "distinct": [1] * len(correct)}))
        (root / "eval" / "r1_T1.texts.json").write_text("[]")  # the judge's texts: not an evaluation
        return root

    mine = study(tmp_path / "a", {"sft": "w0", "r1": "w1", "r2": None, "only_mine": "w9"},
                 {"val/r1_T1": [3, 0], "eval/r1_T1": [2, 1], "eval/sft_T1": [5, 5], "eval/only_mine_T1": [1, 1]})
    theirs = study(tmp_path / "b", {"sft": "w0", "r1": "w1", "r2": None},
                   {"val/r1_T1": [3, 0], "eval/r1_T1": [2, 2], "eval/sft_T1": [5, 5]})
    assert bitwise_agreement(mine, theirs) == {"models": 3, "models_identical": 2, "evaluations": 3,
                                               "evaluations_identical": 2}
    meets = {"threads": 2, "chosen": "SetPO", "headline": {"passn": ci(0.05, 0.02), "pass1": ci(0.0, 0.01)}}
    summary = {**record(agreement={"primary": meets, "replication": {**meets, "threads": 1}}),
               "identical": bitwise_agreement(mine, theirs)}
    line = next(v for v in verdict(summary) if v["question"].startswith("Does the replication"))
    assert line["evidence"].endswith("identical bit for bit: 2 of 3 models, 2 of 3 evaluations")


def test_a_record_made_on_two_processors_says_so():
    one = {**record(), "machines": {"trained": {"A avx2": 12}, "evaluated": {"A avx2": 12}}}
    two = {**record(), "machines": {"trained": {"A avx2": 8, "B avx512f": 4}, "evaluated": {"B avx512f": 12}}}
    question = "Was the record made on one processor"
    assert answers(one)[question] is True
    assert answers(two)[question] is False
    row = next(v for v in verdict(two) if v["question"].startswith(question))
    assert row["answer"] == "no: 2" and "A avx2 (8 rows), B avx512f (4 rows)" in row["evidence"]
    assert question not in answers(record())  # a record that kept no machines asks nothing


def test_the_tables_say_how_many_seeds_each_difference_has():
    """The headline runs on more seeds (headline_seeds) than the baselines and the ceiling: each paired row says
    how many, so a reader does not compare a 12-seed interval with a 5-seed one unawares."""
    from setpo_lab.studies.countdown_results import results_markdown

    summary = record(versus=[{"role": "ceiling", "baseline": "ceiling", **diff((-0.03, 0.02))}])
    summary["paired"][0]["seeds"] = list(range(12))
    summary["selection"] = {"rule": "r", "grpo": {"pass1": 0.2, "passn": 0.5}, "candidates": {}}
    for r in summary["runs"]:  # what the table of means reads besides pass@k
        r.update(variant=r["name"], primary=False, avg_modes=1.0, width=1, pass_at_k={**r["pass_at_k"], "1": 0.2})
    summary["grid"] = []
    lines = results_markdown(summary).splitlines()
    assert "| SetPO ★ | 12 | -1.0 [-2.0, +0.0] |" in "\n".join(lines).replace("−", "-")
    assert any(line.startswith("| ceiling | 5 | +0.0 [-1.0, +1.0] |") for line in lines)
    assert any(line.startswith("| ceiling | ceiling | 5 | ") for line in lines)


def test_a_finished_record_is_drawn_as_it_stands_and_only_when_finished(tmp_path):
    """make figures draws a finished study from results.json, whatever code is checked out (the record names the
    commit that made it); a record that is not the folder's study as it now stands (no replication yet, or
    headline seeds grown since) is not finished, and the notebook resumes the study instead."""
    import json
    from dataclasses import asdict

    from setpo_lab.studies.countdown_config import CountdownLMConfig
    from setpo_lab.studies.countdown_results import figure_record, finished_summary
    from setpo_lab.studies.judging import without_judge

    config = json.loads(json.dumps(without_judge(asdict(CountdownLMConfig(out="results/countdown")))))
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert finished_summary(tmp_path) is None  # nothing written yet
    summary = {"config": config, "runs": [], "agreement": {}}
    (tmp_path / "results.json").write_text(json.dumps({k: v for k, v in summary.items() if k != "agreement"}))
    assert finished_summary(tmp_path) is None  # the main study's record, the replication still to come
    (tmp_path / "results.json").write_text(json.dumps(summary))
    assert finished_summary(tmp_path) == summary
    (tmp_path / "config.json").write_text(json.dumps({**config, "out": "elsewhere"}))
    assert finished_summary(tmp_path) == summary  # where it lives is not what it is
    (tmp_path / "config.json").write_text(json.dumps({**config, "headline_seeds": [5, 6]}))
    assert finished_summary(tmp_path) is None  # grown since: two more seeds to run

    (tmp_path / "identity.json").write_text(json.dumps({"code": {"commit": "720491b", "dirty": False, "files": {}}}))
    record = figure_record({**summary, "runs": []}, "make countdown", folder=tmp_path)
    assert record["study_code"] == {"commit": "720491b", "dirty": False}


def test_the_pass_at_k_figure_gives_each_method_its_colour_and_says_its_seeds():
    """Six methods besides GRPO share the main cell's panel: each has a colour of its own (four shared colours
    made two pairs look alike), and a panel whose methods have different numbers of seeds says the range."""
    from setpo_lab.studies.countdown_results import grid_pass_at_k_figure

    cfg = {"eval_samples": 4, "main_group_size": 7, "main_beta": 0.001, "other_cells": [], "eval_temperatures": [1.0]}
    methods = ["GRPO", "SetPO a", "SetPO b", "pairwise", "DRA", "Pass@k", "ceiling"]
    rows = [{"name": f"{m}{s}", "variant": m, "T": 1.0, "G": 7, "beta": 0.001, "seed": s, "role": "other",
             "pass_curve": [0.1, 0.2, 0.3, 0.4]} for m in methods for s in range(12 if m in ("GRPO", "SetPO a") else 5)]
    fig = grid_pass_at_k_figure({"config": cfg, "runs": rows})
    colours = {t.name: t.line.color for t in fig.data if t.name in methods and t.line.color}
    assert set(colours) == set(methods) and len(set(colours.values())) == len(methods)
    assert "every method (5–12 seeds)" in fig.layout.annotations[0].text
