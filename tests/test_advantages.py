"""Base estimators against verl and hand-computed values; the SetPO combination; the registry."""

import numpy as np
import pytest
import torch

import setpo
from setpo.advantages import ADVANTAGE_ESTIMATORS, group_advantages, register_estimator, setpo_advantages
from setpo.presets import PRESETS, get_preset


def test_grpo_matches_verl_on_ragged_uids():
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    rng = np.random.default_rng(0)
    sizes = [3, 5, 4, 8, 2]
    uids = np.repeat(np.array([f"prompt-{i}" for i in range(len(sizes))], dtype=object), sizes)
    perm = rng.permutation(len(uids))
    uids = uids[perm]
    rewards = torch.tensor(rng.choice([0.0, 0.1, 1.0], size=len(uids)), dtype=torch.float32)
    rewards[:3] = torch.tensor([1.0, 0.0, 0.1])  # make sure groups are not all-equal by chance
    length = 6
    token_rewards = torch.zeros(len(uids), length)
    token_rewards[:, -1] = rewards  # outcome reward on the last token, as verl lays it out
    mask = torch.ones(len(uids), length)
    verl_adv, _ = compute_grpo_outcome_advantage(token_rewards, mask, uids)
    ours = setpo.group_advantages(rewards, uids)
    torch.testing.assert_close(ours, verl_adv[:, 0], atol=1e-6, rtol=1e-5)
    verl_dr, _ = compute_grpo_outcome_advantage(token_rewards, mask, uids, norm_adv_by_std_in_grpo=False)
    torch.testing.assert_close(setpo.group_advantages(rewards, uids, estimator="dr_grpo"), verl_dr[:, 0],
                               atol=1e-6, rtol=1e-5)


def test_dr_grpo_and_rloo_by_hand():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 0.0, 4.0], dtype=torch.float64)
    # groups: a = rows 0,1,2 (mean 1/3); b = rows 3,4,5,6 (mean 7/4)
    idx = ["a", "a", "a", "b", "b", "b", "b"]
    dr = setpo.group_advantages(r, idx, estimator="dr_grpo")
    torch.testing.assert_close(dr, torch.tensor([2 / 3, -1 / 3, -1 / 3, -0.75, 0.25, -1.75, 2.25], dtype=torch.float64))
    rloo = setpo.group_advantages(r, idx, estimator="rloo")
    expected = [1 - 0.0, 0 - 0.5, 0 - 0.5, 1 - 2.0, 2 - 5 / 3, 0 - 7 / 3, 4 - 1.0]
    torch.testing.assert_close(rloo, torch.tensor(expected, dtype=torch.float64))


def test_grpo_by_hand_contiguous():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0], dtype=torch.float64)
    adv = setpo.group_advantages(r, group_size=3, eps=1e-300)  # eps must be > 0; this one is below float64 rounding of std
    mean, std = 1 / 3, np.std([1, 0, 0], ddof=1)
    torch.testing.assert_close(adv[:3], torch.tensor([(1 - mean) / std, -mean / std, -mean / std], dtype=torch.float64))
    # An all-equal group has zero advantage (eps keeps 0/0 away).
    torch.testing.assert_close(setpo.group_advantages(r, group_size=3)[3:], torch.zeros(3, dtype=torch.float64))


def test_setpo_is_base_plus_lambda_marginal():
    gen = torch.Generator().manual_seed(0)
    r = torch.randint(0, 2, (24,), generator=gen).double()
    e = torch.randn(24, 16, generator=gen, dtype=torch.float64)
    idx = np.arange(24) % 4  # four interleaved groups of six
    for est in ADVANTAGE_ESTIMATORS:
        got = setpo.setpo_advantages(r, e, idx, lam=0.3, estimator=est)
        want = setpo.group_advantages(r, idx, estimator=est) + 0.3 * setpo.diversity_marginals(e, idx)
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(setpo.setpo_advantages(r, e, idx, lam=0.0), setpo.group_advantages(r, idx))
    adv, s = setpo.setpo_advantages(r, e, idx, lam=0.3, return_marginals=True)
    torch.testing.assert_close(s, setpo.diversity_marginals(e, idx))
    torch.testing.assert_close(adv, setpo.setpo_advantages(r, e, idx, lam=0.3))


def test_registry_rejects_unknown_and_duplicate_names():
    with pytest.raises(ValueError, match="unknown estimator 'ppo'"):
        setpo.group_advantages([1.0, 0.0, 1.0], estimator="ppo")
    with pytest.raises(ValueError, match="already registered"):
        register_estimator("grpo")(lambda r, v, eps: r)


