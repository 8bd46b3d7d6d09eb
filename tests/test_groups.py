"""Groups.build against a plain-Python reference: the same numbering, slots and padding for every kind of
index (numpy ints, floats, strings and objects, lists, tensors), in verl's block layout and shuffled."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from setpo.groups import Groups


def reference(ids):
    """Codes by first appearance and each row's rank inside its group, with a dict and a loop."""
    first, seen, codes, position = {}, {}, [], []
    for u in ids:
        c = first.setdefault(u, len(first))
        codes.append(c)
        position.append(seen.get(c, 0))
        seen[c] = seen.get(c, 0) + 1
    return codes, position


def as_kind(ids, kind):
    if kind == "int":
        return np.asarray(ids, dtype=np.int64)
    if kind == "float":
        return np.asarray(ids, dtype=np.float64) / 4
    if kind == "str":
        return np.asarray([f"uid-{u}" for u in ids])
    if kind == "object":
        out = np.empty(len(ids), dtype=object)
        out[:] = [f"uid-{u}" if u % 2 else u for u in ids]  # mixed str and int, as Python objects
        return out
    if kind == "list":
        return [(u, "t") if u % 3 == 0 else u for u in ids]
    return torch.as_tensor(ids)


def check(index):
    n = len(index)
    seq = index.tolist() if isinstance(index, (np.ndarray, torch.Tensor)) else list(index)
    codes, position = reference(seq)
    g = Groups.build(n, index)
    assert torch.equal(g.group_id, torch.tensor(codes)) and torch.equal(g.position, torch.tensor(position))
    sizes = np.bincount(codes)
    assert g.num_groups == len(sizes) and g.max_size == sizes.max() and g.min_size == sizes.min()
    x = torch.arange(n, dtype=torch.float64) + 1
    padded = g.pad(x)
    for row, (c, p) in enumerate(zip(codes, position, strict=True)):
        assert padded[c, p] == x[row] and g.slots()[c, p] == row
    assert torch.equal(g.unpad(padded), x)
    if g.valid() is not None:
        assert int(g.valid().sum()) == n and bool((padded[~g.valid()] == 0).all())


@settings(max_examples=150, deadline=None)
@given(sizes=st.lists(st.integers(1, 5), min_size=1, max_size=8), seed=st.integers(0, 2**16),
       kind=st.sampled_from(["int", "float", "str", "object", "list", "tensor"]),
       layout=st.sampled_from(["blocks", "shuffled"]))
def test_build_matches_the_reference(sizes, seed, kind, layout):
    rng = np.random.default_rng(seed)
    group_ids = rng.permutation(len(sizes)) * 7          # ids not in 0..B-1 nor in order
    ids = np.repeat(group_ids, sizes)
    if layout == "shuffled":
        ids = ids[rng.permutation(len(ids))]
    check(as_kind(ids.tolist(), kind))


@pytest.mark.parametrize("index", [
    np.array(["a", "a", "b", "b", "a", "a"]),               # equal blocks, but "a" comes back: 2 groups, not 3
    np.array([1.0, -0.0, 0.0, 1.0]),                        # -0.0 == 0.0
    np.array([True, True, False, False]),
    np.array([0, 0, 0, 1, 1, 1], dtype=object),
    np.array([1, 1.0, 2, True], dtype=object),              # 1 == 1.0 == True: one group of 3
    np.array([None, None, "a", "a"], dtype=object),
    np.array(["2026-01-01", "2026-01-01", "2026-01-02", "2026-01-02"], dtype="datetime64[D]"),
])
def test_build_edge_layouts(index):
    check(index)
    if index.dtype == object and len(index) == 4:
        assert Groups.build(4, index).num_groups == 2


def test_blocks_are_recognised_without_sorting():
    uids = np.array([f"uid-{u}" for u in range(64) for _ in range(8)], dtype=object)
    g = Groups.build(512, uids)
    assert g.contiguous and g.num_groups == 64 and g.max_size == 8
    with pytest.raises(ValueError, match="NaN"):
        Groups.build(4, np.array([float("nan"), float("nan"), 1.0, 1.0], dtype=object))
    with pytest.raises(ValueError, match="hashable"):
        Groups.build(2, [[1], [1]])
    arrays = np.empty(2, dtype=object)
    arrays[0], arrays[1] = np.zeros(2), np.zeros(2)          # == is elementwise: no block check, a clear error
    with pytest.raises(ValueError, match="hashable"):
        Groups.build(2, arrays)


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64])
def test_integer_ids_numbered_as_before_whatever_their_span(dtype):
    """Integer ids spanning fewer than 2**16 values are sorted as 16-bit offsets (numpy's linear-time radix
    sort); the numbering must be the reference's for every integer dtype, at its extremes and across the span
    limit."""
    info = np.iinfo(dtype)
    rng = np.random.default_rng(int(info.bits))
    for lo, span in ((info.min, 3), (max(info.min, info.max - 300), 300), (info.min, (1 << 16) - 1),
                     (info.min, 1 << 16), (0, 1 << 17), (info.min, None)):
        hi = info.max if span is None else min(info.max, lo + span)
        ids = rng.integers(lo, hi, size=400, endpoint=True, dtype=dtype)
        ids[:3] = [lo, hi, lo]
        check(ids[rng.permutation(400)])
