"""Answers to math problems: the final answer of a model's response, and the 0/1 reward that checks it.

``final_answer(completion)`` says what a response answered, in this order:

1. the content of its last ``\\boxed{}`` (Qwen-Math's convention, which the prompt asks for);
2. else its last stated answer: "the (final) answer is 18", "Answer: $18.", "#### 18" (GSM8K's own marker),
   a number possibly with a currency sign, thousands separators, a unit word or a percent sign after it;
3. else its last inline LaTeX span (``$...$``, ``\\(...\\)``, ``\\[...\\]``) that is evidently LaTeX: no
   space just inside the dollars, so currency ("$80,000 - $50,000") is not read as math;
4. else None: the response answered nothing (reward 0).

Step 2 is **design choice**, made from real responses (``results/math/real_responses.md``): SmolLM2-135M-Instruct
never writes ``\\boxed{}``; it ends with "The final answer is 20." or "So, the answer is 18 years.", and with
boxed answers only every reward was 0, so GRPO saw no reward variance at all. Only an explicitly *stated* answer
counts, never "the last number in the text", which would reward a response that happens to end on the right
number; a stated answer that is an expression ("the answer is 2 * 4 = 8") is not read as its first number.

``normalize_answer`` then reduces a plain number with decoration to the number (``\\$1,200.00`` -> ``1200.00``,
``18 dollars`` -> ``18``, ``18.`` -> ``18``, ``18\\%`` -> ``18``, ``1\\,200`` -> ``1200``); it is applied to the gold
answer too, so both sides agree. Everything else (fractions, radicals, expressions) is left to math-verify.

``math_reward(completion, answer)`` parses both as LaTeX inside ``\\boxed{}`` and compares them with
``math_verify.verify`` (numeric, symbolic and set equivalence). Before parsing, cheap text checks
(``answer_too_costly``) refuse answers whose evaluation could run unbounded (exponent towers such as
``9^{9^{9}}``, huge exponents or factorials, deep nesting, over-long answers): sympy's exact big-integer
arithmetic holds the GIL, so only refusing such text keeps scoring bounded in every thread. **Design choice**: we
do not enable math-verify's plain-expression extraction, because it hands the model's text to sympy's
``parse_expr``, which evaluates Python code; the LaTeX path parses with a grammar and never executes model
output. math-verify's timeouts use ``SIGALRM`` and so only work in the main thread; called from another thread
(verl's reward workers score in a thread pool) the timeouts are off, and the text checks above are what bounds
the time.
"""

from __future__ import annotations

import logging
import math
import numbers
import re
import threading
from typing import Any

_log = logging.getLogger("setpo.envs.math")  # one logger for the math task (its tests and users filter on it)



