"""Countdown: reach a target with 3-4 numbers and + - * /, as in the public TinyZero convention.

An instance is a few integers and a target; an answer is an arithmetic expression inside
``<answer>…</answer>`` that uses every number exactly once with ``+ - * /`` and parentheses. The reward
(``score_answer``) is 1.0 for a correct answer, 0.1 for a well-formed answer that is wrong or breaks the
rules, and 0.0 for no answer, the rule reward plus format reward that SetPO (arXiv 2602.01062) trains with.

Safety: the public reference scores answers with Python ``eval`` after a regex, which admits ``**`` and
hangs on ``9**9**9``. Here model text is never executed: an answer is length- and depth-capped, checked
against a character whitelist, parsed with ``ast`` and evaluated by a walk that accepts only integer
literals, the four binary operators and unary minus, in exact ``Fraction`` arithmetic. Every input is
scored in bounded time and memory.

Canonical form (what "distinct solutions" means, for the solver and the diversity metrics):
expressions are equal up to commutativity and associativity of + and *, with - and / folded in by
treating a sum as a multiset of signed terms and a product as a multiset of factors with exponents ±1:

- ``a+b == b+a``, ``(a+b)+c == a+(b+c)``, likewise for ``*``;
- ``a-(b-c) == a-b+c == a+c-b`` and ``a/(b/c) == a*c/b`` (a subtraction flips the signs of a sum's
  terms, a division inverts a product's factors);
- a unary minus is a sign: ``-a+b == b-a``, and a sign is pulled out of a factor that is a single
  negated term or a sum of only negated terms: ``(-a)*b == -(a*b)``, ``(-a-b)*c == -((a+b)*c)``;
- nothing else: no distributivity (``a*(b+c) != a*b+a*c``, and they use different numbers anyway), no
  cancellation (``a-a`` keeps both terms), and no choice of orientation for a factor that is a mixed
  sum: ``d-(b-a)*c`` and ``d+(a-b)*c`` are two solutions. Equal numbers are interchangeable.

The canonical string lists a sum's positive terms first, then its negative ones, and a product's
numerator factors first, then its denominators, each group sorted by text, with no spaces and only the
parentheses a factor that is a sum needs. It parses back to itself and scores 1.0 when the expression
does (a solver solution is a valid answer).

Rules that follow TinyZero's scorer: intermediate values may be negative or fractional (only the final
value is compared with the target, within 1e-5); the answer is the expression alone (``… = 98`` breaks
the rules). Rules that are stricter, because the reference's regex is loose: ASCII digits only (Unicode
digits and decimal points like ``1.5`` break the rules), integer literals only, no ``**``, no unary
plus. ``score_answer`` takes the completion alone; it does not look for the prompt inside the text.
"""

from __future__ import annotations

import ast
import operator
import string
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from typing import Iterable, Sequence

import gymnasium as gym
import numpy as np

from setpo.completions import completion_text

__all__ = [
    "CORRECT_REWARD",
    "FORMAT_REWARD",
    "CountdownEnv",
    "CountdownInstance",
    "canonical_form",
    "correct_canonical_form",
    "export_parquet",
    "extract_answer",
    "generate_instances",
    "load_countdown_tasks",
    "make_prompt",
    "make_splits",
    "score_answer",
    "solve",
    "trl_reward",
    "verl_compute_score",
]

CORRECT_REWARD = 1.0
FORMAT_REWARD = 0.1
NO_ANSWER_REWARD = 0.0

# Limits on an answer before it is parsed. A real answer with 4 two-digit numbers is under 40 characters;
# the caps leave ample room and keep ast.parse and the tree walk far from Python's recursion limit.
MAX_ANSWER_CHARS = 256
MAX_PAREN_DEPTH = 16
TOLERANCE = Fraction(1, 100_000)
_ALLOWED_CHARS = frozenset("0123456789+-*/() \t\n\r")
_OPEN, _CLOSE = "<answer>", "</answer>"


# --------------------------------------------------------------------------------------------------
# Canonical expressions
# --------------------------------------------------------------------------------------------------


