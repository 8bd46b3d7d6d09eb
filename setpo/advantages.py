"""Group advantage estimators, picked by name from one registry, and the SetPO combination.

    Â_i = Ā_i + λ · s_i        (SetPO, arXiv 2602.01062)

Ā_i is a base group estimator's advantage (or one an engine computed itself) and s_i the leave-one-out
diversity marginal of ``setpo.diversity``; s_i is added as is, neither centred nor rescaled, for every rollout,
correct or not (``lam_units="term_std"`` opts into λ in units of s's spread). ``setpo_advantages`` is the one
place Â is assembled: every engine calls it.

Every estimator is a pure function over a padded ``(B, G_max)`` reward matrix and its validity mask
(``None`` when all groups are full), returning advantages in the same layout.

Precision: rewards, base advantages and Â stay in float32 or wider whatever the embeddings' dtype (a GPU
embedder's bfloat16 holds 3 significant digits, enough for a cosine, not for a reward). float32 rewards spread
so widely (beyond ~1e18) that their squared deviations would overflow are computed in float64; float64 ones
beyond ~1e153 are refused (rescale them). A group whose rewards have no spread, up to rounding, carries no
signal: its base advantage is exactly 0 for every estimator, not the ±1e-10 that the float mean of equal
numbers can leave, so that it is treated the same way whatever the scale or offset of the rewards
(``flat_groups``).
"""

from __future__ import annotations

import functools
import math
import re
from typing import Callable

import torch

from setpo.diversity import (DIVERSITY_TERMS, as_embeddings, group_dra_rewards, rewards_and_embeddings,
                             unchecked_group_dra_rewards, unchecked_term)
from setpo.groups import Groups, as_bool_rows, as_tensor, check_finite, check_real, const, representable
from setpo.presets import LAMBDA_UNITS
from setpo.registry import lookup, registrar

#: A base group estimator: fn(rewards (B, G), valid (B, G) bool | None, eps) -> advantages (B, G).
Estimator = Callable[[torch.Tensor, "torch.Tensor | None", float], torch.Tensor]
ADVANTAGE_ESTIMATORS: dict[str, Estimator] = {}
#: ``@register_estimator(name)`` adds a base estimator ``fn(rewards, valid, eps)`` to the registry.
register_estimator = registrar(ADVANTAGE_ESTIMATORS, "advantage estimator")


def _group_stats(r: torch.Tensor, valid: torch.Tensor | None):
    """Per-group size, sum, mean and unbiased std over valid slots; each (B, 1)."""
    if valid is None:
        n = r.shape[1]
        total = r.sum(-1, keepdim=True)
        mean = total / n
        var = ((r - mean) ** 2).sum(-1, keepdim=True) / (n - 1)
    else:
        w = valid.to(r.dtype)
        n = w.sum(-1, keepdim=True)
        total = (r * w).sum(-1, keepdim=True)
        mean = total / n
        var = (((r - mean) * w) ** 2).sum(-1, keepdim=True) / (n - 1)
    return n, total, mean, var.sqrt()


@register_estimator("grpo")
def grpo(r: torch.Tensor, valid: torch.Tensor | None, eps: float) -> torch.Tensor:
    """GRPO: (r_i - mean) / (std + eps), unbiased std as in verl and TRL."""
    if valid is None:  # the same numbers in fewer tensor operations (each costs microseconds at TRL's sizes)
        n = r.shape[1]
        c = r - r.sum(-1, keepdim=True).div_(const(n, r))
        std = torch.linalg.vector_norm(c, dim=-1, keepdim=True).mul_(const((n - 1) ** -0.5, r))
        return c.div_(std.add_(const(eps, r)))
    _, _, mean, std = _group_stats(r, valid)
    return (r - mean) / (std + eps)


@register_estimator("dr_grpo")
def dr_grpo(r: torch.Tensor, valid: torch.Tensor | None, eps: float) -> torch.Tensor:
    """Dr.GRPO: r_i - mean, no division by the group's std."""
    _, _, mean, _ = _group_stats(r, valid)
    return r - mean


@register_estimator("rloo")
def rloo(r: torch.Tensor, valid: torch.Tensor | None, eps: float) -> torch.Tensor:
    """RLOO: r_i minus the mean of the other G-1 rewards."""
    n, total, _, _ = _group_stats(r, valid)
    return r - (total - r) / (n - 1)