_BRACE = re.compile(r"[{}]")


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in text, braces matched; None if there is none.

    text must be a str (anything else is a ValueError). Linear time: braces are found by a regex scan.
    """
    if not isinstance(text, str):
        raise ValueError(f"extract_boxed needs a str, got {type(text).__name__}")
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for m in _BRACE.finditer(text, i):
        depth += 1 if m.group() == "{" else -1
        if depth == 0:
            return text[i:m.start()].strip()
    return None  # unbalanced: a truncated completion


def _check_str(value, name: str) -> None:
    """A ValueError naming ``name`` unless ``value`` is a str (None or bytes failed inside a string method)."""
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a str, got {type(value).__name__}")


_NUMBER_WITH_COMMAS = re.compile(r"^-?\d{1,3}(,\d{3})+(\.\d+)?$")


def clean_answer(value: Any) -> str:
    """A gold answer as a LaTeX string: GSM8K '#### 1,200' -> '1200', 142.0 -> '142', text stripped. A number or
    text; anything else (None, a list, bytes) is a ValueError, not its repr ("None", "[1]") read as LaTeX."""
    if isinstance(value, bool):
        raise ValueError(f"answer must be a number or text, got {value!r}")
    if isinstance(value, (int,)) or (hasattr(value, "dtype") and getattr(value.dtype, "kind", "") in "iu"):
        try:
            return str(int(value))
        except ValueError:  # Python refuses int -> str beyond 4300 digits, with a message naming nothing
            raise ValueError(f"answer is an integer of {int(value).bit_length()} bits, too long to check as "
                             f"text") from None
    if isinstance(value, float) or (hasattr(value, "dtype") and getattr(value.dtype, "kind", "") == "f"):
        v = float(value)
        if not math.isfinite(v):
            raise ValueError(f"answer is not finite: {value!r}")
        return str(int(v)) if v.is_integer() else repr(v)
    if not isinstance(value, (str, numbers.Number)):
        raise ValueError(f"answer must be a number or text, got {type(value).__name__} {value!r:.60}")
    text = str(value).strip()
    if "####" in text:  # GSM8K: a worked solution whose last line is '#### <answer>'
        text = text.rsplit("####", 1)[1].strip()
    if _NUMBER_WITH_COMMAS.match(text):
        text = text.replace(",", "")
    boxed = extract_boxed(text)
    if boxed is not None and text.startswith(("\\boxed", "\\fbox")):
        text = boxed
    return text



# ----------------------------------------------------------------------------------------- reward



#: Limits on the text handed to the LaTeX parser and sympy (see ``answer_too_costly``).
MAX_ANSWER_CHARS = 1000
MAX_NESTING = 12              # parse time grows about 5x per 4 levels of nested \frac or parentheses
MAX_EXPONENT_DIGITS = 4       # 2^{9999} is instant; 2^{99999999} is not
MAX_SYMBOLIC_EXPONENT_DIGITS = 2  # (x+1)^{999} takes seconds to expand and compare; (x+1)^{99} does not
MAX_FACTORIAL_DIGITS = 3
#: Most digits all the powers of an answer may have together, estimated from the text as (exponent × digits of the
#: base): each power passes the exponent-digit limit alone, but sympy multiplies them exactly, in time that grows
#: faster than their size (20 factors 9999^{9999} took 4 s, 60 did not end), and a power of a power multiplies
#: exponents ((9999^{9999})^{9999} has 4·10^8 digits).
MAX_POWER_DIGITS = 200_000
#: Most terms the powers of a symbolic answer may expand to together, C(e + k − 1, k − 1) for a base of k terms:
#: (x+y+z)^{40} (861 terms) took 4 s and (a+b+c+d)^{20} 8 s, though each exponent has 2 digits.
MAX_EXPANDED_TERMS = 500
#: Characters of an input shown in a log line about it.
LOG_CHARS = 200

_EXPONENT = re.compile(r"\^\s*")
_DIGITS = re.compile(r"\d+")
_BIG_FACTORIAL = re.compile(r"(\d{%d,}|[)}\]])\s*!" % (MAX_FACTORIAL_DIGITS + 1))
_BIG_BINOM = re.compile(r"\\[dt]?binom|\\choose")
_COMMAND = re.compile(r"\\[A-Za-z]+")
_LETTER = re.compile(r"[A-Za-z]")


def _operand(text: str, i: int) -> tuple[str, int]:
    """The exponent starting at text[i] and the index after it: a braced group (braces matched), else the
    next token (a command, a number or one character)."""
    if i < len(text) and text[i] == "{":
        depth = 0
        for m in _BRACE.finditer(text, i):
            depth += 1 if m.group() == "{" else -1
            if depth == 0:
                return text[i + 1:m.start()], m.end()
        return text[i + 1:], len(text)
    m = re.compile(r"\\[A-Za-z]+|\d+(?:\.\d+)?|.", re.S).match(text, i)
    return (m.group(), m.end()) if m else ("", i)


_TERM = re.compile(r"\\[A-Za-z]+|[A-Za-z]|\d+")


def _exponent_value(exp: str) -> int:
    """An exponent's size as its digits read as one number (1 without digits: a symbol), an upper bound."""
    digits = "".join(_DIGITS.findall(exp))
    return max(int(digits), 1) if digits else 1


