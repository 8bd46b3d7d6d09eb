"""SetGRPO: calibrated grader-induced coefficients for rubric-graded GRPO (three modules).

Source and status. SetGRPO is described in Huang et al., "SetGRPO: Calibrating Grader-Induced Policy
Optimization" (2026). Only its abstract and figure/table captions are public, and they give no formula. Every
formula in this module is therefore **this package's design**, built to do what the abstract says each module
does, on top of public methods:

- split conformal prediction (Vovk, Gammerman & Shafer 2005; Lei, G'Sell, Rinaldo, Tibshirani & Wasserman
  2018) for the joint coefficient set of module (a);
- Learn-then-Test (Angelopoulos, Bates, Candès, Jordan & Lei 2021) with fixed-sequence testing and binomial
  or Hoeffding–Bentkus p-values (Bates, Angelopoulos, Lei, Malik & Jordan 2021, "RCPS") for module (c);
- the group-relative advantage of GRPO (Shao et al. 2024), taken from ``setpo.group_advantages``.

Setting. Each response i of a group (one prompt, G responses) gets two grader scores r^A_i, r^B_i. GRPO
normalises rewards jointly within the group, so one grader's slip moves the coefficients of the whole group.

(a) Joint reward-set calibration (``joint_coefficient_set``, ``conformal_scores``, ``conformal_quantile``).
    Per-grader group advantages a^A, a^B (the "grpo" estimator of ``setpo.advantages``), centre
    â = (a^A + a^B)/2 and a per-response scale σ̂_i from the graders' disagreement |a^A_i − a^B_i|/2, floored
    by σ_min and (default, our choice) by the group's pooled disagreement. On held-out calibration groups j
    with reference coefficients a*_j (by default the group advantage of the mean of several re-gradings,
    ``reference_coefficients``; any other reference can be passed), the score is
    s_j = max_i |a*_ji − â_ji| / σ̂_ji and q̂ is the ⌈(n+1)(1−α)⌉-th smallest of n scores. The box
    C = Π_i [â_i − q̂σ̂_i, â_i + q̂σ̂_i] then holds a fresh group's a* with probability ≥ 1 − α when
    calibration and fresh groups are exchangeable (split conformal with a max-score over the group).

(b) Geometry-guided safe recovery (``safe_recovery``, ``worst_case_agreement``, ``gate_scores``).
    Per-response gradient features g_i (∇θ of the response's length-normalised log-probability; exact for
    the toy policy of ``envs.rubric``, last-layer or random-projection features for language models) give
    the group's Gram K_ij = ⟨g_i, g_j⟩, so coefficients c produce the update Σ_i c_i g_i and
    ⟨Σ a_i g_i, Σ c_i g_i⟩ = aᵀKc. For a box inflation τ ≥ 0 let C(τ) = Π_i [â_i ± τq̂σ̂_i] (τ = 1 is the
    calibrated box). The anchor c₀(τ) is the point of C(τ) nearest 0 (â soft-thresholded by τq̂σ̂), the
    path c(η) = c₀(τ) + η(â − c₀(τ)), and the worst-case agreement of the update with any coefficient vector
    in C(τ) is

        m_τ(η) = min_{a∈C(τ)} aᵀK c(η) = vᵀâ − τq̂ Σ_i σ̂_i |v_i|,   v = K c(η),

    concave in η (affine minus a sum of absolute values of affine maps). η*(τ) is the largest η ∈ [0, 1]
    with m_τ(η) ≥ 0, found by bisection from a safe breakpoint (m_τ is piecewise linear, so a non-negative
    value, if any, shows at a breakpoint). The group is *accepted at τ* when that update is not zero.

    Design choice (ours). PAPERS.md's score ρ = m(η*)/(‖c(η*)‖_K ‖â‖_K) is zero whenever η* < 1
    (m(η*) = 0 there), so it cannot rank partial recoveries, and a gate on the calibrated box alone leaves
    nothing for the risk test to choose. We make the threshold the box inflation instead: the gate score is
    ρ = the largest τ at which the group is still accepted ("how far the calibrated box can grow before no
    safe update is left"; ``gate_scores``, bisection over τ), and a group passes the gate at τ when ρ ≥ τ,
    updating with c(η*(τ)). τ = 1 reproduces PAPERS.md's anchor, path, m and η*; τ = 0 accepts every group
    with its centre â, i.e. plain two-grader GRPO.

(c) Selective risk-gated optimisation (``reversal_indicators``, ``ltt_select_threshold``). Rejected groups
    get zero coefficients. A *direction reversal* is an accepted group whose applied update disagrees with
    the reference update: c(η*(τ))ᵀ K a* < 0. τ is chosen from a grid by fixed-sequence testing (LTT),
    strictest first: for each τ the null "reversal rate among accepted groups > β" is tested with the
    binomial p-value P(Bin(N_τ, β) ≤ F_τ) (N_τ accepted, F_τ reversals on the risk-calibration groups;
    given N_τ the accepted groups are i.i.d., so this p-value is valid) or the Hoeffding–Bentkus one; the
    sequence stops at the first p > δ and the last τ that passed is selected. Then
    P(conditional reversal risk at τ_sel ≤ β) ≥ 1 − δ. The risk groups are disjoint from the coverage groups
    ("independent risk calibration"). Design choices: the grid is τ ∈ {3, 2.5, 2, 1.75, 1.5, 1.25, 1, 0.75,
    0.5, 0.25, 0}; the sequence starts at the strictest τ at which the *coverage* groups predict enough
    accepted risk groups to certify anything (``ltt_start_factor``; thresholds stricter than that cannot
    pass and would only end the sequence early), which keeps the order independent of the risk groups;
    when no τ passes, every group is rejected. ``SetGRPO`` recalibrates (a) and (c) every K steps as the
    policy drifts.

Positive-affine invariance: r → a·r + b with a > 0 leaves every GRPO advantage unchanged (up to the ε in
std + ε), hence â, σ̂ (σ_min is in advantage units), C, the path, ρ and η*; the tests check it.

Composition with SetPO: the accepted coefficients can take SetPO's diversity term, c_i + λ·s_i with s_i
from ``setpo.diversity_marginals`` (added on accepted groups only; a rejected group contributes nothing).

Language models. ``lm_head_gradient_features`` gives the per-response features from one no-grad forward
pass (the exact output-layer gradient of the length-normalised log-probability, or its seeded Kronecker
random projection), and ``SetGRPOTrainer`` (TRL's ``GRPOTrainer`` with two reward functions acting as the
graders; TRL is imported only when it is first accessed) calibrates on re-graded batches and replaces TRL's
advantages by SetGRPO coefficients.

Shapes: N rows (responses) in B groups, given by a verl-style ``index`` or a contiguous ``group_size``, as
everywhere in setpo; grader scores are (N, 2); gradient features (N, d); per-group outputs are (B,).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from setpo.advantages import group_advantages
from setpo.diversity import diversity_marginals
from setpo.groups import Groups, as_tensor, check_finite

__all__ = [
    "SetGRPO",
    "SetGRPOConfig",
    "SetGRPOOutput",
    "Recovery",
    "binomial_p_value",
    "conformal_quantile",
    "conformal_scores",
    "covers",
    "fixed_sequence_test",
    "gate_scores",
    "gram_matrices",
    "hoeffding_bentkus_p_value",
    "joint_coefficient_set",
    "lm_head_gradient_features",
    "ltt_select_threshold",
    "min_accepted_to_certify",
    "min_calibration_size",
    "reference_coefficients",
    "reversal_indicators",
    "safe_recovery",
    "worst_case_agreement",
]

DEFAULT_TAU_GRID = (3.0, 2.5, 2.0, 1.75, 1.5, 1.25, 1.0, 0.75, 0.5, 0.25, 0.0)


# ----------------------------------------------------------------------------------------------------------
# input checking


def _groups(n_rows: int, index, group_size, device) -> Groups:
    groups = Groups.build(n_rows, index, group_size, device=device)
    small = groups.sizes < 2
    if bool(small.any()):
        g = int(small.nonzero()[0])
        raise ValueError(
            f"SetGRPO needs at least 2 responses per group (group-relative coefficients are undefined for "
            f"one response); group {g} (in order of first appearance) has {int(groups.sizes[g])}"
        )
    return groups


def _grader_scores(scores) -> torch.Tensor:
    s = as_tensor(scores, name="scores")
    if s.ndim != 2 or s.shape[1] != 2:
        raise ValueError(
            f"scores must hold two grader scores per response, shape (N, 2); got {tuple(s.shape)}. "
            f"Stack the graders' scores as columns, e.g. torch.stack([score_a, score_b], dim=1)"
        )
    missing = torch.isnan(s)
    if bool(missing.any()):
        row, col = missing.nonzero()[0].tolist()
        raise ValueError(
            f"grader score missing (NaN) for response {row}, grader {'AB'[col]}: SetGRPO needs both graders' "
            f"scores for every response (re-grade it, or drop its whole group)"
        )
    check_finite(s, "scores")
    return s.to(torch.float64) if s.dtype != torch.float64 else s


def _rows(x, name: str, n: int, device=None) -> torch.Tensor:
    t = as_tensor(x, name=name, device=device, dtype=torch.float64)
    if t.ndim != 1 or t.shape[0] != n:
        raise ValueError(f"{name} must have shape ({n},), got {tuple(t.shape)}")
    check_finite(t, name)
    return t


def _features(features, n: int, device) -> torch.Tensor | None:
    """Shape-checked features in their own float dtype; finiteness is checked on the small Gram matrix."""
    if features is None:
        return None  # identity geometry
    f = as_tensor(features, name="features", device=device)
    if f.ndim != 2 or f.shape[0] != n:
        raise ValueError(f"features must have shape ({n}, d), one gradient feature row per response; "
                         f"got {tuple(f.shape)}")
    return f


# ----------------------------------------------------------------------------------------------------------
# (a) joint reward-set calibration


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
    if not sigma_min > 0:
        raise ValueError(f"sigma_min must be positive, got {sigma_min}")
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    s = _grader_scores(scores)
    groups = _groups(s.shape[0], index, group_size, s.device)
    per = torch.stack([group_advantages(s[:, k], index, group_size=group_size, estimator=estimator, eps=eps)
                       for k in range(2)], dim=1)
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
    _groups(r.shape[0], index, group_size, r.device)
    return group_advantages(r.mean(1), index, group_size=group_size, estimator=estimator, eps=eps)


def conformal_scores(reference, centre, sigma, index=None, *, group_size: int | None = None) -> torch.Tensor:
    """Per-group nonconformity score s_j = max_i |a*_ji − â_ji| / σ̂_ji. All inputs (N,); returns (B,)."""
    c = _rows(centre, "centre", len(centre))
    n = c.shape[0]
    ref, sig = _rows(reference, "reference", n, c.device), _rows(sigma, "sigma", n, c.device)
    if bool((sig <= 0).any()):
        raise ValueError("sigma must be positive (use sigma_min > 0)")
    groups = _groups(n, index, group_size, c.device)
    ratio = groups.pad((ref - c).abs() / sig, fill=0.0)  # padded slots score 0, never the max
    return ratio.amax(-1)


def min_calibration_size(alpha: float) -> int:
    """Smallest n with ⌈(n+1)(1−α)⌉ ≤ n, i.e. the fewest calibration groups that give a finite q̂."""
    _check_level(alpha, "alpha")
    n = 1
    while math.ceil((n + 1) * (1 - alpha) - 1e-12) > n:
        n += 1
    return n


def _check_level(x: float, name: str) -> None:
    if not 0 < x < 1:
        raise ValueError(f"{name} must be in (0, 1), got {x}")


def conformal_quantile(scores, alpha: float) -> float:
    """Split-conformal quantile q̂: the ⌈(n+1)(1−α)⌉-th smallest of n calibration scores.

    Raises ValueError when n is too small for α (the rank would exceed n and q̂ would be infinite).
    """
    _check_level(alpha, "alpha")
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
    return conformal_scores(reference, centre, sigma, index, group_size=group_size) <= q


# ----------------------------------------------------------------------------------------------------------
# (b) geometry-guided safe recovery


def gram_matrices(features, groups: Groups) -> torch.Tensor:
    """(B, G_max, G_max) float64 Gram K_ij = ⟨g_i, g_j⟩ per group; None features → identity.

    The product runs in the features' own dtype (float32 features stay float32: the (N, d) input is read
    once, by the matmul) and only the small Gram is promoted to float64. A NaN or infinity in a row reaches
    that row's Gram entries, so checking the Gram is enough; only then is the input scanned to name it.
    Padded slots are zero rows and columns, so they drop out of every product.
    """
    if features is None:
        eye = torch.eye(groups.max_size, dtype=torch.float64, device=groups.sizes.device)
        k = eye.expand(groups.num_groups, -1, -1).clone()
        valid = groups.valid()
        return k if valid is None else k * valid[:, :, None] * valid[:, None, :]
    f = groups.pad(features, fill=0.0)
    k = (f @ f.transpose(-1, -2)).to(torch.float64)
    if not bool(torch.isfinite(k).all()):
        check_finite(features, "features")
        raise ValueError(f"features are too large: their inner products overflow {features.dtype}")
    return k


@dataclass
class Recovery:
    """Safe recovery of a batch of groups (B groups, G_max slots, T thresholds).

    tau:      (T,) thresholds τ (box inflations) the recovery was solved for.
    anchor:   (B, T, G) c₀(τ), â soft-thresholded by τq̂σ̂ (the point of the box C(τ) nearest 0).
    eta:      (B, T) η*(τ), the largest η ∈ [0, 1] with m_τ(η) ≥ 0 (NaN when none exists).
    m_at_eta: (B, T) m_τ(η*) (≥ 0 where eta is finite).
    accepted: (B, T) bool, the safe update c(η*(τ)) exists and moves the policy (‖Σ c_i g_i‖ is not zero
              to rounding, relative to its bound ‖c‖₂ · sqrt(tr K)).
    coef:     (B, T, G) c(η*(τ)) for accepted groups, zero for rejected ones.
    rho:      (B,) gate score, the largest τ ≤ rho_max at which the group is accepted (bisection over τ;
              −inf when it is not accepted even at τ = 0, i.e. â moves nothing), or None if not computed.
    """

    tau: torch.Tensor
    anchor: torch.Tensor
    eta: torch.Tensor
    m_at_eta: torch.Tensor
    accepted: torch.Tensor
    coef: torch.Tensor
    rho: torch.Tensor | None = None


class _Path:
    """Recovery paths c(η) = c₀(τ) + η(â − c₀(τ)) of B groups at T thresholds each.

    centre, sigma: (B, G); gram: (B, G, G); tau: (B, T). Ratios are evaluated at (B, T, P).
    """

    def __init__(self, centre, sigma, q, gram, tau):
        self.centre, self.box = centre[:, None, :], tau[..., None] * q * sigma[:, None, :]   # (B,1,G), (B,T,G)
        self.anchor = self.centre.sign() * (self.centre.abs() - self.box).clamp_min(0.0)     # (B, T, G)
        self.d = self.centre - self.anchor
        mv = lambda x: (gram[:, None] @ x[..., None])[..., 0]  # noqa: E731  (B, T, G) -> (B, T, G)
        self.v0, self.u = mv(self.anchor), mv(self.d)                                        # v = v0 + ηu
        # ‖Σ c_i g_i‖ ≤ ‖c‖₂ · sqrt(tr K): an update far below that bound is rounding, not a direction
        # (e.g. a group of identical responses, whose coefficients sum to zero).
        self.trace_root = gram.diagonal(dim1=-2, dim2=-1).sum(-1).clamp_min(0.0).sqrt()   # (B,)
        self.qa = (self.d * self.u).sum(-1)                          # ‖c(η)‖²_K = γ + 2bη + aη², each (B, T)
        self.qb = (self.anchor * self.u).sum(-1)
        self.qg = (self.anchor * self.v0).sum(-1)

    def m(self, eta):
        """m_τ(η) = vᵀâ − Σ_i τq̂σ̂_i |v_i| at (B, T, P) ratios."""
        v = self.v0[..., None, :] + eta[..., None] * self.u[..., None, :]
        return (v * self.centre[..., None, :]).sum(-1) - (self.box[..., None, :] * v.abs()).sum(-1)

    def norm(self, eta):
        """‖c(η)‖_K at (B, T, P) ratios."""
        sq = self.qg[..., None] + 2 * self.qb[..., None] * eta + self.qa[..., None] * eta**2
        return sq.clamp_min(0.0).sqrt()

    def breakpoints(self):
        """0, 1 and the ratios where some v_i(η) changes sign (the kinks of m_τ): (B, T, G+2), sorted."""
        moving = self.u.abs() > 0
        kinks = -self.v0 / torch.where(moving, self.u, torch.ones_like(self.u))
        kinks = torch.where(moving & (kinks > 0) & (kinks < 1), kinks, torch.ones_like(kinks))
        ends = self.centre.new_tensor([0.0, 1.0]).expand(*kinks.shape[:-1], 2)
        return torch.sort(torch.cat([ends, kinks], -1), -1).values

    def solve(self, n_bisect: int):
        """η*, m_τ(η*), accepted and coefficients, each over (B, T)."""
        cand = self.breakpoints()
        m_cand = self.m(cand)
        ok = m_cand >= 0
        # m_τ is piecewise linear in η, so if it is non-negative anywhere it is at a breakpoint: the largest
        # such breakpoint is a safe start, and the safe set is an interval (m_τ concave), so bisection
        # between it and the unsafe end 1 finds the largest safe η.
        feasible = ok.any(-1)
        lo = torch.where(ok, cand, torch.full_like(cand, -1.0)).amax(-1).clamp_min(0.0)
        ones = torch.ones_like(lo)
        at_one = self.m(ones[..., None])[..., 0] >= 0
        lo = torch.where(at_one, ones, lo)
        hi = ones.clone()
        for _ in range(n_bisect):
            mid = (lo + hi) / 2
            safe = self.m(mid[..., None])[..., 0] >= 0
            lo = torch.where(safe, mid, lo)
            hi = torch.where(safe, hi, mid)
        eta = torch.where(feasible, lo, torch.full_like(lo, math.nan))
        m_eta = torch.where(feasible, self.m(lo[..., None])[..., 0], torch.full_like(lo, math.nan))
        coef = self.anchor + lo[..., None] * self.d
        bound = coef.norm(dim=-1) * self.trace_root[:, None]
        accepted = feasible & (self.norm(lo[..., None])[..., 0] > 1e-8 * bound) & (bound > 0)
        coef = coef * accepted[..., None]
        return eta, m_eta, accepted, coef


def worst_case_agreement(eta, centre, sigma, q: float, gram, tau: float = 1.0) -> torch.Tensor:
    """m_τ(η) = min over the box C(τ) of aᵀK c(η), for one group; τ = 1 is the calibrated box's m(η).

    eta: (P,), centre and sigma: (G,), gram: (G, G). Returns (P,) float64.
    """
    t = lambda x, n: as_tensor(x, name=n, dtype=torch.float64)  # noqa: E731
    path = _Path(t(centre, "centre")[None], t(sigma, "sigma")[None], float(q), t(gram, "gram")[None],
                 torch.tensor([[float(tau)]], dtype=torch.float64))
    return path.m(t(eta, "eta").reshape(1, 1, -1))[0, 0]


def gate_scores(centre, sigma, q: float, gram, *, rho_max: float = 10.0, n_bisect: int = 30) -> torch.Tensor:
    """ρ per group: the largest τ ∈ [0, rho_max] at which the group's safe recovery is accepted.

    Found by bisection over τ, which assumes acceptance is monotone in τ (a smaller box can only make an
    update safer; exact for identity geometry, and what we observe with general Gram matrices). The gate
    itself never relies on it: ``safe_recovery`` decides acceptance at the selected τ directly.
    centre, sigma: (B, G); gram: (B, G, G). Returns (B,) float64, −inf where not accepted even at τ = 0.
    """
    b = centre.shape[0]
    accepted_at = lambda tau: _Path(centre, sigma, q, gram, tau[:, None]).solve(0)[2][:, 0]  # noqa: E731
    zero = centre.new_zeros(b)
    base = accepted_at(zero)
    lo, hi = zero, centre.new_full((b,), float(rho_max))
    top = accepted_at(hi)
    for _ in range(n_bisect):
        mid = (lo + hi) / 2
        ok = accepted_at(mid)
        lo, hi = torch.where(ok, mid, lo), torch.where(ok, hi, mid)
    rho = torch.where(top, hi, lo)
    return torch.where(base, rho, torch.full_like(rho, -math.inf))


def safe_recovery(centre, sigma, q: float, gram, tau=1.0, *, n_bisect: int = 50, valid=None,
                  with_rho: bool = False) -> Recovery:
    """Geometry-guided safe recovery for a batch of padded groups.

    centre, sigma: (B, G) â and σ̂ (padded slots: zero centre, any positive sigma);
    q: the conformal quantile q̂ ≥ 0; gram: (B, G, G) Gram of gradient features (zero rows/cols on padding);
    tau: a box inflation ≥ 0 or a (T,) grid of them (1 = the calibrated box; 0 = no box, plain centre);
    valid: (B, G) bool mask of real slots or None; with_rho: also compute the gate scores ρ.
    Returns a ``Recovery``; a single group can be passed as (1, G) and (1, G, G).
    """
    c = as_tensor(centre, name="centre", dtype=torch.float64)
    s = as_tensor(sigma, name="sigma", dtype=torch.float64, device=c.device)
    k = as_tensor(gram, name="gram", dtype=torch.float64, device=c.device)
    if c.ndim != 2 or s.shape != c.shape or k.shape != (*c.shape, c.shape[1]):
        raise ValueError(f"need centre and sigma of shape (B, G) and gram (B, G, G); got {tuple(c.shape)}, "
                         f"{tuple(s.shape)}, {tuple(k.shape)}")
    for t, name in ((c, "centre"), (s, "sigma"), (k, "gram")):
        check_finite(t, name)
    if not q >= 0:
        raise ValueError(f"q must be a non-negative number, got {q}")
    taus = as_tensor(tau, name="tau", dtype=torch.float64, device=c.device).reshape(-1)
    if bool((taus < 0).any()) or not bool(torch.isfinite(taus).all()):
        raise ValueError("tau must be finite and >= 0 (a box inflation; m_τ is concave only for τ >= 0)")
    path = _Path(c, s, float(q), k, taus[None, :].expand(c.shape[0], -1))
    eta, m_eta, accepted, coef = path.solve(n_bisect)
    if valid is not None:
        coef = coef * valid[:, None, :]
    rho = gate_scores(c, s, float(q), k) if with_rho else None
    return Recovery(taus, path.anchor, eta, m_eta, accepted, coef, rho)


# ----------------------------------------------------------------------------------------------------------
# (c) selective risk-gated optimisation


def reversal_indicators(coef, reference, gram) -> torch.Tensor:
    """(B, T) bool: applied update disagrees with the reference update, c(η*(τ))ᵀ K a* < 0.

    coef: (B, T, G) applied coefficients (zero for rejected groups, which never count as reversals);
    reference: (B, G) padded a*; gram: (B, G, G).
    """
    v = (gram @ reference[..., None])[..., 0]                                     # (B, G)
    return (coef * v[:, None, :]).sum(-1) < 0


def _log_binom_cdf(k: int, n: int, p: float) -> float:
    """log P(Bin(n, p) ≤ k), summed in log space (n up to millions is fine; no scipy needed)."""
    if k >= n:
        return 0.0
    if k < 0:
        return -math.inf
    lp, lq = math.log(p), math.log1p(-p)
    terms = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq
             for i in range(k + 1)]
    top = max(terms)
    return top + math.log(sum(math.exp(x - top) for x in terms))


def binomial_p_value(failures: int, n: int, beta: float) -> float:
    """Exact p-value for H0: risk > β from F failures in n trials, P(Bin(n, β) ≤ F). n = 0 gives 1."""
    _check_level(beta, "beta")
    if n == 0:
        return 1.0
    return min(1.0, math.exp(_log_binom_cdf(int(failures), int(n), beta)))


def hoeffding_bentkus_p_value(failures: int, n: int, beta: float) -> float:
    """Hoeffding–Bentkus p-value for H0: risk > β (Bates et al. 2021): min(Hoeffding, e·binomial tail)."""
    _check_level(beta, "beta")
    if n == 0:
        return 1.0
    r = failures / n
    a = min(r, beta)
    h1 = (a * math.log(a / beta) if a > 0 else 0.0) + (1 - a) * math.log((1 - a) / (1 - beta))
    hoeffding = math.exp(-n * h1)
    bentkus = math.e * math.exp(_log_binom_cdf(math.ceil(n * r - 1e-12), n, beta))
    return min(1.0, hoeffding, bentkus)


P_VALUES = {"binomial": binomial_p_value, "hoeffding_bentkus": hoeffding_bentkus_p_value}


def fixed_sequence_test(p_values, delta: float) -> int:
    """Fixed-sequence testing: reject nulls in the given order while p ≤ δ; stop at the first p > δ.

    p_values: sequence in test order (strictest threshold first). Returns how many were rejected (declared
    safe), i.e. the index of the first failure. Controls the family-wise error rate at δ.
    """
    _check_level(delta, "delta")
    for k, p in enumerate(p_values):
        if not p <= delta:
            return k
    return len(p_values)


@dataclass
class ThresholdSelection:
    """Outcome of the Learn-then-Test threshold choice.

    tau: the selected threshold (math.inf when none passed: every group is rejected).
    index: its position in the grid (None when none passed).
    tested: grid positions actually tested, in order; p_values, n_accepted, n_reversed aligned with the grid
    (p NaN where not tested); empirical_risk: reversals / accepted at τ_sel (NaN if none).
    """

    tau: float
    index: int | None
    grid: list[float]
    p_values: list[float]
    n_accepted: list[int]
    n_reversed: list[int]
    tested: list[int]
    empirical_risk: float = math.nan


def min_accepted_to_certify(beta: float, delta: float) -> int:
    """Fewest accepted groups at which even zero reversals give a binomial p ≤ δ: ⌈log δ / log(1−β)⌉."""
    _check_level(beta, "beta")
    _check_level(delta, "delta")
    return math.ceil(math.log(delta) / math.log1p(-beta) - 1e-12)


def ltt_select_threshold(accepted, reversed_, grid, *, beta: float = 0.08, delta: float = 0.1,
                         p_value: str = "binomial", start: int = 0) -> ThresholdSelection:
    """Choose τ by fixed-sequence Learn-then-Test on risk-calibration groups.

    accepted, reversed_: (n, T) bool, per calibration group and grid threshold (reversed counts only where
    accepted); grid: (T,) thresholds ordered strictest first (descending). Testing begins at grid position
    ``start`` and stops at the first p > δ; the selected τ is the last one that passed (math.inf if none).
    ``start`` must not depend on these risk groups (``SetGRPO.calibrate`` sets it from the disjoint coverage
    groups), so the order stays fixed in advance and fixed-sequence testing keeps its FWER ≤ δ guarantee.
    """
    _check_level(beta, "beta")
    _check_level(delta, "delta")
    if p_value not in P_VALUES:
        raise ValueError(f"unknown p_value {p_value!r}; choose one of {sorted(P_VALUES)}")
    grid = [float(x) for x in grid]
    if any(b > a for a, b in zip(grid, grid[1:])):
        raise ValueError("the threshold grid must be ordered strictest first (descending)")
    if not 0 <= start < len(grid):
        raise ValueError(f"start must index the grid (0..{len(grid) - 1}), got {start}")
    acc = torch.as_tensor(accepted, dtype=torch.bool)
    rev = torch.as_tensor(reversed_, dtype=torch.bool)
    if acc.shape != rev.shape or acc.ndim != 2 or acc.shape[1] != len(grid):
        raise ValueError(f"accepted and reversed_ must both be (n, {len(grid)}); got {tuple(acc.shape)} and "
                         f"{tuple(rev.shape)}")
    n_acc = acc.sum(0).tolist()
    n_rev = (rev & acc).sum(0).tolist()
    pfun = P_VALUES[p_value]
    p_values = [math.nan] * len(grid)
    # p-values are cheap: compute them all from `start`, then let the fixed sequence say how far it got.
    for k in range(start, len(grid)):
        p_values[k] = pfun(n_rev[k], n_acc[k], beta)
    passed = fixed_sequence_test(p_values[start:], delta)
    tested = list(range(start, min(start + passed + 1, len(grid))))  # the passes and the first failure
    p_values = [p if k in tested else math.nan for k, p in enumerate(p_values)]
    selected = start + passed - 1 if passed > 0 else None
    tau = grid[selected] if selected is not None else math.inf
    risk = n_rev[selected] / n_acc[selected] if selected is not None else math.nan
    return ThresholdSelection(tau, selected, grid, p_values, n_acc, n_rev, tested, risk)


# ----------------------------------------------------------------------------------------------------------
# per-response gradient features of a language model


def lm_head_gradient_features(hidden, logits, tokens, mask, *, dims: tuple[int, int] | None = (16, 16),
                              seed: int = 0, temperature: float = 1.0) -> torch.Tensor:
    """Gradient features of each response's length-normalised log-probability w.r.t. the output layer W.

    hidden: (N, T, h) final hidden states at the positions that predict the response tokens;
    logits: (N, T, V) the logits there (before temperature); tokens: (N, T) response token ids;
    mask: (N, T) 1 for real response tokens. With ℓ_i = (1/T_i) Σ_t log softmax(z_t / temperature)[y_t],

        ∂ℓ_i/∂W = 1/(T_i · temperature) · Σ_t (e_{y_t} − p_t) h_tᵀ           (V × h).

    dims=None returns that gradient flattened (V·h columns: small models and tests only). dims=(k1, k2)
    returns the Kronecker random projection 1/(T_i·temperature) Σ_t (R_V(e_{y_t} − p_t)) ⊗ (R_h h_t) with
    seeded Gaussian R_V (k1 × V) and R_h (k2 × h) of variance 1/k: since E[(R_V ⊗ R_h)ᵀ(R_V ⊗ R_h)] = I,
    inner products of these k1·k2 features are unbiased estimates of the exact ⟨∂ℓ_i/∂W, ∂ℓ_j/∂W⟩, at the
    cost of one (N, T, V) × (V, k1) product. Returns (N, k1·k2) (or (N, V·h)) float32.
    """
    h, z = hidden.float(), logits.float()
    if h.ndim != 3 or z.ndim != 3 or z.shape[:2] != h.shape[:2] or tuple(tokens.shape) != tuple(h.shape[:2]):
        raise ValueError(f"need hidden (N, T, h), logits (N, T, V) and tokens (N, T); got {tuple(h.shape)}, "
                         f"{tuple(z.shape)}, {tuple(tokens.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    m = as_tensor(mask, name="mask", device=h.device, dtype=torch.float32)
    lengths = m.sum(-1, keepdim=True)
    if bool((lengths == 0).any()):
        raise ValueError("every response needs at least one real token (a row of mask is all zeros)")
    p = torch.softmax(z / temperature, -1)
    scale = (m / (lengths * temperature))[..., None]                                 # (N, T, 1)
    vocab, width = z.shape[-1], h.shape[-1]
    if dims is None:
        a = torch.nn.functional.one_hot(tokens.long(), vocab).float() - p            # (N, T, V)
        return torch.einsum("ntv,nth->nvh", a * scale, h).reshape(h.shape[0], -1)
    k1, k2 = dims
    gen = torch.Generator().manual_seed(seed)
    r_v = (torch.randn(k1, vocab, generator=gen) / math.sqrt(k1)).to(h.device)
    r_h = (torch.randn(k2, width, generator=gen) / math.sqrt(k2)).to(h.device)
    a = r_v.T[tokens.long()] - p @ r_v.T                                             # (N, T, k1)
    b = h @ r_h.T                                                                    # (N, T, k2)
    return torch.einsum("nti,ntj->nij", a * scale, b).reshape(h.shape[0], k1 * k2)


# ----------------------------------------------------------------------------------------------------------
# the composing estimator


@dataclass
class SetGRPOConfig:
    """Every SetGRPO knob in one place.

    alpha: miscoverage of the joint coefficient box (module a).
    beta: target conditional direction-reversal risk among accepted groups (module c); 0.08 as in the
        paper's figures.
    delta: probability that the selected threshold misses that target (LTT error level).
    sigma_min: floor of the per-response box scale σ̂, in advantage (z-score) units.
    scale: "pooled" (default) or "response", how σ̂ is formed (see ``joint_coefficient_set``).
    tau_grid: candidate thresholds for the gate ρ ≥ τ (box inflations), strictest first, each ≥ 0; 1 is the
        calibrated box and 0 accepts every group with its centre â (plain two-grader GRPO).
    p_value: "binomial" (exact) or "hoeffding_bentkus".
    risk_fraction: share of the calibration groups kept apart for the risk calibration (c); the rest
        calibrates the box (a).
    ltt_start_factor: the fixed sequence starts at the strictest threshold at which the coverage groups
        predict at least this many times ⌈log δ / log(1−β)⌉ accepted risk groups (the fewest that could
        certify anything). Stricter thresholds accept too few groups to pass, and one reversal among a few
        dozen would end the sequence before it reaches thresholds that can pass.
    recalibrate_every: K, steps between recalibrations as the policy drifts.
    estimator, eps: the per-grader group estimator (a name in setpo.ADVANTAGE_ESTIMATORS) and its ε.
    lam: SetPO diversity weight λ; 0 turns the diversity term off.
    n_bisect: bisection steps for η* (30 halvings: η* to 1e-9).
    identity_geometry: ignore gradient features and use K = I (the paper's "identity geometry" ablation).
    """

    alpha: float = 0.1
    beta: float = 0.08
    delta: float = 0.1
    sigma_min: float = 0.25
    scale: str = "pooled"
    tau_grid: tuple[float, ...] = DEFAULT_TAU_GRID
    p_value: str = "binomial"
    risk_fraction: float = 0.75
    ltt_start_factor: float = 2.0
    recalibrate_every: int = 10
    estimator: str = "grpo"
    eps: float = 1e-6
    lam: float = 0.0
    n_bisect: int = 30
    identity_geometry: bool = False

    def __post_init__(self):
        for name in ("alpha", "beta", "delta", "risk_fraction"):
            _check_level(getattr(self, name), name)
        if not self.sigma_min > 0:
            raise ValueError(f"sigma_min must be positive, got {self.sigma_min}")
        if self.scale not in SCALES:
            raise ValueError(f"scale must be one of {SCALES}, got {self.scale!r}")
        if not self.tau_grid or any(not 0 <= t < math.inf for t in self.tau_grid):
            raise ValueError(f"tau_grid must be a non-empty sequence of finite values >= 0, got {self.tau_grid}")
        if any(b > a for a, b in zip(self.tau_grid, self.tau_grid[1:])):
            raise ValueError("tau_grid must be ordered strictest first (descending)")
        if self.p_value not in P_VALUES:
            raise ValueError(f"p_value must be one of {sorted(P_VALUES)}, got {self.p_value!r}")
        if self.recalibrate_every < 1:
            raise ValueError(f"recalibrate_every must be >= 1, got {self.recalibrate_every}")


@dataclass
class SetGRPOOutput:
    """Coefficients of one batch and what decided them.

    coef: (N,) training coefficients (zero on rejected groups; + λ·s_i on accepted ones when λ > 0).
    accepted: (B,) bool per group; row_accepted: (N,) the same per response.
    eta: (B,) recovery ratio η* at the selected τ (NaN where infeasible); rho: (B,) gate scores or None.
    centre, sigma: (N,) â and σ̂; per_grader: (N, 2) a^A and a^B.
    """

    coef: torch.Tensor
    accepted: torch.Tensor
    row_accepted: torch.Tensor
    eta: torch.Tensor
    rho: torch.Tensor | None
    centre: torch.Tensor
    sigma: torch.Tensor
    per_grader: torch.Tensor
    tau: float
    q: float

    @property
    def accepted_ratio(self) -> float:
        return float(self.accepted.double().mean())

    @property
    def mean_recovery_ratio(self) -> float:
        """Mean η* over accepted groups (NaN when none is accepted)."""
        return float(self.eta[self.accepted].mean()) if bool(self.accepted.any()) else math.nan

    @property
    def coef_norm(self) -> float:
        """RMS of the coefficients over all responses (the paper's coefficient norm, Figure 5, in miniature)."""
        return float(self.coef.double().pow(2).mean().sqrt())


@dataclass
class Calibration:
    """Frozen calibration record (the paper's Table 4 in miniature)."""

    q: float
    tau: float
    n_coverage: int
    n_risk: int
    selection: ThresholdSelection
    coverage_scores: torch.Tensor = field(repr=False)


class SetGRPO:
    """SetGRPO coefficients: calibrate on re-graded groups, then gate and recover each training batch.

    Typical loop::

        sg = SetGRPO(SetGRPOConfig())
        for step in range(steps):
            if sg.needs_calibration(step):
                sg.calibrate(cal_scores, cal_reference, cal_features, group_size=G)
            out = sg.coefficients(scores, features, group_size=G)   # out.coef replaces GRPO's advantages
    """

    def __init__(self, config: SetGRPOConfig | None = None):
        self.config = config or SetGRPOConfig()
        self.calibration: Calibration | None = None
        self._calibrated_at: int | None = None

    def needs_calibration(self, step: int) -> bool:
        return self._calibrated_at is None or step - self._calibrated_at >= self.config.recalibrate_every

    def calibrate(self, scores, reference, features=None, index=None, *, group_size: int | None = None,
                  step: int = 0) -> Calibration:
        """Fit q̂ (a) on one part of the calibration groups and τ (c) on the other, disjoint, part.

        scores: (N, 2) grader scores of calibration responses; reference: (N,) reference coefficients a*
        (e.g. ``reference_coefficients`` of re-gradings); features: (N, d) gradient features or None.
        Groups are split in order of first appearance: the first (1 − risk_fraction) share for coverage.
        """
        cfg = self.config
        s = _grader_scores(scores)
        n = s.shape[0]
        groups = _groups(n, index, group_size, s.device)
        ref = _rows(reference, "reference", n, s.device)
        feats = None if cfg.identity_geometry else _features(features, n, s.device)
        n_groups = groups.num_groups
        n_risk = int(round(n_groups * cfg.risk_fraction))
        n_cov = n_groups - n_risk
        if n_cov < min_calibration_size(cfg.alpha) or n_risk < 1:
            raise ValueError(
                f"calibration set too small: {n_groups} groups split into {n_cov} for coverage and {n_risk} "
                f"for risk; alpha={cfg.alpha} needs at least {min_calibration_size(cfg.alpha)} coverage groups, "
                f"so pass at least {math.ceil(min_calibration_size(cfg.alpha) / (1 - cfg.risk_fraction))} "
                f"calibration groups"
            )
        centre, sigma, _ = joint_coefficient_set(s, index, group_size=group_size, sigma_min=cfg.sigma_min,
                                                 scale=cfg.scale, estimator=cfg.estimator, eps=cfg.eps)
        valid = groups.valid()
        cen_p, ref_p = groups.pad(centre), groups.pad(ref)
        cov_scores = conformal_scores(ref, centre, sigma, index, group_size=group_size)[:n_cov]
        q = conformal_quantile(cov_scores, cfg.alpha)
        gram = gram_matrices(feats, groups)
        sig_p = groups.pad(sigma, fill=1.0)
        tau_grid = torch.tensor(cfg.tau_grid, dtype=torch.float64, device=s.device)
        # Where to start the fixed sequence: thresholds at which too few groups would be accepted to certify
        # anything cannot pass and would only end the sequence early. Judge that on the coverage groups,
        # which are independent of the risk groups, so the test order stays fixed in advance.
        cov_acc = safe_recovery(cen_p[:n_cov], sig_p[:n_cov], q, gram[:n_cov], tau_grid, n_bisect=0,
                                valid=None if valid is None else valid[:n_cov]).accepted
        expected = cov_acc.double().mean(0) * n_risk
        enough = (expected >= cfg.ltt_start_factor * min_accepted_to_certify(cfg.beta, cfg.delta)).nonzero()
        start = int(enough[0]) if len(enough) else len(cfg.tau_grid) - 1
        risk = slice(n_cov, n_groups)
        rec = safe_recovery(cen_p[risk], sig_p[risk], q, gram[risk], tau_grid,
                            n_bisect=cfg.n_bisect, valid=None if valid is None else valid[risk])
        rev = reversal_indicators(rec.coef, ref_p[risk], gram[risk])
        sel = ltt_select_threshold(rec.accepted, rev, cfg.tau_grid, beta=cfg.beta, delta=cfg.delta,
                                   p_value=cfg.p_value, start=start)
        self.calibration = Calibration(q, sel.tau, n_cov, n_risk, sel, cov_scores)
        self._calibrated_at = step
        return self.calibration

    def coefficients(self, scores, features=None, index=None, *, group_size: int | None = None,
                     emb=None, with_rho: bool = False) -> SetGRPOOutput:
        """SetGRPO coefficients of one training batch (needs ``calibrate`` first).

        scores: (N, 2); features: (N, d) per-response gradient features (None only with identity geometry);
        emb: (N, e) response embeddings for SetPO's diversity term when config.lam > 0;
        with_rho: also report the gate scores ρ (a diagnostic: acceptance is decided at τ directly).
        """
        if self.calibration is None:
            raise ValueError("SetGRPO is not calibrated: call calibrate(...) on re-graded groups first")
        cfg, cal = self.config, self.calibration
        s = _grader_scores(scores)
        n = s.shape[0]
        groups = _groups(n, index, group_size, s.device)
        if features is None and not cfg.identity_geometry:
            raise ValueError("features (N, d) of per-response gradients are needed (or set identity_geometry)")
        feats = None if cfg.identity_geometry else _features(features, n, s.device)
        centre, sigma, per = joint_coefficient_set(s, index, group_size=group_size, sigma_min=cfg.sigma_min,
                                                   scale=cfg.scale, estimator=cfg.estimator, eps=cfg.eps)
        valid = groups.valid()
        gram = gram_matrices(feats, groups)
        cen_p, sig_p = groups.pad(centre), groups.pad(sigma, fill=1.0)
        rho = gate_scores(cen_p, sig_p, cal.q, gram) if with_rho else None
        if math.isinf(cal.tau):  # no threshold passed the risk test: every group is rejected
            b = groups.num_groups
            rec_eta = torch.full((b,), math.nan, dtype=torch.float64, device=s.device)
            accepted = torch.zeros(b, dtype=torch.bool, device=s.device)
            coef = torch.zeros(n, dtype=torch.float64, device=s.device)
        else:
            rec = safe_recovery(cen_p, sig_p, cal.q, gram, cal.tau, n_bisect=cfg.n_bisect, valid=valid)
            accepted, rec_eta = rec.accepted[:, 0], rec.eta[:, 0]
            coef = groups.unpad(rec.coef[:, 0, :])
        row_acc = accepted[groups.group_id]
        if cfg.lam > 0:
            if emb is None:
                raise ValueError("config.lam > 0 needs response embeddings emb (N, e) for SetPO's diversity term")
            div = diversity_marginals(emb, index, group_size=group_size).to(coef)
            coef = coef + cfg.lam * div * row_acc
        return SetGRPOOutput(coef, accepted, row_acc, rec_eta, rho, centre, sigma, per, cal.tau, cal.q)


# ----------------------------------------------------------------------------------------------------------
# TRL: GRPOTrainer with two reward functions acting as graders (built on first use, so that importing this
# module does not import TRL)


def _build_trainer_class():
    from trl import GRPOTrainer

    from setpo.trl import gather_embeddings

    class SetGRPOTrainer(GRPOTrainer):
        """TRL's ``GRPOTrainer`` whose advantages are SetGRPO coefficients; its two reward functions are the
        two graders (each response's two scores are ``rewards_per_func``'s two columns, before weights).

        Extra keywords: ``setgrpo`` (a ``SetGRPOConfig``; ``recalibrate_every`` counts training generation
        batches), ``calibration_groups`` (groups collected, with ``n_regrades`` re-gradings each, before a
        (re)calibration), ``feature_dims`` and ``feature_seed`` (``lm_head_gradient_features``; None = exact,
        tiny models only), ``embedder`` (texts -> (N, d); needed when ``setgrpo.lam`` > 0, for SetPO's term).

        Per training generation batch: TRL generates and scores as usual, then this trainer
        (1) computes the responses' gradient features with one extra no-grad forward pass of the policy
        (the paper's "Jacobian" cost), gathered over processes like TRL's rewards;
        (2) while a calibration is being collected, re-grades the batch ``n_regrades`` times by calling the
        reward functions again (reference = group advantage of the mean of all gradings) and stores it;
        once ``calibration_groups`` groups are stored and ``recalibrate_every`` batches have passed since
        the last calibration, calibrates and empties the store;
        (3) replaces TRL's advantages by the SetGRPO coefficients of this process's rows. Until the first
        calibration there is nothing to gate with, and TRL's own GRPO advantages are kept (a warm-up,
        logged as ``setgrpo/calibrated`` = 0). Calibration batches are also trained on: their groups only
        calibrate later batches, so exchangeability with the groups they gate is kept (up to drift).
        Eval batches keep TRL's advantages. Metrics: ``setgrpo/accepted_ratio``, ``mean_recovery_ratio``,
        ``coef_norm``, ``tau``, ``q``, ``calibrated``.
        """

        def __init__(self, *args, setgrpo: SetGRPOConfig | None = None, calibration_groups: int = 64,
                     n_regrades: int = 1, feature_dims: tuple[int, int] | None = (16, 16), feature_seed: int = 0,
                     embedder=None, **kwargs):
            super().__init__(*args, **kwargs)
            if len(self.reward_funcs) != 2:
                raise ValueError(f"SetGRPOTrainer needs exactly two reward functions, the two graders; got "
                                 f"{len(self.reward_funcs)}")
            if n_regrades < 1 or calibration_groups < 2:
                raise ValueError("need n_regrades >= 1 and calibration_groups >= 2")
            self.setgrpo = SetGRPO(setgrpo or SetGRPOConfig())
            if self.setgrpo.config.lam > 0 and embedder is None:
                raise ValueError("setgrpo.lam > 0 needs an embedder (texts -> (N, d)) for SetPO's diversity term")
            self.calibration_groups, self.n_regrades = calibration_groups, n_regrades
            self.feature_dims, self.feature_seed, self.embedder = feature_dims, feature_seed, embedder
            self._store: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
            self._stash = None
            self._train_batches = 0
            self.last_setgrpo: SetGRPOOutput | None = None

        def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
            rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
            if self._stash is None:  # the first call of a batch is TRL's grading; later ones are re-gradings
                self._stash = (inputs, prompts, completions, completion_ids_list, rewards)
            return rewards

        @torch.no_grad()
        def _gradient_features(self, output) -> torch.Tensor:
            prompt_ids, completion_ids = output["prompt_ids"], output["completion_ids"]
            ids = torch.cat([prompt_ids, completion_ids], 1)
            attention = torch.cat([output["prompt_mask"], output["completion_mask"]], 1)
            mask = output["completion_mask"]
            start, step = prompt_ids.shape[1] - 1, self.args.per_device_train_batch_size
            feats = []
            for i in range(0, ids.shape[0], step):
                out = self.model(input_ids=ids[i:i + step], attention_mask=attention[i:i + step],
                                 output_hidden_states=True)
                sl = slice(start, start + completion_ids.shape[1])
                m = mask[i:i + step].clone()
                m[m.sum(-1) == 0, 0] = 1  # an empty completion still needs a token to be defined
                feats.append(lm_head_gradient_features(
                    out.hidden_states[-1][:, sl], out.logits[:, sl], completion_ids[i:i + step], m,
                    dims=self.feature_dims, seed=self.feature_seed, temperature=self.temperature))
            return torch.cat(feats)

        def _generate_and_score_completions(self, inputs):
            self._stash = None
            output = super()._generate_and_score_completions(inputs)
            if not self.model.training:
                return output
            if self._stash is None:
                raise RuntimeError("SetGRPOTrainer: TRL did not score completions through _calculate_rewards; "
                                   "this TRL version is not supported")
            batch_inputs, prompts, completions, ids_list, scores = self._stash
            g = self.num_generations
            device = self.accelerator.device
            feats = self.accelerator.gather(self._gradient_features(output).to(device))     # (N_all, k)
            sg, cfg = self.setgrpo, self.setgrpo.config
            if sg.needs_calibration(self._train_batches) or self._store:
                regrades = [scores] + [self._calculate_rewards(batch_inputs, prompts, completions, ids_list)
                                       for _ in range(self.n_regrades)]
                ref = reference_coefficients(torch.stack(regrades).double().cpu(), group_size=g)
                self._store.append((scores.double().cpu(), ref, feats.float().cpu()))
                if sum(s.shape[0] for s, _, _ in self._store) >= self.calibration_groups * g:
                    cat = lambda k: torch.cat([x[k] for x in self._store])  # noqa: E731
                    sg.calibrate(cat(0), cat(1), cat(2), group_size=g, step=self._train_batches)
                    self._store = []
            metrics = self._metrics["train"]
            metrics["setgrpo/calibrated"].append(float(sg.calibration is not None))
            self._train_batches += 1
            if sg.calibration is None:
                return output
            emb = None
            if cfg.lam > 0:  # every process's rows, like scores and feats: groups may span processes
                emb = gather_embeddings(self.accelerator, self.embedder, completions)[0].float().cpu()
            out = sg.coefficients(scores.double().cpu(), feats.float().cpu(), group_size=g, emb=emb)
            n_local = output["advantages"].shape[0]
            pi = self.accelerator.process_index
            output["advantages"] = out.coef[pi * n_local:(pi + 1) * n_local].to(output["advantages"])
            self.last_setgrpo = out
            for name, value in (("accepted_ratio", out.accepted_ratio), ("mean_recovery_ratio",
                                out.mean_recovery_ratio), ("coef_norm", out.coef_norm), ("tau", out.tau),
                                ("q", out.q)):
                metrics[f"setgrpo/{name}"].append(float(value))
            return output

    return SetGRPOTrainer


_TRAINER = None


def __getattr__(name):  # PEP 562: SetGRPOTrainer is built (and TRL imported) on first access
    global _TRAINER
    if name == "SetGRPOTrainer":
        if _TRAINER is None:
            _TRAINER = _build_trainer_class()
        return _TRAINER
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
