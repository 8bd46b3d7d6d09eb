"""Host reads and compilation of the estimator (issue 47 item 4), checked on the CPU.

A host read is an operation whose answer Python waits for: float()/bool()/.item() of a tensor, .tolist(), and
operations whose output shape depends on the data (nonzero, boolean indexing, unique). On a GPU each one
stalls the host until the device has run everything queued before it, so that nothing can be queued ahead.
The CPU dispatches the same operations (``aten._local_scalar_dense`` is exactly a host read of one number),
so a dispatch mode counts them here without a GPU. A valid call reads once: its input checks wait on the
device as one flag. The same code, with no read at all, compiles whole (``torch.compile(fullgraph=True)``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import setpo
from setpo.advantages import dra_advantages, spread_bound, unchecked_setpo_advantages
from setpo.diversity import inverse_norm_range
from setpo.groups import const, representable

#: ATen operations that make the host wait for the device: a scalar read, or an output shaped by the data
_READS = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique", "_unique2", "unique_dim",
          "unique_consecutive", "equal", "is_nonzero"}


class HostReads(TorchDispatchMode):
    """Counts host reads among the ATen operations a block dispatches (boolean indexing counted as one)."""

    def __init__(self):
        super().__init__()
        self.reads: list[str] = []
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.ops += 1
        if name in _READS:
            self.reads.append(name)
        elif name in ("index", "index_put", "index_put_") and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else ())
                if i is not None):
            self.reads.append(f"{name} with a boolean mask")
        return func(*args, **(kwargs or {}))


def host_reads(fn, monkeypatch) -> list[str]:
    """The host reads of one call of fn (after a warm-up call), .tolist() and .numpy() included."""
    fn()
    with HostReads() as counter:
        with monkeypatch.context() as m:
            for method in ("tolist", "numpy"):
                original = getattr(torch.Tensor, method)

                def counted(self, *a, _original=original, _method=method, **k):
                    counter.reads.append(_method)
                    return _original(self, *a, **k)

                m.setattr(torch.Tensor, method, counted)
            fn()
    return counter.reads


def _inputs(b=6, g=8, d=16, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    emb = torch.randn(b * g, d, generator=gen, dtype=dtype)
    rewards = torch.randint(0, 2, (b * g,), generator=gen).to(dtype)
    return rewards, emb


def _calls():
    r, e = _inputs()
    r64, e64 = _inputs(dtype=torch.float64)
    b, g = 6, 8
    perm = torch.randperm(b * g, generator=torch.Generator().manual_seed(1))
    shuffled = np.repeat(np.arange(b), g)[perm.numpy()]
    blocks = np.repeat(np.array([f"uid-{i}" for i in range(b)], dtype=object), g)
    ragged = np.repeat(np.arange(b), [3, 5, 8, 12, 9, 11])[np.random.default_rng(0).permutation(b * g)]
    base = setpo.group_advantages(r, group_size=g)
    return {
        "setpo_advantages, contiguous": lambda: setpo.setpo_advantages(r, e, group_size=g, lam=0.05),
        "setpo_advantages, contiguous float64": lambda: setpo.setpo_advantages(r64, e64, group_size=g, lam=0.05),
        "diversity_marginals, contiguous": lambda: setpo.diversity_marginals(e, group_size=g),
        "setpo_advantages, uid blocks": lambda: setpo.setpo_advantages(r, e, blocks, lam=0.05),
        "setpo_advantages, shuffled index": lambda: setpo.setpo_advantages(r[perm], e[perm], shuffled, lam=0.05),
        "setpo_advantages, ragged groups": lambda: setpo.setpo_advantages(r, e, ragged, lam=0.05, estimator="rloo"),
        "diversity_marginals, ragged groups": lambda: setpo.diversity_marginals(e, ragged),
        "setpo_advantages, pairwise term": lambda: setpo.setpo_advantages(r, e, group_size=g, diversity="pairwise"),
        "setpo_advantages, as TRL calls it": lambda: setpo.setpo_advantages(
            None, e, group_size=g, base=base, lam=0.05, without_term=torch.zeros(b * g, dtype=torch.bool),
            return_marginals=True),
        "group_advantages": lambda: setpo.group_advantages(r, group_size=g),
        "dra_advantages": lambda: dra_advantages(r, e, group_size=g),
    }


@pytest.mark.parametrize("name", list(_calls()))
def test_a_valid_call_reads_the_host_once(name, monkeypatch):
    reads = host_reads(_calls()[name], monkeypatch)
    assert len(reads) <= 1, f"{name}: {len(reads)} host reads per call: {reads}"
    assert reads == ["_local_scalar_dense"]  # the one flag


def test_today_errors_survive_the_deferred_checks():
    """The checks wait on the device, but bad input still gets the error the checked order gives, even when a
    later check (a shape, pass@k's group size) would refuse first on the unchecked path."""
    r, e = _inputs(4, 6, 8)
    e_nan = e.clone()
    e_nan[5, 3] = float("nan")
    r_nan = r.clone()
    r_nan[9] = float("nan")
    with pytest.raises(ValueError, match=r"emb contains NaN or infinite values \(first at position \[5, 3\]\)"):
        setpo.setpo_advantages(r[:-2], e_nan, group_size=6)  # the rewards' shape is wrong too
    with pytest.raises(ValueError, match=r"base contains NaN or infinite values \(first at position \[9\]\)"):
        setpo.setpo_advantages(None, e_nan, group_size=2, base=r_nan)  # groups of 2 and a bad emb too
    with pytest.raises(ValueError, match=r"rewards contains NaN or infinite values"):
        setpo.setpo_advantages(r_nan, e, group_size=3, estimator="pass@4")  # groups smaller than k too
    with pytest.raises(ValueError, match=r"pass@4' advantage needs groups of at least k = 4"):
        setpo.setpo_advantages(r, e, group_size=3, estimator="pass@4")
    zero = e.clone()
    zero[7] = 0
    with pytest.raises(ValueError, match=r"emb has zero-norm rows .* \(rows \[7\]\)"):
        dra_advantages(r, zero, group_size=6)
    with pytest.raises(ValueError, match=r"rewards contains NaN or infinite values \(first at position \[9\]\)"):
        dra_advantages(r_nan, e_nan, group_size=6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_device_thresholds_answer_as_the_python_comparisons_did(dtype):
    """The flag compares on the device, in the tensor's dtype; its bounds are numbers of that dtype, so that
    the answer is float(t) <= bound in Python for every t, also for t one step either side of the bound."""
    fi = torch.finfo(dtype)
    python_bounds = {"smallest 1/|e|": ((fi.max / 16) ** -0.5, ">="),
                     "largest 1/|e|": ((fi.tiny / fi.eps) ** -0.5, "<="),
                     **{f"spread limit, G = {g}": (math.sqrt(fi.max / (4 * g)), "<=") for g in (3, 7, 8, 16, 64, 100)}}
    device_bounds = dict(zip(("smallest 1/|e|", "largest 1/|e|"), inverse_norm_range(dtype), strict=True))
    device_bounds.update({f"spread limit, G = {g}": spread_bound(dtype, g) for g in (3, 7, 8, 16, 64, 100)})
    for name, (bound, op) in python_bounds.items():
        t = torch.tensor(bound, dtype=torch.float64).to(dtype)
        below, above = (torch.nextafter(t, t.new_tensor(direction)) for direction in (-math.inf, math.inf))
        around = torch.stack([below, t, above])
        for value in around:
            on_device = bool(value >= const(device_bounds[name], value) if op == ">=" else
                             value <= const(device_bounds[name], value))
            in_python = float(value) >= bound if op == ">=" else float(value) <= bound
            assert on_device == in_python, (name, float(value), bound)


def test_representable_is_the_nearest_number_of_the_dtype():
    rng = np.random.default_rng(0)
    for dtype, np_dtype in ((torch.float32, np.float32), (torch.float16, np.float16)):
        low, high = (-150, 128) if dtype == torch.float32 else (-25, 16)
        for x in rng.uniform(0.5, 1, 2000) * np.exp2(rng.integers(low, high, 2000)) * rng.choice([-1, 1], 2000):
            up, down = representable(float(x), dtype, up=True), representable(float(x), dtype, up=False)
            assert down <= x <= up
            if math.isfinite(down) and math.isfinite(up):
                assert float(np_dtype(up)) == up and float(np_dtype(down)) == down
                assert up == down == x or float(np.nextafter(np_dtype(down), np_dtype(np.inf))) == up
    assert representable(1 / 3, torch.float64, up=True) == 1 / 3
    assert representable(1e39, torch.float32, up=True) == math.inf
    assert representable(1e39, torch.float32, up=False) == torch.finfo(torch.float32).max


def test_the_unchecked_path_is_the_public_one_and_its_flag_catches_bad_input():
    r, e = _inputs()
    adv, s, ok = unchecked_setpo_advantages(r, e, group_size=8, lam=0.05)
    want_adv, want_s = setpo.setpo_advantages(r, e, group_size=8, lam=0.05, return_marginals=True)
    assert bool(ok) and torch.equal(adv, want_adv) and torch.equal(s, want_s)
    bad = {"NaN reward": (r.clone().index_fill_(0, torch.tensor([3]), math.nan), e),
           "infinite reward": (r.clone().index_fill_(0, torch.tensor([3]), -math.inf), e),
           "NaN embedding": (r, e.clone().index_fill_(0, torch.tensor([5]), math.nan)),
           "zero row": (r, e.clone().index_fill_(0, torch.tensor([5]), 0.0)),
           "tiny row (rescaled)": (r, torch.cat([e[:1] * 1e-30, e[1:]])),
           "rewards needing float64": (r * 3e19, e)}
    for name, (rb, eb) in bad.items():
        assert not bool(unchecked_setpo_advantages(rb, eb, group_size=8, lam=0.05)[2]), name
    # the rescaled row and the wide rewards are valid input: the public call gives their answer
    torch.testing.assert_close(setpo.setpo_advantages(r, torch.cat([e[:1] * 1e-30, e[1:]]), group_size=8),
                               setpo.setpo_advantages(r, e, group_size=8))
    wide = setpo.group_advantages(r * 3e19, group_size=8)
    torch.testing.assert_close(wide, setpo.group_advantages(r, group_size=8))


def test_the_contiguous_path_compiles_whole():
    """torch.compile(fullgraph=True) takes the code setpo_advantages runs first (no graph break, so no host
    read); its answer agrees with the eager one (a compiled kernel may round differently), and its flag still
    catches a NaN reward."""
    r, e = _inputs(4, 8, 16)
    compiled = torch.compile(unchecked_setpo_advantages, fullgraph=True)
    adv, s, ok = compiled(r, e, group_size=8, lam=0.05)
    want_adv, want_s = setpo.setpo_advantages(r, e, group_size=8, lam=0.05, return_marginals=True)
    assert bool(ok)
    torch.testing.assert_close(adv, want_adv, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(s, want_s, rtol=1e-5, atol=1e-6)
    r_nan = r.clone()
    r_nan[3] = math.nan
    assert not bool(compiled(r_nan, e, group_size=8, lam=0.05)[2])
