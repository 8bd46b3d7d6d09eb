"""The tests the confirmatory short-answer study decides by (setpo_lab.studies.intervals): one-sided paired t, the
exact sign-flip test, Holm's procedure, the fixed sequence and the t-test's power, each against a reference computed another way."""

import itertools
import math
import random

import pytest

from setpo_lab.studies.intervals import fixed_sequence, holm, paired_t_power, paired_t_test, sign_flip_p, t_interval

EXPLORATORY = [0.17, 1.25, 3.50, 3.92, 1.50]  # gated key − GRPO, distinct right answers, seeds 0-4 (cure record)


def test_paired_t_is_the_textbook_statistic_and_p():
    from scipy import stats

    r = paired_t_test(EXPLORATORY)
    assert r["t"] == pytest.approx(2.068 / (1.587032 / math.sqrt(5)), rel=1e-5)
    assert r["p"] == pytest.approx(stats.ttest_1samp(EXPLORATORY, 0.0, alternative="greater").pvalue)
    assert r["p"] == pytest.approx(0.0222, abs=5e-4)  # half the two-sided p ≈ 0.044
    # non-inferiority at margin 0.05: H0 mean <= -0.05
    ni = paired_t_test([0.01, -0.02, 0.03, 0.0], margin=0.05)
    assert ni["p"] == pytest.approx(stats.ttest_1samp([0.06, 0.03, 0.08, 0.05], 0.0, alternative="greater").pvalue)
    assert math.isnan(paired_t_test([1.0])["p"]) and math.isnan(paired_t_test([2.0, 2.0])["p"])


def test_the_90_percent_t_interval_says_what_the_one_sided_test_says():
    from scipy import stats

    lo, hi = t_interval(EXPLORATORY, 0.90)
    mean, se = sum(EXPLORATORY) / 5, stats.sem(EXPLORATORY)
    assert (lo, hi) == pytest.approx(stats.t.interval(0.90, 4, loc=mean, scale=se))
    for diffs, margin in ((EXPLORATORY, 0.0), ([0.01, -0.02, 0.03, 0.0], 0.05), ([0.3, -0.2, 0.1, 0.05], 0.0)):
        lower = t_interval(diffs, 0.90)[0]  # rejected at 0.05 one-sided exactly when the lower end clears -margin
        assert (paired_t_test(diffs, margin=margin)["p"] < 0.05) == (lower > -margin)
    assert t_interval([1.0]) is None and t_interval([2.0, 2.0]) == [2.0, 2.0]


def test_sign_flip_is_exact_and_cannot_go_below_one_over_2_to_the_n():
    assert sign_flip_p(EXPLORATORY) == 1 / 32  # every difference positive: only the observed pattern reaches it
    diffs = [0.4, -0.1, 0.3, 0.2, -0.5, 0.6]
    brute = sum(sum(s * d for s, d in zip(signs, diffs, strict=True)) >= sum(diffs) - 1e-12
                for signs in itertools.product((1, -1), repeat=6)) / 64
    assert sign_flip_p(diffs) == brute
    with pytest.raises(ValueError, match="1 to 20 units"):
        sign_flip_p([0.1] * 21)


def test_holm_rejects_step_down_and_controls_the_family():
    got = holm({"H1": 0.01, "H2": 0.04, "H3": 0.03, "H4": 0.2})
    assert [got[h]["reject"] for h in ("H1", "H3", "H2", "H4")] == [True, False, False, False]  # 0.03 > 0.05/3
    assert got["H1"]["adjusted"] == pytest.approx(0.04) and got["H3"]["adjusted"] == pytest.approx(0.09)
    assert holm({"a": 0.001, "b": 0.02})["b"]["reject"]  # 0.02 <= 0.05 / 1 after a
    assert not holm({"a": float("nan"), "b": 0.001})["a"]["reject"]
    # family-wise error under the null, four independent uniform p-values: at most alpha (seeded)
    rng = random.Random(0)
    false = sum(any(v["reject"] for v in holm({k: rng.random() for k in "abcd"}).values()) for _ in range(4000))
    assert false / 4000 <= 0.06


