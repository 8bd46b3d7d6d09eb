"""TRL reward functions over the environments' checkers.

TRL calls a reward function with the batch's completions (texts, or conversational lists of messages) and
the dataset's other columns as keyword arguments, one value per completion. These adapters turn that call
into the environments' own scorers, which take plain text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from setpo.envs.countdown import score_answer
from setpo.envs.math import math_reward
from setpo.envs.short_answers import score_answer as score_short_answer
from setpo.envs.short_answers import task_from_id
from setpo.completions import completion_text


def _same_lengths(**columns: Sequence) -> None:
    lengths = {name: len(col) for name, col in columns.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"one value per completion is needed; got lengths {lengths}")


def _need_columns(reward: str, given: dict[str, Any], extra: dict[str, Any]) -> None:
    """A dataset without the columns a reward reads is a ValueError naming them (TRL passes the columns as
    keyword arguments, so a missing one would be a TypeError about a function signature)."""
    missing = [name for name, value in given.items() if value is None]
    if missing:
        have = sorted(k for k in extra if k not in ("prompts", "completion_ids", "trainer_state", "log_extra",
                                                    "log_metric"))
        raise ValueError(f"{reward} needs the dataset column(s) {missing}; the batch has {have}")


def countdown_reward(completions, numbers=None, target=None, **columns: Any) -> list[float]:
    """``setpo.envs.countdown.score_answer`` over a batch (1.0 correct, 0.1 well-formed, 0.0 no answer).

    numbers, target: the dataset columns ``setpo.envs.countdown.export_parquet(style="trl")`` writes.
    """
    _need_columns("countdown_reward", {"numbers": numbers, "target": target}, columns)
    _same_lengths(completions=completions, numbers=numbers, target=target)
    return [score_answer(completion_text(c), list(n), t) for c, n, t in zip(completions, numbers, target)]


def math_reward_func(completions: Sequence[Any], answer: Sequence[str] = None, **columns: Any) -> list[float]:
    """``setpo.envs.math.math_reward`` over a batch; ``answer`` is the dataset column of that name."""
    _need_columns("math_reward_func", {"answer": answer}, columns)
    _same_lengths(completions=completions, answer=answer)
    return [math_reward(completion_text(c), a) for c, a in zip(completions, answer)]


def short_answer_reward(completions: Sequence[Any], task_id: Sequence[str] = None, **columns: Any) -> list[float]:
    """``setpo.envs.short_answers.score_answer`` over a batch (1.0 for a right ``Answer: N`` line, else 0.0);
    ``task_id`` is the dataset column ``setpo.envs.short_answers.to_trl_records`` writes. A chat completion is read
    like every other reward's (``completion_text``: all messages, text blocks included)."""
    _need_columns("short_answer_reward", {"task_id": task_id}, columns)
    _same_lengths(completions=completions, task_id=task_id)
    return [score_short_answer(completion_text(c), task_from_id(t)) for c, t in zip(completions, task_id)]
