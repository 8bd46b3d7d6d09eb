"""Kernel diagnostics (setpo.diagnostics) on cases whose answers are known by construction."""

from __future__ import annotations

import math

import pytest
import torch

from setpo.diagnostics import separation_auc, collapsed_group_marginals, diagnose_embedder, kernel_separation
from setpo.diversity import marginals_by_definition


def test_auc_matches_counting_pairs_with_ties():
    pos, neg = torch.tensor([0.9, 0.5, 0.5]), torch.tensor([0.5, 0.1])
    # pairs: (0.9>0.5) 1, (0.9>0.1) 1, (0.5=0.5) 0.5 twice, (0.5>0.1) 1 twice -> 5/6
    assert separation_auc(pos, neg) == pytest.approx(5 / 6)
    assert separation_auc(torch.ones(3), torch.ones(4)) == pytest.approx(0.5)
    assert math.isnan(separation_auc(torch.ones(2), torch.empty(0)))


def test_orthogonal_solutions_are_perfectly_separated():
    # two problems; within each, two copies of solution a and one of solution b, at right angles
    a, b = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    emb = torch.stack([a, a, b, b, b, a])
    ids = ["a", "a", "b", "x", "x", "y"]
    sep = kernel_separation(emb, ids, index=[0, 0, 0, 1, 1, 1])
    assert (sep.n_same, sep.n_different) == (2, 4)
    assert sep.same_mean == pytest.approx(1.0) and sep.different_mean == pytest.approx(0.0)
    assert sep.auc == pytest.approx(1.0)


def test_pairs_never_cross_groups():
    emb = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    sep = kernel_separation(emb, ["a", "b", "a", "b"], group_size=2)
    assert sep.n_same == 0 and sep.n_different == 2   # the two "a" rows sit in different groups


def test_kernel_that_cannot_tell_gives_half():
    emb = torch.ones(6, 3)
    sep = kernel_separation(emb, [0, 0, 1, 1, 2, 2])
    assert sep.auc == pytest.approx(0.5)


def test_collapsed_group_is_the_definition_and_rewards_the_unique_rows():
    gen = torch.Generator().manual_seed(0)
    distinct = torch.randn(5, 8, generator=gen)
    s = collapsed_group_marginals(distinct, copies=4, others=3)
    group = torch.cat([distinct[:1].expand(4, -1), distinct[1:4]])
    torch.testing.assert_close(s, marginals_by_definition(group), rtol=0, atol=1e-6)
    assert s[4:].min() > s[:4].max()   # a unique solution adds more diversity than a fourth copy


def test_collapsed_group_needs_enough_solutions():
    with pytest.raises(ValueError, match="distinct solutions"):
        collapsed_group_marginals(torch.randn(3, 4), copies=4, others=3)


def test_diagnose_embedder_on_a_table_embedder():
    table = {"x": [1.0, 0.0, 0.0, 0.0], "y": [0.0, 1.0, 0.0, 0.0], "z": [0.0, 0.0, 1.0, 0.0],
             "w": [0.0, 0.0, 0.0, 1.0], "x2": [0.99, 0.1, 0.0, 0.0]}
    embed = lambda texts: torch.tensor([table[t] for t in texts])  # noqa: E731
    problems = [[("x", "A"), ("x2", "A"), ("y", "B"), ("z", "C"), ("w", "D")]]
    row = diagnose_embedder(embed, problems)
    assert row["auc"] == pytest.approx(1.0) and row["n_collapsed"] == 1
    assert row["collapsed_spread"] > 0.1 and row["unique_minus_copy"] > 0