def _log_comb(a: torch.Tensor, b: int) -> torch.Tensor:
    """log C(a, b) elementwise (float64), -inf where a < b (no such subset)."""
    a = a.double()
    if b < 0:
        return torch.full_like(a, float("-inf"))
    out = torch.lgamma(a + 1) - math.lgamma(b + 1) - torch.lgamma((a - b).clamp_min(0) + 1)
    return out.masked_fill(a < b, float("-inf"))


def pass_at_k(r: torch.Tensor, valid: torch.Tensor | None, eps: float, *, k: int) -> torch.Tensor:
    """Pass@k Training's group advantage in closed form (Chen et al. 2025, "Pass@k Training for Adaptively
    Balancing Exploration and Exploitation of Large Reasoning Models", arXiv 2508.10751, analytical derivation).

    Every k-subset of a group of n is scored by its best reward (pass@k for 0/1 rewards); a response's
    advantage is the mean, over the subsets that contain it, of (subset score - mean score) / std score,
    both moments over all C(n, k) subsets. With 0/1 rewards and n_neg wrong responses this is the paper's
        R̄ = 1 - C(n_neg, k)/C(n, k),   σ = sqrt(R̄(1 - R̄)),
        Â_correct = (1 - R̄)/σ,          Â_wrong = (1 - R̄ - C(n_neg - 1, k - 1)/C(n - 1, k - 1))/σ;
    real-valued rewards get the same construction with the best reward of the subset (our generalisation,
    computed exactly by sorting). k = 1 is GRPO with the population std. Groups need n >= k.
    Picked by the name "pass@K" for any K >= 1 (``check_estimator``).
    """
    if valid is None:
        return _pass_at_k_full(r, k, eps)
    out = torch.zeros_like(r)
    sizes = valid.sum(-1)
    for n in sizes.unique().tolist():  # groups of one size at a time: their real slots come first
        rows = (sizes == n).nonzero().flatten()
        out[rows, :n] = _pass_at_k_full(r[rows, :n], k, eps)
    return out


def _pass_at_k_full(r: torch.Tensor, k: int, eps: float) -> torch.Tensor:
    """``pass_at_k`` for (B, n) full groups: O(n log n) per group after sorting, in float64."""
    b, n = r.shape
    if n < k:
        raise ValueError(f"the 'pass@{k}' advantage needs groups of at least k = {k} rollouts, got {n}")
    rs, order = torch.sort(r.double(), dim=-1)
    j = torch.arange(n, dtype=torch.float64, device=r.device)        # sorted position, 0-based
    log_all, log_with = _log_comb(torch.tensor(float(n)), k), _log_comb(torch.tensor(n - 1.0), k - 1)
    p_best = torch.exp(_log_comb(j, k - 1) - log_all)                  # P(a k-subset's best is position j)
    mean = (p_best * rs).sum(-1, keepdim=True)
    std = (p_best * (rs - mean) ** 2).sum(-1, keepdim=True).sqrt()
    # the mean score of the subsets containing position p: p itself is best (the rest below it), or some j > p is
    own = torch.exp(_log_comb(j, k - 1) - log_with) * rs
    above = torch.exp(_log_comb(j - 1, k - 2) - log_with) * rs       # best j, p < j among the other k-2 below j
    later = above.flip(-1).cumsum(-1).flip(-1) - above                 # Σ_{j > p}
    adv = (own + later - mean) / (std + eps)
    # every subset scores the same (e.g. k = n, or enough copies of the best reward): no signal, exactly 0,
    # not rounding noise divided by eps
    no_spread = std <= FLAT_ULPS * torch.finfo(torch.float64).eps * rs.abs().amax(-1, keepdim=True)
    adv = adv.masked_fill_(no_spread, 0.0)
    return torch.empty_like(adv).scatter_(-1, order, adv).to(r.dtype)


_PASS_AT_K_NAME = re.compile(r"pass@([1-9][0-9]*)")

#: F-GRPO's default γ: 0.5, the value the paper's runs chose most often (arXiv 2602.06717, Table 7: γ picked from
#: {0.5, 1, 2} by in-domain pass@1; 0.5 for GRPO on Qwen2.5-7B, its headline pass@256 64.1 -> 70.3).
FOCAL_GAMMA = 0.5
#: "focal:<base>" (γ = FOCAL_GAMMA) or "focal@<γ>:<base>", e.g. "focal:grpo", "focal@1:dr_grpo", "focal:pass@4".
_FOCAL_NAME = re.compile(r"focal(?:@([0-9]+(?:\.[0-9]*)?))?:(.+)")


