"""Speed and memory of the SetPO estimator against its floor and against the definition.

For (B groups, G, d) on the CPU in float32, one thread, timed side by side in one run (medians over
interleaved repeats, so machine noise hits every candidate alike; one thread, because on a shared machine
a second OpenMP thread waiting for a busy core makes a 40 µs matmul take milliseconds):
  setpo_advantages     the closed form, contiguous groups (group_size), as the toy trainer calls it
  as TRL calls it      the same with TRL's Ā given (base=), its unscorable rows (without_term) and s returned
  uid blocks           the same through a verl-style index whose groups sit side by side
  shuffled uids        the same through a shuffled index (groups gathered a cache-sized chunk at a time)
  as verl calls it     shuffled object uids (verl's uid column) with verl's small-group rules and s returned
  matmul floor         the one batched matmul that forms the Gram matrix, which any exact method needs
  at d = 1             setpo_advantages on one feature: all it costs besides the matmul (per-call work,
                       the eager tensor operations on (B, G, G), the input checks)
  copy of the input    one copy of the (N, d) embeddings into a ready buffer: the least that gathering the
                       groups of a shuffled index can cost
  definition           recompute D on every reduced set (O(G³) per group, a Python loop)
the host reads per call (float()/bool() of a tensor and data-shaped outputs, each a synchronisation on a GPU,
counted by dispatch here: one per valid call, the input checks' flag), and the peak extra memory of
setpo_advantages (peak RSS of a fresh process above what holds the inputs), in units of one B·G² float32 matrix.
Every engine assembles Â in ``setpo.setpo_advantages`` (the two "as ... calls it" rows are the keywords the TRL
trainer and the verl estimator pass). The targets, each printed with its measured value and PASS / FAIL:
setpo / floor <= 1.5 at (512, 16, 1024); setpo / floor <= 3 at (64, 8, 384) (TRL's usual size, where fixed
per-operation costs dominate); shuffled / contiguous <= 1.5 at every shape; definition / setpo >= 50 at
G = 16; peak extra memory <= 8 B·G² float32 matrices at G >= 16. Writes runs/bench/estimator.md (and .json).
``--smoke``: two tiny shapes (G = 8 and 16) standing in for the two of the targets, two repeats.

Run: `make bench` (all benchmarks) or `python benchmarks/estimator.py [--smoke] [--out DIR]`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import setpo
from setpo.diversity import marginals_by_definition
from harness import options, report
from setpo.records import markdown_table, time_side_by_side

#: (B, G, d); the targets are read at SMALL (TRL's usual size) and LARGE
SHAPES = [(64, 8, 384), (512, 16, 1024), (1024, 64, 1024)]
SMALL, LARGE = (64, 8, 384), (512, 16, 1024)
SMOKE_SHAPES = [(4, 8, 16), (4, 16, 32)]  # the smoke run's stand-ins for SMALL and LARGE


def make_inputs(b, g, d, seed=0):
    gen = torch.Generator().manual_seed(seed)
    emb = torch.randn(b * g, d, generator=gen)
    rewards = torch.randint(0, 2, (b * g,), generator=gen).float()
    return rewards, emb


#: ATen operations that make the host wait for the device: a read of one number (float(), bool(), .item()), or an
#: output whose shape depends on the data
HOST_READS = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique", "_unique2", "unique_dim",
              "unique_consecutive", "equal", "is_nonzero"}


class _CountOps(TorchDispatchMode):
    """Counts the ATen operations a call dispatches (views and host syncs included), and among them the host
    reads (``HOST_READS``), each a synchronisation on a GPU; the CPU dispatches the same ones."""

    def __init__(self):
        super().__init__()
        self.count = 0
        self.reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        self.reads += func.overloadpacket.__name__ in HOST_READS
        return func(*args, **(kwargs or {}))


def tensor_ops(fn) -> int:
    with _CountOps() as counter:
        fn()
    return counter.count


def host_reads(fn) -> int:
    """Host reads (GPU synchronisations) of one call of fn."""
    with _CountOps() as counter:
        fn()
    return counter.reads


def definition_all_groups(emb, g):
    return torch.cat([marginals_by_definition(chunk) for chunk in emb.split(g)])


def peak_extra_bytes(b, g, d) -> int:
    """Peak resident memory that one setpo_advantages call adds beyond its inputs, in a fresh process.

    The child resets the kernel's peak-RSS mark (/proc/self/clear_refs) just before the call and reads it
    (VmHWM) after, so earlier peaks (imports, making the inputs) cannot hide the call's own. glibc's mmap
    threshold is pinned so that every large buffer is a fresh mapping, returned to the system when freed:
    the peak then counts what the call holds at once, not what the allocator happened to keep from before.
    """
    code = f"""
