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
