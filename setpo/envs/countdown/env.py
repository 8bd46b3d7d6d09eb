"""Countdown as a one-step gymnasium text environment."""

from __future__ import annotations

import string
from collections.abc import Iterable, Mapping
from typing import Sequence

import gymnasium as gym

from setpo.envs._checks import check_options, check_seed, whole_number
from setpo.envs.countdown.solver import CountdownInstance, generate_instances
from setpo.envs.countdown.verifier import CORRECT_REWARD, check_instance, extract_answer, make_prompt, score_answer

# Prompts are ASCII; a completion may hold any character, but the declared action space (what
# ``action_space.sample()`` draws) is printable ASCII, and ``step`` accepts any string.
_TEXT_CHARSET = string.printable


def _instance(inst, i: int) -> CountdownInstance:
    """One problem of ``instances``: a CountdownInstance or a (numbers, target) pair, checked."""
    if isinstance(inst, CountdownInstance):  # a dataclass takes anything: checked here, naming the instance
        try:
            check_instance(inst.numbers, inst.target)
        except ValueError as err:
            raise ValueError(f"instances[{i}]: {err}") from None
        return inst
    if isinstance(inst, (str, bytes)) or not isinstance(inst, Iterable):
        raise ValueError(f"instances[{i}] must be a CountdownInstance or a (numbers, target) pair, got "
                         f"{type(inst).__name__}")
    pair = list(inst)
    if len(pair) != 2:
        raise ValueError(f"instances[{i}] must be a (numbers, target) pair, got {len(pair)} items")
    try:
        return CountdownInstance(*check_instance(*pair))
    except ValueError as err:
        raise ValueError(f"instances[{i}]: {err}") from None


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
        max_prompt_chars = whole_number(max_prompt_chars, "max_prompt_chars", 1)
        max_completion_chars = whole_number(max_completion_chars, "max_completion_chars", 1)
        if instances is None:
            instances = generate_instances(n_instances, instance_seed, num_numbers=num_numbers)
        if isinstance(instances, (str, bytes, Mapping)) or not isinstance(instances, Iterable):
            raise ValueError(f"instances must be a sequence of CountdownInstance or (numbers, target) pairs, got "
                             f"{type(instances).__name__}")
        self.instances = [_instance(inst, i) for i, inst in enumerate(instances)]
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
        # everything is checked before the generator is reseeded, so a refused call changes nothing
        seed = check_seed(seed)
        options = check_options(options, ("index",))
        index = None
        if "index" in options:
            index = whole_number(options["index"], "options['index']", 0, len(self.instances))
        super().reset(seed=seed)
        if index is not None:
            self._index = index
        else:
            self._index = int(self.np_random.integers(len(self.instances)))
        self._done = False
        return self._prompts[self._index], self._info()

    def step(self, action: str):
        if self._done:
            raise gym.error.ResetNeeded("call reset() before step(): Countdown episodes last one step")
        if not isinstance(action, str):
            raise ValueError(f"action must be the completion text, a str (any length); got {type(action).__name__}")
        inst = self.instances[self._index]
        reward = score_answer(action, inst.numbers, inst.target)
        self._done = True
        info = self._info()
        info.update(answer=extract_answer(action), correct=reward == CORRECT_REWARD)
        return self._prompts[self._index], float(reward), True, False, info
