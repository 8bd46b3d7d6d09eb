"""The closed-form SetPO marginal against the definition, its proven properties, and bad input."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import setpo
from setpo.diversity import g, kernel_marginals, marginals_by_definition


def random_set(g_size, d=6, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    # A shared offset makes many cosines positive, so the clamp and the kernel both matter.
    return torch.randn(g_size, d, generator=gen, dtype=dtype) + 0.7 * torch.randn(1, d, generator=gen, dtype=dtype)


@pytest.mark.parametrize("g_size", [3, 4, 7, 16, 33, 64])
def test_closed_form_matches_definition(g_size):
    e = random_set(g_size, seed=g_size)
    torch.testing.assert_close(setpo.diversity_marginals(e), marginals_by_definition(e), atol=1e-9, rtol=0)


def test_contiguous_groups_match_definition_per_group():
    sizes = [5] * 6
    e = torch.cat([random_set(n, seed=i) for i, n in enumerate(sizes)])
    s = setpo.diversity_marginals(e, group_size=5)
    for b in range(6):
        torch.testing.assert_close(s[5 * b:5 * b + 5], marginals_by_definition(e[5 * b:5 * b + 5]), atol=1e-9, rtol=0)


@pytest.mark.parametrize("seed", range(5))
def test_ragged_shuffled_groups_match_definition(seed):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(3, 65, size=7)
    ids = np.repeat([f"uid-{rng.integers(1e9)}" for _ in sizes], sizes).astype(object)
    perm = rng.permutation(len(ids))
    ids = ids[perm]
    e = random_set(len(ids), seed=seed)
    s = setpo.diversity_marginals(e, ids)
    for uid in set(ids):
        rows = torch.as_tensor(np.flatnonzero(ids == uid))
        torch.testing.assert_close(s[rows], marginals_by_definition(e[rows]), atol=1e-9, rtol=0)


def test_contiguous_uid_blocks_take_the_reshape_path():
    from setpo.groups import Groups

    ids = np.repeat(np.array(["b", "a", "c"], dtype=object), 4)  # verl layout: blocks of equal size
    assert Groups.build(12, ids).contiguous
    assert not Groups.build(12, ids[::-1].copy()[[0, 4, 1, 5, 2, 6, 3, 7, 8, 9, 10, 11]]).contiguous
    e = random_set(12, seed=9)
    torch.testing.assert_close(setpo.diversity_marginals(e, ids), setpo.diversity_marginals(e, group_size=4))


def test_index_kinds_agree():
    e = random_set(12, seed=3)
    ints = np.array([2, 0, 2, 1, 0, 2, 1, 0, 1, 1, 2, 0])
    as_str = ints.astype(str)
    as_tensor = torch.as_tensor(ints)
    base = setpo.diversity_marginals(e, ints)
    torch.testing.assert_close(setpo.diversity_marginals(e, as_str), base)
    torch.testing.assert_close(setpo.diversity_marginals(e, as_tensor), base)
    torch.testing.assert_close(setpo.diversity_marginals(e, list(ints)), base)


def test_float32_close_to_float64_and_dtype_kept():
    e = random_set(16, seed=1)
    s32 = setpo.diversity_marginals(e.float(), group_size=8)
    assert s32.dtype == torch.float32
    torch.testing.assert_close(s32.double(), setpo.diversity_marginals(e, group_size=8), atol=1e-5, rtol=0)


def test_numpy_input_gives_tensor():
    s = setpo.diversity_marginals(random_set(5).numpy())
    assert isinstance(s, torch.Tensor) and s.shape == (5,)


def test_kernel_clamped_with_unit_diagonal():
    e = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
    k = setpo.cosine_kernel(e)
    assert torch.all(k >= 0) and torch.all(k <= 1)
    torch.testing.assert_close(k.diagonal(), torch.ones(3, dtype=torch.float64))
    assert k[0, 1] == 0.0  # cos = -1 is clamped to 0
    torch.testing.assert_close(k[0, 2], torch.tensor(2 ** -0.5, dtype=torch.float64))


def test_set_diversity_by_hand():
    # Two orthogonal vectors and one at 45°: k01 = 0, k02 = k12 = c.
    c = 2 ** -0.5
    e = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    masses = [c / 2, c / 2, c]
    expected = float(np.mean([-np.log1p(m) for m in masses]))
    assert setpo.set_diversity(e) == pytest.approx(expected, abs=1e-12)


def test_identical_embeddings_give_zero():
    e = torch.ones(6, 4, dtype=torch.float64)
    torch.testing.assert_close(setpo.diversity_marginals(e), torch.zeros(6, dtype=torch.float64))


def test_permutation_equivariance_example():
    e = random_set(9, seed=5)
    perm = torch.randperm(9, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(setpo.diversity_marginals(e[perm]), setpo.diversity_marginals(e)[perm], atol=1e-12, rtol=0)


# ---- property tests over kernels ---------------------------------------------------------------------


@st.composite
def kernels(draw, min_g=3, max_g=10):
    n = draw(st.integers(min_g, max_g))
    vals = draw(st.lists(st.floats(0.0, 1.0), min_size=n * n, max_size=n * n))
    a = torch.tensor(vals, dtype=torch.float64).reshape(n, n)
    k = torch.triu(a, 1)
    k = k + k.T
    k.fill_diagonal_(1.0)
    return k


def marginals_of(k):
    return kernel_marginals(k[None])[0]


@settings(max_examples=60, deadline=None)
@given(kernels(), st.data())
def test_permutation_equivariance(k, data):
    perm = torch.tensor(data.draw(st.permutations(range(k.shape[0]))))
    torch.testing.assert_close(marginals_of(k[perm][:, perm]), marginals_of(k)[perm], atol=1e-12, rtol=0)


@settings(max_examples=60, deadline=None)
@given(kernels(min_g=4), st.data())
def test_more_similar_means_less_credit(k, data):
    """∂s_i/∂k_it < 0, by a finite difference on the symmetric entry pair."""
    n = k.shape[0]
    i = data.draw(st.integers(0, n - 1))
    t = data.draw(st.sampled_from([j for j in range(n) if j != i]))
    h = 1e-6
    up, down = k.clone(), k.clone()
    up[i, t] = up[t, i] = k[i, t] + h
    down[i, t] = down[t, i] = k[i, t] - h
    derivative = (marginals_of(up)[i] - marginals_of(down)[i]) / (2 * h)
    assert derivative < 0


@settings(max_examples=60, deadline=None)
@given(kernels(min_g=4), st.data())
def test_dominance(k, data):
    """If o_i is no more similar than o_j to every other rollout, s_i >= s_j (strictly if any gap)."""
    n = k.shape[0]
    i, j = data.draw(st.lists(st.integers(0, n - 1), min_size=2, max_size=2, unique=True))
    others = [z for z in range(n) if z not in (i, j)]
    shrink = torch.tensor(data.draw(st.lists(st.floats(0.0, 1.0), min_size=len(others), max_size=len(others))),
                          dtype=torch.float64)
    k = k.clone()
    k[i, others] = k[j, others] * shrink
    k[others, i] = k[i, others]
    s = marginals_of(k)
    assert s[i] >= s[j] - 1e-12
    if bool((k[j, others] - k[i, others] > 1e-3).any()):
        assert s[i] > s[j]


@settings(max_examples=40, deadline=None)
@given(st.integers(4, 12), st.integers(0, 2**31 - 1))
def test_duplicate_gets_lower_marginal_than_distinct(n, seed):
    """A rollout present twice earns less than any rollout that appears once, in a spread-out set."""
    gen = torch.Generator().manual_seed(seed)
    e = torch.eye(n, dtype=torch.float64) + 0.05 * torch.rand(n, n, generator=gen, dtype=torch.float64)
    e = torch.cat([e, e[:1]])  # rollout 0 duplicated as the last row
    s = setpo.diversity_marginals(e)
    assert torch.isclose(s[0], s[-1])
    assert bool((s[0] < s[1:-1]).all())


def test_g_is_minus_log1p():
    x = torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64)
    torch.testing.assert_close(g(x), -torch.log(1 + x))


# ---- bad input --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "emb, kwargs, match",
    [
        (torch.randn(2, 4), {}, "at least 3"),
        (torch.randn(8, 4), {"group_size": 2}, "at least 3"),
        (torch.randn(7, 4), {"index": [0, 0, 0, 1, 1, 1, 2]}, "at least 3"),
        (torch.tensor([[1.0, float("nan")], [1.0, 0.0], [0.0, 1.0]]), {}, "NaN or infinite"),
        (torch.tensor([[1.0, float("inf")], [1.0, 0.0], [0.0, 1.0]]), {}, "NaN or infinite"),
        (torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]]), {}, "zero-norm"),
        (torch.randn(6, 4), {"index": [0, 0, 0, 1, 1]}, "index has length 5"),
        (torch.randn(7, 4), {"group_size": 3}, "does not divide"),
        (torch.randn(6, 4), {"group_size": 3, "index": [0] * 6}, "not both"),
        (torch.randn(6), {}, r"shape \(N, d\)"),
    ],
)
def test_bad_input_raises(emb, kwargs, match):
    with pytest.raises(ValueError, match=match):
        setpo.diversity_marginals(emb, **kwargs)


def test_bad_input_to_setpo_advantages():
    with pytest.raises(ValueError, match=r"rewards has shape \(5,\) but emb has 6 rows"):
        setpo.setpo_advantages(torch.ones(5), torch.randn(6, 3), group_size=3)
    with pytest.raises(ValueError, match=r"rewards has shape \(\) but emb has 3 rows"):
        setpo.setpo_advantages(torch.tensor(1.0), torch.randn(3, 3))
    with pytest.raises(ValueError, match="rewards contains NaN"):
        setpo.setpo_advantages(torch.tensor([1.0, float("nan"), 0.0]), torch.randn(3, 3))