class _Expr:
    """A canonical expression node; ``text`` is its canonical string, the identity used everywhere.

    kind "n": items is the integer. kind "+": items is a tuple of (sign, node), sign ±1, nodes not sums,
    sorted positives first, then by text. kind "*": items is a tuple of (exponent, node), exponent ±1,
    nodes not products, sorted numerators first, then by text. A "+" node with one term is a negation.
    """

    __slots__ = ("kind", "items", "text")

    def __init__(self, kind: str, items, text: str):
        self.kind, self.items, self.text = kind, items, text

    def __repr__(self) -> str:
        return f"_Expr({self.text!r})"


def _leaf(value: int) -> _Expr:
    return _Expr("n", value, str(value))


def _terms(x: _Expr) -> tuple:
    return x.items if x.kind == "+" else ((1, x),)


def _make_sum(terms) -> _Expr:
    if len(terms) == 1 and terms[0][0] == 1:
        return terms[0][1]
    items = tuple(sorted(terms, key=lambda t: (-t[0], t[1].text)))
    text = "".join(
        ("-" if s < 0 else ("+" if i else "")) + node.text for i, (s, node) in enumerate(items)
    )
    return _Expr("+", items, text)


def _negate(x: _Expr) -> _Expr:
    return _make_sum(tuple((-s, node) for s, node in _terms(x)))


def _add(x: _Expr, y: _Expr) -> _Expr:
    return _make_sum(_terms(x) + _terms(y))


def _sub(x: _Expr, y: _Expr) -> _Expr:
    return _make_sum(_terms(x) + tuple((-s, node) for s, node in _terms(y)))


def _factors(x: _Expr) -> tuple[int, tuple]:
    """(sign, factors) of x as a factor of a product, pulling out the signs the canonical form pulls."""
    if x.kind == "*":
        return 1, x.items
    if x.kind == "+" and all(s < 0 for s, _ in x.items):
        inner = _negate(x)  # -t for one term, or the all-positive sum
        return -1, (inner.items if inner.kind == "*" else ((1, inner),))
    return 1, ((1, x),)


def _make_product(sign: int, factors) -> _Expr:
    if len(factors) == 1 and factors[0][0] == 1:
        node = factors[0][1]
    else:
        items = tuple(sorted(factors, key=lambda f: (-f[0], f[1].text)))
        parts = []
        for i, (e, f) in enumerate(items):
            piece = f.text if f.kind == "n" else f"({f.text})"
            parts.append(piece if i == 0 else ("*" if e > 0 else "/") + piece)
        node = _Expr("*", items, "".join(parts))
    return node if sign > 0 else _negate(node)


def _mul(x: _Expr, y: _Expr) -> _Expr:
    sx, fx = _factors(x)
    sy, fy = _factors(y)
    return _make_product(sx * sy, fx + fy)


def _div(x: _Expr, y: _Expr) -> _Expr:
    sx, fx = _factors(x)
    sy, fy = _factors(y)
    return _make_product(sx * sy, fx + tuple((-e, f) for e, f in fy))


_CANON_OPS = {"+": _add, "-": _sub, "*": _mul, "/": _div}
_VALUE_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}
_AST_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


# --------------------------------------------------------------------------------------------------
# Safe parsing of untrusted answer text
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Parsed:
    literals: tuple[int, ...]  # the integers the expression uses, in reading order
    canon: _Expr
    value: Fraction | None  # None when the expression divides by zero


