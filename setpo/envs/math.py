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

Reward (``math_reward``, in ``setpo.envs.math_answers``, re-exported here). The completion's final answer
(``final_answer``: its last ``\\boxed{}``, else its last stated answer such as "the answer is 18", else its last
inline LaTeX span) is compared with the gold answer by ``math_verify.verify``, after cheap checks that keep the
parse bounded in time; model text is never executed. ``setpo.envs.math_answers`` says why each rule is there.

Data in the repository. ``data/gsm8k/{train,test}.parquet``: GSM8K (MIT) in verl's layout with this template
(``data/gsm8k/SOURCE.md``); ``gsm8k_file(split)`` is its path.

Smoke data. ``smoke_problems(n, seed)`` generates small arithmetic word problems with integer answers (two
operations each), for end-to-end runs on a CPU; ``write_smoke_files`` writes them as GSM8K-style jsonl.

Command line (``python -m setpo.envs.math``): ``prepare IN OUT.parquet`` writes verl's parquet layout with our
template; ``smoke OUT_DIR`` writes a generated train/val pair.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from setpo.envs._checks import whole_number
from setpo.envs.arguments import Parser, positive_int
# the answer checker lives in setpo.envs.math_answers; these names are the math task's API, here as before
from setpo.envs.math_answers import (LOG_CHARS, MAX_ANSWER_CHARS, UNBOXED_TAIL_CHARS, answer_too_costly,  # noqa: F401
                               clean_answer, extract_boxed, final_answer, math_reward, normalize_answer,
                               verl_compute_score)

QWEN_MATH_SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."

#: verl's ``ability`` column and the default ``data_source`` of generated problems.
ABILITY = "math"
SMOKE_SOURCE = "setpo/arithmetic-smoke"

_QUESTION_KEYS = ("question", "problem", "Question", "Problem", "query")
_ANSWER_KEYS = ("answer", "Answer", "final_answer", "ground_truth", "target")
_SOLUTION_KEYS = ("solution", "Solution")

#: GSM8K as this repository ships it (``data/gsm8k``, verl parquet; see its SOURCE.md).
GSM8K_DIR = Path(__file__).resolve().parents[2] / "data" / "gsm8k"

HOW_TO_GET_DATA = (
    "Data is read from local files only. Pass a .parquet, .jsonl or .json file with question/answer columns, "
    "e.g. the repository's GSM8K (TRAIN_FILE=data/gsm8k/train.parquet, VAL_FILE=data/gsm8k/test.parquet), MATH500 "
    "from "
    "`huggingface-cli download --repo-type dataset HuggingFaceH4/MATH-500 --local-dir <dir>`, or "
    "generate a smoke set with `python -m setpo.envs.math smoke data/smoke`."
)


@dataclass(frozen=True)
class MathProblem:
    """One problem: the question text, its final answer (a LaTeX string), where it came from, its row id."""

    question: str
    answer: str
    source: str
    id: str


def gsm8k_file(split: str) -> Path:
    """``data/gsm8k/{split}.parquet`` of this repository (split "train" or "test"); a FileNotFoundError when this
    is an installed copy without the repository's data folder."""
    if split not in ("train", "test"):
        raise ValueError(f"GSM8K split must be 'train' or 'test', got {split!r}")
    path = GSM8K_DIR / f"{split}.parquet"
    if not path.is_file():
        raise FileNotFoundError(f"no {path}: GSM8K ships in the repository's data/gsm8k folder; run from a clone")
    return path


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
        return str(question), clean_answer(answer)
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
    answer = clean_answer(answer)
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
    ap = Parser(prog="python -m setpo.envs.math", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    pr = sub.add_parser("prepare", help="a GSM8K/MATH500/AIME/AMC file -> verl parquet with the Qwen-Math template")
    pr.add_argument("input")
    pr.add_argument("output")
    pr.add_argument("--source", default=None, help="data_source name (default: from the file)")
    pr.add_argument("--split", default="train")
    sm = sub.add_parser("smoke", help="write a generated train.jsonl / val.jsonl pair")
    sm.add_argument("out_dir")
    sm.add_argument("--n-train", type=positive_int, default=256)
    sm.add_argument("--n-val", type=positive_int, default=64)
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


if __name__ == "__main__":
    main()


__all__ = [
    "GSM8K_DIR", "QWEN_MATH_SYSTEM_PROMPT", "MathProblem", "gsm8k_file", "extract_boxed", "final_answer",
    "is_verl_parquet", "normalize_answer",
    "load_math_problems", "math_reward", "qwen_math_messages", "qwen_math_prompt",
    "smoke_problems", "to_trl_records", "to_verl_rows", "verl_compute_score", "write_smoke_files",
    "write_verl_parquet",
]
