"""SetGRPO module (a): joint reward-set calibration, a conformal box around each group's coefficients.

See ``setpo.setgrpo`` for the method and which parts are this package's design."""

from __future__ import annotations

import math

import torch

from setpo.advantages import base_advantages, check_estimator
from setpo.groups import as_tensor, check_finite, check_real
from setpo.setgrpo.inputs import check_level, float_rows, grader_scores, response_groups

SCALES = ("response", "pooled")


def joint_coefficient_set(scores, index=None, *, group_size: int | None = None, sigma_min: float = 0.25,
                          scale: str = "pooled", estimator: str = "grpo", eps: float = 1e-6):
    """Centre and scale of the joint coefficient box from two graders.

    scores: (N, 2), grader A and grader B per response. Returns (centre â (N,), sigma σ̂ (N,),
    per-grader advantages (N, 2)), float64 on the scores' device.

    scale="response": σ̂_i = max(|a^A_i − a^B_i|/2, σ_min), the per-response disagreement.
    scale="pooled" (default, our design choice): σ̂_i = max(|a^A_i − a^B_i|/2, σ̄_g, σ_min) with σ̄_g the
        root-mean-square of |a^A − a^B|/2 over the response's group. A two-score difference is a
        one-degree-of-freedom scale estimate: by chance it is near zero for some response of most groups,
        and the max-score over the group then inflates q̂ for every group. The group's pooled disagreement
        floors it, while a single response on which the graders disagree still gets its own wider interval.
    σ_min keeps the box open where the graders agree exactly; it is in advantage units, so it does not
    break positive-affine invariance. Its default, 0.25, is our choice: in a group with only two or three
    distinct responses each grader's z-scores are fixed by the order it puts them in, so two graders that
    merely agree on the order give identical advantages, which is weak evidence that both are right.
    """
    sigma_min = check_real(sigma_min, "sigma_min", minimum=0.0, strict=True)
    if not isinstance(scale, str) or scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r:.40}")
    s = grader_scores(scores)
    groups = response_groups(s.shape[0], index, group_size, s.device)
    check_estimator(estimator)
    eps = check_real(eps, "eps", minimum=0.0, strict=True)
    per = torch.stack([base_advantages(s[:, k], groups, estimator, eps) for k in range(2)], dim=1)
    centre = per.mean(1)
    half_gap = (per[:, 0] - per[:, 1]).abs() / 2
    sigma = half_gap.clamp_min(sigma_min)
    if scale == "pooled":
        sq = torch.zeros(groups.num_groups, dtype=s.dtype, device=s.device).index_add_(0, groups.group_id,
                                                                                         half_gap**2)
        pooled = (sq / groups.sizes.to(s.dtype)).sqrt()[groups.group_id]
        sigma = torch.maximum(sigma, pooled)
    return centre, sigma, per


def reference_coefficients(regrades, index=None, *, group_size: int | None = None, estimator: str = "grpo",
                           eps: float = 1e-6) -> torch.Tensor:
    """Default reference a*: the group advantage of each response's mean over several re-gradings.

    regrades: (R, N) or (R, N, n_graders) fresh grader scores of the same responses (any number of graders;
    all are averaged). Returns (N,) float64. Any other reference (a stronger grader, human labels) can be
    passed to the calibration functions instead.
    """
    r = as_tensor(regrades, name="regrades", dtype=torch.float64)
    if r.ndim == 3:
        r = r.reshape(r.shape[0], r.shape[1], -1).transpose(0, 1).reshape(r.shape[1], -1)  # (N, R·k)
    elif r.ndim == 2:
        r = r.transpose(0, 1)
    else:
        raise ValueError(f"regrades must have shape (R, N) or (R, N, n_graders), got {tuple(r.shape)}")
    if bool(torch.isnan(r).any()):
        raise ValueError("regrades contain missing (NaN) scores; every re-grading needs a score per response")
    check_finite(r, "regrades")
    groups = response_groups(r.shape[0], index, group_size, r.device)
    check_estimator(estimator)
    eps = check_real(eps, "eps", minimum=0.0, strict=True)
    return base_advantages(r.mean(1), groups, estimator, eps)


def conformal_scores(reference, centre, sigma, index=None, *, group_size: int | None = None) -> torch.Tensor:
    """Per-group nonconformity score s_j = max_i |a*_ji − â_ji| / σ̂_ji. All inputs (N,); returns (B,)."""
    c = float_rows(centre, "centre", len(centre))
    n = c.shape[0]
    ref, sig = float_rows(reference, "reference", n, c.device), float_rows(sigma, "sigma", n, c.device)
    if bool((sig <= 0).any()):
        raise ValueError("sigma must be positive (use sigma_min > 0)")
    groups = response_groups(n, index, group_size, c.device)
    ratio = groups.pad((ref - c).abs() / sig, fill=0.0)  # padded slots score 0, never the max
    return ratio.amax(-1)


def min_calibration_size(alpha: float) -> int:
    """Smallest n with ⌈(n+1)(1−α)⌉ ≤ n, i.e. the fewest calibration groups that give a finite q̂."""
    check_level(alpha, "alpha")
    n = 1
    while math.ceil((n + 1) * (1 - alpha) - 1e-12) > n:
        n += 1
    return n



def conformal_quantile(scores, alpha: float) -> float:
    """Split-conformal quantile q̂: the ⌈(n+1)(1−α)⌉-th smallest of n calibration scores.

    Raises ValueError when n is too small for α (the rank would exceed n and q̂ would be infinite).
    """
    check_level(alpha, "alpha")
    s = as_tensor(scores, name="calibration scores", dtype=torch.float64).reshape(-1)
    check_finite(s, "calibration scores")
    n = s.numel()
    rank = math.ceil((n + 1) * (1 - alpha) - 1e-12)  # the 1e-12 stops 0.9*10 = 9.000000000000002 rounding up
    if rank > n:
        raise ValueError(
            f"calibration set too small for alpha={alpha}: {n} calibration groups give rank "
            f"ceil((n+1)(1-alpha)) = {rank} > n; need at least {min_calibration_size(alpha)} groups "
            f"(or a larger alpha)"
        )
    return float(torch.sort(s).values[rank - 1])


def covers(reference, centre, sigma, q: float, index=None, *, group_size: int | None = None) -> torch.Tensor:
    """(B,) bool: is each group's reference inside its box C = Π_i [â_i ± q σ̂_i]?"""
    q = check_real(q, "q", minimum=0.0)
    return conformal_scores(reference, centre, sigma, index, group_size=group_size) <= q
