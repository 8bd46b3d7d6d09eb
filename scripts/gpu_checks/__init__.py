"""The checks of scripts/gpu_check.py, one module per kind (that script's docstring says what each does):

- ``wheels``: the pinned wheel folder a bare CUDA machine installs from (``prepare``, ``install``);
- ``ray_stub``: inert stand-ins for Ray, which ``import verl`` needs and the estimator never calls;
- ``numerics``: the estimator, verl's registered estimator and the embedders on the device against the CPU;
- ``training``: notebook 06's TRL training path, and verl's own trainer end to end;
- ``timing``: the estimator against its floor, and SetPO's step-time overhead at the paper's shapes.

Imported by scripts/gpu_check.py, which puts the repository and benchmarks/ on ``sys.path`` first.
"""

from __future__ import annotations

import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
START = time.time()
#: the time the checks aim to finish in on the GPU machine (the overhead check skips itself when it is short)
BUDGET_S = 8 * 60


def elapsed() -> float:
    """Seconds since the check started."""
    return time.time() - START
