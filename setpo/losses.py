"""Policy losses as pure functions over per-token tensors.

Shapes: log_prob, old_log_prob, ref_log_prob, mask: (B, T) over response tokens (mask 1 for real tokens);
advantages: (B,) one per sequence, or (B, T). Every loss returns (loss scalar, metrics dict of floats).

- GRPO: token-level PPO clip, ratio π/π_old clipped to [1-0.2, 1+0.2].
- DAPO: the same with clip-higher [1-0.2, 1+0.28] and token-mean over the whole batch.
- GSPO: one ratio per sequence, exp(mean_t log(π/π_old)), clipped to [1-3e-4, 1+4e-4], seq-mean.
- KL to a reference: the k3 estimator exp(ref-logp) - (ref-logp) - 1.
"""

from __future__ import annotations

import torch

from setpo.groups import as_tensor, check_finite, check_has_data, check_int, check_real
from setpo.presets import PRESETS, AlgorithmPreset, get_preset

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def _check_tensor(t, name: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch tensor, got {type(t).__name__}")
    check_has_data(t, name)
    if t.is_complex():
        raise ValueError(f"{name} is complex ({t.dtype}); it must be real")


def _check_mask(mask: torch.Tensor) -> torch.Tensor:
    """The mask as booleans: a bool tensor, or numbers that are all 0 or 1 (a weight of 2 or 0.5 is not a mask)."""
    if mask.dtype == torch.bool:
        return mask
    if not bool(((mask == 0) | (mask == 1)).all()):
        bad = mask[(mask != 0) & (mask != 1)].flatten()[0].item()
        raise ValueError(f"mask must hold 0 and 1 only (1 for a real response token), got {bad!r}")
    return mask != 0


def _masked_inputs(log_prob: torch.Tensor, mask: torch.Tensor, **others: torch.Tensor):
    """Check (B, T) inputs and return (the mask as booleans, log_prob, *others) with padding set to 0.

    Padding may hold anything a model writes there (−inf log-probs of pad tokens, NaN): it is replaced by 0 so
    that it reaches neither the loss nor its gradient (inf·0 would be NaN). Real tokens must be finite.
    """
    for name, t in {"log_prob": log_prob, "mask": mask, **others}.items():
        _check_tensor(t, name)
    if log_prob.ndim != 2:
        raise ValueError(f"log_prob must have shape (B, T), got {tuple(log_prob.shape)}")
    for name, t in {"log_prob": log_prob, **others}.items():
        if not t.is_floating_point():
            raise ValueError(f"{name} must be a float tensor, got {t.dtype}")
    for name, t in {"mask": mask, **others}.items():
        if t.shape != log_prob.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)} but log_prob has {tuple(log_prob.shape)}")
        if t.device != log_prob.device:
            raise ValueError(f"{name} is on {t.device} but log_prob is on {log_prob.device}")
    real = _check_mask(mask)
    cleaned = []
    for name, t in {"log_prob": log_prob, **others}.items():
        if not bool(torch.isfinite(t[real]).all()):
            where = (real & ~torch.isfinite(t)).nonzero()[0].tolist()
            raise ValueError(f"{name} is NaN or infinite at a real token (row, token) = {tuple(where)}")
        cleaned.append(torch.where(real, t, torch.zeros((), dtype=t.dtype, device=t.device)))
    return (real, *cleaned)


def _check_clip(clip_low, clip_high) -> tuple[float, float]:
    """(ε_low, ε_high) checked; clip_high=None means symmetric (ε_high = ε_low)."""
    low = check_real(clip_low, "clip_low", minimum=0.0)
    if low >= 1.0:
        raise ValueError(f"clip_low must be < 1 (the ratio is clipped below at 1 - clip_low > 0), got {low}")
    return low, low if clip_high is None else check_real(clip_high, "clip_high", minimum=0.0)


def _per_token(advantages, like: torch.Tensor) -> torch.Tensor:
    advantages = as_tensor(advantages, name="advantages", device=like.device).to(like.dtype)
    check_finite(advantages, "advantages")
    if advantages.ndim == 1:
        if advantages.shape[0] != like.shape[0]:
            raise ValueError(f"advantages has {advantages.shape[0]} rows but log_prob has {like.shape[0]}")
        return advantages[:, None].expand_as(like)
    if advantages.shape != like.shape:
        raise ValueError(f"advantages has shape {tuple(advantages.shape)}, expected (B,) or {tuple(like.shape)}")
    return advantages


