"""TRL reward functions over the environments' checkers.

TRL calls a reward function with the batch's completions (texts, or conversational lists of messages) and
the dataset's other columns as keyword arguments, one value per completion. These adapters turn that call
into the environments' own scorers, which take plain text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from envs.countdown import score_answer
from envs.math import math_reward
from setpo.completions import completion_text


def _same_lengths(**columns: Sequence) -> None:
    lengths = {name: len(col) for name, col in columns.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"one value per completion is needed; got lengths {lengths}")


def countdown_reward(completions, numbers, target, **_: Any) -> list[float]:
    """``envs.countdown.score_answer`` over a batch (1.0 correct, 0.1 well-formed, 0.0 no answer).

    numbers, target: the dataset columns ``envs.countdown.export_parquet(style="trl")`` writes.
    """
    _same_lengths(completions=completions, numbers=numbers, target=target)
    return [score_answer(completion_text(c), list(n), t) for c, n, t in zip(completions, numbers, target)]


def math_reward_func(completions: Sequence[Any], answer: Sequence[str], **_: Any) -> list[float]:
    """``envs.math.math_reward`` over a batch; ``answer`` is the dataset column of that name."""
    _same_lengths(completions=completions, answer=answer)
    return [math_reward(completion_text(c), a) for c, a in zip(completions, answer)]
