"""The paper's algorithm settings in one table, so that the toy trainer, TRL and verl read the same numbers.

Each preset names a base advantage estimator, the policy-loss shape (token or sequence ratio, clip range,
aggregation) and SetPO's marginal weight λ as reported in arXiv 2602.01062 (Qwen2.5-Math experiments;
``countdown`` is the Countdown study's λ). Learning rates are the paper's for the 7B/1.5B math runs.
"""

from __future__ import annotations

from dataclasses import dataclass


#: the units λ can be given in: "absolute" (the paper: λ·d as is) or "term_std" (λ in units of the diversity
#: term's spread over the generation batch; ``setpo.trl.SetPOConfig.setpo_lambda_units`` says why).
LAMBDA_UNITS = ("absolute", "term_std")


@dataclass(frozen=True)
class AlgorithmPreset:
    name: str
    estimator: str = "grpo"        # base advantage, a key of setpo.advantages.ADVANTAGE_ESTIMATORS
    ratio_level: str = "token"     # "token" (PPO/GRPO/DAPO) or "sequence" (GSPO)
    clip_low: float = 0.2          # ratio clipped to [1 - clip_low, 1 + clip_high]
    clip_high: float = 0.2
    loss_agg: str = "token-mean"   # see setpo.losses.aggregate
    lam: float = 0.05              # SetPO marginal weight λ
    lr: float = 3e-6
    dynamic_sampling: bool = False  # DAPO: drop groups whose rewards are all equal


PRESETS: dict[str, AlgorithmPreset] = {
    "grpo": AlgorithmPreset("grpo", lam=0.05, lr=3e-6),
    "gspo": AlgorithmPreset("gspo", ratio_level="sequence", clip_low=3e-4, clip_high=4e-4,
                            loss_agg="seq-mean-token-mean", lam=0.1, lr=1e-6),
    "dapo": AlgorithmPreset("dapo", clip_low=0.2, clip_high=0.28, loss_agg="token-mean", lam=0.2, lr=1e-6,
                            dynamic_sampling=True),
    "grpo_32b": AlgorithmPreset("grpo_32b", lam=0.1, lr=1e-6),
    "countdown": AlgorithmPreset("countdown", lam=0.5, lr=1e-6),
}


def get_preset(name: str) -> AlgorithmPreset:
    if name not in PRESETS:
        raise ValueError(f"unknown algorithm preset {name!r}; known: {sorted(PRESETS)}")
    return PRESETS[name]


@dataclass(frozen=True)
class PaperRunSettings:
    """The paper's run settings for the Qwen2.5-Math experiments (arXiv 2602.01062; docs/studies/math.md), in one place.

    The math study (``setpo_lab.studies.math``), the verl launcher (``setpo.verl.launch``) and the benchmarks
    (``benchmarks/paper_shapes.py``) take their defaults from ``PAPER_RUN``, so the three cannot drift apart.

    num_generations: G, rollouts per prompt. temperature: rollout temperature. max_completion_length: tokens
    per response. beta: KL coefficient. prompts_per_step: global batch, in prompts. num_train_epochs: passes
    over the training set. eval_k, eval_temperature, eval_top_p: Pass@1 as avg@k (k samples per problem).
    """

    num_generations: int = 6
    temperature: float = 0.9
    max_completion_length: int = 756
    beta: float = 1e-4
    prompts_per_step: int = 64
    num_train_epochs: int = 2
    eval_k: int = 64
    eval_temperature: float = 0.5
    eval_top_p: float = 0.9


PAPER_RUN = PaperRunSettings()
