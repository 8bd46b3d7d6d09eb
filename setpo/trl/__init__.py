"""SetPO and SetGRPO on TRL (one machine, CPU or GPU).

- ``config``: ``SetPOConfig`` / ``SetPOGSPOConfig`` / ``SetPODAPOConfig`` (``GRPOConfig`` with the paper's
  presets) and ``config_for(preset)``;
- ``trainer``: ``SetPOTrainer``, TRL's ``GRPOTrainer`` plus λ·s_i after TRL's own normalisation;
- ``setgrpo_trainer``: ``SetGRPOTrainer``, SetGRPO's calibrated coefficients in place of TRL's advantages;
- ``rewards``: TRL reward functions over the environments' checkers (Countdown, math);
- ``training``: a trainer run as a resumable study stage (checkpoints, records, probes of the policy).
"""

from setpo.trl.config import TRL_LOSS_TYPE, SetPOConfig, SetPODAPOConfig, SetPOGSPOConfig, config_for
from setpo.trl.rewards import countdown_reward, math_reward_func
from setpo.trl.setgrpo_trainer import SetGRPOTrainer
from setpo.trl.trainer import SetPOTrainer, gather_embeddings, group_diversity_stats
from setpo.trl.training import last_checkpoint, probe_callback, quiet_libraries, train_resumable

__all__ = [
    "TRL_LOSS_TYPE",
    "SetGRPOTrainer",
    "SetPOConfig",
    "SetPODAPOConfig",
    "SetPOGSPOConfig",
    "SetPOTrainer",
    "config_for",
    "countdown_reward",
    "gather_embeddings",
    "group_diversity_stats",
    "last_checkpoint",
    "math_reward_func",
    "probe_callback",
    "quiet_libraries",
    "train_resumable",
]
