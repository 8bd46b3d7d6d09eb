"""Policy losses on small hand-computed cases: clipping at both bounds, masks, aggregation, KL."""

import math

import pytest
import torch

from setpo.losses import aggregate, gspo_loss, kl_k3, policy_loss, ppo_clip_loss, soft_overlong_penalty
from setpo.presets import PRESETS

D = torch.float64


def lp(x):
    return torch.tensor(x, dtype=D)


def test_ppo_clip_token_level_both_bounds_and_mask():
    # ratios: row 0 = [1.5, 0.5, 1.1]; row 1 = [1.5, 0.5, 9 (masked)]
    ratios = torch.tensor([[1.5, 0.5, 1.1], [1.5, 0.5, 9.0]], dtype=D)
    old = torch.zeros(2, 3, dtype=D)
    new = ratios.log()
    adv = lp([1.0, -1.0])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    loss, m = ppo_clip_loss(new, old, adv, mask, clip_low=0.2, agg="token-mean")
    # A>0: -min(ρ, clip(ρ)) -> -1.2 (clipped high), -0.5 (unclipped low side), -1.1
    # A<0: -min(-ρ, -clip(ρ)) = max(ρ, clip(ρ)) -> 1.5 (unclipped), 0.8 (clipped low)
    per_token = [-1.2, -0.5, -1.1, 1.5, 0.8]
    assert float(loss) == pytest.approx(sum(per_token) / 5)
    assert m["clip_frac"] == pytest.approx(2 / 5)


def test_clip_higher_dapo():
    ratios = torch.tensor([[1.25, 1.35]], dtype=D)
    loss, _ = ppo_clip_loss(ratios.log(), torch.zeros(1, 2, dtype=D), lp([1.0]), torch.ones(1, 2),
                            clip_low=0.2, clip_high=0.28)
    assert float(loss) == pytest.approx(-(1.25 + 1.28) / 2)


def test_aggregation_modes():
    loss = torch.tensor([[1.0, 2.0, 3.0, 4.0], [10.0, 0.0, 0.0, 0.0]], dtype=D)
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]])
    assert float(aggregate(loss, mask, "token-mean")) == pytest.approx(20 / 5)
    assert float(aggregate(loss, mask, "seq-mean-token-mean")) == pytest.approx((2.5 + 10) / 2)
    assert float(aggregate(loss, mask, "seq-mean-token-sum-norm")) == pytest.approx(20 / (2 * 4))
    assert float(aggregate(loss, mask, "seq-mean-token-sum-norm", norm_len=10)) == pytest.approx(20 / 20)
    with pytest.raises(ValueError, match="unknown aggregation"):
        aggregate(loss, mask, "sum")


def test_gspo_sequence_ratio_and_clip():
    old = torch.zeros(2, 3, dtype=D)
    # row 0: log-ratios 0.0002, 0.0 and a masked 5.0 -> mean 0.0001; row 1: mean 0.001, above log(1+4e-4)
    new = torch.tensor([[0.0002, 0.0, 5.0], [0.001, 0.001, 0.001]], dtype=D)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    adv = lp([1.0, 1.0])
    loss, m = gspo_loss(new, old, adv, mask)
    s0 = math.exp(0.0001)          # inside the clip range: unclipped
    s1 = 1 + 4e-4                  # exp(0.001) is above 1+4e-4: clipped
    assert float(loss) == pytest.approx(-(s0 + s1) / 2, rel=1e-12)
    assert m["clip_frac"] == pytest.approx(0.5)


def test_gspo_gradient_reaches_every_token_of_unclipped_sequence():
    new = torch.zeros(1, 4, dtype=D, requires_grad=True)
    loss, _ = gspo_loss(new, torch.zeros(1, 4, dtype=D), lp([2.0]), torch.tensor([[1, 1, 1, 0]]))
    loss.backward()
    # d/dlogp_t of -A * s with s = exp(mean log ratio): -A * s / |y| per real token, 0 for the masked one.
    torch.testing.assert_close(new.grad, torch.tensor([[-2 / 3, -2 / 3, -2 / 3, 0.0]], dtype=D))