def test_custom_estimator_is_used_by_name():
    register_estimator("double")(lambda r, valid, eps: r * 2)
    try:
        torch.testing.assert_close(setpo.group_advantages(torch.tensor([1.0, 2.0, 3.0]), estimator="double"),
                                   torch.tensor([2.0, 4.0, 6.0]))
    finally:  # the registry is one dict, shared by the whole test session
        del ADVANTAGE_ESTIMATORS["double"]


def test_groups_with_signal_marks_dapo_filter():
    r = [1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.5, 0.5]
    idx = [0, 0, 0, 1, 1, 1, 2, 2]
    assert setpo.groups_with_signal(r, idx).tolist() == [False] * 3 + [True] * 3 + [False] * 2


def test_group_advantages_bad_input():
    with pytest.raises(ValueError, match="at least 2"):
        setpo.group_advantages([1.0, 0.0, 1.0], [0, 0, 1])
    with pytest.raises(ValueError, match="NaN or infinite"):
        setpo.group_advantages([1.0, float("inf"), 1.0])
    with pytest.raises(ValueError, match=r"shape \(N,\)"):
        setpo.group_advantages(torch.ones(2, 3))


def test_presets_have_the_paper_lambdas():
    assert {k: p.lam for k, p in PRESETS.items()} == {
        "grpo": 0.05, "gspo": 0.1, "dapo": 0.2, "grpo_32b": 0.1, "countdown": 0.5}
    assert get_preset("gspo").ratio_level == "sequence"
    with pytest.raises(ValueError, match="unknown algorithm preset"):
        get_preset("ppo")


def test_output_on_input_device_and_dtype():
    r = np.array([1.0, 0.0, 0.5], dtype=np.float64)
    emb = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)
    out = setpo.setpo_advantages(r, emb)
    # the wider of the rewards' and the embeddings' dtypes: float64 rewards keep their precision
    assert out.dtype == torch.float64 and out.device.type == "cpu"
    assert setpo.setpo_advantages(r.astype(np.float32), emb).dtype == torch.float32
    assert setpo.setpo_advantages(r.astype(np.float32), emb.astype(np.float64)).dtype == torch.float64


def test_pairwise_penalty_is_minus_the_mean_similarity_to_the_rest():
    from setpo.diversity import DIVERSITY_TERMS, cosine_kernel, pairwise_similarity_penalty

    gen = torch.Generator().manual_seed(3)
    emb = torch.randn(7, 5, generator=gen, dtype=torch.float64)
    index = [0, 1, 0, 1, 0, 1, 1]                            # ragged: groups of 3 and 4, interleaved
    got = pairwise_similarity_penalty(emb, index)
    for gid in (0, 1):
        rows = [i for i, x in enumerate(index) if x == gid]
        k = cosine_kernel(emb[rows])
        expect = -(k.sum(-1) - 1.0) / (len(rows) - 1)
        torch.testing.assert_close(got[rows], expect)
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    adv = setpo_advantages(rewards, emb, index, lam=0.3, diversity="pairwise")
    torch.testing.assert_close(adv, group_advantages(rewards, index) + 0.3 * got)
    assert set(DIVERSITY_TERMS) >= {"setpo", "pairwise"}
    with pytest.raises(ValueError, match="unknown diversity term"):
        setpo_advantages(rewards, emb, index, diversity="entropy")


def test_pairwise_penalty_bounds():
    from setpo.diversity import pairwise_similarity_penalty

    assert torch.equal(pairwise_similarity_penalty(torch.eye(4)), torch.zeros(4))      # all orthogonal
    assert torch.allclose(pairwise_similarity_penalty(torch.ones(3, 2)), -torch.ones(3))  # all the same
    with pytest.raises(ValueError, match="at least 2"):
        pairwise_similarity_penalty(torch.eye(3), index=[0, 0, 1])


def test_spreads_that_overflow_their_sum_are_still_accepted():
    # The NaN/inf check looks at the sum of the groups' spreads first; finite spreads whose sum overflows
    # float32 must fall back to looking at each reward, not be refused.
    r = torch.tensor([3e38, 0.0, 3e38, 0.0])
    adv = group_advantages(r, group_size=2)
    assert torch.isfinite(adv).all() and adv[0] > 0 > adv[1]
    with pytest.raises(ValueError, match="NaN or infinite"):
        group_advantages(torch.tensor([3e38, 0.0, float("inf"), 0.0]), group_size=2)


