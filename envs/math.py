"""Math word problems for RL (no environment, just data and a checker): the user's GSM8K / MATH500 / AIME / AMC files -> Qwen-Math prompts, 0/1 reward.

The paper's math setting (SetPO, arXiv 2602.01062) trains Qwen2.5-Math on the GSM8K train split and evaluates
on GSM8K, MATH500, College Math, AMC23, AIME24 and AIME25. This module reads those data sets from files the
user already has (nothing is downloaded), renders each question with the Qwen2.5-Math chain-of-thought
template, and scores a completion 1.0 or 0.0 with ``math-verify``.

Reading. ``load_math_problems(path)`` takes a ``.parquet``, ``.jsonl`` or ``.json`` file and recognises the
usual public layouts by their columns:

=================================  ==========================================================================
layout                             question / answer columns
=================================  ==========================================================================
GSM8K (openai/gsm8k)               ``question`` / ``answer`` (a worked solution ending in ``#### 72``)
MATH500 (HuggingFaceH4/MATH-500)   ``problem`` / ``answer`` (else the last ``\\boxed{}`` of ``solution``)
AIME 2024/2025, AMC 2023            ``problem``/``Problem``/``question`` / ``answer``/``Answer`` (int or float)
verl parquet (ours or verl's)      ``prompt`` (chat messages) / ``reward_model.ground_truth``
=================================  ==========================================================================

Template. Qwen2.5-Math's chain-of-thought prompt: system message "Please reason step by step, and put your
final answer within \\boxed{}." and the question as the user message (``qwen_math_messages``), rendered as
ChatML by the model's chat template, or by ``qwen_math_prompt`` for tokenizers without one.

Reward (``math_reward``). The gold answer is parsed as LaTeX inside ``\\boxed{}``; the completion's answer is
its last ``\\boxed{}`` (without one, math-verify's LaTeX extraction of ``$...$`` spans), and the two are
compared by ``math_verify.verify`` (numeric, symbolic and set equivalence). Before parsing, cheap text checks
(``answer_too_costly``) refuse answers whose evaluation could run unbounded (exponent towers such as
``9^{9^{9}}``, huge exponents or factorials, deep nesting, over-long answers): sympy's exact big-integer
arithmetic holds the GIL, so only refusing such text keeps scoring bounded in every thread. **Design choice**: we do
not enable math-verify's plain-expression extraction, because it hands the model's text to sympy's
``parse_expr``, which evaluates Python code; the LaTeX path parses with a grammar and never executes model
output. A completion whose answer is neither boxed nor in ``$...$`` scores 0, which is the Qwen-Math
convention the template asks for. math-verify's timeouts use ``SIGALRM`` and so only work in the main thread;
called from another thread (verl's reward workers score in a thread pool) the timeouts are off, and the text
checks above are what bounds the time.

Smoke data. ``smoke_problems(n, seed)`` generates small arithmetic word problems with integer answers (two
operations each), for end-to-end runs on a CPU; ``write_smoke_files`` writes them as GSM8K-style jsonl.

Command line (``python -m envs.math``): ``prepare IN OUT.parquet`` writes verl's parquet layout with our
template; ``smoke OUT_DIR`` writes a generated train/val pair.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envs._checks import whole_number

_log = logging.getLogger(__name__)

#: Characters at the end of an unboxed completion that the answer parser sees.
UNBOXED_TAIL_CHARS = 2000

QWEN_MATH_SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."

#: verl's ``ability`` column and the default ``data_source`` of generated problems.
ABILITY = "math"
SMOKE_SOURCE = "setpo/arithmetic-smoke"

_QUESTION_KEYS = ("question", "problem", "Question", "Problem", "query")
_ANSWER_KEYS = ("answer", "Answer", "final_answer", "ground_truth", "target")
_SOLUTION_KEYS = ("solution", "Solution")

HOW_TO_GET_DATA = (
    "Data is read from local files only. Pass a .parquet, .jsonl or .json file with question/answer columns, "
    "e.g. GSM8K from `huggingface-cli download --repo-type dataset openai/gsm8k --local-dir data/gsm8k` "
    "(then TRAIN_FILE=data/gsm8k/main/train-00000-of-00001.parquet), MATH500 from HuggingFaceH4/MATH-500, or "
    "generate a smoke set with `python -m envs.math smoke data/smoke`."
)


@dataclass(frozen=True)
class MathProblem:
    """One problem: the question text, its final answer (a LaTeX string), where it came from, its row id."""

    question: str
    answer: str
    source: str
    id: str


# ----------------------------------------------------------------------------------------- template


def qwen_math_messages(question: str) -> list[dict[str, str]]:
    """Chat messages of Qwen2.5-Math's chain-of-thought prompt for one question."""
    return [{"role": "system", "content": QWEN_MATH_SYSTEM_PROMPT}, {"role": "user", "content": question}]


