"""Argument checks shared by the environments: ``reset``'s seed and options, whole-number arguments.

Each failure is a ValueError that names the argument and what it accepts (gymnasium's own seed check raises
``gymnasium.error.Error``, and ``int()`` on a bad option a TypeError or OverflowError deep inside ``reset``).
``setpo.envs`` imports nothing else of ``setpo``, so these stand alone.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping

import numpy as np


def whole_number(value, name: str, low: int | None = None, high: int | None = None) -> int:
    """``value`` as a Python int in [low, high): ints, numpy ints, integer-valued floats (3.0); not bool, str,
    None, 2.5, NaN or infinities. The message names ``name`` and the valid range."""
    if low is None:
        want = f"{name} must be an integer"
    else:
        want = f"{name} must be a whole number " + (f">= {low}" if high is None else f"in [{low}, {high})")
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ValueError(f"{want}, got {value!r:.80} ({type(value).__name__})")
    if isinstance(value, numbers.Integral):
        out = int(value)
    else:
        f = float(value)
        if not (math.isfinite(f) and f.is_integer()):
            raise ValueError(f"{want}, got {value!r}")
        out = int(f)
    if (low is not None and out < low) or (high is not None and out >= high):
        raise ValueError(f"{want}, got {out}")
    return out


def check_seed(seed) -> int | None:
    """``reset``'s seed: None or a whole number >= 0 (numpy ints included), as a Python int."""
    if seed is None:
        return None
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, numbers.Integral):
        raise ValueError(f"seed must be None or an integer >= 0, got {seed!r:.80} ({type(seed).__name__})")
    if seed < 0:
        raise ValueError(f"seed must be None or an integer >= 0, got {int(seed)}")
    return int(seed)


def check_options(options, known: tuple[str, ...]) -> dict:
    """``reset``'s options: None or a mapping whose keys are all in ``known``; returned as a dict."""
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise ValueError(f"options must be None or a dict with keys among {list(known)}, got "
                         f"{type(options).__name__}")
    unknown = [k for k in options if k not in known]
    if unknown:
        raise ValueError(f"options has unknown key(s) {unknown!r:.80}; the valid keys are {list(known)}")
    return dict(options)


def finite_real(value, name: str, low: float | None = None, high: float | None = None) -> float:
    """``value`` as a finite Python float in [low, high] (either bound optional); not bool, str, None or complex."""
    if low is None and high is None:
        want = f"{name} must be a finite number"
    elif high is None:
        want = f"{name} must be a finite number >= {low}"
    elif low is None:
        want = f"{name} must be a finite number <= {high}"
    else:
        want = f"{name} must be a finite number in [{low}, {high}]"
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ValueError(f"{want}, got {value!r:.80} ({type(value).__name__})")
    f = float(value)
    if not math.isfinite(f) or (low is not None and f < low) or (high is not None and f > high):
        raise ValueError(f"{want}, got {value!r}")
    return f
