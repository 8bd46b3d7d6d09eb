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
from collections.abc import Iterable, Mapping, Set

import numpy as np
import torch

# Half-precision floats hold ~3 significant digits (bfloat16) or overflow at 65504 (float16): sums, means and
# stds of rewards in them are wrong by whole units, so every quantity is computed in float32 or wider.
_HALF = (torch.float16, torch.bfloat16)


def as_bool_rows(x, *, name: str, device=None) -> torch.Tensor:
    """A bool tensor from booleans (a bool tensor or array, or a sequence of True/False); numbers, 0/1 included,
    are a ValueError naming ``name``: a row flag must say yes or no, not be read as truthy."""
    if isinstance(x, torch.Tensor):
        t = x
    else:
        arr = np.asarray(x if not isinstance(x, (str, bytes, Mapping, Set)) else [x], dtype=object)
        if arr.size and not all(isinstance(v, (bool, np.bool_)) for v in arr.reshape(-1).tolist()):
            bad = next(v for v in arr.reshape(-1).tolist() if not isinstance(v, (bool, np.bool_)))
            raise ValueError(f"{name} must be booleans (True/False for each row), got {type(bad).__name__} {bad!r:.40}")
        t = torch.as_tensor(arr.astype(bool))
    if t.dtype != torch.bool:
        raise ValueError(f"{name} must be booleans (True/False for each row), got dtype {t.dtype}")
    return t if device is None else t.to(device)


def as_tensor(x, *, name: str, device=None, dtype=None) -> torch.Tensor:
    """Torch tensor from a tensor, numpy array or sequence of numbers.

    float32/float64 are kept; float16/bfloat16, integers and bools become float32 (the default dtype), so
    no sum or mean runs in half precision; ``dtype`` forces one. Complex, string and object input, and
    anything that is not an array of real numbers, is a ValueError naming ``name``.
    """
    if isinstance(x, torch.Tensor):
        check_has_data(x, name)
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


def check_has_data(t: torch.Tensor, name: str) -> None:
    """Refuse a tensor without values: a meta tensor (shape only, e.g. from ``torch.device("meta")`` model
    building) has nothing to compute SetPO's data-dependent checks and groups from."""
    if t.device.type == "meta":
        raise ValueError(f"{name} is on the 'meta' device (a shape without values); SetPO needs its values: "
                         f"pass a tensor on 'cpu' or 'cuda' (materialise it, e.g. with .to_empty() and real data)")


def const(value: float, like: torch.Tensor) -> torch.Tensor:
    """``value`` as a 0-d tensor of ``like``'s dtype and device, made once and reused.

    Use it for the constants of elementwise operations on hot paths: a Python float there is first turned
    into a tensor and converted to the operand's dtype, two extra operations that cost about as much as the
    arithmetic itself on a few thousand numbers (TRL's usual sizes). Same rounding: the float is converted
    to ``like``'s dtype either way. Never modify the result in place: it is shared.
    """
    if torch.compiler.is_compiling():  # under torch.compile: a plain number, which the compiler folds in
        return value
    return _const(float(value), like.dtype, like.device)


