"""Group advantage estimators, picked by name from one registry, and the SetPO combination.

    Â_i = Ā_i + λ · s_i        (SetPO, arXiv 2602.01062)

Ā_i is a base group estimator's advantage and s_i the leave-one-out diversity marginal of
``setpo.diversity``; s_i is added as is, neither centred nor rescaled, for every rollout, correct or not.

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

from setpo.diversity import DIVERSITY_TERMS, as_embeddings, group_dra_rewards, rewards_and_embeddings
from setpo.groups import Groups, as_tensor, check_finite, check_real, const
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


def check_estimator(estimator) -> Estimator:
    """The base estimator named ``estimator``: a registered one, or "pass@K" (``pass_at_k`` with k = K, for any
    K >= 1; a family, so it is resolved by name rather than registered); else a ValueError listing them."""
    if isinstance(estimator, str) and estimator not in ADVANTAGE_ESTIMATORS:
        match = _PASS_AT_K_NAME.fullmatch(estimator)
        if match:
            return functools.partial(pass_at_k, k=int(match.group(1)))
        raise ValueError(f"unknown estimator {estimator!r}; registered: {sorted(ADVANTAGE_ESTIMATORS)} "
                         f"and 'pass@K' for any K >= 1")
    return lookup(ADVANTAGE_ESTIMATORS, estimator, "estimator")


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
    named here), groups of >= 2 rollouts, eps > 0 -> (N,) float32 or float64; flat groups get exactly 0."""
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
    adv = check_estimator(estimator)(padded.double() if wide else padded, valid, eps).to(padded.dtype)
    adv = adv.masked_fill_(flat.unsqueeze(1), 0.0)
    return groups.unpad(adv if valid is None else adv * valid)


def setpo_advantages(rewards, emb, index=None, *, group_size: int | None = None, lam: float = 0.05,
                     estimator: str = "grpo", eps: float = 1e-6, return_marginals: bool = False,
                     diversity: str = "setpo"):
    """SetPO advantages Â_i = Ā_i + λ · s_i.

    diversity: which term s_i is, by name in ``setpo.diversity.DIVERSITY_TERMS``: "setpo" (the paper's
        leave-one-out marginal, the default) or "pairwise" (the local baseline: minus the mean similarity to
        the rest of the group), for comparisons.

    rewards: (N,), emb: (N, d) embeddings of the complete responses (rows aligned with rewards).
    lam: the marginal weight λ, finite and >= 0 (the paper's value for each algorithm is in
        ``setpo.presets.PRESETS``; 0 gives the base estimator exactly).
    Returns (N,) on emb's device, in the wider of float32, the rewards' and the embeddings' float dtype (the
    rewards and Ā never drop to half precision); with ``return_marginals``, the pair (Â, s) for logging.
    """
    lam = check_real(lam, "lam", minimum=0.0)
    check_estimator(estimator)
    eps = check_real(eps, "eps", minimum=0.0, strict=True)
    term = lookup(DIVERSITY_TERMS, diversity, "diversity term")
    e = as_embeddings(emb)
    groups = Groups.build(e.shape[0], index, group_size, device=e.device)  # once, for s and for Ā
    s = term(e, groups)
    r = as_tensor(rewards, name="rewards", device=s.device)
    if r.ndim != 1 or r.shape[0] != s.shape[0]:
        raise ValueError(f"rewards has shape {tuple(r.shape)} but emb has {s.shape[0]} rows; expected ({s.shape[0]},)")
    adv = combine_advantages(base_advantages(r, groups, estimator, eps), s, lam)
    return (adv, s) if return_marginals else adv


def combine_advantages(base: torch.Tensor, s: torch.Tensor, lam: float) -> torch.Tensor:
    """Â = Ā + λ · s, the paper's combination, written once: ``setpo_advantages``, the verl estimator, the toy
    trainer, SetGRPO's SetPO composition and the TRL trainer (on TRL's own normalised advantages) call it.

    base: (N,) Ā; s: (N,) the diversity term; lam: λ (checked by the callers). Returns (N,) in the wider of
    the two dtypes; at λ = 0 exactly Ā (same values, no arithmetic). ``base`` is not modified.
    λ·s is rounded, then added (two correctly rounded operations, not one fused multiply-add): the same bits
    on every processor, whatever kernels torch picks, and the bits every trainer recorded with.
    """
    dtype = torch.promote_types(base.dtype, s.dtype)
    adv = base.to(dtype)
    if not lam:
        return adv
    return adv + lam * s.to(dtype)


def dra_advantages(rewards, emb, index=None, *, group_size: int | None = None, estimator: str = "grpo",
                   eps: float = 1e-6) -> torch.Tensor:
    """DRA-GRPO (arXiv 2505.09655): the base estimator's advantage of DRA's adjusted rewards
    (``setpo.diversity.dra_rewards``), the prior art SetPO is compared with. Inputs as ``setpo_advantages``."""
    check_estimator(estimator)
    eps = check_real(eps, "eps", minimum=0.0, strict=True)
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
