"""The lab's one statistics module: every report's intervals and tests come from here.

- Intervals: the mean of a few paired differences (over seeds in the Countdown and short-answer studies, over
  problems in the math study) with its Student t-interval (``mean_ci``, ``paired_ci``, ``t_interval``), and the
  paired bootstrap over seeds × prompts (``paired_bootstrap``), which the short-answer records keep as description.
- Tests over units (the seed is the unit a user meets): the one-sided paired t (``paired_t_test``), the exact
  sign-flip test beside it (``sign_flip_p``) and the paired t's power (``paired_t_power``).
- Multiplicity: Holm's step-down procedure (``holm``) and the fixed sequence (``fixed_sequence``)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

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


#: the paired bootstrap's resamples and seed
RESAMPLES, BOOTSTRAP_SEED = 2000, 0


def paired_bootstrap(a: np.ndarray, b: np.ndarray, *, resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED) -> dict:
    """Mean of a − b and its 95% percentile interval, resampling seeds (rows) and prompts (columns) together for
    both sides. a: (S, P) per seed and prompt; b: (S, P), or (1, P) for the base model (one model, no seeds).
    Prompts where either side is None (NaN) are left out. Returns {"mean", "lo", "hi", "seeds", "prompts",
    "per_seed"} (no interval, and no "per_seed", when no prompt is left)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    b = np.broadcast_to(b, a.shape)
    keep = ~(np.isnan(a) | np.isnan(b)).any(axis=0)
    d = (a - b)[:, keep]
    s, p = d.shape
    if p == 0:
        return {"mean": None, "lo": None, "hi": None, "seeds": s, "prompts": 0}
    rng = np.random.default_rng(seed)
    rows, cols = rng.integers(0, s, size=(resamples, s)), rng.integers(0, p, size=(resamples, p))
    means = np.array([d[r][:, c].mean() for r, c in zip(rows, cols)])
    lo, hi = np.percentile(means, [2.5, 97.5])
    return {"mean": float(d.mean()), "lo": float(lo), "hi": float(hi), "seeds": s, "prompts": p,
            "per_seed": [float(x) for x in d.mean(axis=1)]}


# ---- tests over units (the seed is the unit a user meets) and their multiplicity ------------------------------------
# The confirmatory short-answer study (results/short_answers/confirm/PLAN.md) decides each hypothesis by a one-sided
# paired t over seeds, with the exact sign-flip test beside it, and corrects over its hypotheses by Holm.


def paired_t_test(diffs: Sequence[float], *, margin: float = 0.0) -> dict:
    """One-sided paired t over units for H1: mean(diffs) > −margin (margin 0: "a beats b"; margin > 0: "a is no more
    than margin worse than b", non-inferiority). Returns {"mean", "sd", "n", "t", "df", "p"}; p is NaN with fewer
    than 2 units or no spread."""
    from scipy import stats

    n = len(diffs)
    mean = sum(diffs) / n if n else float("nan")
    sd = statistics.stdev(diffs) if n > 1 else float("nan")
    if n < 2 or not sd > 0:
        return {"mean": mean, "sd": sd, "n": n, "t": float("nan"), "df": n - 1, "p": float("nan")}
    t = (mean + margin) / (sd / math.sqrt(n))
    return {"mean": mean, "sd": sd, "n": n, "t": t, "df": n - 1, "p": float(stats.t.sf(t, n - 1))}


def t_interval(diffs: Sequence[float], level: float = 0.90) -> list[float] | None:
    """The two-sided ``level`` Student t-interval of mean(diffs), [lo, hi] (None with fewer than 2 units). At 0.90
    its lower end is the bound a one-sided t-test at α = 0.05 compares with −margin, so the interval and the test
    say the same."""
    from scipy import stats

    n = len(diffs)
    if n < 2:
        return None
    mean = sum(diffs) / n
    half = float(stats.t.ppf((1 + level) / 2, n - 1)) * statistics.stdev(diffs) / math.sqrt(n)
    return [mean - half, mean + half]


def sign_flip_p(diffs: Sequence[float], *, margin: float = 0.0) -> float:
    """The exact one-sided sign-flip (permutation) p of mean(diffs) + margin > 0: the share of the 2^n sign patterns
    of the shifted differences whose mean is at least the observed one. Exact for n up to 20; its smallest possible
    value is 2^-n (1/32 with 5 units one-sided, 1/16 two-sided)."""
    import itertools

    shifted = [d + margin for d in diffs]
    n = len(shifted)
    if not 1 <= n <= 20:
        raise ValueError(f"the exact sign-flip test takes 1 to 20 units, got {n}")
    observed = sum(shifted)
    tol = 1e-12 * max(1.0, sum(abs(d) for d in shifted))
    hits = sum(sum(s * d for s, d in zip(signs, shifted)) >= observed - tol
               for signs in itertools.product((1, -1), repeat=n))
    return hits / 2 ** n


def holm(pvalues: Mapping[str, float], alpha: float = 0.05) -> dict:
    """Holm's step-down procedure over named p-values: {name: {"p", "adjusted", "reject"}}. The family-wise error
    rate is at most alpha whatever the dependence between the tests; a NaN p is never rejected and counts in m."""
    names = sorted(pvalues, key=lambda k: (math.isnan(pvalues[k]), pvalues[k]))
    m, out, running, stopped = len(names), {}, 0.0, False
    for i, name in enumerate(names):
        p = pvalues[name]
        adjusted = min(1.0, (m - i) * p) if not math.isnan(p) else float("nan")
        running = max(running, adjusted) if not math.isnan(adjusted) else float("nan")
        stopped = stopped or math.isnan(p) or p > alpha / (m - i)
        out[name] = {"p": p, "adjusted": running, "reject": not stopped}
    return out


def fixed_sequence(pvalues: Mapping[str, float | None], alpha: float = 0.05) -> dict:
    """The fixed-sequence procedure over hypotheses in their given order: each is tested at the full alpha only if
    every one before it was rejected; the first not rejected (p >= alpha, NaN, or None: not measured) stops the
    sequence. Returns {name: {"tested", "reject"}}; the family-wise error rate is at most alpha."""
    out, going = {}, True
    for name, p in pvalues.items():
        reject = going and p is not None and not math.isnan(p) and p < alpha
        out[name] = {"tested": going and p is not None, "reject": reject}
        going = reject
    return out


def paired_t_power(effect: float, sd: float, n: int, alpha: float, *, margin: float = 0.0) -> float:
    """Power of ``paired_t_test`` at level alpha with n units when the true mean difference is ``effect`` and its
    spread over units ``sd`` (the noncentral t)."""
    from scipy import stats

    df, nc = n - 1, (effect + margin) / (sd / math.sqrt(n))
    return float(stats.nct.sf(stats.t.ppf(1 - alpha, df), df, nc))