def _openers(text: str) -> dict[int, int]:
    """{index of each closing bracket: index of the bracket it closes}, any kind of bracket, in one pass."""
    out, stack = {}, []
    for i, ch in enumerate(text):
        if ch in "{([":
            stack.append(i)
        elif ch in "})]" and stack:
            out[i] = stack.pop()
    return out


def _powers_too_costly(text: str, symbolic: bool) -> str | None:
    """Whether the answer's powers together are too big to compute (``MAX_POWER_DIGITS``) or, with a symbol, to
    expand (``MAX_EXPANDED_TERMS``). A power's base is the bracketed group, number or symbol before its ^; a
    group that holds powers of its own multiplies their exponents into this one ((a^b)^c = a^(bc)). Estimates
    from the text, linear in it; called once each exponent has passed the digit limits."""
    openers = _openers(text)
    digits = terms = 0
    for m in _EXPONENT.finditer(text):
        exponent = _exponent_value(_operand(text, m.end())[0])
        j = m.start() - 1
        while j >= 0 and text[j].isspace():
            j -= 1
        if j in openers:  # (base)^e, {base}^e, \frac{1}{base}^e
            base = text[openers[j]:j]
            for inner in _EXPONENT.finditer(base):
                exponent *= _exponent_value(_operand(base, inner.end())[0])
            base_digits, base_terms = sum(len(d) for d in _DIGITS.findall(base)), len(_TERM.findall(base))
        else:  # a number, a symbol or a command
            k = j
            while k >= 0 and (text[k].isdigit() or text[k] == "."):
                k -= 1
            base_digits, base_terms = j - k, 1
        digits += exponent * max(base_digits, 1)
        if digits > MAX_POWER_DIGITS:
            return f"powers with more than {MAX_POWER_DIGITS} digits in all"
        if symbolic:
            terms += math.comb(exponent + max(base_terms, 1) - 1, max(base_terms, 1) - 1)
            if terms > MAX_EXPANDED_TERMS:
                return f"symbolic powers that expand to more than {MAX_EXPANDED_TERMS} terms"
    return None


def answer_too_costly(text: str, max_chars: int = MAX_ANSWER_CHARS) -> str | None:
    """Why evaluating ``text`` could take unbounded time or memory, or None when it is safe to parse.

    sympy evaluates numbers exactly: 9^{9^{9}} has 370 million digits and 10^{10^{10}} cannot be stored, and
    the big-integer arithmetic holds the GIL, so no thread-based timeout can stop it; SIGALRM only works
    in the main thread, and verl's reward workers score in a thread pool. A few cheap text checks bound the
    work instead: the length (``max_chars``), the nesting depth, exponent towers (an exponent holding
    another ^, or a^b^c), exponents with more than MAX_EXPONENT_DIGITS digits (MAX_SYMBOLIC_EXPONENT_DIGITS
    when the answer has a variable), factorials of more than
    MAX_FACTORIAL_DIGITS digits or of a bracketed expression, binomials of large numbers, and powers too big
    together (``MAX_POWER_DIGITS``, ``MAX_EXPANDED_TERMS``; a power of a power counts the product of its
    exponents). Linear scans. text must be a str; max_chars a whole number >= 1.
    """
    _check_str(text, "text")
    if isinstance(max_chars, bool) or not isinstance(max_chars, numbers.Integral) or max_chars < 1:
        raise ValueError(f"max_chars must be a whole number >= 1, got {max_chars!r}")
    if len(text) > max_chars:
        return f"answer longer than {max_chars} characters"
    depth = top = 0
    for ch in text:
        if ch in "{([":
            depth += 1
            top = max(top, depth)
        elif ch in "})]":
            depth -= 1
    if top > MAX_NESTING:
        return f"brackets nested deeper than {MAX_NESTING}"
    # with a symbol in the answer a power is expanded, not just computed, so its exponent is held smaller
    symbolic = bool(_LETTER.search(_COMMAND.sub(" ", text)))
    max_digits = MAX_SYMBOLIC_EXPONENT_DIGITS if symbolic else MAX_EXPONENT_DIGITS
    for m in _EXPONENT.finditer(text):
        exp, after = _operand(text, m.end())
        if "^" in exp or "\\exp" in exp or text[after:].lstrip().startswith("^"):
            return "exponent tower"
        if sum(len(d) for d in _DIGITS.findall(exp)) > max_digits:
            return f"exponent with more than {max_digits} digits" + (" on a symbolic expression" if symbolic else "")
    if _BIG_FACTORIAL.search(text) or "\\Gamma" in text:
        return "factorial of a large number or of an expression"
    if _BIG_BINOM.search(text) and any(len(d) > MAX_FACTORIAL_DIGITS for d in _DIGITS.findall(text)):
        return "binomial of a large number"
    return _powers_too_costly(text, symbolic)


