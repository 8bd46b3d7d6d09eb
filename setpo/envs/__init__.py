"""Gymnasium environments for setpo, registered on import:

- ``setpo/MultiModalBandit-v0``: the paper's Figure 1 world (``setpo.envs.bandit``).
- ``setpo/Countdown-v0``: the Countdown arithmetic task over text (``setpo.envs.countdown``).

Also here without an environment: ``setpo.envs.math`` (GSM8K-style problems), ``setpo.envs.short_answers`` (generated
short-answer number tasks), ``setpo.envs.rubric``.
"""

import gymnasium as gym


def register_envs() -> None:
    """Register the environments with gymnasium (idempotent)."""
    specs = {
        "setpo/MultiModalBandit-v0": "setpo.envs.bandit:MultiModalBanditEnv",
        "setpo/Countdown-v0": "setpo.envs.countdown:CountdownEnv",
    }
    for env_id, entry_point in specs.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry_point)


register_envs()
