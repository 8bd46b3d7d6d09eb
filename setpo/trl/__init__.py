"""SetPO and SetGRPO on TRL (one machine, CPU or GPU).

- ``config``: ``SetPOConfig`` / ``SetPOGSPOConfig`` / ``SetPODAPOConfig`` (``GRPOConfig`` with the paper's
  presets) and ``config_for(preset)``;
- ``trainer``: ``SetPOTrainer``, TRL's ``GRPOTrainer`` plus λ·s_i after TRL's own normalisation;
- ``setgrpo_trainer``: ``SetGRPOTrainer``, SetGRPO's calibrated coefficients in place of TRL's advantages;
- ``rewards``: TRL reward functions over the environments' checkers (Countdown, math, short answers);
- ``training``: a trainer run as a resumable study stage (checkpoints, records, probes of the policy);
- ``shared_prefix``: the loss's forward pass with one prompt pass per distinct prompt (``setpo_share_prompt_pass``).
"""

import importlib
from typing import Any

# Lazy exports: importing a light submodule (``setpo.trl.rewards``) must not pull in TRL and transformers.
_SOURCES = {
    "TRL_LOSS_TYPE": "config",
    "SetPOConfig": "config",
    "SetPODAPOConfig": "config",
    "SetPOGSPOConfig": "config",
    "config_for": "config",
    "countdown_reward": "rewards",
    "math_reward_func": "rewards",
    "short_answer_reward": "rewards",
    "SetGRPOTrainer": "setgrpo_trainer",
    "SetPOTrainer": "trainer",
    "gather_embeddings": "trainer",
    "group_diversity_stats": "trainer",
    "last_checkpoint": "training",
    "probe_callback": "training",
    "quiet_libraries": "training",
    "train_resumable": "training",
}

__all__ = list(_SOURCES)


def __getattr__(name: str) -> Any:
    if name not in _SOURCES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_SOURCES[name]}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
