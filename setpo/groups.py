"""Rollout groups: from a verl-style ``index`` or a contiguous ``group_size`` to a padded layout.

Every group-level quantity in this package (base advantages, diversity marginals) is computed on a padded
``(B, G_max)`` layout with a validity mask, so that ragged groups in any order cost one batched tensor
operation rather than a Python loop over groups. ``Groups`` holds the mapping both ways.

This module also holds the input checks every public function shares (``as_tensor``, ``check_finite``,
``check_int``, ``check_real``): bad input is a ``ValueError`` that names the argument and the problem.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Mapping, Set

import numpy as np
import torch

# Half-precision floats hold ~3 significant digits (bfloat16) or overflow at 65504 (float16): sums, means and
# stds of rewards in them are wrong by whole units, so every quantity is computed in float32 or wider.
_HALF = (torch.float16, torch.bfloat16)


def as_tensor(x, *, name: str, device=None, dtype=None) -> torch.Tensor:
    """Torch tensor from a tensor, numpy array or sequence of numbers.

    float32/float64 are kept; float16/bfloat16, integers and bools become float32 (the default dtype), so
    no sum or mean runs in half precision; ``dtype`` forces one. Complex, string and object input, and
    anything that is not an array of real numbers, is a ValueError naming ``name``.
    """
    if isinstance(x, torch.Tensor):
        t = x
    else:
        if isinstance(x, (str, bytes, Mapping, Set)) or x is None:
            raise ValueError(f"{name} must be a numeric array, got {type(x).__name__}")
        try:
            arr = np.asarray(x)
            if arr.dtype == object:  # e.g. verl's object columns holding numbers: numbers only, never str
                arr = np.asarray(arr.tolist())
        except (TypeError, ValueError) as err:
            raise ValueError(f"{name} must be a numeric array (rows of equal length), got {type(x).__name__}: "
                             f"{err}") from None
        if arr.dtype.kind not in "biuf":
            raise ValueError(f"{name} must hold real numbers, got numpy dtype {arr.dtype}"
                             + (" (complex values would lose their imaginary part)" if arr.dtype.kind == "c" else ""))
        if arr.dtype.kind == "f" and arr.dtype.itemsize > 8:  # long double: torch has no such dtype
            arr = arr.astype(np.float64)
        if arr.dtype.kind == "u" and arr.dtype.itemsize > 1:  # torch lacks uint16..64 arithmetic
            arr = arr.astype(np.float64)
        t = torch.as_tensor(arr)
    if t.is_complex():
        raise ValueError(f"{name} is complex ({t.dtype}); it must be real (the imaginary part would be lost)")
    if dtype is not None:
        t = t.to(dtype)
    elif not t.is_floating_point() or t.dtype in _HALF:
        t = t.to(torch.float32 if t.dtype in _HALF else torch.get_default_dtype())
    if device is not None and t.device != torch.device(device):
        t = t.to(device)
    return t


def const(value: float, like: torch.Tensor) -> torch.Tensor:
    """``value`` as a 0-d tensor of ``like``'s dtype and device, made once and reused.

    Use it for the constants of elementwise operations on hot paths: a Python float there is first turned
    into a tensor and converted to the operand's dtype, two extra operations that cost about as much as the
    arithmetic itself on a few thousand numbers (TRL's usual sizes). Same rounding: the float is converted
    to ``like``'s dtype either way. Never modify the result in place: it is shared.
    """
    return _const(float(value), like.dtype, like.device)


@functools.lru_cache(maxsize=1024)
def _const(value: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    with torch.inference_mode(False):  # a normal tensor, usable in and out of inference mode
        return torch.tensor(value, dtype=dtype, device=device)


def check_finite(t: torch.Tensor, name: str) -> None:
    if not bool(torch.isfinite(t).all()):
        bad = (~torch.isfinite(t)).nonzero()[0].tolist()
        raise ValueError(f"{name} contains NaN or infinite values (first at position {bad})")


def check_int(value, name: str, *, minimum: int | None = None) -> int:
    """``value`` as a Python int: ints, numpy ints and integer-valued floats (3.0); not bool, str, 3.7, NaN."""
    if isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim == 0:
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    if isinstance(value, numbers.Integral):
        out = int(value)
    else:
        f = float(value)
        if not (math.isfinite(f) and f.is_integer()):
            raise ValueError(f"{name} must be an integer, got {value!r}")
        out = int(f)
    if minimum is not None and out < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {out}")
    return out


def check_real(value, name: str, *, minimum: float | None = None, strict: bool = False) -> float:
    """``value`` as a finite Python float (a number, 0-d tensor or numpy scalar; not bool, str or complex).

    minimum: lower bound, inclusive (exclusive with ``strict``).
    """
    if isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim == 0 and not isinstance(value, str):
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
    f = float(value)
    if not math.isfinite(f):
        raise ValueError(f"{name} must be finite, got {f}")
    if minimum is not None and (f <= minimum if strict else f < minimum):
        raise ValueError(f"{name} must be {'>' if strict else '>='} {minimum}, got {f}")
    return f


def _is_nan(u) -> bool:
    return isinstance(u, (float, np.floating)) and u != u


def _factorize(index) -> np.ndarray:
    """Map group ids to 0..B-1, numbered in order of first appearance.

    Ids keep their identity as Python's ``==`` and ``hash`` define it: 1 and 1.0 (and True) are one group,
    1 and '1' are two. Numeric arrays and tensors are factorised by numpy without a Python loop; lists and
    object arrays (verl's uid column) go through a dict, one pass over the rows, so that numpy never casts
    mixed ids to one type (it would turn 1 into '1'). Tuples are valid ids. NaN is not (NaN != NaN, so it
    could not name a group); neither are unhashable ids.
    """
    if isinstance(index, torch.Tensor):
        if index.is_complex():
            raise ValueError("index must hold group ids, got a complex tensor")
        index = index.detach().cpu().numpy()
    if isinstance(index, (str, bytes)):
        raise ValueError("index must be a sequence of group ids, one per row, got a single string")
    if isinstance(index, (Mapping, Set)):
        raise ValueError(f"index must be an ordered sequence of group ids, got a {type(index).__name__}")
    if isinstance(index, np.ndarray):
        if index.ndim != 1:
            # verl stores uids in a 1-D object array; a 2-D array here is almost always a mistake.
            raise ValueError(f"index must be one-dimensional, got shape {index.shape} (for tuple ids pass a "
                             f"list of tuples or a 1-D object array)")
        if index.dtype.kind in "biufcUS":
            if index.dtype.kind in "fc" and bool(np.isnan(index).any()):
                raise ValueError("index contains NaN, which cannot name a group (NaN != NaN)")
            _, first, inverse = np.unique(index, return_index=True, return_inverse=True)
            return np.argsort(np.argsort(first))[inverse.reshape(-1)]
        ids_seq = index.tolist()
    else:
        try:
            ids_seq = list(index)
        except TypeError:
            raise ValueError(f"index must be a sequence of group ids, one per row, got {type(index).__name__}"
                             ) from None
    ids: dict = {}
    try:
        out = np.fromiter((ids.setdefault(u, len(ids)) for u in ids_seq), dtype=np.int64, count=len(ids_seq))
    except TypeError as err:
        bad = next((u for u in ids_seq if not _hashable(u)), None)
        raise ValueError(f"index ids must be hashable (str, int, tuple, ...), got {bad!r:.60}") from err
    if any(_is_nan(u) for u in ids):  # over the distinct ids only
        raise ValueError("index contains NaN, which cannot name a group (NaN != NaN)")
    return out


def _hashable(u) -> bool:
    try:
        hash(u)
    except TypeError:
        return False
    return True


class Groups:
    """How N rows split into B groups.

    group_id: (N,) long, the group of each row, 0..B-1.
    position: (N,) long, the row's slot inside its group's padded row, 0..size-1.
    sizes:    (B,) long, rows per group.
    contiguous: True when rows are already laid out as B consecutive blocks of equal size, so that
        padding is a free ``reshape``.
    equal_sizes: True when every group has ``max_size`` rows (then no slot is padding: ``valid()`` is None).

    For contiguous groups the three tensors are made only when first asked for: the estimator never needs
    them there, and at TRL's usual sizes (a few hundred rows) each tensor operation costs as much as the
    arithmetic, so building them would be most of the call.
    """

    __slots__ = ("num_rows", "num_groups", "max_size", "contiguous", "equal_sizes", "device", "_group_id",
                 "_position", "_sizes", "_slots")

    def __init__(self, num_rows: int, num_groups: int, max_size: int, contiguous: bool, equal_sizes: bool,
                 device=None, group_id=None, position=None, sizes=None):
        self.num_rows, self.num_groups, self.max_size = num_rows, num_groups, max_size
        self.contiguous, self.equal_sizes, self.device = contiguous, equal_sizes, device
        self._group_id, self._position, self._sizes, self._slots = group_id, position, sizes, None

    def __repr__(self) -> str:
        return (f"Groups(num_rows={self.num_rows}, num_groups={self.num_groups}, max_size={self.max_size}, "
                f"contiguous={self.contiguous}, equal_sizes={self.equal_sizes})")

    @property
    def group_id(self) -> torch.Tensor:
        if self._group_id is None:
            self._group_id = torch.arange(self.num_rows, device=self.device) // self.max_size
        return self._group_id

    @property
    def position(self) -> torch.Tensor:
        if self._position is None:
            self._position = torch.arange(self.num_rows, device=self.device) % self.max_size
        return self._position

    @property
    def sizes(self) -> torch.Tensor:
        if self._sizes is None:
            self._sizes = torch.full((self.num_groups,), self.max_size, device=self.device)
        return self._sizes

    @classmethod
    def build(cls, n_rows: int, index=None, group_size: int | None = None, *, device=None) -> "Groups":
        if n_rows == 0:
            raise ValueError("the input is empty (0 rows): there are no groups to compute over")
        if index is not None and group_size is not None:
            raise ValueError("give either index or group_size, not both")
        if index is None:
            g = n_rows if group_size is None else check_int(group_size, "group_size", minimum=1)
            if n_rows % g != 0:
                raise ValueError(f"group_size={g} does not divide the number of rows ({n_rows})")
            return cls(n_rows, n_rows // g, g, True, True, device)
        codes = _factorize(index)
        if codes.shape[0] != n_rows:
            raise ValueError(f"index has length {codes.shape[0]} but there are {n_rows} rows")
        # group structure on the host (the ids are host data anyway), then one copy of each tensor to device
        sizes = np.bincount(codes)
        b, g = len(sizes), int(sizes.max())
        equal = bool(sizes.min() == g)
        if equal and bool((codes == np.arange(n_rows) // g).all()):
            # verl's usual layout (each uid's rollouts side by side, equal counts): padding is a free reshape.
            return cls(n_rows, b, g, True, True, device)
        # Position of each row inside its group: rank among rows of the same group, by row order.
        order = np.argsort(codes, kind="stable")
        starts = np.cumsum(sizes) - sizes
        position = np.empty_like(codes)
        position[order] = np.arange(n_rows) - starts[codes[order]]

        def to(a):
            return torch.as_tensor(a, dtype=torch.long).to(device)

        return cls(n_rows, b, g, False, equal, device, to(codes), to(position), to(sizes))

    def require_min_size(self, minimum: int, what: str) -> None:
        if self.contiguous:  # one size for all: no tensor needed
            if self.max_size < minimum:
                raise ValueError(f"{what} needs every group to have at least {minimum} rollouts; "
                                 f"group 0 (in order of first appearance) has {self.max_size}")
            return
        small = self.sizes < minimum
        if bool(small.any()):
            g = int(small.nonzero()[0])
            raise ValueError(
                f"{what} needs every group to have at least {minimum} rollouts; "
                f"group {g} (in order of first appearance) has {int(self.sizes[g])}"
            )

    def slots(self) -> torch.Tensor:
        """(B, G_max) long: the row in each padded slot. Padding slots name row 0 (any real row would do:
        they are masked out, and a real row keeps them finite and non-zero)."""
        if self._slots is None:
            if self.contiguous:
                self._slots = torch.arange(self.num_rows, device=self.device).view(self.num_groups, self.max_size)
            else:
                slots = torch.zeros(self.num_groups, self.max_size, dtype=torch.long, device=self.device)
                slots[self.group_id, self.position] = torch.arange(self.num_rows, device=self.device)
                self._slots = slots
        return self._slots

    def pad(self, x: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """(N, ...) rows -> (B, G_max, ...) padded groups."""
        b, gmax = self.num_groups, self.max_size
        if self.contiguous:
            return x.reshape(b, gmax, *x.shape[1:])
        if self.equal_sizes:  # no padding slot: one gather
            return x[self.slots()]
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
        if self.equal_sizes:
            return None
        slots = torch.arange(self.max_size, device=self.sizes.device)
        return slots[None, :] < self.sizes[:, None]