def aggregate(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean",
              norm_len: int | None = None) -> torch.Tensor:
    """Reduce a (B, T) per-token loss to a scalar; padding (mask 0) counts for nothing, whatever it holds.

    token-mean:              Σ loss·mask / Σ mask: every token of the batch weighs the same (DAPO).
    seq-mean-token-mean:     mean over sequences of each sequence's token mean (GRPO paper, GSPO).
    seq-mean-token-sum-norm: Σ loss·mask / (B · norm_len), a constant normaliser (Dr.GRPO); norm_len
                             defaults to T, the padded response length.
    A batch without tokens reduces to 0.
    """
    _check_mode(mode)
    _check_tensor(loss_mat, "loss_mat")
    _check_tensor(mask, "mask")
    if loss_mat.ndim != 2 or mask.shape != loss_mat.shape:
        raise ValueError(f"loss_mat and mask must have the same shape (B, T), got {tuple(loss_mat.shape)} and "
                         f"{tuple(mask.shape)}")
    if norm_len is not None:
        norm_len = check_int(norm_len, "norm_len", minimum=1)
    real = _check_mask(mask)
    return _aggregate(torch.where(real, loss_mat, torch.zeros((), dtype=loss_mat.dtype, device=loss_mat.device)),
                      real, mode, norm_len)


def _check_mode(mode) -> None:
    if not isinstance(mode, str) or mode not in AGG_MODES:
        raise ValueError(f"unknown aggregation {mode!r}; choose one of {AGG_MODES}")


def _aggregate(loss_mat: torch.Tensor, real: torch.Tensor, mode: str, norm_len: int | None = None) -> torch.Tensor:
    """``aggregate`` on checked inputs: padding already 0 in loss_mat, ``real`` the boolean mask."""
    tokens = real.to(loss_mat.dtype)
    if mode == "token-mean":
        return loss_mat.sum() / tokens.sum().clamp_min(1.0)
    if mode == "seq-mean-token-mean":
        per_seq = loss_mat.sum(-1) / tokens.sum(-1).clamp_min(1.0)
        has_tokens = (tokens.sum(-1) > 0).to(loss_mat.dtype)
        return (per_seq * has_tokens).sum() / has_tokens.sum().clamp_min(1.0)
    return loss_mat.sum() / max(loss_mat.shape[0] * (norm_len or loss_mat.shape[1]), 1)


def _clipped_surrogate(ratio, adv, clip_low, clip_high):
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    return torch.maximum(unclipped, clipped), (clipped > unclipped)


def ppo_clip_loss(log_prob, old_log_prob, advantages, mask, *, clip_low: float = 0.2,
                  clip_high: float | None = None, agg: str = "token-mean"):
    """Token-level PPO clip: -min(ρ_t A, clip(ρ_t, 1-ε_low, 1+ε_high) A), ρ_t = π/π_old per token.

    clip_high=None means symmetric (GRPO); DAPO's clip-higher is clip_high=0.28 with agg="token-mean".
    """
    real, log_prob, old_log_prob = _masked_inputs(log_prob, mask, old_log_prob=old_log_prob)
    low, high = _check_clip(clip_low, clip_high)
    _check_mode(agg)
    adv = _per_token(advantages, log_prob)
    ratio = torch.exp(log_prob - old_log_prob)
    loss_mat, was_clipped = _clipped_surrogate(ratio, adv, low, high)
    loss = _aggregate(loss_mat * real, real, agg)
    return loss, {"clip_frac": float(_aggregate((was_clipped & real).to(loss_mat.dtype), real, "token-mean"))}


