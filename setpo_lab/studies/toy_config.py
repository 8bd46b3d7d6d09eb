"""The toy study's configuration: one training run's every knob (``ToyConfig``, CleanRL style), the fields a
resumed run may change, and the study around it (``ToyStudyConfig``: the seeds, the folder, the projection of
Figure 1)."""

from __future__ import annotations

from dataclasses import dataclass, field

from setpo.envs.bandit import BanditConfig
from setpo.groups import check_real


@dataclass
class ToyConfig:
    algo: str = "grpo"             # policy-loss preset from setpo.presets: grpo | gspo | dapo
    setpo: bool = False            # add λ·s_i (SetPO) to the base advantage
    lam: float = 0.5               # SetPO marginal weight λ on this toy (docs/studies/toy.md: the sweep)
    estimator: str = "grpo"        # base group advantage, a key of setpo.ADVANTAGE_ESTIMATORS
    group_size: int = 8            # G rollouts per prompt
    groups_per_step: int = 16      # prompts (groups) per batch
    steps: int = 200               # training steps (batches)
    updates_per_batch: int = 2     # optimiser steps per batch; the second sees ratios != 1, so clipping acts
    lr: float = 0.01               # Adam learning rate
    hidden: int = 64               # policy MLP width
    kl_coef: float = 0.0           # β for the k3 KL to the initial policy
    max_resample: int = 4          # DAPO dynamic sampling: extra batches drawn to refill dropped groups
    seed: int = 0                  # policy init and sampling
    bandit: BanditConfig = field(default_factory=BanditConfig)
    snapshot_every: int = 50       # record sampled embeddings for the trajectory plot every this many steps
    snapshot_samples: int = 160    # trajectories per snapshot
    checkpoint_dir: str | None = None  # save here every checkpoint_every steps and resume from it
    checkpoint_every: int = 50

    def __post_init__(self):
        # checked whatever ``setpo`` says: a λ = nan or -1 run trained as plain GRPO would be labelled wrongly
        self.lam = check_real(self.lam, "lam", minimum=0.0)

    @property
    def name(self) -> str:
        return ("SetPO+" if self.setpo else "") + self.algo.upper()


# Fields that may differ from the config a checkpoint was made with (``setpo_lab.studies.stages.claim_folder``
# says what every study's REUSE_NEUTRAL_FIELDS means): how far to train and where to save, not what is trained;
# a checkpoint at step k is the same state whatever ``steps`` the run goes on to.
REUSE_NEUTRAL_FIELDS = ("steps", "checkpoint_dir", "checkpoint_every")


@dataclass
class ToyStudyConfig:
    """The toy study (``make demo``, notebook 01): GRPO vs SetPO+GRPO from the same ``seeds``, then Figure 1
    (first seed) and the coverage tables, written to ``out``.

    smoke: 12 steps instead of 200 (seconds). projection: Figure 1's 2-D map, "umap" or "pca" (None: PCA for a
    smoke run, UMAP otherwise). command: what the figure's record names as its maker.
    """

    out: str = "runs/demo"
    seeds: int = 5
    smoke: bool = False
    projection: str | None = None
    command: str = "make demo"

    def __post_init__(self):
        if isinstance(self.seeds, bool) or not isinstance(self.seeds, int) or not 1 <= self.seeds <= 1000:
            raise ValueError(f"seeds must be a whole number from 1 to 1000, got {self.seeds!r}")
        if self.projection not in (None, "umap", "pca"):
            raise ValueError(f"projection must be 'umap', 'pca' or None, got {self.projection!r}")

    def base(self) -> ToyConfig:
        """The training config every run of the study shares (the variants change setpo only)."""
        return ToyConfig(steps=12, snapshot_every=4) if self.smoke else ToyConfig()

    def figure_projection(self) -> str:
        return self.projection or ("pca" if self.smoke else "umap")
