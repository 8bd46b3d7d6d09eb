"""setpo: set-level policy optimization (SetPO) for diversity-preserving RL of language models.

The estimator in one line, Â_i = Ā_i + λ · s_i, is assembled in ``setpo_advantages`` alone (every engine calls
it: the toy trainer, the TRL trainer, the verl estimator, SetGRPO); the leave-one-out diversity marginal s_i in
``setpo.diversity.kernel_marginals``.
"""

from setpo.advantages import (
    ADVANTAGE_ESTIMATORS,
    group_advantages,
    groups_with_signal,
    register_estimator,
    setpo_advantages,
)
from setpo.diversity import (
    DIVERSITY_TERMS,
    cosine_kernel,
    diversity_marginals,
    diversity_term,
    kernel_marginals,
    register_diversity_term,
    set_diversity,
)
from setpo.metrics import (
    ModeCoverage,
    answer_entropy,
    diversity_width_and_average_modes,
    hill_number,
    mean_pairwise_similarity,
    mode_coverage,
    pass_at_k,
    rarefied_distinct,
)
from setpo.presets import PAPER_RUN, PRESETS, AlgorithmPreset, get_preset

__version__ = "0.5.0"

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "DIVERSITY_TERMS",
    "PAPER_RUN",
    "PRESETS",
    "AlgorithmPreset",
    "ModeCoverage",
    "answer_entropy",
    "diversity_width_and_average_modes",
    "mean_pairwise_similarity",
    "mode_coverage",
    "cosine_kernel",
    "diversity_marginals",
    "diversity_term",
    "get_preset",
    "group_advantages",
    "groups_with_signal",
    "hill_number",
    "kernel_marginals",
    "pass_at_k",
    "rarefied_distinct",
    "register_diversity_term",
    "register_estimator",
    "set_diversity",
    "setpo_advantages",
]
