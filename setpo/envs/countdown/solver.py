"""Countdown solver and instance generator: every distinct solution, reachable targets, seeded splits."""

from __future__ import annotations

import operator
from dataclasses import dataclass
from fractions import Fraction
from typing import Iterable, Sequence

import numpy as np

from setpo.envs._checks import whole_number
from setpo.envs.countdown.canonical import (UNSET, canonical_difference, canonical_leaf, canonical_product,
                                      canonical_quotient, canonical_sum)
from setpo.envs.countdown.verifier import TOLERANCE, check_instance, make_prompt, score_answer

#: Most numbers an instance may have for ``solve`` and ``generate_instances``: the search is exponential.
MAX_NUMBERS = 6

# --------------------------------------------------------------------------------------------------
# Solver
# --------------------------------------------------------------------------------------------------


def solve(numbers: Sequence[int], target, limit: int | None = None) -> list[str]:
    """All distinct solutions of an instance, as canonical strings (each scores 1.0 as an answer).

    Enumerates every expression tree that uses each number once, by repeatedly replacing two pool
    entries with their sum, either difference, product or either quotient (skipping division by zero),
    with exact ``Fraction`` values; pools already seen (same multiset of canonical subexpressions) are not
    expanded twice. Distinct means distinct canonical form (``setpo.envs.countdown.canonical``: equal up to
    commutativity, associativity and moving signs and inverses around, so ``3-(2-5)*7`` and
    ``(5-2)*7+3`` are one solution). Solutions are returned in sorted order; with ``limit`` the search
    stops once that many have been found (which ones is then deterministic but not the sorted prefix).
    Four numbers take a few tens of milliseconds.
    """
    numbers, target = check_instance(numbers, target)
    if len(numbers) > MAX_NUMBERS:  # the search is exponential in the count: 5 numbers take a second, 8 never end
        raise ValueError(f"solve takes at most {MAX_NUMBERS} numbers (the search is exponential), got {len(numbers)}")
    if limit is not None:  # whole_number: int() of NaN or infinity failed with Python's own message
        limit = whole_number(limit, "limit", 1)
    found: dict[str, None] = {}
    seen: set[tuple[str, ...]] = set()
    pool = tuple(sorted(((Fraction(v), canonical_leaf(v)) for v in numbers), key=lambda p: p[1].text))

    def full() -> bool:
        return limit is not None and len(found) >= limit

    def search(pool) -> None:
        if len(pool) == 1:
            value, node = pool[0]
            if abs(value - target) <= TOLERANCE:
                found.setdefault(node.text)
            return
        key = tuple(node.text for _, node in pool)
        if key in seen:
            return
        seen.add(key)
        for (a, x), (b, y), rest in _pick_two(pool):
            combos = [(a + b, canonical_sum(x, y)), (a - b, canonical_difference(x, y)),
                      (b - a, canonical_difference(y, x)), (a * b, canonical_product(x, y))]
            if b != 0:
                combos.append((a / b, canonical_quotient(x, y)))
            if a != 0:
                combos.append((b / a, canonical_quotient(y, x)))
            for item in combos:
                if item[1]._value is UNSET:  # the canonical node's value is known: spare recomputing it
                    item[1]._value = item[0]
                search(tuple(sorted(rest + (item,), key=lambda p: p[1].text)))
                if full():
                    return

    search(pool)
    return list(found) if limit is not None else sorted(found)


def _pick_two(pool: tuple):
    """Every unordered pair of a pool's items, with the rest of the pool: the step of both searches."""
    for i in range(len(pool)):
        for j in range(i + 1, len(pool)):
            yield pool[i], pool[j], pool[:i] + pool[i + 1 : j] + pool[j + 1 :]


def _reachable_integers(numbers: Sequence[int], lo: int, hi: int) -> set[int]:
    """Integer values in [lo, hi] that some expression using each number once evaluates to."""
    out: set[int] = set()
    seen: set[tuple[Fraction, ...]] = set()

    def search(pool: tuple[Fraction, ...]) -> None:
        if len(pool) == 1:
            v = pool[0]
            if v.denominator == 1 and lo <= v <= hi:
                out.add(int(v))
            return
        if pool in seen:
            return
        seen.add(pool)
        for a, b, rest in _pick_two(pool):
            vals = {a + b, a - b, b - a, a * b}
            if b != 0:
                vals.add(a / b)
            if a != 0:
                vals.add(b / a)
            for v in vals:
                search(tuple(sorted(rest + (v,))))

    search(tuple(sorted(Fraction(v) for v in numbers)))
    return out


def _random_expression_target(numbers, rng, lo: int, hi: int, usable, tries: int = 64) -> int | None:
    """The integer value in [lo, hi] of a random expression over numbers that ``usable`` accepts, or None."""
    for _ in range(tries):
        pool = [Fraction(v) for v in numbers]
        while len(pool) > 1:
            i, j = (int(v) for v in rng.choice(len(pool), size=2, replace=False))
            a, b = pool[i], pool[j]
            op = int(rng.integers(4))  # the pair is ordered, so a-b and b-a, a/b and b/a are all drawn
            pool = [v for k, v in enumerate(pool) if k not in (i, j)]
            pool.append((a + b, a - b, a * b, a / b if b else a * b)[op])  # x/0 falls back to x*0
        v = pool[0]
        if v.denominator == 1 and lo <= v <= hi and usable(int(v)):
            return int(v)
    return None