def test_kl_k3_values():
    logp = lp([[0.0, math.log(0.5)]])
    ref = lp([[0.0, math.log(0.25)]])
    d = math.log(0.25) - math.log(0.5)
    torch.testing.assert_close(kl_k3(logp, ref), lp([[0.0, math.exp(d) - d - 1]]))
    assert bool((kl_k3(torch.randn(5, 7, dtype=D), torch.randn(5, 7, dtype=D)) >= 0).all())


def test_policy_loss_presets_and_kl():
    gen = torch.Generator().manual_seed(0)
    new, old, ref = (torch.randn(3, 5, generator=gen, dtype=D) * 0.1 for _ in range(3))
    adv, mask = lp([1.0, -0.5, 0.2]), torch.ones(3, 5)
    loss_grpo, _ = policy_loss(PRESETS["grpo"], new, old, adv, mask)
    want, _ = ppo_clip_loss(new, old, adv, mask, clip_low=0.2, clip_high=0.2)
    assert float(loss_grpo) == pytest.approx(float(want))
    loss_gspo, _ = policy_loss(PRESETS["gspo"], new, old, adv, mask)
    assert float(loss_gspo) == pytest.approx(float(gspo_loss(new, old, adv, mask)[0]))
    with_kl, m = policy_loss(PRESETS["dapo"], new, old, adv, mask, ref_log_prob=ref, kl_coef=0.01)
    base, _ = ppo_clip_loss(new, old, adv, mask, clip_low=0.2, clip_high=0.28)
    assert float(with_kl) == pytest.approx(float(base) + 0.01 * m["kl"])


def test_shape_errors_name_the_problem():
    with pytest.raises(ValueError, match="mask has shape"):
        ppo_clip_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2), torch.ones(2, 4))
    with pytest.raises(ValueError, match="advantages has 3 rows"):
        ppo_clip_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3), torch.ones(2, 3))


def test_soft_overlong_penalty():
    pen = soft_overlong_penalty([10, 16, 18, 20], max_len=20, cache_len=4)
    torch.testing.assert_close(pen, torch.tensor([0.0, 0.0, -0.5, -1.0]))
    with pytest.raises(ValueError, match="cache_len"):
        soft_overlong_penalty([1], max_len=4, cache_len=4)


# ------------------------------------------------------------------ hostile inputs: padding, masks, missing terms
@pytest.mark.parametrize("loss_fn", [ppo_clip_loss, gspo_loss])
@pytest.mark.parametrize("junk", [math.nan, -math.inf, math.inf, 1e30])
def test_padding_reaches_neither_the_loss_nor_its_gradient(loss_fn, junk):
    gen = torch.Generator().manual_seed(1)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    clean = (torch.randn(2, 4, generator=gen, dtype=D) * 0.01).masked_fill(mask == 0, 0.0)
    old = torch.zeros(2, 4, dtype=D)
    adv = lp([1.0, -2.0])
    got_lp = clean.masked_fill(mask == 0, junk).requires_grad_()
    want_lp = clean.clone().requires_grad_()
    got, _ = loss_fn(got_lp, old.masked_fill(mask == 0, junk), adv, mask)
    want, _ = loss_fn(want_lp, old, adv, mask)
    got.backward()
    want.backward()
    assert float(got.detach()) == float(want.detach())
    assert torch.equal(got_lp.grad, want_lp.grad)
    assert bool((got_lp.grad[mask == 0] == 0).all())


@pytest.mark.parametrize("bad", [2, 0.5, -1, math.nan])
def test_a_mask_holds_zeros_and_ones_only(bad):
    mask = torch.tensor([[1.0, bad]], dtype=D)
    with pytest.raises(ValueError, match="mask must hold 0 and 1"):
        ppo_clip_loss(torch.zeros(1, 2, dtype=D), torch.zeros(1, 2, dtype=D), lp([1.0]), mask)
    with pytest.raises(ValueError, match="mask must hold 0 and 1"):
        aggregate(torch.zeros(1, 2, dtype=D), mask)


def test_a_bool_mask_equals_its_0_1_form():
    new, old = torch.randn(2, 3, dtype=D) * 0.1, torch.zeros(2, 3, dtype=D)
    ints = torch.tensor([[1, 1, 0], [1, 0, 0]])
    a, _ = ppo_clip_loss(new, old, lp([1.0, -1.0]), ints)
    b, _ = ppo_clip_loss(new, old, lp([1.0, -1.0]), ints.bool())
    assert float(a) == float(b)


