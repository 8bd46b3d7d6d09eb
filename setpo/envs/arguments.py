"""Command-line argument helpers shared by every command of the project (``python -m setpo.envs.math``, ``setpo``,
``python -m setpo.judge``, the study commands): a parser whose errors are one line with exit status 2, and the
checked number types. It lives in ``setpo.envs``, the lowest layer, because the environments may import nothing else of ``setpo`` while
everything in ``setpo`` may import ``setpo.envs``; it needs the standard library only."""

from __future__ import annotations

import argparse
import math


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (``prog: error: ...``) and exit status 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value}")
    return value


def nonnegative_float(text: str) -> float:
    """An argparse type: a finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text}")
    return value
