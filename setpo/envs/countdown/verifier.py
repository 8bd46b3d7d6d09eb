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

Canonical forms (what "distinct solution" means) are built in ``setpo.envs.countdown.canonical``.

Rules that follow TinyZero's scorer: intermediate values may be negative or fractional (only the final
value is compared with the target, within 1e-5); the answer is the expression alone (``… = 98`` breaks
the rules). Rules that are stricter, because the reference's regex is loose: ASCII digits only (Unicode
digits and decimal points like ``1.5`` break the rules), integer literals only, no ``**``, no unary
plus. ``score_answer`` takes the completion alone; it does not look for the prompt inside the text.
"""

from __future__ import annotations

import ast
import operator
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from typing import Iterable, Mapping, Sequence

from setpo.envs.countdown.canonical import CANONICAL_OPS, CanonicalExpr, canonical_leaf, canonical_negation

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
_TRUTH_KEYS = ("numbers", "target")  # verl ground truth, as export_parquet(style="verl") writes it


_VALUE_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}
_AST_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


# --------------------------------------------------------------------------------------------------
# Safe parsing of untrusted answer text
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Parsed:
    literals: tuple[int, ...]  # the integers the expression uses, in reading order
    canon: CanonicalExpr
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


def _walk(node: ast.AST, literals: list[int]) -> tuple[CanonicalExpr, Fraction | None]:
    """(canonical node, exact value or None after a division by zero) of an allowed AST."""
    if isinstance(node, ast.Constant):
        if type(node.value) is not int:  # floats, complex, strings, bools, Ellipsis, None
            raise _Refused
        literals.append(node.value)
        return canonical_leaf(node.value), Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        canon, value = _walk(node.operand, literals)
        return canonical_negation(canon), (None if value is None else -value)
    if isinstance(node, ast.BinOp) and type(node.op) in _AST_OPS:
        op = _AST_OPS[type(node.op)]
        left, lv = _walk(node.left, literals)
        right, rv = _walk(node.right, literals)
        if lv is None or rv is None or (op == "/" and rv == 0):
            value = None
        else:
            value = _VALUE_OPS[op](lv, rv)
        return CANONICAL_OPS[op](left, right), value
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
    numbers, target = check_instance(numbers, target)
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


def check_instance(numbers, target) -> tuple[tuple[int, ...], int | Fraction]:
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
    if isinstance(target, (bool, str, bytes)):  # Fraction() parses a string: "6" or "1/3" passed for a number
        raise ValueError(f"target must be a number, got {target!r:.80}")
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
        check_instance(numbers, target)  # a caller error is an error whatever the text
        return NO_ANSWER_REWARD
    correct = correct_canonical_form(answer, numbers, target, extract=False) is not None
    return CORRECT_REWARD if correct else FORMAT_REWARD


def correct_canonical_form(text: str, numbers: Sequence[int], target, extract: bool = True) -> str | None:
    """Canonical form of a correct answer, else None (the metrics' notion of a distinct solution).

    extract=True: ``text`` is a completion, correct when ``score_answer`` gives 1.0. extract=False:
    ``text`` is a bare expression, held to the same rules.
    """
    numbers, target = check_instance(numbers, target)
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


def verl_compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    """``score_answer`` with verl's custom reward function signature.

    Point verl at it with ``custom_reward_function.path=<this file>`` and
    ``custom_reward_function.name=verl_compute_score``; ``ground_truth`` is the
    ``{"numbers": [...], "target": ...}`` that ``export_parquet(style="verl")`` writes. A ground truth that is
    not such a mapping (another dataset's layout, say Countdown-Tasks' ``nums``) is a ValueError naming the
    keys it needs and the ones it got: a wiring mistake, never a silent 0.
    """
    if not isinstance(ground_truth, Mapping):
        raise ValueError(f"verl_compute_score needs ground_truth as a mapping with keys {list(_TRUTH_KEYS)} (what "
                         f"export_parquet(style='verl') writes), got {type(ground_truth).__name__}")
    missing = [k for k in _TRUTH_KEYS if k not in ground_truth]
    if missing:
        got = sorted(map(str, ground_truth))
        raise ValueError(f"verl_compute_score needs ground_truth keys {list(_TRUTH_KEYS)}, got {got} (missing "
                         f"{missing}); write the data with setpo.envs.countdown.export_parquet(style='verl')")
    numbers = ground_truth["numbers"]
    if isinstance(numbers, (str, bytes)) or not isinstance(numbers, Iterable):
        raise ValueError(f"verl_compute_score: ground_truth['numbers'] must be a sequence of integers, got "
                         f"{type(numbers).__name__}")
    return score_answer(solution_str, list(numbers), ground_truth["target"])


def distinct_correct_solutions(answers, numbers, target, *, extract: bool = True) -> dict[str, int]:
    """The distinct correct solutions among one Countdown problem's sampled answers, with their counts.

    answers: the completions sampled for the problem (extract=True: each scored like
        ``setpo.envs.countdown.score_answer``, answer in the last ``<answer>`` tags) or bare expressions
        (extract=False).
    numbers, target: the problem.
    Returns {canonical form: how many answers had it} over the answers that score 1.0, sorted by
    canonical form; ``len()`` of it is the problem's number of distinct correct solutions ("modes").
    Two answers are the same solution when they are equal up to commutativity, associativity and moving
    signs and inverses around (``3-(2-5)*7 == (5-2)*7+3``; see ``setpo.envs.countdown.canonical``).
    """
    if isinstance(answers, str):
        raise ValueError("answers must be a sequence of strings, got a single string")
    if not isinstance(answers, Iterable):
        raise ValueError(f"answers must be a sequence of strings, got {type(answers).__name__}")
    counts: dict[str, int] = {}
    for a in answers:
        form = correct_canonical_form(a, numbers, target, extract=extract)
        if form is not None:
            counts[form] = counts.get(form, 0) + 1
    return dict(sorted(counts.items()))
