"""Unbiased pass@k against exact enumeration of k-subsets, and its numerical range."""

import itertools
import math

import pytest

from setpo import pass_at_k


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_matches_enumeration(n):
    for c in range(n + 1):
        outcomes = [1] * c + [0] * (n - c)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(outcomes, k))
            exact = sum(any(s) for s in subsets) / len(subsets)
            assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)


def test_large_n_is_stable_and_monotone():
    n = 1024
    prev = 0.0
    for k in (1, 2, 8, 64, 256, 1024):
        p = pass_at_k(n, 3, k)
        assert 0.0 <= p <= 1.0 and p >= prev
        prev = p
    assert pass_at_k(n, 3, 1) == pytest.approx(3 / 1024)
    # closed form through lgamma for a mid-size case
    n, c, k = 1000, 10, 100
    exact = 1 - math.exp(math.lgamma(n - c + 1) - math.lgamma(n - c - k + 1) - math.lgamma(n + 1) + math.lgamma(n - k + 1))
    assert pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-10)


@pytest.mark.parametrize("args, match", [((4, 5, 1), "0 <= c <= n"), ((4, 2, 0), "1 <= k <= n"),
                                         ((4, 2, 5), "1 <= k <= n"), ((4.5, 2, 1), "integer")])
def test_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        pass_at_k(*args)