def test_shared_constants_work_in_and_out_of_inference_mode():
    # The estimator's constants are made once and reused; made first under inference_mode they must still
    # serve a later call whose inputs need gradients (an inference tensor cannot be saved for backward).
    from setpo.groups import const

    gen = torch.Generator().manual_seed(0)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    with torch.inference_mode():
        emb = torch.randn(6, 4, generator=gen, dtype=torch.float64) + 1.0
        ref = setpo_advantages(rewards, emb, group_size=3, lam=0.5)
        assert not const(0.125, emb).is_inference()
    leaf = emb.clone().requires_grad_(True)
    adv = setpo_advantages(rewards, leaf, group_size=3, lam=0.5)
    adv.sum().backward()
    assert torch.equal(adv.detach(), ref) and torch.isfinite(leaf.grad).all()
    assert const(0.125, emb) is const(0.125, emb) and const(0.125, emb).dtype == torch.float64


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo"])
def test_huge_rewards_are_not_silently_zeroed(estimator):
    # Squared deviations of float32 rewards above ~1e19 overflow: the group must be computed wider, not
    # come back as 0 (GRPO's std would be inf).
    r = torch.tensor([1e20, 0.0, 0.0, 2.0, 1.0, 0.0])
    got = group_advantages(r, group_size=3, estimator=estimator)
    expect = group_advantages(r.double(), group_size=3, estimator=estimator).float()
    assert got.dtype == torch.float32 and torch.equal(got, expect) and got[0] > 0
    with pytest.raises(ValueError, match="rescale"):
        group_advantages(torch.tensor([1e200, 0.0, 1.0], dtype=torch.float64), estimator=estimator)


def test_setpo_advantages_is_the_one_sum():
    """Â = Ā + λ·s, with Ā from the estimator or given (as an engine that normalises rewards itself gives it)."""
    gen = torch.Generator().manual_seed(5)
    r = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    emb = torch.randn(9, 4, generator=gen, dtype=torch.float64)
    adv, marg = setpo_advantages(r, emb, group_size=3, lam=0.25, return_marginals=True)
    bar = group_advantages(r, group_size=3)
    assert adv.dtype == torch.float64                                     # the wider of Ā's and s's dtypes
    assert torch.equal(adv, bar.double() + 0.25 * marg)  # λ·s rounded, then added: the bits every engine records
    # a given Ā: used as is, not modified, and Â keeps its dtype (s is cast to it first)
    base = torch.randn(9, generator=gen)
    before = base.clone()
    given = setpo_advantages(None, emb, group_size=3, base=base, lam=0.25)
    assert given.dtype == torch.float32 and torch.equal(base, before)
    assert torch.equal(given, base + 0.25 * marg.float())
    assert torch.equal(setpo_advantages(None, emb, group_size=3, base=base, lam=0.0), base)  # λ = 0: Ā exactly
    assert torch.equal(setpo_advantages(None, None, group_size=3, base=base, lam=0.0), base)  # no emb needed
    # not a fused multiply-add, whose bits depend on the kernels the processor gets (they differ here)
    for dtype in (torch.float32, torch.float64):
        a = torch.randn(4096, generator=gen, dtype=dtype)
        e = torch.randn(4096, 3, generator=gen, dtype=dtype)
        out, s = setpo_advantages(None, e, group_size=8, base=a, lam=0.05, return_marginals=True)
        assert torch.equal(out, a + 0.05 * s)
    with pytest.raises(ValueError, match="exactly one of rewards"):
        setpo_advantages(r, emb, group_size=3, base=base)
    with pytest.raises(ValueError, match="exactly one of rewards"):
        setpo_advantages(None, emb, group_size=3)
    with pytest.raises(ValueError, match="embeddings"):
        setpo_advantages(r, None, group_size=3, lam=0.1)
    with pytest.raises(ValueError, match="base"):
        setpo_advantages(None, emb, group_size=3, base=base[:6])