def _parse(expr: str) -> _Parsed | None:
    """Parse an answer expression; None when it is not an allowed Countdown expression.

    Cheap checks first (type, length, characters, parenthesis depth) so that ``ast.parse`` only ever sees
    short inputs of digits, operators and parentheses; the parser's own failures are caught as well.
    """
    if not isinstance(expr, str) or len(expr) > MAX_ANSWER_CHARS:
        return None
    if not _ALLOWED_CHARS.issuperset(expr):
        return None
    depth = 0
    for ch in expr:
        if ch == "(":
            depth += 1
            if depth > MAX_PAREN_DEPTH:
                return None
        elif ch == ")":
            depth -= 1
    expr = " ".join(expr.split())  # newlines inside an eval-mode expression are a syntax error
    if not expr:
        return None
    try:
        tree = ast.parse(expr, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    literals: list[int] = []
    try:
        canon, value = _walk(tree.body, literals)
    except _Refused:
        return None
    return _Parsed(tuple(literals), canon, value)


class _Refused(Exception):
    """An AST node outside the Countdown grammar."""


def _walk(node: ast.AST, literals: list[int]) -> tuple[_Expr, Fraction | None]:
    """(canonical node, exact value or None after a division by zero) of an allowed AST."""
    if isinstance(node, ast.Constant):
        if type(node.value) is not int:  # floats, complex, strings, bools, Ellipsis, None
            raise _Refused
        literals.append(node.value)
        return _leaf(node.value), Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        canon, value = _walk(node.operand, literals)
        return _negate(canon), (None if value is None else -value)
    if isinstance(node, ast.BinOp) and type(node.op) in _AST_OPS:
        op = _AST_OPS[type(node.op)]
        left, lv = _walk(node.left, literals)
        right, rv = _walk(node.right, literals)
        if lv is None or rv is None or (op == "/" and rv == 0):
            value = None
        else:
            value = _VALUE_OPS[op](lv, rv)
        return _CANON_OPS[op](left, right), value
    raise _Refused


def canonical_form(expr: str) -> str | None:
    """Canonical string of a Countdown expression (see the module docstring), or None.

    None when ``expr`` is not an allowed expression: not a string, over ``MAX_ANSWER_CHARS`` characters,
    deeper than ``MAX_PAREN_DEPTH`` parentheses, any character besides ASCII digits, ``+ - * / ( )`` and
    whitespace, or not parsable into integer literals, binary ``+ - * /`` and unary minus. The numbers
    and the value are not checked (a division by zero still has a canonical form).
    """
    parsed = _parse(expr)
    return None if parsed is None else parsed.canon.text


# --------------------------------------------------------------------------------------------------
# Prompt, answer extraction, reward
# --------------------------------------------------------------------------------------------------

_SYSTEM = (
    "You are a helpful assistant. You first think about the reasoning process privately and then give "
    "the user the answer."
)


def _user_text(numbers: Sequence[int], target: int) -> str:
    return (
        f"Using the numbers {list(numbers)}, create an equation that equals {target}. You can use basic "
        "arithmetic operations (+, -, *, /) and each number must be used exactly once. Show your reasoning "
        "in <think> </think> tags, and give the final expression in <answer> </answer> tags, for example "
        "<answer> (1 + 2) / 3 </answer>."
    )


def make_prompt(numbers: Sequence[int], target: int, chat: bool = False) -> str | list[dict]:
    """The Countdown prompt in the public TinyZero layout.

    chat=False: one text for a base (or from-scratch) model: a "User:/Assistant:" conversation that ends
    with the assistant opening its ``<think>`` block, so the completion continues the reasoning and then
    closes it and gives ``<answer>…</answer>``.
    chat=True: ``[{"role": "system", ...}, {"role": "user", ...}]`` for a chat template (the trainer's
    tokenizer adds the assistant turn).
    Either way ``score_answer`` expects the completion only, without the prompt (the prompt's example
    answer would otherwise count as an answer when the completion has none).
    """
    numbers, target = _check_instance(numbers, target)
    user = _user_text(numbers, target)
    if chat:
        return [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": user}]
    return (
        "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
        "The Assistant first thinks about the reasoning process in the mind and then provides the user "
        f"with the answer.\nUser: {user}\nAssistant: Let me solve this step by step.\n<think>"
    )


def extract_answer(text: str) -> str | None:
    """The text inside the last ``<answer>…</answer>`` pair, stripped, or None when there is none.

    "Last" means the last closing tag and the nearest opening tag before it; found with two ``rfind``
    calls, so the cost is linear in the text whatever it holds (a regex with a lazy ``.*?`` is quadratic
    on a text with many unclosed tags).
    """
    if not isinstance(text, str):
        raise ValueError(f"text must be a string, got {type(text).__name__}")
    end = text.rfind(_CLOSE)
    if end < 0:
        return None
    start = text.rfind(_OPEN, 0, end)
    if start < 0:
        return None
    return text[start + len(_OPEN) : end].strip()


def _check_instance(numbers, target) -> tuple[tuple[int, ...], int | Fraction]:
    """Validate caller-supplied (trusted) ground truth; a ValueError names the problem."""
    if isinstance(numbers, (str, bytes)) or not isinstance(numbers, Iterable):
        raise ValueError(f"numbers must be a sequence of integers, got {type(numbers).__name__}")
    out = []
    for x in numbers:
        if isinstance(x, bool):
            raise ValueError(f"numbers must be integers, got {x!r}")
        try:
            out.append(operator.index(x))
        except TypeError:
            if isinstance(x, float) and x.is_integer():
                out.append(int(x))
            else:
                raise ValueError(f"numbers must be integers, got {x!r}") from None
    if not out:
        raise ValueError("numbers must not be empty")
    if any(v < 0 for v in out):
        raise ValueError(f"numbers must be non-negative, got {out}")
    if isinstance(target, bool):
        raise ValueError(f"target must be a number, got {target!r}")
    try:
        t = operator.index(target)
    except TypeError:
        try:
            t = Fraction(target)
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"target must be a finite number, got {target!r}") from None
        if t.denominator == 1:
            t = int(t)
    return tuple(out), t


def score_answer(text: str, numbers: Sequence[int], target) -> float:
    """Countdown reward of a completion: 1.0 correct, 0.1 well-formed but wrong or rule-breaking, 0.0 none.

    text: the completion (without the prompt). numbers: the instance's integers; target: its target
    (an integer, or any exact number). The answer is the last ``<answer>…</answer>`` (``extract_answer``).

    - 0.0: no answer tag pair, or an answer that is empty or whitespace only. (The reference gives empty
      tags the format reward; that would pay a policy for emitting empty tags, so here they count as no
      answer.)
    - 1.0: the answer parses as an allowed expression (see ``canonical_form``), uses each number exactly
      once (as a multiset: equal numbers may be swapped), and its exact value is within 1e-5 of target.
    - 0.1: anything else inside the tags: wrong value, a number missing or used twice, a number not in
      the instance, division by zero, floats, ``**``, names, calls, Unicode digits, over-long or
      over-nested text, trailing ``= target``.

    Never raises on the text's content (a non-string text or bad numbers/target is a caller error and
    raises ValueError); never executes it; bounded time and memory.
    """
    answer = extract_answer(text)
    if not answer:
        _check_instance(numbers, target)  # a caller error is an error whatever the text
        return NO_ANSWER_REWARD
    correct = correct_canonical_form(answer, numbers, target, extract=False) is not None
    return CORRECT_REWARD if correct else FORMAT_REWARD


def correct_canonical_form(text: str, numbers: Sequence[int], target, extract: bool = True) -> str | None:
    """Canonical form of a correct answer, else None (the metrics' notion of a distinct solution).

    extract=True: ``text`` is a completion, correct when ``score_answer`` gives 1.0. extract=False:
    ``text`` is a bare expression, held to the same rules.
    """
    numbers, target = _check_instance(numbers, target)
    if extract:
        if not isinstance(text, str):
            raise ValueError(f"text must be a string, got {type(text).__name__}")
        text = extract_answer(text)
        if text is None:
            return None
    elif not isinstance(text, str):
        raise ValueError(f"text must be a string, got {type(text).__name__}")
    parsed = _parse(text.strip())
    if parsed is None or parsed.value is None or Counter(parsed.literals) != Counter(numbers):
        return None
    return parsed.canon.text if abs(parsed.value - target) <= TOLERANCE else None


def trl_reward(completions, numbers, target, **kwargs) -> list[float]:
    """``score_answer`` as a TRL ``GRPOTrainer`` reward function, over a batch.

    completions: texts, or conversational completions (lists of messages, their text joined by
    ``setpo.completions.completion_text``). numbers, target: the dataset columns ``export_parquet(style="trl")`` writes,
    which TRL passes per completion. Other keyword arguments (prompts, trainer_state, ...) are ignored.
    """
    if not (len(completions) == len(numbers) == len(target)):
        raise ValueError(
            f"completions, numbers and target must have equal lengths, got "
            f"{len(completions)}, {len(numbers)}, {len(target)}"
        )
    out = []
    for completion, nums, t in zip(completions, numbers, target):
        out.append(score_answer(completion_text(completion), list(nums), t))
    return out


def verl_compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    """``score_answer`` with verl's custom reward function signature.

    Point verl at it with ``custom_reward_function.path=<this file>`` and
    ``custom_reward_function.name=verl_compute_score``; ``ground_truth`` is the
    ``{"numbers": [...], "target": ...}`` that ``export_parquet(style="verl")`` writes.
    """
    return score_answer(solution_str, list(ground_truth["numbers"]), ground_truth["target"])


# --------------------------------------------------------------------------------------------------
# Solver
# --------------------------------------------------------------------------------------------------


def solve(numbers: Sequence[int], target, limit: int | None = None) -> list[str]:
    """All distinct solutions of an instance, as canonical strings (each scores 1.0 as an answer).

    Enumerates every expression tree that uses each number once, by repeatedly replacing two pool
    entries with their sum, either difference, product or either quotient (skipping division by zero),
    with exact ``Fraction`` values; pools already seen (same multiset of canonical subexpressions) are not
    expanded twice. Distinct means distinct canonical form (module docstring). Solutions are returned in
    sorted order; with ``limit`` the search stops once that many have been found (which ones is then
    deterministic but not the sorted prefix). Four numbers take a few tens of milliseconds.
    """
    numbers, target = _check_instance(numbers, target)
    if limit is not None and (isinstance(limit, bool) or int(limit) != limit or limit < 1):
        raise ValueError(f"limit must be a positive integer or None, got {limit!r}")
    found: dict[str, None] = {}
    seen: set[tuple[str, ...]] = set()
    pool = tuple(sorted(((Fraction(v), _leaf(v)) for v in numbers), key=lambda p: p[1].text))

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
            combos = [(a + b, _add(x, y)), (a - b, _sub(x, y)), (b - a, _sub(y, x)), (a * b, _mul(x, y))]
            if b != 0:
                combos.append((a / b, _div(x, y)))
            if a != 0:
                combos.append((b / a, _div(y, x)))
            for item in combos:
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
    if isinstance(n, bool) or int(n) != n or n < 0:
        raise ValueError(f"n must be a non-negative integer, got {n!r}")
    counts = (num_numbers,) if isinstance(num_numbers, (int, np.integer)) else tuple(num_numbers)
    if not counts or any(isinstance(c, bool) or int(c) != c or c < 1 for c in counts):
        raise ValueError(f"num_numbers must be a positive integer or a sequence of them, got {num_numbers!r}")
    if max(counts) > 6:
        raise ValueError(f"at most 6 numbers per instance (the solver is exponential), got {num_numbers!r}")
    nlo, nhi = _check_range("number_range", number_range)
    tlo, thi = _check_range("target_range", target_range)
    if nlo < 0:
        raise ValueError(f"number_range must be non-negative, got {number_range!r}")
    if target_sampling not in ("expression", "reachable"):
        raise ValueError(f"target_sampling must be 'expression' or 'reachable', got {target_sampling!r}")
    rng = np.random.default_rng(seed)
    taken = {inst.key for inst in exclude}
    out: list[CountdownInstance] = []
    misses = 0
    while len(out) < n:
        k = int(counts[rng.integers(len(counts))])
        numbers = tuple(int(v) for v in rng.integers(nlo, nhi + 1, size=k))
        key = tuple(sorted(numbers))
        if target_sampling == "expression":
            target = _random_expression_target(numbers, rng, tlo, thi, lambda t: (key, t) not in taken)
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
    for name, v in (("n_train", n_train), ("n_test", n_test)):
        if isinstance(v, bool) or int(v) != v or v < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {v!r}")
    both = generate_instances(int(n_train) + int(n_test), seed, **kwargs)
    return both[: int(n_train)], both[int(n_train) :]


# --------------------------------------------------------------------------------------------------
# Gymnasium environment
# --------------------------------------------------------------------------------------------------

# Prompts are ASCII; a completion may hold any character, but the declared action space (what
# ``action_space.sample()`` draws) is printable ASCII, and ``step`` accepts any string.
_TEXT_CHARSET = string.printable


class CountdownEnv(gym.Env):
    """Countdown as a one-step text environment.

    Observation: the prompt text (``make_prompt(..., chat=False)``), a ``spaces.Text``.
    Action: the completion text (any ``str``; the declared ``spaces.Text`` is printable ASCII).
    Reward: ``score_answer(action, numbers, target)``; every episode terminates after one step.

    Args:
        instances: the problems to draw from; default ``generate_instances(n_instances, instance_seed,
            num_numbers)``. The problem set is fixed at construction; ``reset(seed=...)`` picks which one.
        n_instances, instance_seed, num_numbers: used only when ``instances`` is None.
        max_prompt_chars, max_completion_chars: the spaces' ``max_length``.

    ``reset(seed=None, options=None)``: draws a problem uniformly with the env's generator, or takes
    ``options={"index": i}``. info holds ``numbers``, ``target`` and ``index``. ``step(completion)``
    returns the prompt again as observation and info with the extracted ``answer`` (or None) and
    ``correct``. Stepping before ``reset`` or after the episode ended raises ``gymnasium.error.ResetNeeded``.
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        instances: Sequence[CountdownInstance] | None = None,
        *,
        n_instances: int = 1000,
        instance_seed: int = 0,
        num_numbers: int | Sequence[int] = (3, 4),
        max_prompt_chars: int = 4096,
        max_completion_chars: int = 4096,
    ):
        if instances is None:
            instances = generate_instances(n_instances, instance_seed, num_numbers=num_numbers)
        self.instances = [
            inst if isinstance(inst, CountdownInstance) else CountdownInstance(*_check_instance(*inst))
            for inst in instances
        ]
        if not self.instances:
            raise ValueError("CountdownEnv needs at least one instance")
        self._prompts = [make_prompt(inst.numbers, inst.target) for inst in self.instances]
        longest = max(len(p) for p in self._prompts)
        if longest > max_prompt_chars:
            raise ValueError(f"a prompt has {longest} characters, over max_prompt_chars={max_prompt_chars}")
        self.observation_space = gym.spaces.Text(max_prompt_chars, min_length=1, charset=_TEXT_CHARSET)
        self.action_space = gym.spaces.Text(max_completion_chars, min_length=0, charset=_TEXT_CHARSET)
        self._index: int | None = None
        self._done = True

    def _info(self) -> dict:
        inst = self.instances[self._index]
        return {"numbers": list(inst.numbers), "target": inst.target, "index": self._index}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if options and "index" in options:
            index = options["index"]
            if isinstance(index, bool) or int(index) != index or not 0 <= index < len(self.instances):
                raise ValueError(f"options['index'] must be in [0, {len(self.instances)}), got {index!r}")
            self._index = int(index)
        else:
            self._index = int(self.np_random.integers(len(self.instances)))
        self._done = False
        return self._prompts[self._index], self._info()

    def step(self, action: str):
        if self._done:
            raise gym.error.ResetNeeded("call reset() before step(): Countdown episodes last one step")
        if not isinstance(action, str):
            raise ValueError(f"the action is the completion text, a str; got {type(action).__name__}")
        inst = self.instances[self._index]
        reward = score_answer(action, inst.numbers, inst.target)
        self._done = True
        info = self._info()
        info.update(answer=extract_answer(action), correct=reward == CORRECT_REWARD)
        return self._prompts[self._index], float(reward), True, False, info


# --------------------------------------------------------------------------------------------------
# Datasets: parquet export for TRL and verl, the public Countdown-Tasks-3to4 by path
# --------------------------------------------------------------------------------------------------

COUNTDOWN_TASKS_HELP = (
    "Countdown-Tasks-3to4 is the public dataset 'Jiayi-Pan/Countdown-Tasks-3to4' on the Hugging Face Hub; "
    "nothing here downloads it. Get a copy yourself, e.g. `huggingface-cli download --repo-type dataset "
    "Jiayi-Pan/Countdown-Tasks-3to4 --local-dir data/countdown`, and pass the parquet file or its folder. "
    "Or make instances locally with envs.countdown.generate_instances / make_splits."
)


def export_parquet(
    instances: Sequence[CountdownInstance],
    path,
    style: str = "trl",
    *,
    chat: bool | None = None,
    split: str = "train",
    data_source: str = "countdown",
):
    """Write instances to a parquet file for a trainer; returns the path.

    style="trl" (``GRPOTrainer``'s dataset; extra columns reach reward functions as keyword arguments):
        prompt   text (chat=False, the default: the base-model prompt of ``make_prompt``), or a list of
                 {"role", "content"} messages (chat=True, a conversational dataset)
        numbers  list of int
        target   int
    style="verl" (verl's RL dataset convention):
        data_source   ``data_source`` ("countdown")
        prompt        list of chat messages: ``make_prompt(chat=True)`` by default; chat=False wraps the
                      base-model prompt text in one user message (TinyZero's base-model layout)
        ability       "math"
        reward_model  {"style": "rule", "ground_truth": {"numbers": [...], "target": t}}
        extra_info    {"split": split, "index": i, "numbers": [...], "target": t}
    ``verl_compute_score`` scores this layout.
    """
    import pandas as pd

    if style not in ("trl", "verl"):
        raise ValueError(f"style must be 'trl' or 'verl', got {style!r}")
    rows = []
    for i, inst in enumerate(instances):
        if not isinstance(inst, CountdownInstance):
            raise ValueError(f"instances must be CountdownInstance, got {type(inst).__name__} at {i}")
        numbers, target = [int(v) for v in inst.numbers], int(inst.target)
        if style == "trl":
            prompt = make_prompt(numbers, target, chat=bool(chat))
            rows.append({"prompt": prompt, "numbers": numbers, "target": target})
        else:
            prompt = make_prompt(numbers, target, chat=True if chat is None else chat)
            if isinstance(prompt, str):
                prompt = [{"role": "user", "content": prompt}]
            truth = {"numbers": numbers, "target": target}
            rows.append(
                {
                    "data_source": data_source,
                    "prompt": prompt,
                    "ability": "math",
                    "reward_model": {"style": "rule", "ground_truth": truth},
                    "extra_info": {"split": split, "index": i, **truth},
                }
            )
    if not rows:
        raise ValueError("no instances to export")
    pd.DataFrame(rows).to_parquet(path, index=False)
    return path


def load_countdown_tasks(path, limit: int | None = None) -> list[CountdownInstance]:
    """Instances from a local copy of the public Countdown-Tasks-3to4 parquet (columns ``nums``, ``target``).

    path: a parquet file, or a folder whose ``*.parquet`` files (searched recursively, in sorted order)
    are read one after another. limit: keep the first ``limit`` rows. Nothing is downloaded: a missing
    path raises FileNotFoundError saying where to get the data. Rows are not checked for solvability
    (``solve`` does that, ~10 ms a row).
    """
    import pandas as pd
    from pathlib import Path

    p = Path(path).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"no Countdown-Tasks-3to4 parquet at {str(p)!r}. {COUNTDOWN_TASKS_HELP}")
    files = sorted(p.rglob("*.parquet")) if p.is_dir() else [p]
    if not files:
        raise FileNotFoundError(f"no *.parquet files under {str(p)!r}. {COUNTDOWN_TASKS_HELP}")
    if limit is not None and (isinstance(limit, bool) or int(limit) != limit or limit < 0):
        raise ValueError(f"limit must be a non-negative integer or None, got {limit!r}")
    out: list[CountdownInstance] = []
    for f in files:
        df = pd.read_parquet(f, columns=None)
        missing = {"nums", "target"} - set(df.columns)
        if missing:
            raise ValueError(
                f"{f} lacks the column(s) {sorted(missing)} of Countdown-Tasks-3to4 (nums, target)"
            )
        for nums, target in zip(df["nums"], df["target"]):
            if limit is not None and len(out) >= limit:
                return out
            numbers, t = _check_instance(list(nums), target)
            if not isinstance(t, int):
                raise ValueError(f"{f}: target must be an integer, got {target!r}")
            out.append(CountdownInstance(numbers, t))
    return out
