"""One floating-point path for long studies, whatever x86 CPU runs them.

torch, MKL and oneDNN each pick their CPU kernels by what the processor offers (AVX2 or AVX-512), and kernels
of two widths add in different orders: the same training on two machines drifts apart in the last bits at the
first step and ends with other weights. A study that takes several sittings, on whatever machine each sitting
gets, must therefore fix the path, or its halves are not one experiment.

torch's own kernels are the ones that change a forward and backward pass of the study's models on AMD processors;
MKL and oneDNN are pinned too, because on Intel processors they choose AVX-512 kernels of their own. What was
measured, and on which runs, is in docs/reproducibility/index.md ("One floating-point path, whatever the machine").

Every setting is read when the library starts, so the pin must be in the environment before the process
starts: ``python -m setpo_lab.repro.arithmetic <command ...>`` runs a command under it (``make countdown``, ``make lab``
and notebook 03 under ``make figures`` do), and ``pinned()`` tells whether this process runs under it. AVX2 is
what every x86-64 server of the last decade has; on a CPU without it (or not x86) the settings are ignored.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Mapping

# The one place the pin is written. Values as each library spells them.
PINNED_ARITHMETIC = {
    "ATEN_CPU_CAPABILITY": "avx2",   # torch's own vectorised kernels (the one that mattered, above)
    "MKL_CBWR": "AVX2",              # MKL's conditional numerical reproducibility: its BLAS on the AVX2 path
    "ONEDNN_MAX_CPU_ISA": "AVX2",    # oneDNN's kernels at most AVX2
}


def pinned_environment(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's environment) with the pinned arithmetic settings added."""
    return {**(os.environ if env is None else env), **PINNED_ARITHMETIC}


def pinned(env: dict[str, str] | None = None) -> bool:
    """Whether ``env`` (default: this process's) carries every pinned setting."""
    env = os.environ if env is None else env
    return all(env.get(k) == v for k, v in PINNED_ARITHMETIC.items())


def active_arithmetic() -> dict:
    """What this process computes with: torch's CPU capability as torch reports it, and the three settings."""
    import torch

    return {"torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            **{k: os.environ.get(k) for k in PINNED_ARITHMETIC}}


def pinned_children():
    """Within the block, processes started from this one (a notebook's kernel, a subprocess) run under the
    pin; this process's own arithmetic is unchanged (it was fixed when it started)."""
    return children_environment(PINNED_ARITHMETIC)


@contextlib.contextmanager
def children_environment(values: Mapping[str, str]):
    """Within the block, this process's environment (which the processes it starts inherit) holds ``values``;
    afterwards each of those variables is what it was again (unset where it was unset)."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def bf16_matrix_units() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware (AVX512-BF16 or AMX), as oneDNN, which runs torch's bf16
    matrix products on the CPU, reports it. Without them torch multiplies bf16 in a scalar loop: on a 2-core AVX2
    machine a 512×2048 by 2048×2048 product took 13.9 s in bf16 and 0.03 s in float32."""
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch without oneDNN: no hardware bf16 path either
        return False


def require_pinned(what: str) -> None:
    """Refuse to go on (ValueError naming the fix) unless this process runs under the pin."""
    if not pinned():
        missing = " ".join(f"{k}={v}" for k, v in PINNED_ARITHMETIC.items() if os.environ.get(k) != v)
        raise ValueError(f"{what} must run on the pinned floating-point path, so that its parts made on different "
                         f"machines are one experiment; this process lacks {missing}: start it with "
                         "`python -m setpo_lab.repro.arithmetic <command>` (`make countdown`, `make lab`, `make figures` do)")


def main(argv: list[str] | None = None) -> int:
    """``python -m setpo_lab.repro.arithmetic COMMAND [ARG ...]``: run COMMAND under the pin (it replaces this process)."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m setpo_lab.repro.arithmetic COMMAND [ARG ...]   (runs COMMAND with "
              + " ".join(f"{k}={v}" for k, v in PINNED_ARITHMETIC.items()) + ")",
              file=sys.stderr if not argv else sys.stdout)
        return 2 if not argv else 0
    try:
        os.execvpe(argv[0], argv, pinned_environment())
    except OSError as e:
        print(f"python -m setpo_lab.repro.arithmetic: cannot run {argv[0]!r}: {e.strerror}", file=sys.stderr)
        return 2
    return 0  # not reached: exec replaces the process


if __name__ == "__main__":
    sys.exit(main())