def _parse_latex(text: str, timeout: int | None):
    from math_verify import LatexExtractionConfig, parse

    return parse(text, (LatexExtractionConfig(),), parsing_timeout=timeout)


def _shorten(text: str) -> str:
    return text if len(text) <= LOG_CHARS else f"{text[:LOG_CHARS]}... ({len(text)} characters)"


#: Characters at the end of an unboxed completion searched for a stated answer: the answer sits at the end.
UNBOXED_TAIL_CHARS = 2000

_NUMBER = r"-?\d[\d,]*(?:\.\d+)?"
# "the answer is 18", "final answer: $18.", "Answer = **1,200** dollars"; not "the answer is 2 * 4 = 8" (an
# expression: its first number is not the answer)
_STATED = re.compile(r"(?:answer\s*(?:is|was|would\s+be|will\s+be|=|:)|####)\s*:?\s*(?:\*\*)?\s*(?:\\?\$)?\s*"
                     r"(" + _NUMBER + r")(?![\d,]*\s*[-+*/×÷=^]\s*\d)", re.IGNORECASE)
# inline LaTeX that is evidently LaTeX: no space just inside the delimiters (currency "$5 and $6" is not a span)
_LATEX_SPAN = re.compile(r"\\\((.+?)\\\)|\\\[(.+?)\\\]|\$\$([^$]+?)\$\$|\$([^\s$](?:[^$]*[^\s$])?)\$", re.S)
_DECORATED_NUMBER = re.compile(r"^(?:\\?\$|\\text\{\$\})?\s*(" + _NUMBER + r")\s*(?:\\?%|[A-Za-z][A-Za-z\s.]*)?\.?$")
_THIN_SPACE_THOUSANDS = re.compile(r"(?<=\d)(?:\\,|\{,\}|\\ )(?=\d{3}\b)")


def normalize_answer(text: str) -> str:
    """A plain number with decoration reduced to the number (currency sign, thousands separators, a unit word,
    a percent sign, a trailing period); anything else returned stripped, unchanged. text must be a str."""
    _check_str(text, "text")
    t = _THIN_SPACE_THOUSANDS.sub("", text.strip()).rstrip(".").strip()
    m = _DECORATED_NUMBER.match(t)
    if not m:
        return t
    number = m.group(1)
    return number.replace(",", "") if _NUMBER_WITH_COMMAS.match(number) else number


