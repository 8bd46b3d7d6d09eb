"""Evaluation metrics: unbiased pass@k and, for the environments, diversity of what a policy samples."""

from __future__ import annotations

import math
import numbers
from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch

from setpo.diversity import as_embeddings, group_kernels, pair_mask
from setpo.groups import Groups, check_int, check_real


#: Above this many factors the exact integer form gives way to a vectorised sum of logs.
_EXACT_PASS_AT_K_TERMS = 4096
#: Largest n pass_at_k takes (2**63 - 1, int64's largest): the log form converts n to float64, which raised an
#: OverflowError above ~1.8e308, and the exact form's C(n, m) grows with m·log(n) digits (n = 10**3000 ran for
#: minutes).
MAX_PASS_AT_K_N = 2**63 - 1


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021, "Codex").

    pass@k = 1 - C(n-c, k) / C(n, k). The ratio equals C(n-m', m) / C(n, m) with m = min(c, k) and
    m' = max(c, k), a product of m factors, so the cost is O(min(c, k)), never O(n):
    - m <= 4096: exact integers, one correctly rounded division (any n, e.g. n = 10**18).
    - larger m: -expm1(Σ_{i<m} log1p(-m'/(n-i))) in float64 with numpy (relative error ~1e-13), after a
      bound that returns 1.0 at once when the ratio is below float64 resolution.
    n, c, k: integers (integer-valued floats are accepted), n >= 1, 0 <= c <= n, 1 <= k <= n.
    """
    n, c, k = check_int(n, "n"), check_int(c, "c"), check_int(k, "k")
    if n < 1 or not 0 <= c <= n:
        raise ValueError(f"need n >= 1 and 0 <= c <= n, got n={n}, c={c}")
    if n > MAX_PASS_AT_K_N:
        raise ValueError(f"n must be at most 2**63 - 1 samples, got an integer of {n.bit_length()} bits")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    m, big = min(c, k), max(c, k)
    if m == 0:
        return 0.0
    if m <= _EXACT_PASS_AT_K_TERMS:
        total = math.comb(n, m)
        return (total - math.comb(n - big, m)) / total  # int / int is correctly rounded in Python
    # ratio <= (1 - big/n)^m; below 2^-60 the answer rounds to 1.0
    if m * math.log1p(-big / n) < -60 * math.log(2):
        return 1.0
    log_ratio = 0.0
    for lo in range(0, m, 1 << 20):  # chunks keep memory bounded for huge m
        i = np.arange(lo, min(m, lo + (1 << 20)), dtype=np.float64)
        log_ratio += float(np.log1p(-big / (n - i)).sum())
    return float(-math.expm1(log_ratio))


# ----------------------------------------------------------------------------------------------------
# Diversity metrics for the environments (SetPO, arXiv 2602.01062: Figure 1 and Table 3)
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModeCoverage:
    """Which correct modes a policy's samples cover.

    covered: the correct modes holding at least ``threshold`` of the sampled mass, sorted.
    count: ``len(covered)``.
    masses: every correct mode's share of the total sampled mass (0.0 when never sampled), by mode id.
    correct_mass: the share of the mass on correct modes (the policy's accuracy).
    threshold: the threshold used.
    """

    covered: tuple
    count: int
    masses: dict
    correct_mass: float
    threshold: float


def mode_coverage(modes, correct_modes, threshold: float = 0.05, weights=None) -> ModeCoverage:
    """Mode coverage: the correct modes that hold at least ``threshold`` of the sampled mass.

    modes: (N,) mode id of each sample (ints, or any hashable ids in a list), e.g. the bandit mode of
        each sampled trajectory for one prompt.
    correct_modes: the rewarded mode ids (the paper's toy: the first 4 of 12).
    threshold: share of the *total* sampled mass (correct and incorrect samples alike) a correct mode
        needs to count as covered; the paper's figure uses 5%. In (0, 1].
    weights: optional (N,) non-negative weight per sample (default 1 each), e.g. exact probabilities with
        ``modes = range(M)``, to measure a policy's distribution without sampling noise.
    A mode is covered when ``mass >= threshold`` (up to 1e-12 of rounding).
    """
    ids = _hashable_ids(modes, "modes")
    if not ids:
        raise ValueError("modes is empty: mode coverage needs at least one sample")
    correct = list(dict.fromkeys(_hashable_ids(correct_modes, "correct_modes")))
    if not correct:
        raise ValueError("correct_modes is empty")
    threshold = check_real(threshold, "threshold")
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    if weights is None:
        w = [1.0] * len(ids)
    else:
        w = _as_id_list(weights, "weights")
        # float() took the string "1.5" as a weight, and None or a complex number failed inside it
        bad = [x for x in w if not isinstance(x, numbers.Real)]
        if bad:
            raise ValueError(f"weights must be real numbers, got {type(bad[0]).__name__} {bad[0]!r:.40}")
        w = [float(x) for x in w]
        if len(w) != len(ids):
            raise ValueError(f"weights has length {len(w)} but modes has {len(ids)}")
        if not all(math.isfinite(x) and x >= 0 for x in w):
            raise ValueError("weights must be finite and non-negative")
    try:
        total = math.fsum(w)
    except OverflowError:  # finite weights whose sum is not (1e308 + 1e308)
        raise ValueError("weights sum beyond the float range; rescale them (only their ratios matter)") from None
    if total <= 0:
        raise ValueError("weights sum to zero: no sampled mass")
    per_mode: dict = {}
    for m, x in zip(ids, w):
        per_mode[m] = per_mode.get(m, 0.0) + x
    masses = {m: per_mode.get(m, 0.0) / total for m in correct}
    covered = tuple(sorted((m for m in correct if masses[m] >= threshold - 1e-12), key=_sort_key))
    return ModeCoverage(covered, len(covered), masses, math.fsum(masses.values()), threshold)


def _sort_key(x):
    return (0, x, "") if isinstance(x, (int, float)) else (1, 0, str(x))


def _as_id_list(x, name: str) -> list:
    if isinstance(x, (str, bytes)):
        raise ValueError(f"{name} must be a sequence, got a string")
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        if x.ndim != 1:
            raise ValueError(f"{name} must be one-dimensional, got shape {tuple(x.shape)}")
        return x.tolist()
    if isinstance(x, np.ndarray):
        if x.ndim != 1:
            raise ValueError(f"{name} must be one-dimensional, got shape {x.shape}")
        return x.tolist()
    try:
        return list(x)
    except TypeError:
        raise ValueError(f"{name} must be a sequence, got {type(x).__name__}") from None


def _hashable_ids(x, name: str) -> list:
    """``_as_id_list`` of mode ids, each hashable (a list id failed in a dict as "unhashable type")."""
    ids = _as_id_list(x, name)
    for i, v in enumerate(ids):
        try:
            hash(v)
        except TypeError:
            raise ValueError(f"{name} must hold hashable ids (ints, strings); entry {i} is a "
                             f"{type(v).__name__} {v!r:.40}") from None
    return ids


#: Largest per-problem count of distinct solutions: the average of larger ones can overflow a float.
_MAX_DISTINCT_COUNT = 2**53


def diversity_width_and_average_modes(
    per_problem_distinct_counts, min_distinct: int = 2, over: str = "solved"
) -> tuple[int, float]:
    """The paper's Table 3 diversity numbers from each problem's count of distinct correct solutions.

    per_problem_distinct_counts: (P,) non-negative integers, one per evaluation problem (e.g.
        ``len(distinct_correct_solutions(...))`` over the n samples drawn for it; 0 when none is correct).
    Returns (width, average_modes):
        width: how many problems have at least ``min_distinct`` (2) distinct correct solutions
            ("diversity width").
        average_modes: the mean number of distinct correct solutions ("average mode"), over the solved
            problems (at least one correct solution) by default, so that it measures diversity where the
            policy succeeds rather than mixing in accuracy; ``over="all"`` averages over all P problems.
            0.0 when there is nothing to average over. The paper does not say which; its values (2.1 to
            3.5 next to widths of 321 to 415) are consistent with averaging over solved problems.
    """
    counts = _as_id_list(per_problem_distinct_counts, "per_problem_distinct_counts")
    for c in counts:
        whole = isinstance(c, (int, np.integer)) or (isinstance(c, float) and c.is_integer())
        if isinstance(c, bool) or not whole or c < 0:
            raise ValueError(f"per_problem_distinct_counts must be non-negative integers, got {c!r}")
        if c > _MAX_DISTINCT_COUNT:  # 10**400 made the average an OverflowError
            raise ValueError("per_problem_distinct_counts must be at most 2**53 (a count of samples), got a larger one")
    counts = [int(c) for c in counts]
    # check_int: int() of NaN, infinity or None failed with Python's own message, naming nothing
    min_distinct = check_int(min_distinct, "min_distinct", minimum=1)
    if over not in ("solved", "all"):
        raise ValueError(f"over must be 'solved' or 'all', got {over!r}")
    width = sum(c >= min_distinct for c in counts)
    pool = [c for c in counts if c > 0] if over == "solved" else counts
    return width, (sum(pool) / len(pool) if pool else 0.0)


def _answer_counts(answers, name: str = "answers") -> Counter:
    """How often each answer occurs; ``None`` entries (a sample without a readable answer) are left out."""
    return Counter(a for a in _hashable_ids(answers, name) if a is not None)


def answer_entropy(answers) -> float:
    """Shannon entropy, in nats, of the answers' empirical distribution: 0.0 when every answer is the same (or
    there is none), log(m) for m equally frequent answers.

    answers: (N,) one prompt's parsed answers (hashable: ints, strings), ``None`` for a sample without one (left
        out).
    """
    return _entropy(_answer_counts(answers))


def _entropy(counts: Counter) -> float:
    total = sum(counts.values())
    return -sum(c / total * math.log(c / total) for c in counts.values()) if total else 0.0


def hill_number(answers) -> float | None:
    """The effective number of distinct answers: exp(``answer_entropy``), the Hill number of order 1, i.e. how
    many equally frequent answers would have the same entropy (1.0 for one answer however often, m for m equally
    frequent ones; fewer than the raw count when some answers are rare). None without an answer.

    answers: as in ``answer_entropy``.
    """
    counts = _answer_counts(answers)  # counted once: the entropy and whether there is any answer
    return math.exp(_entropy(counts)) if counts else None


def rarefied_distinct(answers, r: int) -> float | None:
    """The expected number of distinct answers among ``r`` of the answers drawn without replacement (rarefaction):
    Σ_a 1 − C(R − c_a, r) / C(R, r) over the distinct answers a, each given c_a times, R in all: each ratio from
    exact integers, correctly rounded (for r above 4096, each term is ``pass_at_k(R, c_a, r)``, whose cost does not
    grow with R). None when there are fewer than ``r`` answers.

    Unlike the raw count of distinct answers, it does not grow with how many answers there are: compare two
    policies' right answers at the same ``r``, and the one that is right more often no longer counts more
    distinct ones for that alone.
    answers: as in ``answer_entropy`` (``None`` left out); r: an integer >= 1.
    """
    r = check_int(r, "r", minimum=1)
    counts = _answer_counts(answers)
    total = sum(counts.values())
    if total < r:
        return None
    if r > _EXACT_PASS_AT_K_TERMS:
        return sum(pass_at_k(total, c, r) for c in counts.values())
    every = math.comb(total, r)
    missing = {c: math.comb(total - c, r) for c in set(counts.values())}  # draws without answer a, by its count
    return sum(1.0 - missing[c] / every for c in counts.values())


def mean_pairwise_similarity(emb, index=None, *, group_size: int | None = None, reduce: bool = True):
    """Mean pairwise similarity of responses within each group, averaged over groups.

    emb: (N, d) response embeddings (torch or numpy). index / group_size: groups as in
        ``setpo.diversity_marginals`` (verl-style ids, or contiguous blocks; neither: one group).
    The similarity is SetPO's kernel, ``setpo.cosine_kernel`` (cosine clamped to [0, 1], so opposite
    directions count as 0, not -1). For each group, the mean over ordered pairs i != j of k(e_i, e_j);
    lower is more diverse. Every group needs at least 2 rows.
    Returns a float, the unweighted mean over groups (reduce=True), or the (B,) per-group means in order
    of each group's first row (reduce=False).
    """
    e = as_embeddings(emb)
    groups = Groups.build(e.shape[0], index, group_size, device=e.device)
    groups.require_min_size(2, "mean pairwise similarity")
    k = group_kernels(e, groups)  # (B, G, G); padded slots repeat a real row and are masked below
    keep = pair_mask(groups.valid(), k.shape[-1], k.device)
    n = groups.sizes.to(k.dtype)
    per_group = (k * keep).sum((-1, -2)) / (n * (n - 1))
    return float(per_group.mean()) if reduce else per_group