def focal(r: torch.Tensor, valid: torch.Tensor | None, eps: float, *, base: Estimator, gamma: float) -> torch.Tensor:
    """F-GRPO's focal weighting of any base estimator (Plyusov et al. 2026, "F-GRPO: Don't Let Your Policy Learn
    the Obvious and Forget the Rare", arXiv 2602.06717, Eqs. 11-13):

        μ̂_pos = X / N,    g = (1 − μ̂_pos)^γ,    Ā_i^F = g · Ā_i

    X of the group's N rollouts are correct; one scalar g per group multiplies the base advantage (after its
    normalisation), down-weighting prompts the policy already solves. γ = 0 is the base estimator. The paper's
    rewards are binary (R_c for a correct rollout, R_w for a wrong one, R_c = 1 typically), μ̂_pos = (R̄ − R_w) /
    (R_c − R_w) = X / N; here a rollout counts as correct when its reward is at least 1 (``setpo_correct_reward``'s
    default), which is the same for 0/1 and ±1 rewards and says what "correct" means for graded ones.
    Picked by the name "focal:<base>" or "focal@<γ>:<base>" (``check_estimator``)."""
    adv = base(r, valid, eps)
    correct = (r >= 1).to(torch.float64)
    if valid is None:
        mu = correct.mean(-1, keepdim=True)
    else:
        w = valid.to(torch.float64)
        mu = (correct * w).sum(-1, keepdim=True) / w.sum(-1, keepdim=True)
    return adv * (1 - mu).pow(gamma).to(adv.dtype)


def _rewards_and_groups(rewards, index, group_size, check: bool = True):
    r = as_tensor(rewards, name="rewards")
    if r.ndim != 1:
        raise ValueError(f"rewards must have shape (N,), got {tuple(r.shape)}")
    if check:
        check_finite(r, "rewards")
    return r, Groups.build(r.shape[0], index, group_size, device=r.device)


#: A group's rewards have "no spread" when max - min <= FLAT_ULPS · (machine epsilon) · max |r|: within a few
#: rounding steps of the group's own magnitude, where r and a·r + b cannot be told apart.
FLAT_ULPS = 16