def qwen_math_prompt(question: str) -> str:
    """The same prompt rendered as ChatML text, ending where the assistant's answer starts.

    Identical to what Qwen2.5-Math's own chat template produces from ``qwen_math_messages`` with
    ``add_generation_prompt=True``; use it with tokenizers that have no chat template.
    """
    return (f"<|im_start|>system\n{QWEN_MATH_SYSTEM_PROMPT}<|im_end|>\n"
            f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n")


# ----------------------------------------------------------------------------------------- answers


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


_NUMBER_WITH_COMMAS = re.compile(r"^-?\d{1,3}(,\d{3})+(\.\d+)?$")


def _clean_answer(value: Any) -> str:
    """A gold answer as a LaTeX string: GSM8K '#### 1,200' -> '1200', 142.0 -> '142', text stripped."""
    if isinstance(value, bool):
        raise ValueError(f"answer must be a number or text, got {value!r}")
    if isinstance(value, (int,)) or (hasattr(value, "dtype") and getattr(value.dtype, "kind", "") in "iu"):
        return str(int(value))
    if isinstance(value, float) or (hasattr(value, "dtype") and getattr(value.dtype, "kind", "") == "f"):
        v = float(value)
        if not math.isfinite(v):
            raise ValueError(f"answer is not finite: {value!r}")
        return str(int(v)) if v.is_integer() else repr(v)
    text = str(value).strip()
    if "####" in text:  # GSM8K: a worked solution whose last line is '#### <answer>'
        text = text.rsplit("####", 1)[1].strip()
    if _NUMBER_WITH_COMMAS.match(text):
        text = text.replace(",", "")
    boxed = extract_boxed(text)
    if boxed is not None and text.startswith(("\\boxed", "\\fbox")):
        text = boxed
    return text


def _row_question_answer(row: Mapping[str, Any]) -> tuple[str, str]:
    """(question, answer) of one row in any layout of the module docstring's table."""
    if "reward_model" in row and isinstance(row["reward_model"], Mapping):  # verl layout
        answer = row["reward_model"].get("ground_truth")
        extra = row.get("extra_info") or {}
        question = extra.get("question") if isinstance(extra, Mapping) else None
        if question is None:
            messages = list(row.get("prompt") or [])
            users = [m["content"] for m in messages if isinstance(m, Mapping) and m.get("role") == "user"]
            question = users[-1] if users else None
        if question is None or answer is None:
            raise ValueError("verl-layout row without a user message or reward_model.ground_truth")
        return str(question), _clean_answer(answer)
    question = next((row[k] for k in _QUESTION_KEYS if row.get(k) is not None), None)
    if question is None:
        raise ValueError(f"row has none of the question columns {_QUESTION_KEYS}; its columns: {sorted(row)}")
    answer = next((row[k] for k in _ANSWER_KEYS if row.get(k) is not None), None)
    if answer is None:
        solution = next((row[k] for k in _SOLUTION_KEYS if row.get(k) is not None), None)
        answer = extract_boxed(str(solution)) if solution is not None else None
        if answer is None:
            raise ValueError(f"row has no answer column {_ANSWER_KEYS} and no solution with a \\boxed{{}} answer; "
                             f"its columns: {sorted(row)}")
    answer = _clean_answer(answer)
    if not answer:
        raise ValueError("row has an empty answer")
    return str(question).strip(), answer


def _read_rows(path: Path) -> list[dict[str, Any]]:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    if suffix == ".jsonl":
        rows = []
        with path.open(encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as err:
                        raise ValueError(f"{path}: line {n} is not JSON: {err}") from None
        return rows
    if suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data, Mapping):  # {"data": [...]} or column-oriented {"question": [...], ...}
            if "data" in data and isinstance(data["data"], list):
                data = data["data"]
            elif all(isinstance(v, list) for v in data.values()):
                keys = list(data)
                data = [dict(zip(keys, vals)) for vals in zip(*data.values())]
        if not isinstance(data, list):
            raise ValueError(f"{path}: expected a list of records")
        return data
    raise ValueError(f"{path}: unsupported file type {suffix!r}; use .parquet, .jsonl or .json")


def load_math_problems(path: str | Path, *, source: str | None = None, limit: int | None = None
                       ) -> list[MathProblem]:
    """Problems from a local file (layouts in the module docstring).

    path: .parquet, .jsonl or .json. source: the data set's name, verl's ``data_source`` (default: the
    ``data_source`` column if there is one, else the file's stem). limit: keep the first ``limit`` rows.
    A missing file is a FileNotFoundError that says what to pass; a row that cannot be read is a ValueError
    naming the row.
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"no math data file at {str(p)!r}. {HOW_TO_GET_DATA}")
    if limit is not None:
        limit = whole_number(limit, "limit", 1)
    rows = _read_rows(p)
    if not rows:
        raise ValueError(f"{p}: no rows")
    out = []
    for i, row in enumerate(rows[:limit] if limit else rows):
        if not isinstance(row, Mapping):
            raise ValueError(f"{p}: row {i} is a {type(row).__name__}, not a record")
        try:
            question, answer = _row_question_answer(row)
        except ValueError as err:
            raise ValueError(f"{p}: row {i}: {err}") from None
        src = source or row.get("data_source") or p.stem
        rid = next((row[k] for k in ("unique_id", "id", "ID", "idx") if row.get(k) is not None), i)
        out.append(MathProblem(question, answer, str(src), str(rid)))
    return out


# ----------------------------------------------------------------------------------------- reward


#: Limits on the text handed to the LaTeX parser and sympy (see ``answer_too_costly``).
MAX_ANSWER_CHARS = 1000
MAX_NESTING = 12              # parse time grows about 5x per 4 levels of nested \frac or parentheses
MAX_EXPONENT_DIGITS = 4       # 2^{9999} is instant; 2^{99999999} is not
MAX_SYMBOLIC_EXPONENT_DIGITS = 2  # (x+1)^{999} takes seconds to expand and compare; (x+1)^{99} does not
MAX_FACTORIAL_DIGITS = 3
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


def answer_too_costly(text: str, max_chars: int = MAX_ANSWER_CHARS) -> str | None:
    """Why evaluating ``text`` could take unbounded time or memory, or None when it is safe to parse.

    sympy evaluates numbers exactly: 9^{9^{9}} has 370 million digits and 10^{10^{10}} cannot be stored, and
    the big-integer arithmetic holds the GIL, so no thread-based timeout can stop it; SIGALRM only works
    in the main thread, and verl's reward workers score in a thread pool. A few cheap text checks bound the
    work instead: the length (``max_chars``), the nesting depth, exponent towers (an exponent holding
    another ^, or a^b^c), exponents with more than MAX_EXPONENT_DIGITS digits (MAX_SYMBOLIC_EXPONENT_DIGITS
    when the answer has a variable), factorials of more than
    MAX_FACTORIAL_DIGITS digits or of a bracketed expression, and binomials of large numbers. Linear scans.
    """
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
    return None


def _parse_latex(text: str, timeout: int | None):
    from math_verify import LatexExtractionConfig, parse

    return parse(text, (LatexExtractionConfig(),), parsing_timeout=timeout)


def _shorten(text: str) -> str:
    return text if len(text) <= LOG_CHARS else f"{text[:LOG_CHARS]}... ({len(text)} characters)"


def math_reward(completion: str, answer: str, *, timeout: int = 5) -> float:
    """1.0 if the completion's final answer equals ``answer`` by math-verify, else 0.0.

    completion: the model's response text (prompt excluded). answer: the gold answer, LaTeX or a number.
    timeout: seconds for each of parsing and verifying; applies in the main thread only (SIGALRM).
    Bounded time in any thread: the text handed to the parser is first screened by ``answer_too_costly``
    (a refused model answer scores 0 and is logged, truncated, at debug level; a refused gold answer is a
    ValueError, since it is a data problem). Never raises on model output: anything unparsable scores 0.
    """
    from math_verify import verify

    if not isinstance(completion, str):
        raise ValueError(f"completion must be a str, got {type(completion).__name__}")
    if answer is None:
        raise ValueError("the gold answer is None")
    t = timeout if threading.current_thread() is threading.main_thread() else None
    gold_text = _clean_answer(answer)
    why = answer_too_costly(gold_text)
    if why:
        raise ValueError(f"gold answer {_shorten(gold_text)!r} is refused ({why}): it could not be checked in "
                         f"bounded time")
    gold = _parse_latex("\\boxed{" + gold_text + "}", t)
    if not gold:
        raise ValueError(f"gold answer {_shorten(str(answer))!r} cannot be parsed as LaTeX")
    # The last \\boxed{} is the answer (Qwen-Math's convention; math-verify alone would take the first one).
    # Parsing only that span also keeps long reasoning text away from the parser.
    boxed = extract_boxed(completion)
    if boxed is None:  # without a box, only the tail is parsed: the answer sits at the end
        target = completion[-UNBOXED_TAIL_CHARS:]
        why = answer_too_costly(target, max_chars=UNBOXED_TAIL_CHARS)
    else:
        target = "\\boxed{" + boxed + "}"
        why = answer_too_costly(boxed)
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


# ----------------------------------------------------------------------------------------- formats


def to_trl_records(problems: Sequence[MathProblem], *, chat: bool = True) -> list[dict[str, Any]]:
    """Rows for a TRL dataset: ``prompt`` (chat messages, or ChatML text if ``chat=False``) and ``answer``."""
    return [{"prompt": qwen_math_messages(p.question) if chat else qwen_math_prompt(p.question),
             "answer": p.answer, "data_source": p.source, "id": p.id} for p in problems]


def to_verl_rows(problems: Sequence[MathProblem], *, split: str = "train") -> list[dict[str, Any]]:
    """Rows in verl's RL parquet layout (``data_source``, chat ``prompt``, ``reward_model.ground_truth``...)."""
    return [{
        "data_source": p.source,
        "prompt": qwen_math_messages(p.question),
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": p.answer},
        "extra_info": {"split": split, "index": i, "id": p.id, "question": p.question},
    } for i, p in enumerate(problems)]


def write_verl_parquet(problems: Sequence[MathProblem], path: str | Path, *, split: str = "train") -> Path:
    """Write ``to_verl_rows`` to a parquet file (parent directories created)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not problems:
        raise ValueError("no problems to write")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(to_verl_rows(problems, split=split)), out)
    return out


def is_verl_parquet(path: str | Path) -> bool:
    """True when a parquet file already has verl's columns (a chat ``prompt`` and ``reward_model``)."""
    import pyarrow.parquet as pq

    p = Path(path)
    if p.suffix.lower() != ".parquet" or not p.is_file():
        return False
    names = set(pq.read_schema(p).names)
    return {"prompt", "reward_model", "data_source"} <= names


# ----------------------------------------------------------------------------------------- smoke data

_NAMES = ["Ava", "Ben", "Chen", "Dana", "Eli", "Fatima", "Gus", "Hana", "Ivan", "June", "Kofi", "Lena"]
_ITEMS = ["apples", "marbles", "stickers", "books", "pencils", "coins", "shells", "cards"]


def _smoke_problem(rng: random.Random) -> tuple[str, int]:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    kind = rng.randrange(4)
    if kind == 0:
        a, b, c = rng.randint(2, 9), rng.randint(2, 9), rng.randint(1, 9)
        return (f"{name} has {a} boxes with {b} {item} in each box and gives away {c} {item}. "
                f"How many {item} does {name} have left?", a * b - c)
    if kind == 1:
        a, b, c = rng.randint(2, 20), rng.randint(1, 20), rng.randint(2, 6)
        return (f"{name} fills {c} bags. Each bag holds {a} red {item} and {b} blue {item}. "
                f"How many {item} are in the bags altogether?", (a + b) * c)
    if kind == 2:
        per, n, extra = rng.randint(2, 12), rng.randint(2, 9), rng.randint(0, 9)
        return (f"{n} friends share {per * n + extra} {item}. Each friend gets {per} {item}. "
                f"How many {item} are left over?", extra)
    a, b, c = rng.randint(10, 60), rng.randint(10, 60), rng.randint(1, 9)
    return (f"{name} had {a} {item} on Monday and {b} {item} on Tuesday, and lost {c} {item} on Wednesday. "
            f"How many {item} does {name} have on Thursday?", a + b - c)


def smoke_problems(n: int = 64, seed: int = 0) -> list[MathProblem]:
    """``n`` generated arithmetic word problems with non-negative integer answers, reproducible from ``seed``."""
    n, seed = whole_number(n, "n", 1), whole_number(seed, "seed")
    rng = random.Random(seed)
    out = []
    for i in range(n):
        question, answer = _smoke_problem(rng)
        out.append(MathProblem(question, str(answer), SMOKE_SOURCE, f"smoke-{seed}-{i}"))
    return out


def write_smoke_files(out_dir: str | Path, *, n_train: int = 256, n_val: int = 64, seed: int = 0
                      ) -> tuple[Path, Path]:
    """Write GSM8K-style ``train.jsonl`` and ``val.jsonl`` (``question``, ``answer`` = '... #### N')."""
    seed = whole_number(seed, "seed")
    splits = (("train", smoke_problems(n_train, seed)), ("val", smoke_problems(n_val, seed + 1)))  # checked first
    d = Path(out_dir)
    if d.exists() and not d.is_dir():
        raise ValueError(f"out_dir {str(d)!r} is a file, not a folder")
    d.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, problems in splits:
        path = d / f"{name}.jsonl"
        with path.open("w", encoding="utf-8") as f:
            for p in problems:
                f.write(json.dumps({"question": p.question, "answer": f"#### {p.answer}",
                                    "data_source": p.source, "id": p.id}) + "\n")
        paths.append(path)
    return paths[0], paths[1]


def main(argv: Sequence[str] | None = None) -> None:
    ap = _Parser(prog="python -m envs.math", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    pr = sub.add_parser("prepare", help="a GSM8K/MATH500/AIME/AMC file -> verl parquet with the Qwen-Math template")
    pr.add_argument("input")
    pr.add_argument("output")
    pr.add_argument("--source", default=None, help="data_source name (default: from the file)")
    pr.add_argument("--split", default="train")
    sm = sub.add_parser("smoke", help="write a generated train.jsonl / val.jsonl pair")
    sm.add_argument("out_dir")
    sm.add_argument("--n-train", type=_count, default=256)
    sm.add_argument("--n-val", type=_count, default=64)
    sm.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    # bad input (a missing or unreadable file, an output that is a folder): one line, exit status 2
    try:
        if args.cmd == "prepare":
            out = Path(args.output)
            if not args.output.strip() or out.is_dir():
                raise ValueError(f"output {args.output!r} must be a file path for the parquet, not a folder")
            problems = load_math_problems(args.input, source=args.source)
            print(write_verl_parquet(problems, args.output, split=args.split), f"({len(problems)} problems)")
        else:
            for p in write_smoke_files(args.out_dir, n_train=args.n_train, n_val=args.n_val, seed=args.seed):
                print(p)
    except (ValueError, FileNotFoundError) as err:
        ap.exit(2, f"{ap.prog}: error: {' '.join(str(err).split())}\n")


class _Parser(argparse.ArgumentParser):
    """Errors as one line (``prog: error: ...``), exit status 2, like the ``setpo`` commands."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value}")
    return value


if __name__ == "__main__":
    main()


__all__ = [
    "QWEN_MATH_SYSTEM_PROMPT", "MathProblem", "extract_boxed", "is_verl_parquet",
    "load_math_problems", "math_reward", "qwen_math_messages", "qwen_math_prompt",
    "smoke_problems", "to_trl_records", "to_verl_rows", "verl_compute_score", "write_smoke_files",
    "write_verl_parquet",
]
