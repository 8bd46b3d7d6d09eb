"""Short-answer number tasks for a small language model: generated prompts, a train / validation / test split by
prompt, and a 0/1 checker that never executes model text.

Two families, chosen so that a 135M-parameter instruct model is right on some but not all samples (its base
rates are measured by ``python -m setpo_lab run short_answers_base``; see docs/studies/short_answers.md):

- **many right answers per prompt**, where mode collapse shows as the number of *distinct* right answers a
  policy still gives to one prompt:
  ``between`` ("Name a number between 23 and 41.") and ``multiple`` ("Name a multiple of 5 between 12 and 45.");
  and three whose templates the study never trains on (``UNTRAINED_MANY_ANSWER_KINDS``), to see whether diversity
  kept on the trained ones carries over: ``odd`` ("Name an odd number between 23 and 41."), ``ends_in`` ("Name a
  number between 23 and 81 that ends in 7.") and ``above`` ("Name a number greater than 23 and less than 41.");
- **one right answer per prompt**, in graded difficulty, where pass@k against the base model applies:
  ``add_1x1`` (3 + 4), ``add_2x1`` (23 + 4), ``add_2x2`` (23 + 41) and ``times_1x1`` (3 times 4); and harder ones
  (``HARD_ONE_ANSWER_KINDS``: ``add_3x2`` 347 + 28, ``add_3x3`` 347 + 281, ``times_2x1`` 37 times 6, ``times_2x2``
  23 times 17), where a small model is right on few samples, so that pass@k at large k has room above the base
  model (chosen by measuring it: docs/studies/short_answers.md).

Prompt. A system message asks for one line ``Answer: <number>``, and one worked example of the same kind (a
user turn and the assistant's ``Answer: ...`` turn) comes before the question (``task_messages``). The
examples lie outside every split.

Answer (``parse_answer``): the completion's first line must read ``Answer: N`` with one whole number N (an
optional sign and a final full stop allowed, at most ``MAX_DIGITS`` digits); anything else (no ``Answer:``,
several numbers, words, an empty reply) is no answer and scores 0. ``score_answer`` gives 1.0 for a right N.

Split. Every kind enumerates all its prompts; each prompt's split is fixed by a hash of its text
(``split_of``): 70% train, 10% validation, 20% test, so the splits are disjoint by prompt and do not depend on
which kinds or how many prompts a study draws.

Task ids (``TaskSpec.task_id``, e.g. ``"between:23:41"``, ``"multiple:5:12:45"``, ``"add_2x1:23:4"``) carry all a
checker needs, so a trainer's dataset column can rebuild the task (``task_from_id``).
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from setpo.envs._checks import whole_number

SYSTEM_PROMPT = "You are a helpful assistant. Reply with one line: 'Answer: ' followed by the answer."
"""The system message of every prompt."""

MAX_DIGITS = 9
"""Most digits an answer may have: a right answer here has at most 3, and the bound keeps ``int()`` cheap."""
#: characters of a completion's first line that are read at all (the answer line is short)
MAX_LINE_CHARS = 200

MANY_ANSWER_KINDS = ("between", "multiple")
"""Kinds with many right answers per prompt that the study trains on."""
UNTRAINED_MANY_ANSWER_KINDS = ("odd", "ends_in", "above")
"""Kinds with many right answers per prompt whose templates no training pool holds: evaluation only (the
confirmatory plan, results/short_answers/confirm/PLAN.md, keeps those the base model's train split qualifies)."""
ONE_ANSWER_KINDS = ("add_1x1", "add_2x1", "add_2x2", "times_1x1")
"""Kinds with one right answer per prompt, easiest first by operand size."""
STUDY_KINDS = MANY_ANSWER_KINDS + ONE_ANSWER_KINDS
"""The kinds the short-answer study trains on (and the base table's first measurement)."""
HARD_ONE_ANSWER_KINDS = ("add_3x2", "add_3x3", "times_2x1", "times_2x2")
"""Harder one-answer kinds, for pass@k at large k (a base model right on few samples)."""
KINDS = STUDY_KINDS + HARD_ONE_ANSWER_KINDS + UNTRAINED_MANY_ANSWER_KINDS
"""Every task kind."""
SPLITS = ("train", "val", "test")
"""The splits, disjoint by prompt (``split_of``)."""

EXAMPLES = {
    "between": ("Name a number between 10 and 20.", "Answer: 14"),
    "multiple": ("Name a multiple of 5 between 10 and 40.", "Answer: 25"),
    "add_1x1": ("What is 2 + 3?", "Answer: 5"),
    "add_2x1": ("What is 60 + 3?", "Answer: 63"),
    "add_2x2": ("What is 61 + 13?", "Answer: 74"),
    "times_1x1": ("What is 1 times 3?", "Answer: 3"),
    "add_3x2": ("What is 500 + 12?", "Answer: 512"),
    "add_3x3": ("What is 500 + 120?", "Answer: 620"),
    "times_2x1": ("What is 10 times 3?", "Answer: 30"),
    "times_2x2": ("What is 10 times 12?", "Answer: 120"),
    "odd": ("Name an odd number between 10 and 20.", "Answer: 13"),
    "ends_in": ("Name a number between 10 and 50 that ends in 7.", "Answer: 27"),
    "above": ("Name a number greater than 10 and less than 20.", "Answer: 16"),
}
"""The worked example shown before each question of a kind: (question, assistant turn); never itself a task."""

_ANSWER_LINE = re.compile(r"\s*answer\s*:\s*([+-]?\d{1,%d})\s*\.?\s*" % MAX_DIGITS, re.IGNORECASE)


@dataclass(frozen=True)
class TaskSpec:
    """One prompt. Right answers: the integers v with ``low <= v <= high`` and ``v % step == residue``; a one-answer
    task has ``low == high`` (and step 1)."""

    kind: str
    low: int
    high: int
    step: int = 1
    operands: tuple[int, int] = ()
    residue: int = 0

    def __post_init__(self):
        # a spec built by hand was taken unchecked: step=0 made every check a ZeroDivisionError, and an unknown kind
        # read as an addition ("What is 1 + 10?")
        _check_kind(self.kind)
        for name in ("low", "high", "step", "residue"):
            whole_number(getattr(self, name), f"TaskSpec.{name}")
        if self.step < 1 or not 0 <= self.residue < self.step or self.low > self.high:
            raise ValueError(f"TaskSpec needs step >= 1, 0 <= residue < step and low <= high, got step={self.step}, "
                             f"residue={self.residue}, low={self.low}, high={self.high}")

    @property
    def question(self) -> str:
        a, b = self.operands or (self.low, self.high)
        if self.kind == "between":
            return f"Name a number between {self.low} and {self.high}."
        if self.kind == "multiple":
            return f"Name a multiple of {self.step} between {self.low} and {self.high}."
        if self.kind == "odd":
            return f"Name an odd number between {self.low} and {self.high}."
        if self.kind == "ends_in":
            return f"Name a number between {self.low} and {self.high} that ends in {self.residue}."
        if self.kind == "above":
            return f"Name a number greater than {a} and less than {b}."
        if self.kind.startswith("times_"):
            return f"What is {a} times {b}?"
        return f"What is {a} + {b}?"

    @property
    def task_id(self) -> str:
        if self.kind in ("between", "odd"):
            parts = (self.low, self.high)
        elif self.kind == "multiple":
            parts = (self.step, self.low, self.high)
        elif self.kind == "ends_in":
            parts = (self.residue, self.low, self.high)
        else:
            parts = self.operands
        return ":".join([self.kind, *map(str, parts)])

    @property
    def many_answers(self) -> bool:
        return self.kind in MANY_ANSWER_KINDS or self.kind in UNTRAINED_MANY_ANSWER_KINDS

    def is_right(self, value: int | None) -> bool:
        return value is not None and self.low <= value <= self.high and value % self.step == self.residue

    @property
    def right_answers(self) -> int:
        """How many integers are right (1 for a one-answer task)."""
        return (self.high - self.residue) // self.step - (self.low - 1 - self.residue) // self.step


def _between(a: int, b: int) -> TaskSpec:
    return TaskSpec("between", a, b)


def _multiple(c: int, a: int, b: int) -> TaskSpec:
    return TaskSpec("multiple", a, b, c)


def _odd(a: int, b: int) -> TaskSpec:
    return TaskSpec("odd", a, b, 2, residue=1)


def _ends_in(d: int, a: int, b: int) -> TaskSpec:
    return TaskSpec("ends_in", a, b, 10, residue=d)


def _above(a: int, b: int) -> TaskSpec:
    """Greater than a and less than b: the right answers are a + 1 .. b - 1."""
    return TaskSpec("above", a + 1, b - 1, 1, (a, b))


def _sum(kind: str, a: int, b: int) -> TaskSpec:
    return TaskSpec(kind, a + b, a + b, 1, (a, b))


def _product(kind: str, a: int, b: int) -> TaskSpec:
    return TaskSpec(kind, a * b, a * b, 1, (a, b))


@lru_cache(maxsize=None)
def _universe(kind: str) -> tuple[TaskSpec, ...]:
    """Every prompt of ``kind``, in a fixed order."""
    if kind == "between":
        specs = [_between(a, a + w) for a in range(5, 41) for w in range(10, 31)]
    elif kind == "multiple":
        specs = [_multiple(c, a, a + w) for c in (2, 3, 5, 10) for a in range(5, 41) for w in range(20, 41)]
    elif kind == "add_1x1":
        specs = [_sum(kind, a, b) for a in range(1, 10) for b in range(1, 10)]
    elif kind == "add_2x1":
        specs = [_sum(kind, a, b) for a in range(10, 50) for b in range(1, 10)]
    elif kind == "add_2x2":
        specs = [_sum(kind, a, b) for a in range(10, 50) for b in range(10, 50)]
    elif kind == "times_1x1":
        specs = [_product(kind, a, b) for a in range(2, 10) for b in range(2, 10)]
    elif kind == "add_3x2":
        specs = [_sum(kind, a, b) for a in range(101, 500, 7) for b in range(11, 100, 3)]
    elif kind == "add_3x3":
        specs = [_sum(kind, a, b) for a in range(101, 500, 7) for b in range(101, 500, 11)]
    elif kind == "times_2x1":
        specs = [_product(kind, a, b) for a in range(11, 100) for b in range(3, 10)]
    elif kind == "times_2x2":
        specs = [_product(kind, a, b) for a in range(11, 40) for b in range(11, 40)]
    elif kind == "odd":
        specs = [_odd(a, a + w) for a in range(5, 41) for w in range(10, 31)]
    elif kind == "ends_in":
        specs = [_ends_in(d, a, a + w) for d in range(1, 10) for a in range(5, 41) for w in range(30, 61, 5)]
    elif kind == "above":
        specs = [_above(a, a + w) for a in range(5, 41) for w in range(10, 31)]
    else:
        raise ValueError(f"unknown task kind {kind!r}; kinds: {', '.join(KINDS)}")
    shown = EXAMPLES[kind][0]
    return tuple(s for s in specs if s.question != shown)


@lru_cache(maxsize=None)
def _by_id(kind: str) -> dict[str, TaskSpec]:
    return {s.task_id: s for s in _universe(kind)}


def split_of(question: str) -> str:
    """The split a prompt belongs to, from a hash of its text: 70% train, 10% val, 20% test."""
    if not isinstance(question, str):
        raise ValueError(f"question must be a str, got {type(question).__name__}")
    bucket = int.from_bytes(hashlib.sha256(question.encode()).digest()[:4], "big") % 10
    return "train" if bucket < 7 else "val" if bucket < 8 else "test"


def _check_task(task) -> "TaskSpec":
    """A ValueError unless ``task`` is a TaskSpec (a task id string failed as "'str' object has no attribute")."""
    if not isinstance(task, TaskSpec):
        hint = "; build it with task_from_id(...)" if isinstance(task, str) else ""
        raise ValueError(f"task must be a TaskSpec, got {type(task).__name__} {task!r:.60}{hint}")
    return task


def _check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown task kind {kind!r}; kinds: {', '.join(KINDS)}")
    return kind


def tasks_of(kind: str, split: str) -> list[TaskSpec]:
    """All prompts of ``kind`` in ``split`` ('train', 'val' or 'test'), in a fixed order."""
    _check_kind(kind)
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; splits: {', '.join(SPLITS)}")
    return [s for s in _universe(kind) if split_of(s.question) == split]


def sample_tasks(kinds: Iterable[str], split: str, per_kind: int, seed: int = 0) -> list[TaskSpec]:
    """``per_kind`` prompts of each kind from ``split``, drawn without replacement (reproducible from ``seed``),
    kinds in the order given."""
    per_kind, seed = whole_number(per_kind, "per_kind", 1), whole_number(seed, "seed")
    if isinstance(kinds, str):  # would be read letter by letter
        raise ValueError(f"kinds must be a list of task kinds, got the string {kinds!r}; write [{kinds!r}]")
    if not isinstance(kinds, Iterable):
        raise ValueError(f"kinds must be a list of task kinds, got {type(kinds).__name__}")
    out = []
    for kind in kinds:
        pool = tasks_of(kind, split)
        if per_kind > len(pool):
            raise ValueError(f"per_kind={per_kind} but kind {kind!r} has only {len(pool)} {split} prompts")
        rng = random.Random(f"{seed}:{kind}:{split}")
        out += rng.sample(pool, per_kind)
    return out


def task_from_id(task_id: str) -> TaskSpec:
    """The task a ``TaskSpec.task_id`` names; a ValueError for an id no kind makes."""
    if not isinstance(task_id, str):
        raise ValueError(f"task_id must be a string, got {type(task_id).__name__}")
    kind, *parts = task_id.split(":")
    _check_kind(kind)
    try:
        nums = [int(p) for p in parts if len(p) <= MAX_DIGITS]
    except ValueError:
        nums = []
    builders = {"between": (2, _between), "multiple": (3, _multiple), "odd": (2, _odd), "ends_in": (3, _ends_in),
                "above": (2, _above)}
    arity, build = builders.get(kind, (2, lambda a, b: (_product if kind.startswith("times_") else _sum)(kind, a, b)))
    if len(nums) != arity or len(parts) != arity:
        raise ValueError(f"malformed task id {task_id!r}")
    spec = _by_id(kind).get(":".join([kind, *map(str, nums)]))
    if spec is None or spec != build(*nums):
        raise ValueError(f"task id {task_id!r} is not a prompt of kind {kind!r}")
    return spec


def task_messages(task: TaskSpec) -> list[dict[str, str]]:
    """The chat prompt: the system message, the kind's worked example, then the question."""
    shown, reply = EXAMPLES[_check_task(task).kind]
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": shown},
            {"role": "assistant", "content": reply}, {"role": "user", "content": task.question}]


