"""SetGRPO module (c): selective risk-gated optimisation, a threshold chosen by Learn-then-Test.

See ``setpo.setgrpo`` for the method and which parts are this package's design."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

from setpo.groups import as_bool_rows, as_tensor, check_int, check_real
from setpo.setgrpo.inputs import check_level

#: Most trials a p-value is computed for: the exact binomial tail sums up to `failures` + 1 terms.
MAX_TRIALS = 10**7


def reversal_indicators(coef, reference, gram) -> torch.Tensor:
    """(B, T) bool: applied update disagrees with the reference update, c(η*(τ))ᵀ K a* < 0.

    coef: (B, T, G) applied coefficients (zero for rejected groups, which never count as reversals);
    reference: (B, G) padded a*; gram: (B, G, G).
    """
    coef = as_tensor(coef, name="coef", dtype=torch.float64)
    reference = as_tensor(reference, name="reference", dtype=torch.float64, device=coef.device)
    gram = as_tensor(gram, name="gram", dtype=torch.float64, device=coef.device)
    if coef.ndim != 3 or reference.shape != (coef.shape[0], coef.shape[2]) or \
            gram.shape != (coef.shape[0], coef.shape[2], coef.shape[2]):
        raise ValueError(f"need coef (B, T, G), reference (B, G) and gram (B, G, G); got {tuple(coef.shape)}, "
                         f"{tuple(reference.shape)}, {tuple(gram.shape)}")
    v = (gram @ reference[..., None])[..., 0]                                     # (B, G)
    return (coef * v[:, None, :]).sum(-1) < 0


def _log_binom_cdf(k: int, n: int, p: float) -> float:
    """log P(Bin(n, p) ≤ k), summed in log space (n up to millions is fine; no scipy needed)."""
    if k >= n:
        return 0.0
    if k < 0:
        return -math.inf
    lp, lq = math.log(p), math.log1p(-p)
    terms = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq
             for i in range(k + 1)]
    top = max(terms)
    return top + math.log(sum(math.exp(x - top) for x in terms))


def _trials(failures, n) -> tuple[int, int]:
    """(failures, n) as ints with 0 ≤ failures ≤ n ≤ MAX_TRIALS."""
    failures, n = check_int(failures, "failures", minimum=0), check_int(n, "n", minimum=0)
    if failures > n:
        raise ValueError(f"failures ({failures}) cannot exceed the number of trials n ({n})")
    if n > MAX_TRIALS:
        raise ValueError(f"n must be <= {MAX_TRIALS} trials (calibration groups), got {n}")
    return failures, n


def binomial_p_value(failures: int, n: int, beta: float) -> float:
    """Exact p-value for H0: risk > β from F failures in n trials, P(Bin(n, β) ≤ F). n = 0 gives 1."""
    failures, n = _trials(failures, n)
    beta = check_level(beta, "beta")
    if n == 0:
        return 1.0
    return min(1.0, math.exp(_log_binom_cdf(int(failures), int(n), beta)))


def hoeffding_bentkus_p_value(failures: int, n: int, beta: float) -> float:
    """Hoeffding–Bentkus p-value for H0: risk > β (Bates et al. 2021): min(Hoeffding, e·binomial tail)."""
    failures, n = _trials(failures, n)
    beta = check_level(beta, "beta")
    if n == 0:
        return 1.0
    r = failures / n
    a = min(r, beta)
    h1 = (a * math.log(a / beta) if a > 0 else 0.0) + (1 - a) * math.log((1 - a) / (1 - beta))
    hoeffding = math.exp(-n * h1)
    bentkus = math.e * math.exp(_log_binom_cdf(math.ceil(n * r - 1e-12), n, beta))
    return min(1.0, hoeffding, bentkus)


P_VALUES = {"binomial": binomial_p_value, "hoeffding_bentkus": hoeffding_bentkus_p_value}


def fixed_sequence_test(p_values, delta: float) -> int:
    """Fixed-sequence testing: reject nulls in the given order while p ≤ δ; stop at the first p > δ.

    p_values: sequence in test order (strictest threshold first). Returns how many were rejected (declared
    safe), i.e. the index of the first failure. Controls the family-wise error rate at δ.
    """
    delta = check_level(delta, "delta")
    if isinstance(p_values, (str, bytes)) or not hasattr(p_values, "__iter__"):
        raise ValueError(f"p_values must be a sequence of p-values, got {type(p_values).__name__}")
    p_values = list(p_values)
    for k, p in enumerate(p_values):
        if isinstance(p, (bool, str)) or not isinstance(p, numbers.Real) or not (math.isnan(p) or 0 <= p <= 1):
            raise ValueError(f"p_values[{k}] must be a number in [0, 1] (NaN: not tested, ends the sequence), "
                             f"got {p!r:.40}")
    for k, p in enumerate(p_values):
        if not p <= delta:
            return k
    return len(p_values)


@dataclass
class ThresholdSelection:
    """Outcome of the Learn-then-Test threshold choice.

    tau: the selected threshold (math.inf when none passed: every group is rejected).
    index: its position in the grid (None when none passed).
    tested: grid positions actually tested, in order; p_values, n_accepted, n_reversed aligned with the grid
    (p NaN where not tested); empirical_risk: reversals / accepted at τ_sel (NaN if none).
    """

    tau: float
    index: int | None
    grid: list[float]
    p_values: list[float]
    n_accepted: list[int]
    n_reversed: list[int]
    tested: list[int]
    empirical_risk: float = math.nan


def min_accepted_to_certify(beta: float, delta: float) -> int:
    """Fewest accepted groups at which even zero reversals give a binomial p ≤ δ: ⌈log δ / log(1−β)⌉."""
    check_level(beta, "beta")
    check_level(delta, "delta")
    return math.ceil(math.log(delta) / math.log1p(-beta) - 1e-12)


def ltt_select_threshold(accepted, reversed_, grid, *, beta: float = 0.08, delta: float = 0.1,
                         p_value: str = "binomial", start: int = 0) -> ThresholdSelection:
    """Choose τ by fixed-sequence Learn-then-Test on risk-calibration groups.

    accepted, reversed_: (n, T) bool, per calibration group and grid threshold (reversed counts only where
    accepted); grid: (T,) thresholds ordered strictest first (descending). Testing begins at grid position
    ``start`` and stops at the first p > δ; the selected τ is the last one that passed (math.inf if none).
    ``start`` must not depend on these risk groups (``SetGRPO.calibrate`` sets it from the disjoint coverage
    groups), so the order stays fixed in advance and fixed-sequence testing keeps its FWER ≤ δ guarantee.
    """
    check_level(beta, "beta")
    check_level(delta, "delta")
    if not isinstance(p_value, str) or p_value not in P_VALUES:
        raise ValueError(f"unknown p_value {p_value!r:.40}; choose one of {sorted(P_VALUES)}")
    if isinstance(grid, (str, bytes)) or not hasattr(grid, "__iter__"):
        raise ValueError(f"grid must be a sequence of thresholds, got {type(grid).__name__}")
    grid = [check_real(x, f"grid[{k}]") for k, x in enumerate(grid)]
    if not grid:
        raise ValueError("the threshold grid is empty")
    if any(b > a for a, b in zip(grid, grid[1:])):
        raise ValueError("the threshold grid must be ordered strictest first (descending)")
    start = check_int(start, "start", minimum=0)
    if not start < len(grid):
        raise ValueError(f"start must index the grid (0..{len(grid) - 1}), got {start}")
    acc = as_bool_rows(accepted, name="accepted")  # 0/1 or 0.5 would be read as truthy: booleans only
    rev = as_bool_rows(reversed_, name="reversed_")
    if acc.shape != rev.shape or acc.ndim != 2 or acc.shape[1] != len(grid):
        raise ValueError(f"accepted and reversed_ must both be (n, {len(grid)}); got {tuple(acc.shape)} and "
                         f"{tuple(rev.shape)}")
    n_acc = acc.sum(0).tolist()
    n_rev = (rev & acc).sum(0).tolist()
    pfun = P_VALUES[p_value]
    p_values = [math.nan] * len(grid)
    # p-values are cheap: compute them all from `start`, then let the fixed sequence say how far it got.
    for k in range(start, len(grid)):
        p_values[k] = pfun(n_rev[k], n_acc[k], beta)
    passed = fixed_sequence_test(p_values[start:], delta)
    tested = list(range(start, min(start + passed + 1, len(grid))))  # the passes and the first failure
    p_values = [p if k in tested else math.nan for k, p in enumerate(p_values)]
    selected = start + passed - 1 if passed > 0 else None
    tau = grid[selected] if selected is not None else math.inf
    risk = n_rev[selected] / n_acc[selected] if selected is not None else math.nan
    return ThresholdSelection(tau, selected, grid, p_values, n_acc, n_rev, tested, risk)
