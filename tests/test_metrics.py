"""Diversity metrics (setpo.metrics) against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from setpo.envs.countdown import distinct_correct_solutions
from setpo.metrics import (
    ModeCoverage,
    diversity_width_and_average_modes,
    mean_pairwise_similarity,
    mode_coverage,
)

# ---------------------------------------------------------------------------------------------------
# mode_coverage
# ---------------------------------------------------------------------------------------------------


def test_mode_coverage_by_hand():
    modes = [0, 0, 0, 1, 2, 5, 5, 5, 5, 7]  # 10 samples; correct modes 0-3 hold 3, 1, 1, 0
    cov = mode_coverage(modes, [0, 1, 2, 3], threshold=0.15)
    assert isinstance(cov, ModeCoverage)
    assert cov.covered == (0,) and cov.count == 1
    assert cov.masses == pytest.approx({0: 0.3, 1: 0.1, 2: 0.1, 3: 0.0})
    assert cov.correct_mass == pytest.approx(0.5)
    assert mode_coverage(modes, [0, 1, 2, 3], threshold=0.1).covered == (0, 1, 2)  # >= is inclusive


def test_mode_coverage_default_threshold_is_five_percent_inclusive():
    modes = [0] * 19 + [1]  # mode 1 holds exactly 1/20 = 5%
    assert mode_coverage(modes, [0, 1]).covered == (0, 1)
    assert mode_coverage([0] * 20 + [1], [0, 1]).covered == (0,)  # 1/21 < 5%


def test_mode_coverage_with_weights_and_array_inputs():
    probs = [0.5, 0.3, 0.04, 0.16]
    cov = mode_coverage(np.arange(4), [0, 1, 2], weights=probs)
    assert cov.covered == (0, 1) and cov.masses == pytest.approx({0: 0.5, 1: 0.3, 2: 0.04})
    assert cov.correct_mass == pytest.approx(0.84)
    same = mode_coverage(torch.tensor([0, 0, 1, 3]), torch.tensor([0, 1]), threshold=0.25)
    assert same.covered == (0, 1) and same.masses == pytest.approx({0: 0.5, 1: 0.25})


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(modes=[], correct_modes=[0]), "empty"),
        (dict(modes=[0], correct_modes=[]), "correct_modes"),
        (dict(modes=[0], correct_modes=[0], threshold=0.0), "threshold"),
        (dict(modes=[0], correct_modes=[0], threshold=1.5), "threshold"),
        (dict(modes=[0, 1], correct_modes=[0], weights=[1.0]), "weights"),
        (dict(modes=[0, 1], correct_modes=[0], weights=[1.0, -1.0]), "weights"),
        (dict(modes=[0, 1], correct_modes=[0], weights=[0.0, 0.0]), "zero"),
        (dict(modes=np.zeros((2, 2)), correct_modes=[0]), "one-dimensional"),
    ],
)
def test_mode_coverage_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        mode_coverage(**kwargs)


# ---------------------------------------------------------------------------------------------------
# Countdown: distinct correct solutions, diversity width and average modes
# ---------------------------------------------------------------------------------------------------


def test_distinct_correct_solutions_by_hand():
    answers = [
        "<think>..</think><answer>1*2*3*4</answer>",
        "<answer>4 * 3 * 2 * 1</answer>",  # same solution, reordered
        "<answer>(1+2+3)*4</answer>",
        "<answer>4*(3+(2+1))</answer>",  # same, reassociated
        "<answer>(1+2+3)*4</answer>",
        "<answer>1+2+3+4</answer>",  # wrong value
        "no answer",
        "<answer>2**3*3*1</answer>",  # not allowed
        "<answer>(4*3)*2*1</answer> wait <answer>4*6</answer>",  # last tag counts: 6 is not a number
    ]
    got = distinct_correct_solutions(answers, [1, 2, 3, 4], 24)
    assert got == {"(1+2+3)*4": 3, "1*2*3*4": 2}
    assert list(got) == sorted(got)
    assert distinct_correct_solutions(["(2+1+3)*4", "4*3*2*1", "24"], [1, 2, 3, 4], 24, extract=False) == {
        "(1+2+3)*4": 1,
        "1*2*3*4": 1,
    }
    assert distinct_correct_solutions([], [1, 2], 3) == {}
    with pytest.raises(ValueError, match="single string"):
        distinct_correct_solutions("<answer>1+2</answer>", [1, 2], 3)


def test_diversity_width_and_average_modes_by_hand():
    counts = [0, 1, 2, 3, 5, 0]
    assert diversity_width_and_average_modes(counts) == (3, pytest.approx(11 / 4))  # over solved problems
    assert diversity_width_and_average_modes(counts, over="all") == (3, pytest.approx(11 / 6))
    assert diversity_width_and_average_modes(counts, min_distinct=3) == (2, pytest.approx(11 / 4))
    assert diversity_width_and_average_modes(np.array(counts)) == (3, pytest.approx(11 / 4))
    assert diversity_width_and_average_modes([0, 0]) == (0, 0.0)
    assert diversity_width_and_average_modes([]) == (0, 0.0)
    for bad in ([1, -1], [1.5], [True]):
        with pytest.raises(ValueError, match="non-negative integers"):
            diversity_width_and_average_modes(bad)
    with pytest.raises(ValueError, match="over"):
        diversity_width_and_average_modes(counts, over="unsolved")


def test_countdown_metrics_compose():
    problems = [([1, 2, 3, 4], 24), ([44, 19, 35], 98)]
    samples = [
        ["<answer>1*2*3*4</answer>", "<answer>(1+2+3)*4</answer>", "<answer>(1+3)*(2+4)</answer>"],
        ["<answer>44+19+35</answer>", "<answer>35+44+19</answer>", "<answer>1</answer>"],
    ]
    counts = [len(distinct_correct_solutions(s, *p)) for s, p in zip(samples, problems, strict=True)]
    assert counts == [3, 1]
    assert diversity_width_and_average_modes(counts) == (1, 2.0)


# ---------------------------------------------------------------------------------------------------
# mean_pairwise_similarity
# ---------------------------------------------------------------------------------------------------

TRIANGLE = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]  # pairwise cosines 0, 1/√2, 1/√2
TRIANGLE_MEAN = math.sqrt(2) / 3


def test_mean_pairwise_similarity_one_group():
    assert mean_pairwise_similarity(TRIANGLE) == pytest.approx(TRIANGLE_MEAN)
    assert mean_pairwise_similarity(np.array([[1.0, 0.0], [-1.0, 0.0]])) == 0.0  # clamped kernel: no negatives
    assert mean_pairwise_similarity(torch.ones(5, 3)) == pytest.approx(1.0)


def test_mean_pairwise_similarity_groups():
    emb = torch.tensor(TRIANGLE + [[1.0, 0.0], [2.0, 0.0], [3.0, 0.0]])
    per = mean_pairwise_similarity(emb, group_size=3, reduce=False)
    assert per.tolist() == pytest.approx([TRIANGLE_MEAN, 1.0])
    assert mean_pairwise_similarity(emb, group_size=3) == pytest.approx((TRIANGLE_MEAN + 1.0) / 2)
    # Ragged groups in any order: group "b" has 2 rows, group "a" the triangle; each group weighs the same.
    rows = torch.tensor([[5.0, 0.0], TRIANGLE[0], TRIANGLE[1], [0.0, 5.0], TRIANGLE[2]])
    index = np.array(["b", "a", "a", "b", "a"], dtype=object)
    per = mean_pairwise_similarity(rows, index, reduce=False)
    assert per.tolist() == pytest.approx([0.0, TRIANGLE_MEAN])  # order of first appearance: b, a
    assert mean_pairwise_similarity(rows, index) == pytest.approx(TRIANGLE_MEAN / 2)


def test_mean_pairwise_similarity_bad_input():
    with pytest.raises(ValueError, match="at least 2"):
        mean_pairwise_similarity(torch.ones(3, 2), index=[0, 0, 1])
    with pytest.raises(ValueError, match="shape"):
        mean_pairwise_similarity(torch.ones(3))
    with pytest.raises(ValueError, match="zero-norm"):
        mean_pairwise_similarity(torch.tensor([[1.0, 0.0], [0.0, 0.0]]))
    with pytest.raises(ValueError, match="NaN"):
        mean_pairwise_similarity(torch.tensor([[1.0, 0.0], [float("nan"), 0.0]]))


def test_rarefied_distinct_is_the_mean_over_every_subset():
    import itertools

    from setpo.metrics import rarefied_distinct

    answers = [3, 3, 3, 5, 7, 7, 9]
    for r in (1, 2, 3, 7):
        subsets = list(itertools.combinations(range(len(answers)), r))
        brute = sum(len({answers[i] for i in sub}) for sub in subsets) / len(subsets)
        assert rarefied_distinct(answers, r) == pytest.approx(brute)
        assert rarefied_distinct([*answers, None, None], r) == rarefied_distinct(answers, r)  # no answer: left out
    assert rarefied_distinct(answers, 8) is None and rarefied_distinct([], 1) is None
    assert rarefied_distinct(["a", "b", "b"], 3) == 2.0  # every answer drawn: the raw count
    assert rarefied_distinct(np.array([1, 1, 2]), 1) == 1.0 and rarefied_distinct(torch.tensor([1, 2]), 2) == 2.0


def test_rarefied_distinct_beyond_the_exact_terms_agrees_with_pass_at_k_and_stays_in_range():
    from setpo.metrics import pass_at_k, rarefied_distinct

    answers = [i % 50 for i in range(10_000)]  # 50 answers, 200 each; r above the 4096 exact terms
    value = rarefied_distinct(answers, 5000)
    assert value == pytest.approx(50 * pass_at_k(10_000, 200, 5000)) and 0 < value <= 50
    assert rarefied_distinct(answers, 4096) == pytest.approx(50.0)  # 4096 draws miss none of 50 answers


def test_answer_entropy_and_hill_number():
    from setpo.metrics import answer_entropy, hill_number

    assert answer_entropy([4, 4, 6, 6]) == pytest.approx(math.log(2)) and answer_entropy([4] * 5) == 0.0
    assert answer_entropy([]) == 0.0 and answer_entropy([None, None]) == 0.0
    assert answer_entropy([1, 1, 2, None]) == pytest.approx(-(2 / 3) * math.log(2 / 3) - (1 / 3) * math.log(1 / 3))
    assert hill_number([4, 4, 6, 6]) == pytest.approx(2.0) and hill_number([4] * 5) == pytest.approx(1.0)
    assert hill_number([1, 2, 3, 3]) < 3  # a rare answer counts for less than a whole one
    assert hill_number([]) is None and hill_number([None]) is None


@pytest.mark.parametrize("call, message", [
    (lambda f: f["rarefied_distinct"]("abc", 1), "answers must be a sequence, got a string"),
    (lambda f: f["rarefied_distinct"]([1, 2], 0), "r must be >= 1"),
    (lambda f: f["rarefied_distinct"]([1, 2], 1.5), "r must be an integer"),
    (lambda f: f["rarefied_distinct"]([1, 2], True), "r must be an integer"),
    (lambda f: f["hill_number"]([[1], [2]]), "answers must hold hashable ids"),
    (lambda f: f["answer_entropy"](5), "answers must be a sequence, got int"),
])
def test_answer_metrics_refuse_bad_input_by_name(call, message):
    from setpo import metrics

    with pytest.raises(ValueError, match=message):
        call(vars(metrics))
