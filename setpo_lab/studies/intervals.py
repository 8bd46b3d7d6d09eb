"""Confidence intervals the studies share: the mean of a few paired differences (over seeds in the Countdown study,
over problems in the math study) with its 95% Student t-interval."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence

# two-sided 95% Student t quantiles by degrees of freedom (values - 1); a normal 1.96 beyond the table
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        15: 2.131, 20: 2.086, 30: 2.042}


def t975(df: int) -> float:
    """The two-sided 95% Student t quantile for ``df`` degrees of freedom (the table's nearest lower entry)."""
    return T975.get(df, 1.96 if df > 30 else T975[max(k for k in T975 if k <= df)])


def mean_ci(values: Sequence[float]) -> dict:
    """Mean and its 95% t-interval over the values (seeds, problems): {"mean", "lo", "hi", "n"} (no interval from
    one value)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return {"mean": mean, "lo": None, "hi": None, "n": n}
    half = t975(n - 1) * statistics.stdev(values) / math.sqrt(n)
    return {"mean": mean, "lo": mean - half, "hi": mean + half, "n": n}


def paired_ci(pairs: Iterable[tuple], value: Callable | None = None, *, differences: str | None = None) -> dict:
    """The paired difference a − b over units (seeds, problems): ``mean_ci`` of ``value(a) − value(b)`` for each
    (a, b) in ``pairs``, in their order (``value`` None: the pairs hold the numbers); with ``differences``, the
    per-unit differences too, under that key."""
    value = value or (lambda x: x)
    diffs = [value(a) - value(b) for a, b in pairs]
    return {**mean_ci(diffs), differences: diffs} if differences else mean_ci(diffs)


def interval_side(d: Mapping | None) -> str | None:
    """Where a difference's 95% interval lies: "above 0", "below 0" or "spans 0"; None without one (no record, no
    interval, or fewer than 2 values)."""
    if not d or d.get("lo") is None or d.get("n", 2) < 2:
        return None
    return "above 0" if d["lo"] > 0 else "below 0" if d["hi"] < 0 else "spans 0"


def interval_text(d: Mapping, fmt: str = "{:+.3f}", *, scale: float = 1.0, unit: str = "", alone: str = "",
                  missing: str = "–") -> str:
    """A mean and its interval, each value ``fmt.format(scale * v)``: "{mean}{unit} [{lo}, {hi}]"; without an
    interval "{mean}{unit}{alone}"; without a mean ``missing``."""
    if d.get("mean") is None:
        return missing
    mean = fmt.format(scale * d["mean"]) + unit
    if d.get("lo") is None:
        return mean + alone
    return f"{mean} [{fmt.format(scale * d['lo'])}, {fmt.format(scale * d['hi'])}]"
