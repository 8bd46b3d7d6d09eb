"""The rubric study's configuration (SetGRPO on the rubric-graded toy, notebook 05): one training run's every
knob (``TrainConfig``, CleanRL style) and the study around it (``RubricStudyConfig``: seeds, world, training)."""

from __future__ import annotations

from dataclasses import dataclass, field

from setpo.envs.rubric import RubricToyConfig
from setpo.setgrpo import SetGRPOConfig
from setpo_lab.studies.arguments import check_fields


@dataclass
class TrainConfig:
    """Training on the toy (one dataclass holds every knob, CleanRL style).

    n_cal_groups: calibration groups drawn from the current policy at each recalibration (split between the
    box and the risk test by ``setgrpo.risk_fraction``). reference: "regrade" (the mean of re-gradings by the
    same two graders, the library default) or "expert".
    """

    steps: int = 200               # training steps
    batch_prompts: int = 16        # prompts per step
    group_size: int = 8            # G responses per prompt
    lr: float = 0.02               # Adam learning rate
    grpo_gradings: int = 1         # gradings per grader averaged into GRPO's reward (1: one score from each)
    n_cal_groups: int = 512        # calibration groups per recalibration (see above)
    n_regrades: int = 1            # re-gradings per response for the reference (per grader for "regrade")
    reference: str = "regrade"     # what SetGRPO calibrates against: "regrade" or "expert"
    # SetGRPO's own knobs (α, β, δ, K, ...), recalibrating every 50 steps on this toy
    setgrpo: SetGRPOConfig = field(default_factory=lambda: SetGRPOConfig(recalibrate_every=50))

    def __post_init__(self):
        if self.reference not in ("regrade", "expert"):
            raise ValueError(f"reference must be 'regrade' or 'expert', got {self.reference!r}")
        check_fields(self, count=("steps", "batch_prompts", "grpo_gradings", "n_cal_groups"), seed=("n_regrades",),
                     group=("group_size",), positive=("lr",))

    def grader_calls_per_step(self, method: str) -> float:
        """Training plus amortised calibration grader calls per step (expert calls not included)."""
        train_calls = self.batch_prompts * self.group_size * 2
        if method == "grpo":
            return train_calls * self.grpo_gradings
        regrades = self.n_regrades if self.reference == "regrade" else 0
        cal = self.n_cal_groups * self.group_size * 2 * (1 + regrades)
        return train_calls + cal / self.setgrpo.recalibrate_every


@dataclass
class RubricStudyConfig:
    """The rubric study (``python -m setpo_lab run rubric``): GRPO, budget-matched GRPO and SetGRPO over
    ``seeds`` seeds, one world per seed (``task``: None for the default toy), each run trained with ``train``."""

    seeds: int = 5
    train: TrainConfig = field(default_factory=TrainConfig)
    task: RubricToyConfig | None = None