def parse_answer(text) -> int | None:
    """The number N of a first line ``Answer: N`` (one whole number, at most ``MAX_DIGITS`` digits, an optional
    final full stop); None for anything else, including non-strings."""
    if not isinstance(text, str):
        return None
    line = text[:MAX_LINE_CHARS].lstrip().split("\n", 1)[0]
    match = _ANSWER_LINE.fullmatch(line)
    return int(match.group(1)) if match else None


def text_after_answer(text) -> str:
    """What a completion says after its first line, stripped: text the checker never reads ("" for none, and
    for non-strings). The reward cannot see it, but an embedder of whole completions does."""
    if not isinstance(text, str):
        return ""
    return text.lstrip().partition("\n")[2].strip()


def answer_key(text) -> str | None:
    """The answer the checker reads, as text ("30" for "Answer: 30."), or None when there is none: what SetPO's
    kernel reads with ``kernel_reads="answer"`` (the answer reader ``setpo.envs.short_answers:answer_key``)."""
    value = parse_answer(text)
    return None if value is None else str(value)


def score_answer(text, task: TaskSpec) -> float:
    """1.0 when the completion's answer (``parse_answer``) is right for ``task``, else 0.0."""
    return 1.0 if _check_task(task).is_right(parse_answer(text)) else 0.0


