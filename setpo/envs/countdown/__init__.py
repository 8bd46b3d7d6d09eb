"""Countdown: reach a target with 3-4 numbers and + - * /, as in the public TinyZero convention.

One job a module:

- ``verifier``: the safe scorer (``score_answer``: 1.0 / 0.1 / 0.0, never executes model text), answer
  extraction, canonical forms (what "distinct solution" means), prompts, verl's reward signature;
- ``solver``: every distinct solution of an instance, seeded instance generation and disjoint splits;
- ``env``: ``CountdownEnv``, the one-step gymnasium text environment (``setpo/Countdown-v0``);
- ``data``: parquet for TRL and verl, and a local copy of the public Countdown-Tasks-3to4.

Everything public is importable from ``setpo.envs.countdown`` directly.
"""

from setpo.envs.countdown.data import COUNTDOWN_TASKS_HELP, export_parquet, load_countdown_tasks
from setpo.envs.countdown.env import CountdownEnv
from setpo.envs.countdown.solver import CountdownInstance, generate_instances, make_splits, solve
from setpo.envs.countdown.verifier import (
    CORRECT_REWARD,
    FORMAT_REWARD,
    NO_ANSWER_REWARD,
    canonical_form,
    correct_canonical_form,
    distinct_correct_solutions,
    extract_answer,
    make_prompt,
    score_answer,
    verl_compute_score,
)

__all__ = [
    "CORRECT_REWARD",
    "COUNTDOWN_TASKS_HELP",
    "FORMAT_REWARD",
    "NO_ANSWER_REWARD",
    "CountdownEnv",
    "CountdownInstance",
    "canonical_form",
    "correct_canonical_form",
    "distinct_correct_solutions",
    "export_parquet",
    "extract_answer",
    "generate_instances",
    "load_countdown_tasks",
    "make_prompt",
    "make_splits",
    "score_answer",
    "solve",
    "verl_compute_score",
]