import torch, setpo
def status(key):
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(key + ":"))
torch.set_num_threads({torch.get_num_threads()})
emb, rewards = torch.randn({b * g}, {d}), torch.randint(0, 2, ({b * g},)).float()
setpo.setpo_advantages(rewards[:{3 * g}], emb[:{3 * g}], group_size={g})  # warm up kernels and allocator
open("/proc/self/clear_refs", "w").write("5")
before = status("VmRSS")
setpo.setpo_advantages(rewards, emb, group_size={g})
print(status("VmHWM") - before)
"""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    return int(out.stdout.strip().splitlines()[-1])


# "peak extra memory O(B·G²)": at most this many B·G² float32 matrices where that unit is not dwarfed by fixed
# allocations (G >= 16; at (64, 8) one matrix is 16 KiB)
MAX_PEAK_MATRICES = 8


def target_rows(rows: list[dict], small_shape=SMALL, large_shape=LARGE) -> list[dict]:
    """Each target of this benchmark, the measured value, whether it was met, and what bounds it here."""
    at = {(r["B"], r["G"], r["d"]): r for r in rows}
    g16 = [r for r in rows if r["G"] == 16]
    small = at[small_shape]
    worst = max(rows, key=lambda r: r["shuffled / contiguous"])
    checks = [(f"setpo / floor <= 1.5 at {large_shape}", at[large_shape]["setpo / floor"], lambda v: v <= 1.5, ""),
              (f"setpo / floor <= 3 at {small_shape}", small["setpo / floor"], lambda v: v <= 3,
               f"the same call at d = 1 alone takes {small['at d = 1 / floor']}x this floor "
               f"({small['tensor ops per call']} tensor operations per call)"),
              ("shuffled uids / setpo <= 1.5, every shape", worst["shuffled / contiguous"], lambda v: v <= 1.5,
               f"at ({worst['B']}, {worst['G']}, {worst['d']}) shuffled - contiguous = "
               f"{worst['(shuffled - contiguous) / copy']} copies of the input; one copy = "
               f"{worst['copy / contiguous']}x the contiguous call"),
              ("definition / setpo >= 50 at G = 16", min(r["definition / setpo"] for r in g16), lambda v: v >= 50, ""),
              (f"peak extra memory <= {MAX_PEAK_MATRICES} B·G² float32 matrices (O(B·G²)) at G >= 16",
               max(r["peak extra / (B·G²·4 B)"] for r in rows if r["G"] >= 16), lambda v: v <= MAX_PEAK_MATRICES, "")]
    return [{"target": name, "measured": value, "met": "PASS" if ok(value) else "FAIL", "bound here": why}
            for name, value, ok, why in checks]


THREADS = 1


def main(argv=None) -> None:
    args = options(__doc__, argv)
    shapes = SMOKE_SHAPES if args.smoke else SHAPES
    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    rows = []
    for b, g, d in shapes:
        print(f"  (B, G, d) = ({b}, {g}, {d}) ...", flush=True)
        rewards, emb = make_inputs(b, g, d)
        grouped = emb.reshape(b, g, d)
        perm = torch.randperm(b * g)
        blocks = np.repeat(np.arange(b), g)  # verl's usual layout: each uid's rollouts side by side
        index = blocks[perm.numpy()]
        r_perm, e_perm = rewards[perm], emb[perm]
        one_feature, copy_buffer = emb[:, :1].contiguous(), torch.empty_like(emb)
        trl_base, unscorable = setpo.group_advantages(rewards, group_size=g), torch.zeros(b * g, dtype=torch.bool)
        uids = np.array([f"uid-{k}" for k in index], dtype=object)  # verl's uid column: strings in an object array
        # Each lambda binds this shape's tensors as default arguments (they are called only within this iteration).
        fns = {
            "setpo_advantages": lambda rewards=rewards, emb=emb, g=g: setpo.setpo_advantages(
                rewards, emb, group_size=g),
            "as TRL calls it": lambda emb=emb, g=g, trl_base=trl_base, unscorable=unscorable: setpo.setpo_advantages(
                None, emb, group_size=g, base=trl_base, lam=0.05, without_term=unscorable, return_marginals=True),
            "uid blocks": lambda rewards=rewards, emb=emb, blocks=blocks: setpo.setpo_advantages(rewards, emb, blocks),
            "shuffled uids": lambda r_perm=r_perm, e_perm=e_perm, index=index: setpo.setpo_advantages(
                r_perm, e_perm, index),
            "as verl calls it": lambda r_perm=r_perm, e_perm=e_perm, uids=uids: setpo.setpo_advantages(
                r_perm, e_perm, uids, lam=0.05, small_groups="verl", return_marginals=True),
            "matmul floor": lambda grouped=grouped: torch.bmm(grouped, grouped.transpose(1, 2)),
            "at d = 1": lambda rewards=rewards, one_feature=one_feature, g=g: setpo.setpo_advantages(
                rewards, one_feature, group_size=g),
            "copy of the input": lambda copy_buffer=copy_buffer, emb=emb: copy_buffer.copy_(emb),
        }
        for fn in fns.values():
            fn()  # warm-up
        t = time_side_by_side(fns, repeats=2 if args.smoke else 15 if b * g * d < 2e7 else 7)
        # The definition is slow; time it once per shape (and only a slice of groups at the largest shape).
        n_def = b if g <= 16 else 64
        t0 = time.perf_counter()
        definition_all_groups(emb[: n_def * g], g)
        t["definition"] = (time.perf_counter() - t0) * b / n_def
        extra = peak_extra_bytes(b, g, d)
        unit = b * g * g * 4
        rows.append({
            "B": b, "G": g, "d": d,
            **{f"{k} (ms)": round(v * 1e3, 3) for k, v in t.items()},
            "tensor ops per call": tensor_ops(fns["setpo_advantages"]),
            "host reads per call": host_reads(fns["setpo_advantages"]),
            "host reads, shuffled uids": host_reads(fns["shuffled uids"]),
            "host reads, as verl calls it": host_reads(fns["as verl calls it"]),
            "host reads, as TRL calls it": host_reads(fns["as TRL calls it"]),
            "setpo / floor": round(t["setpo_advantages"] / t["matmul floor"], 2),
            "shuffled / contiguous": round(t["shuffled uids"] / t["setpo_advantages"], 2),
            "TRL's call / contiguous": round(t["as TRL calls it"] / t["setpo_advantages"], 2),
            "verl's call / shuffled": round(t["as verl calls it"] / t["shuffled uids"], 2),
            "at d = 1 / floor": round(t["at d = 1"] / t["matmul floor"], 2),
            "(shuffled - contiguous) / copy": round((t["shuffled uids"] - t["setpo_advantages"]) / t["copy of the input"], 2),
            "copy / contiguous": round(t["copy of the input"] / t["setpo_advantages"], 2),
            "definition / setpo": round(t["definition"] / t["setpo_advantages"], 1),
            "definition extrapolated": n_def < b,
            "peak extra (MiB)": round(extra / 2**20, 1),
            "peak extra / (B·G²·4 B)": round(extra / unit, 1),
            "B·G²·d·4 B would be (MiB)": round(b * g * g * d * 4 / 2**20),
        })
    table = markdown_table(rows)
    checks = target_rows(rows, *SMOKE_SHAPES) if args.smoke else target_rows(rows)
    note = (f"\nCPU float32, torch {torch.__version__}, {torch.get_num_threads()} thread(s); medians of interleaved "
            "repeats. Run: `python benchmarks/estimator.py`.\n\nTargets\n\n" + markdown_table(checks) + "\n")
    report(args, "estimator", table + "\n" + note, {"rows": rows, "targets": checks})


if __name__ == "__main__":
    main()
