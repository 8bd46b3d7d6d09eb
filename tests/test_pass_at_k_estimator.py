"""Pass@k Training's closed-form group advantage (arXiv 2508.10751), held to a direct transcription of its
definition (every k-subset enumerated) and, for 0/1 rewards, to the paper's formulas."""

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import setpo
from setpo.advantages import ADVANTAGE_ESTIMATORS, check_estimator


def by_enumeration(rewards: list[float], k: int) -> list[float]:
    """Each response's mean over the k-subsets containing it of (best reward - mean best) / std best."""
    subsets = list(itertools.combinations(range(len(rewards)), k))
    best = {s: max(rewards[i] for i in s) for s in subsets}
    if len(set(best.values())) == 1:  # every subset has the same best: no signal (a float mean of equal values
        return [0.0] * len(rewards)   # can miss them by rounding and leave a "std" of 1e-17 to divide by)
    mean = sum(best.values()) / len(subsets)
    std = math.sqrt(sum((v - mean) ** 2 for v in best.values()) / len(subsets))
    out = []
    for i in range(len(rewards)):
        mine = [best[s] for s in subsets if i in s]
        out.append((sum(mine) / len(mine) - mean) / std if std > 0 else 0.0)
    return out


def papers_formula(correct: list[bool], k: int) -> list[float]:
    n, n_neg = len(correct), correct.count(False)
    r_bar = 1 - math.comb(n_neg, k) / math.comb(n, k)
    sigma = math.sqrt(r_bar * (1 - r_bar))
    pos = (1 - r_bar) / sigma
    neg = (1 - r_bar - math.comb(n_neg - 1, k - 1) / math.comb(n - 1, k - 1)) / sigma
    return [pos if c else neg for c in correct]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([0.0, 0.1, 0.5, 1.0, 2.0]), min_size=2, max_size=8), st.integers(1, 8))
def test_closed_form_equals_enumeration(rewards, k):
    k = min(k, len(rewards))
    got = setpo.group_advantages(torch.tensor(rewards, dtype=torch.float64), estimator=f"pass@{k}", eps=1e-300)
    want = by_enumeration(rewards, k)
    if max(rewards) == min(rewards):
        want = [0.0] * len(rewards)  # a flat group carries no signal, for every estimator
    np.testing.assert_allclose(got.numpy(), want, atol=1e-12, rtol=1e-9)


@pytest.mark.parametrize("correct,k", [([1, 0, 0, 1, 0, 0, 0], 3), ([1, 0, 0, 0, 0, 0, 0], 4), ([1, 0, 0], 2),
                                       ([0, 1, 0, 1, 1, 0, 0, 0], 4)])
def test_binary_rewards_give_the_papers_formula(correct, k):
    got = setpo.group_advantages(torch.tensor(correct, dtype=torch.float64), estimator=f"pass@{k}", eps=1e-300)
    np.testing.assert_allclose(got.numpy(), papers_formula([bool(c) for c in correct], k), rtol=1e-12)


def test_ragged_groups_shuffled_index_and_pass_at_1_is_population_grpo():
    gen = torch.Generator().manual_seed(2)
    r = torch.rand(11, generator=gen, dtype=torch.float64)
    index = [0, 1, 0, 2, 1, 0, 2, 1, 0, 2, 1]               # groups of 4, 4 and 3, interleaved
    got = setpo.group_advantages(r, index, estimator="pass@3", eps=1e-300)
    for gid in (0, 1, 2):
        rows = [i for i, x in enumerate(index) if x == gid]
        np.testing.assert_allclose(got[rows].numpy(), by_enumeration(r[rows].tolist(), 3), rtol=1e-9)
    one = setpo.group_advantages(r, index, estimator="pass@1", eps=1e-300)
    for gid in (0, 1, 2):
        rows = [i for i, x in enumerate(index) if x == gid]
        x = r[rows]
        torch.testing.assert_close(one[rows], (x - x.mean()) / x.std(unbiased=False))


def test_names_and_group_sizes_are_checked():
    assert callable(check_estimator("pass@5")) and "pass@5" not in ADVANTAGE_ESTIMATORS  # a family, by name
    for bad in ("pass@0", "pass@-1", "pass@", "pass@1.5", "pass@k"):
        with pytest.raises(ValueError, match="pass@K"):
            setpo.group_advantages([1.0, 0.0, 1.0], estimator=bad)
    with pytest.raises(ValueError, match="at least k = 4"):
        setpo.group_advantages([1.0, 0.0, 1.0], estimator="pass@4")
    # SetPO composes with it like with any base estimator
    emb = torch.randn(6, 3, generator=torch.Generator().manual_seed(0))
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    torch.testing.assert_close(setpo.setpo_advantages(r, emb, group_size=3, lam=0.5, estimator="pass@2"),
                               setpo.group_advantages(r, group_size=3, estimator="pass@2")
                               + 0.5 * setpo.diversity_marginals(emb, group_size=3))