@functools.lru_cache(maxsize=1024)
def _const(value: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    with torch.inference_mode(False):  # a normal tensor, usable in and out of inference mode
        return torch.tensor(value, dtype=dtype, device=device)


def representable(x: float, dtype: torch.dtype, *, up: bool) -> float:
    """The nearest number of ``dtype`` at or above x (``up``) or at or below it, as a Python float.

    A tensor compared with a Python number compares in the tensor's dtype, the number first rounded to it,
    which can land on the wrong side of x: ``t >= x`` in float32 is not ``float(t) >= x``. A bound made
    representable this way gives the same answer both ways (for t of ``dtype``: t >= x exactly when
    t >= representable(x, up=True), t <= x exactly when t <= representable(x, up=False)), so that a check can
    stay on the device without moving its threshold. Pure Python arithmetic (also under torch.compile).
    """
    if dtype == torch.float64 or x == 0 or not math.isfinite(x):
        return float(x)
    fi = torch.finfo(dtype)
    digits = 1 - round(math.log2(fi.eps))                          # significand bits: 24 for float32
    step = max(math.frexp(x)[1], round(math.log2(fi.tiny)) + 1) - digits  # x's unit in the last place, 2**step
    q = math.ldexp(x, -step)                                         # exact: a power-of-two scaling
    out = math.ldexp(math.ceil(q) if up else math.floor(q), step)
    if abs(out) > fi.max:
        return math.copysign(math.inf if (out > 0) == up else fi.max, out)
    return out


def check_finite(t: torch.Tensor, name: str) -> None:
    if not bool(torch.isfinite(t).all()):
        bad = (~torch.isfinite(t)).nonzero()[0].tolist()
        raise ValueError(f"{name} contains NaN or infinite values (first at position {bad})")


def check_texts(texts, name: str = "texts") -> list[str]:
    """``texts`` as a list of str; a single str (which would be read letter by letter), a mapping, None or an item
    that is not a str is a ValueError naming ``name``. Shared by the embedders (``setpo.embed``) and ``setpo.reads``."""
    if isinstance(texts, str):
        raise ValueError(f"{name} must be a sequence of strings, got a single str (wrap it in a list)")
    if not isinstance(texts, Iterable) or isinstance(texts, (bytes, Mapping)):
        raise ValueError(f"{name} must be a sequence of strings, got {type(texts).__name__}")
    texts = list(texts)
    bad = [i for i, t in enumerate(texts) if not isinstance(t, str)]
    if bad:
        raise ValueError(f"{name} must all be str; rows {bad[:5]} are {type(texts[bad[0]]).__name__}")
    return texts


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


def _index_ids(index) -> np.ndarray | list:
    """The group ids of ``index``, checked: a 1-D numpy array (tensors become one), or a list for any other
    sequence (so that numpy never casts mixed ids to one type: it would turn 1 into '1')."""
    if isinstance(index, torch.Tensor):
        check_has_data(index, "index")
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
        if index.dtype.kind in "fc" and bool(np.isnan(index).any()):
            raise ValueError("index contains NaN, which cannot name a group (NaN != NaN)")
        return index
    try:
        return list(index)
    except TypeError:
        raise ValueError(f"index must be a sequence of group ids, one per row, got {type(index).__name__}"
                         ) from None


def _block_count(ids) -> int | None:
    """B when the rows form B consecutive blocks of equal size with distinct ids (verl's usual layout: each
    uid's rollouts side by side), else None. One vectorised pass over the ids, no sort and no dict: for a
    numpy array only (lists go through ``_factorize``), and anything unusual (NaN, unhashable or oddly
    comparing ids) answers None and is left to ``_factorize`` to number or to refuse."""
    if not isinstance(ids, np.ndarray):
        return None
    n = ids.shape[0]
    try:
        if n < 2 or ids[0] != ids[1]:  # blocks of one, or (nearly always) a shuffled index: not worth a pass
            return None
        starts = np.flatnonzero(ids[1:] != ids[:-1]) + 1
        b = starts.shape[0] + 1
        if n % b or not np.array_equal(starts, np.arange(1, b) * (n // b)):
            return None
        firsts = ids[:: n // b].tolist()
        if len(set(firsts)) != b or any(_is_nan(u) for u in firsts):
            return None
    except Exception:  # ids whose comparison or hash fails: _factorize refuses them with a clear message
        return None
    return b


def _factorize(ids) -> tuple[np.ndarray, np.ndarray]:
    """Number the groups 0..B-1 in order of first appearance, and rank each row inside its group by row
    order. Returns (codes, position), each (N,) int64.

    Ids keep their identity as Python's ``==`` and ``hash`` define it: 1 and 1.0 (and True) are one group,
    1 and '1' are two. Numeric and string arrays are numbered by one stable sort, without a Python loop;
    lists and object arrays (verl's uid column) go through a dict, one pass over the rows. Tuples are valid
    ids. NaN is not (NaN != NaN, so it could not name a group); neither are unhashable ids.
    """
    n = len(ids)
    if isinstance(ids, np.ndarray) and ids.dtype.kind in "biufcUS":
        order = np.argsort(_sort_keys(ids), kind="stable")  # rows grouped by id, in row order inside a group
        sorted_ids = ids[order]
        new = np.empty(n, dtype=bool)
        new[0] = True
        np.not_equal(sorted_ids[1:], sorted_ids[:-1], out=new[1:])
        starts = np.flatnonzero(new)                        # where each id's run begins, ids in sorted order
        code_of_run = np.empty(starts.shape[0], dtype=np.int64)
        code_of_run[np.argsort(order[starts], kind="stable")] = np.arange(starts.shape[0])  # by first row
        run = np.cumsum(new) - 1
        codes, position = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
        codes[order] = code_of_run[run]
        position[order] = np.arange(n) - starts[run]
        return codes, position
    seq = ids.tolist() if isinstance(ids, np.ndarray) else ids
    first: dict = {}
    try:
        codes = np.fromiter((first.setdefault(u, len(first)) for u in seq), dtype=np.int64, count=n)
    except TypeError as err:
        bad = next((u for u in seq if not _hashable(u)), None)
        raise ValueError(f"index ids must be hashable (str, int, tuple, ...), got {bad!r:.60}") from err
    if any(_is_nan(u) for u in first):  # over the distinct ids only
        raise ValueError("index contains NaN, which cannot name a group (NaN != NaN)")
    order = np.argsort(codes, kind="stable")
    sizes = np.bincount(codes)
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n) - (np.cumsum(sizes) - sizes)[codes[order]]
    return codes, position


def _to_device(host: torch.Tensor, device) -> torch.Tensor:
    """A host tensor on ``device``. To a GPU through pinned memory, without blocking: a plain copy from pageable
    memory waits for all the work already queued on the device (e.g. the embedder's forward pass), a host
    synchronisation on every call with a shuffled index. The pinned buffer is held by torch's caching host
    allocator until the copy has run."""
    if device is not None and torch.device(device).type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


def _sort_keys(ids: np.ndarray) -> np.ndarray:
    """Keys that sort like ``ids``: integer ids spanning fewer than 2**16 values as uint16 offsets from the
    smallest (numpy sorts 16-bit keys stably by radix, in linear time: 7x faster than int64's merge sort at
    65536 rows); any other ids as they are. Equal ids get equal keys and the order is kept, so the stable
    sort's permutation, and every number derived from it, is the same either way."""
    if ids.dtype.kind in "iu" and ids.shape[0] > 1:
        lo, hi = int(ids.min()), int(ids.max())  # Python ints: no int64 overflow for ids spanning its whole range
        if hi - lo < 1 << 16:  # the offsets, exact: unsigned ones in their own dtype, signed ones in int64
            offsets = ids - ids.dtype.type(lo) if ids.dtype.kind == "u" else ids.astype(np.int64) - lo
            return offsets.astype(np.uint16)
    return ids


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
    Both per-row tensors derive from one, each row's flat slot group_id · G_max + position.
    contiguous: True when rows are already laid out as B consecutive blocks of equal size, so that
        padding is a free ``reshape``.
    equal_sizes: True when every group has ``max_size`` rows (then no slot is padding: ``valid()`` is None).
    min_size: the smallest group's size, a Python int.

    For contiguous groups the tensors are made only when first asked for: the estimator never needs them
    there, and at TRL's usual sizes (a few hundred rows) each tensor operation costs as much as the
    arithmetic, so building them would be most of the call. Otherwise they are worked out on the host (the
    ids are host data anyway) and copied to the device once. Every tensor is made at most once.
    """

    __slots__ = ("num_rows", "num_groups", "max_size", "min_size", "contiguous", "equal_sizes", "device",
                 "_slot_of_row", "_group_id", "_position", "_sizes", "_slots", "_valid")

    def __init__(self, num_rows: int, num_groups: int, max_size: int, contiguous: bool, equal_sizes: bool,
                 device=None, slot_of_row=None, sizes=None, slots=None, min_size: int | None = None):
        self.num_rows, self.num_groups, self.max_size = num_rows, num_groups, max_size
        self.min_size = max_size if min_size is None else min_size
        self.contiguous, self.equal_sizes, self.device = contiguous, equal_sizes, device
        self._slot_of_row, self._sizes, self._slots = slot_of_row, sizes, slots
        self._group_id = self._position = self._valid = None

    def __repr__(self) -> str:
        return (f"Groups(num_rows={self.num_rows}, num_groups={self.num_groups}, max_size={self.max_size}, "
                f"contiguous={self.contiguous}, equal_sizes={self.equal_sizes})")

    @property
    def slot_of_row(self) -> torch.Tensor:
        """(N,) long: each row's slot in the flattened (B · G_max) padded layout."""
        if self._slot_of_row is None:  # contiguous: row i sits in slot i
            self._slot_of_row = torch.arange(self.num_rows, device=self.device)
        return self._slot_of_row

    @property
    def group_id(self) -> torch.Tensor:
        if self._group_id is None:
            self._group_id = self.slot_of_row // self.max_size
        return self._group_id

    @property
    def position(self) -> torch.Tensor:
        if self._position is None:
            self._position = self.slot_of_row % self.max_size
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
        ids = _index_ids(index)
        if len(ids) != n_rows:
            raise ValueError(f"index has length {len(ids)} but there are {n_rows} rows")
        b = _block_count(ids)
        if b is not None:  # verl's usual layout: padding is a free reshape, and no sort was needed to know
            return cls(n_rows, b, n_rows // b, True, True, device)
        codes, position = _factorize(ids)
        sizes = np.bincount(codes)
        b, g, smallest = len(sizes), int(sizes.max()), int(sizes.min())
        if isinstance(ids, list) and smallest == g and bool((codes == np.arange(n_rows) // g).all()):
            return cls(n_rows, b, g, True, True, device)  # blocks after all (lists skip _block_count)
        slot_of_row = codes * g + position                           # (N,) flat slot of each row
        slots = np.zeros(b * g, dtype=np.int64)                      # padding slots name row 0 (see slots())
        slots[slot_of_row] = np.arange(n_rows)
        # one copy to the device for all three
        host = _to_device(torch.from_numpy(np.concatenate([slot_of_row, sizes, slots])), device)
        slot_of_row_t, sizes_t, slots_t = host.split([n_rows, b, b * g])
        return cls(n_rows, b, g, False, smallest == g, device, slot_of_row_t, sizes_t, slots_t.view(b, g), smallest)

    def require_min_size(self, minimum: int, what: str) -> None:
        if self.min_size >= minimum:
            return
        g = 0 if self.contiguous else int((self.sizes < minimum).nonzero()[0])
        raise ValueError(f"{what} needs every group to have at least {minimum} rollouts; "
                         f"group {g} (in order of first appearance) has {int(self.sizes[g])}")

    def slots(self) -> torch.Tensor:
        """(B, G_max) long: the row in each padded slot. Padding slots name row 0 (any real row would do:
        they are masked out, and a real row keeps them finite and non-zero)."""
        if self._slots is None:  # only contiguous groups get here: the others made theirs in build
            self._slots = torch.arange(self.num_rows, device=self.device).view(self.num_groups, self.max_size)
        return self._slots

    def pad(self, x: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """(N, ...) rows -> (B, G_max, ...) padded groups."""
        b, gmax = self.num_groups, self.max_size
        if self.contiguous:
            return x.reshape(b, gmax, *x.shape[1:])
        if self.equal_sizes:  # no padding slot: one gather
            return x.index_select(0, self._slots.view(-1)).view(b, gmax, *x.shape[1:])
        out = x.new_full((b * gmax, *x.shape[1:]), fill)
        out[self.slot_of_row] = x  # index_put_, which has a deterministic CUDA kernel (index_copy_ has not)
        return out.view(b, gmax, *x.shape[1:])

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """(B, G_max, ...) padded groups -> (N, ...) rows, in the original row order."""
        rows = x.reshape(self.num_rows if self.contiguous else self.num_groups * self.max_size, *x.shape[2:])
        return rows if self.contiguous else rows.index_select(0, self.slot_of_row)

    def valid(self) -> torch.Tensor | None:
        """(B, G_max) bool mask of real rows; None when every group is full."""
        if self.equal_sizes:
            return None
        if self._valid is None:
            slots = torch.arange(self.max_size, device=self.sizes.device)
            self._valid = slots[None, :] < self.sizes[:, None]
        return self._valid