def _flat(padded: torch.Tensor, valid: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(B,) bool: the group has no spread up to rounding (see ``FLAT_ULPS``); and (B,) the spreads max - min.

    A spread is finite exactly when all the group's rewards are (NaN propagates through max and min;
    inf - x, x + inf and inf - inf are not finite), so the spreads also answer "any NaN or infinity?"."""
    if valid is None:
        bottom, top = torch.aminmax(padded, dim=-1)
    else:
        top = padded.masked_fill(~valid, float("-inf")).amax(-1)
        bottom = padded.masked_fill(~valid, float("inf")).amin(-1)
    spread = top - bottom
    size = torch.maximum(top, -bottom)  # = max(|top|, |bottom|), as top >= bottom
    return spread <= size.mul_(const(FLAT_ULPS * torch.finfo(padded.dtype).eps, size)), spread


def _spread_limit(dtype: torch.dtype, group_size: int) -> float:
    """Largest spread whose squared deviations, summed over a group, cannot overflow ``dtype``."""
    return math.sqrt(torch.finfo(dtype).max / (4 * group_size))


def spread_bound(dtype: torch.dtype, group_size: int) -> float:
    """``_spread_limit`` as the largest number of ``dtype`` at or below it (``representable``): for a spread
    sum t of that dtype, t <= spread_bound(...) on the device exactly when float(t) <= _spread_limit(...).
    Worked out once per (dtype, group size): a dict, which torch.compile reads as a constant."""
    bound = _SPREAD_BOUNDS.get((dtype, group_size))
    if bound is None:
        bound = _SPREAD_BOUNDS[dtype, group_size] = representable(_spread_limit(dtype, group_size), dtype, up=False)
    return bound


_SPREAD_BOUNDS: dict = {}


def check_estimator(estimator) -> Estimator:
    """The base estimator named ``estimator``: a registered one, "pass@K" (``pass_at_k`` with k = K, for any
    K >= 1), or "focal:<base>" / "focal@<γ>:<base>" (``focal``, F-GRPO's weighting of any of these; γ =
    ``FOCAL_GAMMA`` by default); families, so they are resolved by name rather than registered; else a
    ValueError listing them."""
    if isinstance(estimator, str) and estimator not in ADVANTAGE_ESTIMATORS:
        match = _PASS_AT_K_NAME.fullmatch(estimator)
        if match:
            return functools.partial(pass_at_k, k=int(match.group(1)))
        match = _FOCAL_NAME.fullmatch(estimator)
        if match and not match.group(2).startswith("focal"):
            gamma = FOCAL_GAMMA if match.group(1) is None else float(match.group(1))
            return functools.partial(focal, base=check_estimator(match.group(2)), gamma=gamma)
        raise ValueError(f"unknown estimator {estimator!r}; registered: {sorted(ADVANTAGE_ESTIMATORS)}, "
                         f"'pass@K' for any K >= 1, and 'focal:<one of these>' or 'focal@<γ>:<one of these>' "
                         f"(F-GRPO's weighting, γ = {FOCAL_GAMMA} by default)")
    return lookup(ADVANTAGE_ESTIMATORS, estimator, "estimator")


def estimator_group_minimum(name: str) -> int:
    """The smallest group an estimator works on: K for "pass@K" (also under "focal:"), else 2."""
    match = _FOCAL_NAME.fullmatch(name)
    inner = match.group(2) if match else name
    return max(2, int(inner[5:])) if _PASS_AT_K_NAME.fullmatch(inner) else 2


def group_advantages(rewards, index=None, *, group_size: int | None = None, estimator: str = "grpo",
                     eps: float = 1e-6) -> torch.Tensor:
    """Base group advantages Ā of ``estimator`` (a name in ``ADVANTAGE_ESTIMATORS``).

    rewards: (N,) real numbers, N >= 1 (bool and integer rewards count as 0/1 and whole numbers; float16
        and bfloat16 are computed in float32); groups by verl-style ``index`` or contiguous ``group_size``
        (neither: one group). eps: the GRPO denominator's ε, finite and > 0.
    Returns (N,) float32 or float64 on the rewards' device. Every group needs at least 2 rollouts; a group
    with no spread (up to rounding) gets exactly 0.
    """
    check_estimator(estimator)
    eps = check_real(eps, "eps", minimum=0.0, strict=True)
    r, groups = _rewards_and_groups(rewards, index, group_size, check=False)
    return base_advantages(r, groups, estimator, eps)


def base_advantages(r: torch.Tensor, groups: Groups, estimator: str, eps: float) -> torch.Tensor:
    """Ā of ``estimator`` over built groups: r (N,) rewards (a tensor; NaN and infinities are found and
    named here), groups of >= 2 rollouts, eps > 0 -> (N,) float32 or float64; flat groups get exactly 0.
    One host read: ``unchecked_base_advantages``' answer (then the checks of ``_checked_base_advantages``
    run only when it says the rewards are not finite or need float64)."""
    return settled_base(r, groups, estimator, eps, *_unchecked_or_refused(r, groups, estimator, eps))


def _unchecked_or_refused(r, groups, estimator, eps):
    """``unchecked_base_advantages``, or (None, False) when it raised a ValueError (an estimator's own refusal,
    e.g. pass@k's groups smaller than k): ``settled_base`` then raises in the checked order (NaN first)."""
    try:
        return unchecked_base_advantages(r, groups, estimator, eps)
    except ValueError:
        return None, False


def unchecked_base_advantages(r: torch.Tensor, groups: Groups, estimator: str, eps: float):
    """(Ā, ok): ``base_advantages`` with no host read, ok a 0-d bool tensor on r's device. ok is True when every
    reward is finite and no group's squared deviations can overflow r's dtype, and Ā is then
    ``base_advantages``' answer; when False, Ā is not, and ``settled_base`` reads ok and names the bad reward
    or recomputes Ā in float64. Group sizes are checked here, as ``base_advantages`` does."""
    groups.require_min_size(2, f"the {estimator!r} advantage")
    valid = groups.valid()
    padded = groups.pad(r)
    flat, spread = _flat(padded, valid)
    # One number answers two questions: any NaN or infinity (then the sum is not finite), and can a group's
    # squared deviations overflow; a bound of the dtype's own keeps the Python comparison's answer.
    total = spread.sum()
    ok = total <= const(spread_bound(total.dtype, groups.max_size), total)
    return _estimate(padded, valid, flat, groups, estimator, eps), ok


def settled_base(r: torch.Tensor, groups: Groups, estimator: str, eps: float, adv, ok) -> torch.Tensor:
    """Ā from ``unchecked_base_advantages``' (adv, ok) once ok is read: adv when ok is True, else
    ``_checked_base_advantages`` (a ValueError naming the bad reward, or Ā in float64)."""
    return adv if _read(ok) else _checked_base_advantages(r, groups, estimator, eps)


def _checked_base_advantages(r: torch.Tensor, groups: Groups, estimator: str, eps: float) -> torch.Tensor:
    """``base_advantages`` with its checks read on the host, in order: group sizes, NaN or infinite rewards,
    float64 rewards whose squared deviations would overflow; float32 ones that would are computed in float64."""
    groups.require_min_size(2, f"the {estimator!r} advantage")
    valid = groups.valid()
    padded = groups.pad(r)
    flat, spread = _flat(padded, valid)
    # One number answers two questions: any NaN or infinity (then the sum is not finite, unless finite
    # spreads overflowed it: look at each reward), and can a group's squared deviations overflow.
    total = float(spread.sum())
    if not math.isfinite(total):
        check_finite(padded if valid is None else padded[valid], "rewards")
    wide = total > _spread_limit(padded.dtype, groups.max_size)
    if wide and padded.dtype == torch.float64:
        raise ValueError(f"rewards spread over more than {_spread_limit(torch.float64, groups.max_size):.3g} "
                         f"within a group, where squared deviations overflow float64: rescale them")
    return _estimate(padded, valid, flat, groups, estimator, eps, wide)


def _estimate(padded: torch.Tensor, valid, flat: torch.Tensor, groups: Groups, estimator: str, eps: float,
              wide: bool = False) -> torch.Tensor:
    """Ā of padded rewards (B, G_max) in their dtype (computed in float64 when ``wide``), exactly 0 in flat
    groups and padding slots -> (N,)."""
    adv = check_estimator(estimator)(padded.double() if wide else padded, valid, eps).to(padded.dtype)
    adv = adv.masked_fill_(flat.unsqueeze(1), 0.0)
    return groups.unpad(adv if valid is None else adv * valid)


#: ``setpo_advantages(small_groups=...)``: what happens to groups too small for s (fewer than 3 rollouts) or for
#: Ā (one rollout). "raise": a ValueError naming the group. "verl": verl's GRPO conventions (its trainer hands
#: over whatever groups a batch holds, and a dropped session must not stop training).
SMALL_GROUP_RULES = ("raise", "verl")

#: Below this standard deviation a batch's term has no spread, and λ in "term_std" units adds nothing.
TERM_STD_FLOOR = 1e-6


def setpo_advantages(rewards, emb, index=None, *, group_size: int | None = None, lam: float = 0.05,
                     estimator: str = "grpo", eps: float = 1e-6, return_marginals: bool = False,
                     diversity: str = "setpo", base=None, lam_units: str = "absolute",
                     small_groups: str = "raise", without_term=None, term_rows=None):
    """SetPO advantages Â_i = Ā_i + λ · s_i: the one place Â is assembled, for every engine (the toy trainer,
    ``setpo.trl.SetPOTrainer``, the verl estimator and SetGRPO's composition call it).

    rewards: (N,) rewards, from which ``estimator`` computes Ā; or None when ``base`` is given.
    emb: (N, d) embeddings of the complete responses (rows aligned with rewards); may be None when λ = 0
        (then s = 0 and no embedding is needed).
    index, group_size: the groups, as in ``group_advantages`` (neither: one group).
    lam: the marginal weight λ, finite and >= 0 (the paper's value for each algorithm is in
        ``setpo.presets.PRESETS``; 0 gives Ā exactly).
    estimator, eps: the base estimator Ā of ``rewards`` (a name in ``ADVANTAGE_ESTIMATORS`` or "pass@K") and
        its ε, finite and > 0.
    diversity: which term s_i is, by name in ``setpo.diversity.DIVERSITY_TERMS``: "setpo" (the paper's
        leave-one-out marginal, the default) or "pairwise" (the local baseline: minus the mean similarity to
        the rest of the group), for comparisons.
    base: (N,) a precomputed Ā, for an engine that normalises rewards itself (TRL adds λ·s to its own
        advantages); ``rewards`` must then be None, and Â keeps base's dtype and device (s is cast to them
        before λ·s is formed), so an engine's advantages keep the dtype it trains with.
    lam_units: "absolute" (the paper: λ·s as is) or "term_std": s divided by its standard deviation over all
        N rows, so that λ is in units of the term's own spread in this batch (``term_in_lambda_units``; a
        batch whose s has no spread, std < ``TERM_STD_FLOOR``, adds nothing).
    small_groups: "raise" (the default: every group needs the rollouts its parts need, >= 2 for Ā and >= 3
        for the "setpo" term, else a ValueError) or "verl", verl's GRPO conventions: a group of one response
        gets Ā = r / (1 + eps) under "grpo" (verl sets a lone response's mean to 0 and its std to 1) and
        Ā = r under any other estimator; groups of one or two get s = 0 (leave-one-out needs three). Ā and s
        of the other groups are computed over those groups alone, exactly as if the small ones were absent.
    without_term: (N,) bool, rows whose s is set to 0 before anything else uses it (TRL's rows that no
        reward function could score); None: none.
    term_rows: (N,) bool, the rows that form the diversity sets; None: every row (the paper). With it, each
        group's term is computed over its member rows alone, Ω⁺ = {o_i ∈ Ω : term_rows_i}, as if the other
        rows were absent: s_i = D(Ω⁺) − D(Ω⁺ ∖ {o_i}) for members of a group with |Ω⁺| >= 3, and s_i = 0 for
        every other row (non-members, and members of a group with fewer than 3). This is how the correctness
        gate (term_rows = reward >= τ) and rows with nothing for the kernel to read are left out
        (``setpo.reads``). Under "raise" every group must still have the rollouts the term needs.

    Returns Â (N,) on emb's device (base's, when given), in the wider of float32, the rewards' and the
    embeddings' float dtype (the rewards and Ā never drop to half precision); with ``return_marginals`` the
    pair (Â, s), s the term per row after ``without_term`` and before ``lam_units`` (in the embeddings'
    dtype; 0 in Ā's dtype when no row has a term), for logging.
    λ·s is rounded, then added (two correctly rounded operations, not one fused multiply-add): the same bits
    on every processor, whatever kernels torch picks.

    One host read per call on valid input (the small groups of ``small_groups="verl"``, ``term_rows`` and
    ``lam_units="term_std"`` add their own): the input checks of s and Ā wait on the device as one flag
    (``unchecked_setpo_advantages``), read once; only when it says something is off does the call run again
    with every check read where it is made, which names the problem (or rescales tiny or huge embedding rows,
    or computes Ā in float64).
    """
    lam = check_real(lam, "lam", minimum=0.0)
    check_estimator(estimator)
    eps = check_real(eps, "eps", minimum=0.0, strict=True)
    term = lookup(DIVERSITY_TERMS, diversity, "diversity term")
    _check_choice(lam_units, LAMBDA_UNITS, "lam_units")
    _check_choice(small_groups, SMALL_GROUP_RULES, "small_groups")
    args = (rewards, emb, index, group_size, lam, estimator, eps, term, lam_units, small_groups, base, without_term,
            term_rows)
    try:
        adv, s, ok = _setpo(*args, deferred=True)
    except ValueError:  # refused before the flag was read: the checked run raises, in the checked order
        ok = False
    if not _read(ok):  # the one host read
        adv, s, _ = _setpo(*args, deferred=False)
    return (adv, s) if return_marginals else adv


def unchecked_setpo_advantages(rewards: torch.Tensor, emb: torch.Tensor, index=None, *, group_size: int | None = None,
                               lam: float = 0.05, estimator: str = "grpo", eps: float = 1e-6,
                               diversity: str = "setpo"):
    """(Â, s, ok): what ``setpo_advantages`` computes first, with no host read, so that
    ``torch.compile(..., fullgraph=True)`` takes it whole (contiguous groups: ``group_size``; a shuffled
    ``index`` is numbered on the host). ok is a 0-d bool tensor: True when the rewards and embeddings are
    finite, no embedding row is zero (or so small or large that its products under- or overflow) and the
    rewards need no float64, and Â and s are then exactly ``setpo_advantages(..., return_marginals=True)``;
    when False they are not, and ``setpo_advantages`` with the same arguments gives them or names the problem.
    rewards (N,), emb (N, d), lam, eps as in ``setpo_advantages``, which checks them; here they are taken as
    given."""
    term = lookup(DIVERSITY_TERMS, diversity, "diversity term")
    return _setpo(rewards, emb, index, group_size, lam, estimator, eps, term, "absolute", "raise", None, None, None,
                  deferred=True)


def _setpo(rewards, emb, index, group_size, lam, estimator, eps, term, lam_units, small_groups, base, without_term,
           term_rows, *, deferred: bool):
    """``setpo_advantages``' work after its argument checks: (Â, s, ok). deferred: s's and Ā's input checks stay
    on the device, ok a 0-d bool tensor (True: Â and s are right; or the Python True when nothing was left to
    check); else every check is read where it is made, in order (s's errors before the rewards'), ok True."""
    if (rewards is None) == (base is None):
        raise ValueError("give exactly one of rewards (the estimator computes Ā from them) and base (Ā itself)")
    if emb is None:
        if lam != 0:
            raise ValueError("lam > 0 needs the response embeddings emb")
        e = None
        name = "rewards" if base is None else "base"
        first = as_tensor(rewards if base is None else base, name=name)
        if first.ndim != 1:
            raise ValueError(f"{name} must have shape (N,), got {tuple(first.shape)}")
        n, device = first.shape[0], first.device
    else:
        e = as_embeddings(emb)
        n, device = e.shape[0], e.device
    groups = Groups.build(n, index, group_size, device=device)  # once, for s and for Ā
    lenient = small_groups == "verl" and groups.min_size < 3
    members = None
    if term_rows is not None:
        members = as_bool_rows(term_rows, name="term_rows", device=device)
        if members.shape != (n,):
            raise ValueError(f"term_rows has shape {tuple(members.shape)}; expected ({n},)")
        if small_groups == "raise" and e is not None:
            groups.require_min_size(3, "the diversity term")
    s, ok = None, True
    if e is not None and base is None:  # s first: its errors (bad embeddings) come before the rewards'
        s, ok = _term(term, e, groups, members, lenient, deferred)
        device = e.device if s is None else s.device
    if base is None:
        r = as_tensor(rewards, name="rewards", device=device)
        if r.ndim != 1 or r.shape[0] != n:
            raise ValueError(f"rewards has shape {tuple(r.shape)} but emb has {n} rows; expected ({n},)")
        if lenient:
            bar = _lenient_base(r, groups, estimator, eps)
        elif deferred:
            bar, ok_bar = unchecked_base_advantages(r, groups, estimator, eps)
            ok = _both(ok, ok_bar)
        else:
            bar = base_advantages(r, groups, estimator, eps)
        dtype = None
    else:
        bar = as_tensor(base, name="base")
        if bar.ndim != 1 or bar.shape[0] != n:
            raise ValueError(f"base has shape {tuple(bar.shape)} but there are {n} rows; expected ({n},)")
        if deferred:  # a NaN or infinity makes the sum NaN or ±inf, and then sum · 0 is NaN (a false alarm when
            ok = bar.sum().mul(0).eq(0)  # finite values overflow the sum: the checked run finds nothing wrong)
        else:
            check_finite(bar, "base")
        dtype = bar.dtype
        if e is not None:
            s, ok_s = _term(term, e, groups, members, lenient, deferred)
            ok = _both(ok, ok_s)
    if s is None:
        s = torch.zeros_like(bar)
    if without_term is not None:
        mask = as_bool_rows(without_term, name="without_term", device=s.device)
        if mask.shape != s.shape:
            raise ValueError(f"without_term has shape {tuple(mask.shape)}; expected ({n},)")
        s = s.masked_fill(mask, 0.0)
    adv = _combine(bar, term_in_lambda_units(s, lam_units), lam, dtype)
    return adv, s, ok


def _term(term, e: torch.Tensor, groups: Groups, members, lenient: bool, deferred: bool):
    """(s, ok) of ``_setpo``: over members or with small groups (``_term_over``, checked), else the term itself,
    checked or (deferred) with its check left on the device (``unchecked_term``)."""
    if lenient or members is not None:
        return _term_over(term, e, groups, members), True
    if deferred:
        return unchecked_term(term, e, groups)
    return term(e, groups), True


def _read(ok) -> bool:
    """An ok as a Python bool: the Python True or False as is, a 0-d tensor read from the device (a host read)."""
    return ok is True or (ok is not False and bool(ok))


def _both(a, b):
    """Two oks (the Python True or 0-d bool tensors) as one, without an operation when either is True."""
    return b if a is True else a if b is True else a & b


def _check_choice(value, choices: tuple, name: str) -> None:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def term_in_lambda_units(s: torch.Tensor, lam_units: str) -> torch.Tensor:
    """The term that λ multiplies: s (N,) as is ("absolute"), or divided by its standard deviation over the
    N rows ("term_std"; all 0 when that is below ``TERM_STD_FLOOR`` or N = 1). Same dtype and device."""
    _check_choice(lam_units, LAMBDA_UNITS, "lam_units")
    if lam_units == "absolute":
        return s
    s_std = float(s.std()) if s.numel() > 1 else 0.0
    return s / s_std if s_std >= TERM_STD_FLOOR else torch.zeros_like(s)


def _combine(base: torch.Tensor, term: torch.Tensor, lam: float, dtype: torch.dtype | None) -> torch.Tensor:
    """Â = Ā + λ · term in ``dtype`` (None: the wider of the two), on base's device; at λ = 0 exactly Ā (no
    arithmetic). λ·term is rounded, then added: the bits every trainer recorded with. base is not modified."""
    dtype = torch.promote_types(base.dtype, term.dtype) if dtype is None else dtype
    adv = base.to(dtype)
    if not lam:
        return adv
    return adv + lam * term.to(device=adv.device, dtype=dtype)


def _subgroups(groups: Groups, rows: torch.Tensor) -> Groups:
    """The groups of the rows where ``rows`` (N,) bool is True, numbered by first appearance as before."""
    return Groups.build(int(rows.sum()), groups.group_id[rows].cpu().numpy(), device=groups.device)


def _lenient_base(r: torch.Tensor, groups: Groups, estimator: str, eps: float) -> torch.Tensor:
    """Ā under ``small_groups="verl"``: groups of >= 2 as ``base_advantages`` over those groups alone; a lone
    response r / (1 + eps) under "grpo" and r otherwise (verl: mean 0, std 1)."""
    if groups.min_size >= 2:
        return base_advantages(r, groups, estimator, eps)
    check_finite(r, "rewards")
    multi = (groups.sizes >= 2)[groups.group_id]
    out = r / (1 + eps) if estimator == "grpo" else r.clone()
    if bool(multi.any()):
        out[multi] = base_advantages(r[multi], _subgroups(groups, multi), estimator, eps).to(r.dtype)
    return out


def _term_over(term, e: torch.Tensor, groups: Groups, members: torch.Tensor | None) -> torch.Tensor | None:
    """s over each group's member rows alone (``members`` (N,) bool; None: every row), 0 for non-members and
    for the members of groups with fewer than 3 of them (leave-one-out needs three); None when no group has
    3 members (s is then 0 in Ā's dtype). Groups left whole are computed exactly as ``term(e, groups)``."""
    if members is None or bool(members.all()):
        if groups.min_size >= 3:
            return term(e, groups)
        counts, members = groups.sizes, torch.ones(groups.num_rows, dtype=torch.bool, device=groups.device)
    else:
        counts = torch.zeros(groups.num_groups, dtype=torch.long, device=members.device)
        counts.index_add_(0, groups.group_id.to(members.device)[members],
                          torch.ones(int(members.sum()), dtype=torch.long, device=members.device))
    big = members & (counts >= 3).to(members.device)[groups.group_id.to(members.device)]
    if not bool(big.any()):
        return None
    s_big = term(e[big.to(e.device)], _subgroups(groups, big.to(groups.device)))
    s = torch.zeros(groups.num_rows, dtype=s_big.dtype, device=s_big.device)
    s[big] = s_big
    return s


def dra_advantages(rewards, emb, index=None, *, group_size: int | None = None, estimator: str = "grpo",
                   eps: float = 1e-6) -> torch.Tensor:
    """DRA-GRPO (arXiv 2505.09655): the base estimator's advantage of DRA's adjusted rewards
    (``setpo.diversity.dra_rewards``), the prior art SetPO is compared with. Inputs as ``setpo_advantages``."""
    check_estimator(estimator)
    eps = check_real(eps, "eps", minimum=0.0, strict=True)
    try:  # one host read: the embeddings' check and the adjusted rewards' (NaN or infinite r makes r̃ so) as one flag
        r, e, groups = rewards_and_embeddings(rewards, emb, index, group_size, check=False)
        adjusted, ok = unchecked_group_dra_rewards(r, e, groups)
        adv, ok_adv = unchecked_base_advantages(adjusted, groups, estimator, eps)
        ok = _both(ok, ok_adv)
    except ValueError:  # refused before the flag was read: the checked run raises, in the checked order
        ok = False
    if _read(ok):
        return adv
    r, e, groups = rewards_and_embeddings(rewards, emb, index, group_size)
    return base_advantages(group_dra_rewards(r, e, groups), groups, estimator, eps)


def flat_groups(rewards, index=None, *, group_size: int | None = None) -> torch.Tensor:
    """(N,) bool: rows whose group's rewards have no spread up to rounding (``FLAT_ULPS``)."""
    r, groups = _rewards_and_groups(rewards, index, group_size)
    return _flat(groups.pad(r), groups.valid())[0][groups.group_id]


def groups_with_signal(rewards, index=None, *, group_size: int | None = None) -> torch.Tensor:
    """(N,) bool: rows whose group's rewards are not all equal, up to rounding (DAPO's dynamic-sampling
    filter; the complement of ``flat_groups``)."""
    return ~flat_groups(rewards, index, group_size=group_size)