def test_fixed_sequence_tests_each_hypothesis_only_after_all_before_it_are_rejected():
    r = fixed_sequence({"H1": 0.001, "H2": 0.04, "H3": 0.2, "H4": 0.0})
    assert [r[h]["reject"] for h in ("H1", "H2", "H3", "H4")] == [True, True, False, False]
    assert [r[h]["tested"] for h in ("H1", "H2", "H3", "H4")] == [True, True, True, False]  # H4's p = 0 untested
    # not measured (None) or NaN stops the sequence; a p equal to alpha is not a rejection
    r = fixed_sequence({"H1": None, "H2": 0.0})
    assert r == {"H1": {"tested": False, "reject": False}, "H2": {"tested": False, "reject": False}}
    assert not fixed_sequence({"H1": math.nan, "H2": 0.0})["H2"]["tested"]
    assert not fixed_sequence({"H1": 0.05}, 0.05)["H1"]["reject"]
    # the family-wise error under the global null: only H1's test can err, so at most alpha
    rng = random.Random(0)
    errors = sum(any(v["reject"] for v in fixed_sequence({h: rng.random() for h in "abcd"}).values())
                 for _ in range(20000))
    assert errors / 20000 == pytest.approx(0.05, abs=0.006)


def test_power_matches_a_simulation_of_the_test():
    rng = random.Random(1)
    n, effect, sd, alpha = 8, 1.0, 1.6, 0.05
    hits = sum(paired_t_test([rng.gauss(effect, sd) for _ in range(n)])["p"] < alpha for _ in range(3000))
    assert hits / 3000 == pytest.approx(paired_t_power(effect, sd, n, alpha), abs=0.03)


def test_the_plans_power_table_is_what_the_exploratory_record_gives():
    """results/short_answers/confirm/PLAN.md quotes the power of each primary test from the cure record's per-seed
    differences; recomputed here from the committed results.json, its numbers must stand."""
    import json
    import re
    import statistics

    from setpo_lab import ROOT

    record = json.loads((ROOT / "results" / "short_answers" / "cure" / "results.json").read_text())
    per_seed = record["per_seed"]

    def diffs(metric):
        return [per_seed[f"key_gated_s{s}"][metric] - per_seed[f"grpo_s{s}"][metric] for s in range(5)]

    hard = next(c["per_seed"] for c in record["comparisons"]
                if "128" in c["metric"] and c["a"] == "SetPO, answer key, right only" and c["b"] == "GRPO")
    tests = {"H1": (diffs("distinct_right"), 0.0), "H2": (diffs("pass@1"), 0.05), "H4": (hard, 0.0)}
    plan = (ROOT / "results" / "short_answers" / "confirm" / "PLAN.md").read_text()
    rows = {int(m.group(1)): m.group(2) for m in re.finditer(r"^\| (\d+) \| (.+) \|$", plan, re.M)}
    assert set(rows) == {5, 8, 12, 16}
    for n, cells in rows.items():
        h1, h2, h2_equal, h4 = [c.strip() for c in cells.split("|")]
        for quoted, (d, margin) in ((h1, tests["H1"]), (h2, tests["H2"]), (h4, tests["H4"])):
            got = paired_t_power(statistics.mean(d), statistics.stdev(d), n, 0.05, margin=margin)
            assert float(quoted) == pytest.approx(got, abs=6e-4), (n, quoted, got)
        if h2_equal:
            got = paired_t_power(0.0, statistics.stdev(tests["H2"][0]), n, 0.05, margin=0.05)
            assert float(h2_equal) == pytest.approx(got, abs=6e-4)
    assert "0.5 in `term_std` units" in plan and "100–111" in plan and "H1 → H2 → H4 → H3" in plan


def test_near_miss_guesser_hits_by_its_spread_around_grpos_answer():
    from statistics import NormalDist

    from setpo_lab.studies import short_answers_confirm as confirm

    answers = [370, 375, 380, 372, None, 378]
    values = [a for a in answers if a is not None]
    mean = sum(values) / len(values)
    sd = (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5
    q = NormalDist(370, sd).cdf(375.5) - NormalDist(370, sd).cdf(374.5)
    assert confirm._near_miss_pass_at_k(370, answers, 375, 4) == pytest.approx(1 - (1 - q) ** 4)
    assert confirm._near_miss_pass_at_k(375, [375, 375], 375, 1) == 1.0
    assert confirm._near_miss_pass_at_k(374, [375], 375, 8) == 0.0
    assert confirm._near_miss_pass_at_k(None, answers, 375, 4) is None
    assert confirm._modal_answer([5, 3, 3, 5, None, 9]) == 3 and confirm._modal_answer([None]) is None
    assert confirm._distinct_near([365, 366, 366, 385, 386, None], 375) == 3