def right_answer(text, task: TaskSpec) -> int | None:
    """The completion's answer when it is right, else None (the key that counts distinct right answers)."""
    value = parse_answer(text)
    return value if _check_task(task).is_right(value) else None


def to_trl_records(tasks: Sequence[TaskSpec]) -> list[dict]:
    """TRL prompt-dataset rows: ``prompt`` (chat messages), ``task_id`` and ``kind`` (columns TRL passes to
    reward functions)."""
    if isinstance(tasks, (str, bytes)) or not isinstance(tasks, Iterable):
        raise ValueError(f"tasks must be a sequence of TaskSpec, got {type(tasks).__name__}")
    return [{"prompt": task_messages(t), "task_id": t.task_id, "kind": t.kind} for t in tasks]


__all__ = [
    "EXAMPLES", "HARD_ONE_ANSWER_KINDS", "KINDS", "MANY_ANSWER_KINDS", "MAX_DIGITS", "ONE_ANSWER_KINDS", "SPLITS",
    "STUDY_KINDS", "SYSTEM_PROMPT", "UNTRAINED_MANY_ANSWER_KINDS",
    "TaskSpec", "answer_key", "parse_answer", "right_answer", "sample_tasks", "score_answer",
    "split_of", "task_from_id", "task_messages", "tasks_of", "to_trl_records",
]
