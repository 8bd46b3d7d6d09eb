"""Group advantage estimators, picked by name from one registry, and the SetPO combination.

    Â_i = Ā_i + λ · s_i        (SetPO, arXiv 2602.01062)

Ā_i is a base group estimator's advantage and s_i the leave-one-out diversity marginal of
``setpo.diversity``; s_i is added as is, neither centred nor rescaled, for every rollout, correct or not.

Every estimator is a pure function over a padded ``(B, G_max)`` reward matrix and its validity mask
(``None`` when all groups are full), returning advantages in the same layout.
"""

from __future__ import annotations

from typing import Callable

import torch

from setpo.diversity import diversity_marginals
from setpo.groups import Groups, as_tensor, check_finite

Estimator = Callable[[torch.Tensor, "torch.Tensor | None", float], torch.Tensor]
ADVANTAGE_ESTIMATORS: dict[str, Estimator] = {}


def register_estimator(name: str) -> Callable[[Estimator], Estimator]:
    """Add a base estimator ``fn(rewards (B, G), valid (B, G) | None, eps) -> (B, G)`` to the registry."""

    def deco(fn: Estimator) -> Estimator:
        if name in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        ADVANTAGE_ESTIMATORS[name] = fn
        return fn

    return deco


def _group_stats(r: torch.Tensor, valid: torch.Tensor | None):
    """Per-group size, sum, mean and unbiased std over valid slots; each (B, 1)."""
    if valid is None:
        n = r.new_full((r.shape[0], 1), r.shape[1])
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


def _rewards_and_groups(rewards, index, group_size, device=None):
    r = as_tensor(rewards, name="rewards", device=device)
    if r.ndim != 1:
        raise ValueError(f"rewards must have shape (N,), got {tuple(r.shape)}")
    check_finite(r, "rewards")
    return r, Groups.build(r.shape[0], index, group_size, device=r.device)


def group_advantages(rewards, index=None, *, group_size: int | None = None, estimator: str = "grpo",
                     eps: float = 1e-6) -> torch.Tensor:
    """Base group advantages Ā of ``estimator`` (a name in ``ADVANTAGE_ESTIMATORS``).

    rewards: (N,); groups by verl-style ``index`` or contiguous ``group_size`` (neither: one group).
    Returns (N,) on the rewards' device. Every group needs at least 2 rollouts.
    """
    if estimator not in ADVANTAGE_ESTIMATORS:
        raise ValueError(f"unknown estimator {estimator!r}; registered: {sorted(ADVANTAGE_ESTIMATORS)}")
    r, groups = _rewards_and_groups(rewards, index, group_size)
    groups.require_min_size(2, f"the {estimator!r} advantage")
    valid = groups.valid()
    adv = ADVANTAGE_ESTIMATORS[estimator](groups.pad(r), valid, eps)
    return groups.unpad(adv if valid is None else adv * valid)


def setpo_advantages(rewards, emb, index=None, *, group_size: int | None = None, lam: float = 0.05,
                     estimator: str = "grpo", eps: float = 1e-6, return_marginals: bool = False):
    """SetPO advantages Â_i = Ā_i + λ · s_i.

    rewards: (N,), emb: (N, d) embeddings of the complete responses (rows aligned with rewards).
    lam: the marginal weight λ (the paper's value for each algorithm is in ``setpo.presets.PRESETS``).
    Returns (N,) on emb's device, in emb's dtype; with ``return_marginals``, the pair (Â, s) for logging.
    """
    s = diversity_marginals(emb, index, group_size=group_size)
    r = as_tensor(rewards, name="rewards", device=s.device, dtype=s.dtype)
    if r.ndim != 1 or r.shape[0] != s.shape[0]:
        raise ValueError(f"rewards has shape {tuple(r.shape)} but emb has {s.shape[0]} rows; expected ({s.shape[0]},)")
    adv = group_advantages(r, index, group_size=group_size, estimator=estimator, eps=eps) + lam * s
    return (adv, s) if return_marginals else adv


def groups_with_signal(rewards, index=None, *, group_size: int | None = None) -> torch.Tensor:
    """(N,) bool: rows whose group's rewards are not all equal (DAPO's dynamic-sampling filter)."""
    r, groups = _rewards_and_groups(rewards, index, group_size)
    padded = groups.pad(r)
    valid = groups.valid()
    hi = padded if valid is None else padded.masked_fill(~valid, float("-inf"))
    lo = padded if valid is None else padded.masked_fill(~valid, float("inf"))
    spread = hi.amax(-1) - lo.amin(-1)
    return (spread > 0)[groups.group_id]
