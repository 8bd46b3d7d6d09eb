"""Input checks shared by the three SetGRPO modules: groups, grader scores, per-row vectors, features."""

from __future__ import annotations

import torch

from setpo.groups import Groups, as_tensor, check_finite, check_int, check_real


def response_groups(n_rows: int, index, group_size, device) -> Groups:
    """The groups of N responses (``Groups.build``), each of at least 2 (a ValueError names the first short one)."""
    groups = Groups.build(n_rows, index, group_size, device=device)
    if groups.min_size >= 2:
        return groups
    small = groups.sizes < 2
    if bool(small.any()):
        g = int(small.nonzero()[0])
        raise ValueError(
            f"SetGRPO needs at least 2 responses per group (group-relative coefficients are undefined for "
            f"one response); group {g} (in order of first appearance) has {int(groups.sizes[g])}"
        )
    return groups


def grader_scores(scores) -> torch.Tensor:
    """(N, 2) two graders' scores per response, as float64; NaN (a missing score) and infinities are errors."""
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


def float_rows(x, name: str, n: int, device=None) -> torch.Tensor:
    """x as a finite (n,) float64 tensor named ``name`` in errors."""
    t = as_tensor(x, name=name, device=device, dtype=torch.float64)
    if t.ndim != 1 or t.shape[0] != n:
        raise ValueError(f"{name} must have shape ({n},), got {tuple(t.shape)}")
    check_finite(t, name)
    return t


def feature_rows(features, n: int, device) -> torch.Tensor | None:
    """(n, d) shape-checked gradient features in their own float dtype, or None (identity geometry);
    finiteness is checked later, on the small Gram matrix."""
    if features is None:
        return None  # identity geometry
    f = as_tensor(features, name="features", device=device)
    if f.ndim != 2 or f.shape[0] != n:
        raise ValueError(f"features must have shape ({n}, d), one gradient feature row per response; "
                         f"got {tuple(f.shape)}")
    return f


def check_level(x: float, name: str) -> float:
    """A probability level (α, β, δ) strictly inside (0, 1), as a float (not a bool, str or NaN)."""
    x = check_real(x, name)
    if not 0 < x < 1:
        raise ValueError(f"{name} must be in (0, 1), got {x}")
    return x


#: Most bisection halvings worth asking for: from an interval of width 1, float64 stops changing after 1074.
MAX_BISECT = 1100


def check_bisect(n_bisect) -> int:
    """A number of bisection steps: a whole number in [0, MAX_BISECT] (more would change nothing, and only run)."""
    n = check_int(n_bisect, "n_bisect", minimum=0)
    if n > MAX_BISECT:
        raise ValueError(f"n_bisect must be <= {MAX_BISECT} (float64 resolves [0, 1] in 1074 halvings), got {n}")
    return n


def check_feature_dims(dims, name: str = "dims") -> tuple[int, int] | None:
    """``lm_head_gradient_features``' projection size: None (exact features) or a pair (k1, k2) of ints >= 1."""
    if dims is None:
        return None
    if isinstance(dims, (str, bytes)) or not isinstance(dims, (tuple, list)) or len(dims) != 2:
        raise ValueError(f"{name} must be None or a pair (k1, k2) of ints (None: exact features), got {dims!r:.40}")
    return check_int(dims[0], f"{name}[0]", minimum=1), check_int(dims[1], f"{name}[1]", minimum=1)