def gspo_loss(log_prob, old_log_prob, advantages, mask, *, clip_low: float = 3e-4, clip_high: float = 4e-4,
              agg: str = "seq-mean-token-mean"):
    """GSPO: sequence ratio s_i = exp(mean_t log(π/π_old)) over the response's tokens, clipped per sequence.

    Each token carries sg[s_i] · π_t / sg[π_t], whose value is s_i and whose gradient flows through every
    token of the sequence (the "GSPO-token" form), so all tokens share the sequence's clipping decision.
    """
    real, log_prob, old_log_prob = _masked_inputs(log_prob, mask, old_log_prob=old_log_prob)
    low, high = _check_clip(clip_low, clip_high)
    _check_mode(agg)
    adv = _per_token(advantages, log_prob)
    tokens = real.to(log_prob.dtype)
    seq_log_ratio = ((log_prob - old_log_prob) * tokens).sum(-1) / tokens.sum(-1).clamp_min(1.0)
    token_log_ratio = seq_log_ratio.detach()[:, None] + log_prob - log_prob.detach()
    ratio = torch.exp(token_log_ratio)
    loss_mat, was_clipped = _clipped_surrogate(ratio, adv, low, high)
    loss = _aggregate(loss_mat * real, real, agg)
    return loss, {"clip_frac": float(_aggregate((was_clipped & real).to(loss_mat.dtype), real,
                                                "seq-mean-token-mean"))}


def kl_k3(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(π ‖ π_ref): exp(ref - logp) - (ref - logp) - 1, always ≥ 0."""
    d = ref_log_prob - log_prob
    return torch.exp(d) - d - 1.0


def policy_loss(preset, log_prob, old_log_prob, advantages, mask, *, ref_log_prob=None, kl_coef: float = 0.0):
    """The loss of an ``AlgorithmPreset`` (GRPO, GSPO, DAPO) or a preset's name, plus β·KL_k3 to a reference.

    kl_coef > 0 needs ``ref_log_prob`` (a KL term asked for is never silently left out).
    """
    if isinstance(preset, str):
        preset = get_preset(preset)
    elif not isinstance(preset, AlgorithmPreset):
        raise ValueError(f"preset must be an AlgorithmPreset or one of {sorted(PRESETS)}, got "
                         f"{type(preset).__name__}")
    kl_coef = check_real(kl_coef, "kl_coef", minimum=0.0)
    if kl_coef and ref_log_prob is None:
        raise ValueError(f"kl_coef={kl_coef} needs ref_log_prob, the reference model's log-probs (B, T)")
    if preset.ratio_level == "sequence":
        loss, metrics = gspo_loss(log_prob, old_log_prob, advantages, mask, clip_low=preset.clip_low,
                                  clip_high=preset.clip_high, agg=preset.loss_agg)
    elif preset.ratio_level == "token":
        loss, metrics = ppo_clip_loss(log_prob, old_log_prob, advantages, mask, clip_low=preset.clip_low,
                                      clip_high=preset.clip_high, agg=preset.loss_agg)
    else:
        raise ValueError(f"unknown ratio_level {preset.ratio_level!r}; use 'token' or 'sequence'")
    if ref_log_prob is not None and kl_coef:
        real, log_prob, ref_log_prob = _masked_inputs(log_prob, mask, ref_log_prob=ref_log_prob)
        kl = _aggregate(kl_k3(log_prob, ref_log_prob) * real, real, preset.loss_agg)
        loss = loss + kl_coef * kl
        metrics["kl"] = float(kl)
    return loss, metrics


def soft_overlong_penalty(lengths, max_len: int, cache_len: int) -> torch.Tensor:
    """DAPO's soft overlong penalty: 0 if |y| ≤ L_max - L_cache, else (L_max - L_cache - |y|) / L_cache."""
    max_len, cache_len = check_int(max_len, "max_len"), check_int(cache_len, "cache_len")
    if max_len > 2**53:  # lengths are floats below: beyond 2**53 they stop being exact integers
        raise ValueError(f"max_len must be <= 2**53, got {max_len}")
    lengths = as_tensor(lengths, name="lengths", dtype=torch.get_default_dtype())
    check_finite(lengths, "lengths")
    if bool((lengths < 0).any()):
        raise ValueError("lengths must be >= 0")
    if cache_len <= 0 or cache_len >= max_len:
        raise ValueError(f"cache_len must be in (0, max_len); got cache_len={cache_len}, max_len={max_len}")
    return ((max_len - cache_len - lengths) / cache_len).clamp(max=0.0)