# --------------------------------------------------------------------------------------------------
# Instances and splits
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CountdownInstance:
    """One Countdown problem: reach ``target`` using each of ``numbers`` exactly once.

    numbers: the integers in the order the prompt shows them. target: an integer.
    Two instances with the same numbers in a different order are the same problem (``key``).
    """

    numbers: tuple[int, ...]
    target: int

    @property
    def key(self) -> tuple[tuple[int, ...], int]:
        """Order-free identity, used to keep splits disjoint."""
        return tuple(sorted(self.numbers)), self.target

    def prompt(self, chat: bool = False) -> str | list[dict]:
        return make_prompt(self.numbers, self.target, chat=chat)

    def score(self, text: str) -> float:
        return score_answer(text, self.numbers, self.target)


def _check_range(name: str, rng) -> tuple[int, int]:
    try:
        lo, hi = (operator.index(v) for v in rng)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a pair of integers (low, high), got {rng!r}") from None
    if lo > hi:
        raise ValueError(f"{name} must have low <= high, got {rng!r}")
    return lo, hi


def generate_instances(
    n: int,
    seed: int,
    num_numbers: int | Sequence[int] = (3, 4),
    number_range: tuple[int, int] = (1, 100),
    target_range: tuple[int, int] = (1, 100),
    exclude: Iterable[CountdownInstance] = (),
    target_sampling: str = "expression",
) -> list[CountdownInstance]:
    """n distinct, solvable Countdown instances, the same list for the same arguments.

    Each instance draws its count of numbers uniformly from ``num_numbers`` and the numbers uniformly
    (with replacement) from ``number_range`` (inclusive); then the target, in ``target_range``
    (inclusive), by ``target_sampling``:

    - ``"expression"`` (default): the value of a random expression over the numbers (combine two random
      pool entries with a random one of + - * / until one is left; retried until the value is an integer
      in range). Every instance is solvable by construction, and targets that many expressions reach are
      favoured, so problems with several distinct solutions are common, which the diversity metrics need
      (the Stream-of-Search style of generator; the public data's exact generator is not documented).
    - ``"reachable"``: uniform among all integers in range that the numbers can reach (exhaustive
      search, ~5 ms for 4 numbers): harder problems, most with a single solution.

    Numbers that give no usable target are redrawn. Instances are distinct by ``CountdownInstance.key``
    and none has the key of an instance in ``exclude``. Defaults follow the scale of the public
    Countdown-Tasks-3to4 data (numbers and targets up to 100). numpy's PCG64 seeded with ``seed``.
    """
    n = whole_number(n, "n", 0)
    seed = whole_number(seed, "seed", 0)
    if isinstance(num_numbers, (str, bytes, dict)):
        raise ValueError(f"num_numbers must be a positive integer or a sequence of them, got {num_numbers!r:.80}")
    counts = tuple(num_numbers) if isinstance(num_numbers, Iterable) else (num_numbers,)
    if not counts:
        raise ValueError("num_numbers must be a positive integer or a non-empty sequence of them, got ()")
    counts = tuple(whole_number(c, "num_numbers", 1) for c in counts)
    if max(counts) > MAX_NUMBERS:
        raise ValueError(f"at most {MAX_NUMBERS} numbers per instance (the solver is exponential), got {num_numbers!r}")
    nlo, nhi = _check_range("number_range", number_range)
    tlo, thi = _check_range("target_range", target_range)
    if nlo < 0:
        raise ValueError(f"number_range must be non-negative, got {number_range!r}")
    if nhi >= 2**63 - 1:  # numpy draws int64: a larger bound was its "high is out of bounds", naming nothing
        raise ValueError(f"number_range must stay below 2**63 - 1, got {number_range!r:.80}")
    if target_sampling not in ("expression", "reachable"):
        raise ValueError(f"target_sampling must be 'expression' or 'reachable', got {target_sampling!r}")
    if isinstance(exclude, (str, bytes)) or not isinstance(exclude, Iterable):
        raise ValueError(f"exclude must be a sequence of CountdownInstance, got {type(exclude).__name__}")
    exclude = list(exclude)
    if not all(isinstance(inst, CountdownInstance) for inst in exclude):
        bad = next(inst for inst in exclude if not isinstance(inst, CountdownInstance))
        raise ValueError(f"exclude must hold CountdownInstance objects, got a {type(bad).__name__}")
    rng = np.random.default_rng(seed)
    taken = {inst.key for inst in exclude}
    out: list[CountdownInstance] = []
    misses = 0
    while len(out) < n:
        k = int(counts[rng.integers(len(counts))])
        numbers = tuple(int(v) for v in rng.integers(nlo, nhi + 1, size=k))
        key = tuple(sorted(numbers))
        if target_sampling == "expression":
            target = _random_expression_target(numbers, rng, tlo, thi, lambda t: (key, t) not in taken)  # noqa: B023 (called here)
            candidates = [] if target is None else [target]
        else:
            reachable = sorted(_reachable_integers(numbers, tlo, thi))
            candidates = [t for t in reachable if (key, t) not in taken]
        if not candidates:
            misses += 1
            if misses > 1000 + 100 * n:
                raise ValueError(
                    f"could not find {n} distinct solvable instances with num_numbers={num_numbers}, "
                    f"number_range={number_range}, target_range={target_range}; widen the ranges"
                )
            continue
        inst = CountdownInstance(numbers, candidates[int(rng.integers(len(candidates)))])
        taken.add(inst.key)
        out.append(inst)
    return out


def make_splits(
    n_train: int, n_test: int, seed: int, **kwargs
) -> tuple[list[CountdownInstance], list[CountdownInstance]]:
    """Train and test instances that share no problem (by ``CountdownInstance.key``).

    Drawn as one list of n_train + n_test distinct instances, the first n_train for training, so the two
    come from the same distribution. kwargs go to ``generate_instances``.
    """
    n_train, n_test = whole_number(n_train, "n_train", 0), whole_number(n_test, "n_test", 0)
    both = generate_instances(n_train + n_test, seed, **kwargs)
    return both[:n_train], both[n_train:]