@pytest.mark.parametrize("where", ["log_prob", "old_log_prob", "advantages"])
def test_a_non_finite_value_at_a_real_token_is_refused(where):
    args = {"log_prob": torch.zeros(2, 2, dtype=D), "old_log_prob": torch.zeros(2, 2, dtype=D),
            "advantages": lp([1.0, 1.0]), "mask": torch.ones(2, 2)}
    args[where] = args[where].clone()
    args[where].view(-1)[1] = math.nan
    with pytest.raises(ValueError, match=f"{where}.*(NaN|infinite)"):
        ppo_clip_loss(**args)


def test_integer_log_probs_and_tensors_elsewhere_are_refused():
    with pytest.raises(ValueError, match="old_log_prob must be a float tensor"):
        ppo_clip_loss(torch.zeros(1, 2), torch.zeros(1, 2, dtype=torch.long), lp([1.0]), torch.ones(1, 2))
    with pytest.raises(ValueError, match="mask must be a torch tensor"):
        ppo_clip_loss(torch.zeros(1, 2), torch.zeros(1, 2), lp([1.0]), [[1, 1]])
    with pytest.raises(ValueError, match="meta"):
        ppo_clip_loss(torch.zeros(1, 2, device="meta"), torch.zeros(1, 2), lp([1.0]), torch.ones(1, 2))


def test_a_kl_term_asked_for_is_never_left_out():
    x, mask = torch.zeros(1, 2, dtype=D), torch.ones(1, 2)
    with pytest.raises(ValueError, match="kl_coef=0.1 needs ref_log_prob"):
        policy_loss(PRESETS["grpo"], x, x, lp([1.0]), mask, kl_coef=0.1)
    with pytest.raises(ValueError, match="kl_coef"):
        policy_loss(PRESETS["grpo"], x, x, lp([1.0]), mask, ref_log_prob=x, kl_coef=-0.1)


def test_a_preset_is_an_algorithm_preset_or_its_name():
    gen = torch.Generator().manual_seed(2)
    new, old = (torch.randn(2, 3, generator=gen, dtype=D) * 0.1 for _ in range(2))
    adv, mask = lp([1.0, -1.0]), torch.ones(2, 3)
    for name in ("grpo", "gspo", "dapo"):
        assert float(policy_loss(name, new, old, adv, mask)[0]) == float(policy_loss(PRESETS[name], new, old,
                                                                                     adv, mask)[0])
    with pytest.raises(ValueError, match="unknown algorithm preset 'ppo'"):
        policy_loss("ppo", new, old, adv, mask)
    with pytest.raises(ValueError, match="AlgorithmPreset"):
        policy_loss({"name": "grpo"}, new, old, adv, mask)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_a_batch_without_tokens_reduces_to_zero(mode):
    for shape in [(0, 4), (3, 0)]:
        assert float(aggregate(torch.zeros(shape, dtype=D), torch.zeros(shape), mode)) == 0.0
    assert float(aggregate(torch.full((2, 3), math.nan, dtype=D), torch.zeros(2, 3), mode)) == 0.0


@pytest.mark.parametrize("norm_len", [0, -3, 2.5, True, "4"])
def test_aggregate_checks_norm_len(norm_len):
    with pytest.raises(ValueError, match="norm_len"):
        aggregate(torch.ones(1, 2, dtype=D), torch.ones(1, 2), "seq-mean-token-sum-norm", norm_len=norm_len)


def test_gspo_clip_high_none_is_symmetric():
    new = torch.tensor([[0.01, 0.01], [-0.01, -0.01]], dtype=D)
    old, adv, mask = torch.zeros(2, 2, dtype=D), lp([1.0, -1.0]), torch.ones(2, 2)
    a, _ = gspo_loss(new, old, adv, mask, clip_low=0.005, clip_high=None)
    b, _ = gspo_loss(new, old, adv, mask, clip_low=0.005, clip_high=0.005)
    assert float(a) == float(b)


def test_soft_overlong_penalty_keeps_lengths_exact():
    with pytest.raises(ValueError, match="max_len must be <= 2\\*\\*53"):
        soft_overlong_penalty([1], max_len=2**60, cache_len=4)
