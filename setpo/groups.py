"""Rollout groups: from a verl-style ``index`` or a contiguous ``group_size`` to a padded layout.

Every group-level quantity in this package (base advantages, diversity marginals) is computed on a padded
``(B, G_max)`` layout with a validity mask, so that ragged groups in any order cost one batched tensor
operation rather than a Python loop over groups. ``Groups`` holds the mapping both ways.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


def as_tensor(x, *, name: str, device=None, dtype=None) -> torch.Tensor:
    """Torch tensor from a tensor, numpy array or sequence; floats keep float32/float64, ints become float32."""
    if isinstance(x, torch.Tensor):
        t = x
    else:
        try:
            t = torch.as_tensor(np.asarray(x))
        except (TypeError, ValueError) as err:
            raise ValueError(f"{name} must be numeric array-like, got {type(x).__name__}: {err}") from None
    if dtype is not None:
        t = t.to(dtype)
    elif not t.is_floating_point():
        t = t.to(torch.get_default_dtype())
    if device is not None:
        t = t.to(device)
    return t


def check_finite(t: torch.Tensor, name: str) -> None:
    if not bool(torch.isfinite(t).all()):
        bad = (~torch.isfinite(t)).nonzero()[0].tolist()
        raise ValueError(f"{name} contains NaN or infinite values (first at position {bad})")


def _factorize(index) -> np.ndarray:
    """Map arbitrary hashable group ids to 0..B-1, numbered in order of first appearance."""
    if isinstance(index, torch.Tensor):
        index = index.detach().cpu().numpy()
    arr = np.asarray(index)
    if arr.ndim != 1:
        # verl stores uids in an object array; a 2-D array here is almost always a mistake.
        raise ValueError(f"index must be one-dimensional, got shape {arr.shape}")
    try:
        _, first, inverse = np.unique(arr, return_index=True, return_inverse=True)
        order_of_first = np.argsort(np.argsort(first))
        return order_of_first[inverse.reshape(-1)]
    except TypeError:  # mixed, unorderable ids: fall back to a dict, still one pass over rows
        ids: dict = {}
        return np.array([ids.setdefault(u, len(ids)) for u in arr.tolist()], dtype=np.int64)


@dataclass(frozen=True)
class Groups:
    """How N rows split into B groups.

    group_id: (N,) long, the group of each row, 0..B-1.
    position: (N,) long, the row's slot inside its group's padded row, 0..size-1.
    sizes:    (B,) long, rows per group.
    contiguous: True when rows are already laid out as B consecutive blocks of equal size, so that
        padding is a free ``reshape``.
    """

    group_id: torch.Tensor
    position: torch.Tensor
    sizes: torch.Tensor
    contiguous: bool

    @property
    def num_groups(self) -> int:
        return int(self.sizes.numel())

    @property
    def max_size(self) -> int:
        return int(self.sizes.max())

    @property
    def num_rows(self) -> int:
        return int(self.group_id.numel())

    @classmethod
    def build(cls, n_rows: int, index=None, group_size: int | None = None, *, device=None) -> "Groups":
        if index is not None and group_size is not None:
            raise ValueError("give either index or group_size, not both")
        if index is None:
            g = n_rows if group_size is None else int(group_size)
            if g <= 0 or n_rows % g != 0:
                raise ValueError(f"group_size={group_size} does not divide the number of rows ({n_rows})")
            b = n_rows // g
            rows = torch.arange(n_rows, device=device)
            return cls(rows // g, rows % g, torch.full((b,), g, device=device), True)
        if len(index) != n_rows:
            raise ValueError(f"index has length {len(index)} but there are {n_rows} rows")
        gid = torch.as_tensor(_factorize(index), dtype=torch.long, device=device)
        sizes = torch.bincount(gid)
        rows = torch.arange(n_rows, device=device)
        g = int(sizes[0])
        if bool((sizes == g).all()) and torch.equal(gid, rows // g):
            # verl's usual layout (each uid's rollouts side by side, equal counts): padding is a free reshape.
            return cls(gid, rows % g, sizes, True)
        # Position of each row inside its group: rank among rows of the same group, by row order.
        order = torch.sort(gid, stable=True).indices
        starts = torch.cumsum(sizes, 0) - sizes
        position = torch.empty_like(gid)
        position[order] = rows - starts[gid[order]]
        return cls(gid, position, sizes, False)

    def require_min_size(self, minimum: int, what: str) -> None:
        small = self.sizes < minimum
        if bool(small.any()):
            g = int(small.nonzero()[0])
            raise ValueError(
                f"{what} needs every group to have at least {minimum} rollouts; "
                f"group {g} (in order of first appearance) has {int(self.sizes[g])}"
            )

    def pad(self, x: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """(N, ...) rows -> (B, G_max, ...) padded groups."""
        b, gmax = self.num_groups, self.max_size
        if self.contiguous:
            return x.reshape(b, gmax, *x.shape[1:])
        out = x.new_full((b, gmax, *x.shape[1:]), fill)
        out[self.group_id, self.position] = x
        return out

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """(B, G_max, ...) padded groups -> (N, ...) rows, in the original row order."""
        if self.contiguous:
            return x.reshape(self.num_rows, *x.shape[2:])
        return x[self.group_id, self.position]

    def valid(self) -> torch.Tensor | None:
        """(B, G_max) bool mask of real rows; None when every group is full."""
        if self.contiguous:
            return None
        slots = torch.arange(self.max_size, device=self.sizes.device)
        return slots[None, :] < self.sizes[:, None]