def final_answer(completion: str) -> str | None:
    """What a response answered (the module docstring's order: last box, last stated answer, last LaTeX span),
    normalised by ``normalize_answer``; None when it states none. completion must be a str."""
    if not isinstance(completion, str):
        raise ValueError(f"completion must be a str, got {type(completion).__name__}")
    boxed = extract_boxed(completion)
    if boxed is not None:
        return normalize_answer(boxed)
    tail = completion[-UNBOXED_TAIL_CHARS:]
    stated = None
    for stated in _STATED.finditer(tail):  # noqa: B007 (the loop keeps the last match)
        pass
    if stated is not None:
        return normalize_answer(stated.group(1))
    span = None
    for span in _LATEX_SPAN.finditer(tail):  # noqa: B007 (the loop keeps the last match)
        pass
    if span is not None:
        return normalize_answer(next(g for g in span.groups() if g is not None))
    return None


def math_reward(completion: str, answer: str, *, timeout: int = 5) -> float:
    """1.0 if the completion's final answer (``final_answer``) equals ``answer`` by math-verify, else 0.0.

    completion: the model's response text (prompt excluded). answer: the gold answer, LaTeX or a number.
    timeout: seconds for each of parsing and verifying; applies in the main thread only (SIGALRM).
    Bounded time in any thread: only the extracted answer reaches the parser, screened first by
    ``answer_too_costly`` (a refused model answer scores 0 and is logged, truncated, at debug level; a refused
    gold answer is a ValueError, since it is a data problem). Never raises on model output: anything
    unparsable scores 0.
    """
    from math_verify import verify

    if not isinstance(completion, str):
        raise ValueError(f"completion must be a str, got {type(completion).__name__}")
    if answer is None:
        raise ValueError("the gold answer is None")
    # math-verify reads timeout <= 0 as "no timeout" and fails on a string deep inside; 0.5 surfaced as
    # "gold answer cannot be parsed as LaTeX" (SIGALRM takes whole seconds)
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, numbers.Integral) or timeout < 1):
        raise ValueError(f"timeout must be a whole number of seconds >= 1 (or None: no timeout), got {timeout!r}")
    t = timeout if threading.current_thread() is threading.main_thread() else None
    gold_text = normalize_answer(clean_answer(answer))
    why = answer_too_costly(gold_text)
    if why:
        raise ValueError(f"gold answer {_shorten(gold_text)!r} is refused ({why}): it could not be checked in "
                         f"bounded time")
    gold = _parse_latex("\\boxed{" + gold_text + "}", t)
    if not gold:
        raise ValueError(f"gold answer {_shorten(str(answer))!r} cannot be parsed as LaTeX")
    predicted = final_answer(completion)
    if predicted is None:
        return 0.0
    target = "\\boxed{" + predicted + "}"
    why = answer_too_costly(predicted)
    if why:
        _log.debug("math_reward: scored 0 without parsing (%s): %s", why, _shorten(target))
        return 0.0
    try:
        pred = _parse_latex(target, t)
        return 1.0 if pred and verify(gold, pred, timeout_seconds=t) else 0.0
    except Exception as err:  # noqa: BLE001 - a timeout or a parser failure on model text is a wrong answer
        _log.debug("math_reward: scored 0 (%s: %s) for %s", type(err).__name__, err, _shorten(target))
        return 0.0


def verl_compute_score(data_source: str = None, solution_str: str = None, ground_truth: str = None,
                       extra_info: Any = None, **_: Any) -> float:
    """verl's custom reward function signature (``reward.custom_reward_function``); data_source is unused.

    A missing ``solution_str`` or ``ground_truth`` is a ValueError naming it (a wiring mistake in the
    reward config, not a wrong answer, so it must not be scored 0 silently).
    """
    missing = [name for name, v in (("solution_str", solution_str), ("ground_truth", ground_truth)) if v is None]
    if missing:
        raise ValueError(f"verl_compute_score needs {' and '.join(missing)} (verl passes data_source, "
                         f"solution_str, ground_truth, extra_info)")
    return math_reward(solution_str, ground_truth)



__all__ = ["MAX_ANSWER_CHARS", "UNBOXED_TAIL_CHARS", "LOG_CHARS", "answer_too_costly", "clean_answer", "extract_boxed",
           "final_answer", "math_reward", "normalize_answer", "verl_compute_score"]