def test_lambda_in_units_of_the_terms_spread_and_rows_without_term():
    gen = torch.Generator().manual_seed(8)
    r = torch.randint(0, 2, (12,), generator=gen).float()
    emb = torch.randn(12, 5, generator=gen)
    no_term = torch.tensor([True, False, False] * 4)
    adv, s = setpo_advantages(r, emb, group_size=4, lam=0.3, lam_units="term_std", without_term=no_term,
                              return_marginals=True)
    raw = setpo.diversity_marginals(emb, group_size=4)
    assert torch.equal(s, raw.masked_fill(no_term, 0.0))                 # s after without_term, before the units
    assert torch.equal(adv, group_advantages(r, group_size=4) + 0.3 * (s / float(s.std())))
    # no spread: the term adds nothing in these units
    same = torch.ones(6, 3)
    flat_r = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 1.0])
    assert torch.equal(setpo_advantages(flat_r, same, group_size=3, lam=2.0, lam_units="term_std"),
                       group_advantages(flat_r, group_size=3))
    with pytest.raises(ValueError, match="lam_units"):
        setpo_advantages(r, emb, group_size=4, lam_units="sigma")
    with pytest.raises(ValueError, match="without_term"):
        setpo_advantages(r, emb, group_size=4, without_term=no_term[:6])


def test_small_groups_follow_verls_conventions_when_asked():
    """small_groups="verl": a lone response gets r / (1 + eps) under GRPO (mean 0, std 1), r otherwise; groups
    of one or two get s = 0; the other groups' Ā and s are those of the same call without the small groups."""
    gen = torch.Generator().manual_seed(9)
    index = ["a", "b", "b", "c", "c", "c", "d", "d", "d", "d"]
    r = torch.tensor([0.7, 1.0, 0.0, 1.0, 0.0, 0.5, 1.0, 1.0, 0.0, 0.25])
    emb = torch.randn(10, 6, generator=gen)
    with pytest.raises(ValueError, match="at least"):
        setpo_advantages(r, emb, index, lam=0.2)                          # the default refuses them
    for estimator in ("grpo", "rloo"):
        adv, s = setpo_advantages(r, emb, index, lam=0.2, estimator=estimator, small_groups="verl",
                                  return_marginals=True)
        lone = r[0] / (1 + 1e-6) if estimator == "grpo" else r[0]
        assert torch.equal(adv[0], lone) and torch.equal(s[:3], torch.zeros(3))
        torch.testing.assert_close(adv[1:3], group_advantages(r[1:3], estimator=estimator))
        rest = setpo_advantages(r[3:], emb[3:], index[3:], lam=0.2, estimator=estimator, return_marginals=True)
        torch.testing.assert_close(adv[3:], rest[0])
        assert torch.equal(s[3:], rest[1])
    # no group of three: s is 0 in Ā's dtype, and λ = 0 needs no embeddings
    adv, s = setpo_advantages(r[:3], emb[:3], index[:3], lam=0.2, small_groups="verl", return_marginals=True)
    assert torch.equal(s, torch.zeros(3)) and adv.dtype == torch.float32
    assert torch.equal(setpo_advantages(r[:3], None, index[:3], lam=0.0, small_groups="verl"), adv)
    with pytest.raises(ValueError, match="small_groups"):
        setpo_advantages(r, emb, index, small_groups="drop")


def test_group_level_api_and_a_registered_diversity_term():
    from setpo.diversity import (DIVERSITY_TERMS, as_embeddings, diversity_term, group_kernels, group_marginals,
                                 register_diversity_term)
    from setpo.groups import Groups

    gen = torch.Generator().manual_seed(6)
    emb = torch.randn(7, 5, generator=gen, dtype=torch.float64)
    index = ["a", "b", "a", "b", "a", "b", "b"]
    e = as_embeddings(emb)
    groups = Groups.build(7, index)
    k = group_kernels(e, groups)
    assert k.shape == (2, 4, 4) and torch.all((k >= 0) & (k <= 1))
    torch.testing.assert_close(group_marginals(e, groups), setpo.diversity_marginals(emb, index))

    name = "test_negated_setpo"
    if name not in DIVERSITY_TERMS:
        register_diversity_term(name)(lambda e, groups: -group_marginals(e, groups))
    torch.testing.assert_close(diversity_term(name, emb, index), -setpo.diversity_marginals(emb, index))
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0], dtype=torch.float64)
    torch.testing.assert_close(setpo_advantages(r, emb, index, lam=0.5, diversity=name),
                               group_advantages(r, index) - 0.5 * setpo.diversity_marginals(emb, index))
    with pytest.raises(ValueError, match="already registered"):
        register_diversity_term(name)(lambda e, groups: e[:, 0])
    with pytest.raises(ValueError, match="non-empty str"):
        register_diversity_term("")
    with pytest.raises(ValueError, match="unknown diversity term 'nope'"):
        diversity_term("nope", emb, index)
