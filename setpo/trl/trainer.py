"""SetPO on TRL: a ``GRPOTrainer`` that adds λ·s_i to TRL's own group-normalised advantages.

    Â_i = Ā_i + λ · s_i            (SetPO, arXiv 2602.01062)

Ā_i is exactly what TRL computes (``(r - mean) / (std + 1e-4)`` per group with the default
``scale_rewards="group"``; whatever ``scale_rewards`` / ``multi_objective_aggregation`` say otherwise), and
s_i is ``setpo.diversity_marginals`` over the embeddings of the complete response texts (prompt excluded),
one group per prompt of ``num_generations`` rollouts; or, with ``setpo_kernel_reads="answer"`` and/or
``setpo_gate_reward``, over what the answer reader returns and the rows that pass the gate (``setpo.reads``).

Where it hooks in. TRL has no advantage hook: ``GRPOTrainer._generate_and_score_completions`` generates,
scores, normalises and slices to this process's rows in one method. ``SetPOTrainer`` overrides two methods
(and ``training_step``, for timing only) and calls the originals unchanged:

- ``_calculate_rewards`` (called once per generation batch with this process's completions, returning the
  rewards gathered from all processes): keep the texts and the gathered rewards, embed this process's
  completions and gather the embeddings (``accelerator.gather``; groups may span processes), once per batch,
  and with ``setpo_reward_adjustment="dra"`` return DRA-GRPO's rescaled rewards
  r̃_i = r_i / (1 + Σ_{j≠i} k(o_i, o_j)) (Chen et al. 2025, arXiv 2505.09655), which TRL then normalises;
- ``_generate_and_score_completions``: after TRL returns, ``_setpo_advantages`` computes Â: optionally TRL's
  advantages replaced by a ``setpo.advantages`` estimator's (``setpo_estimator``, e.g. "pass@4", Pass@k
  Training, arXiv 2508.10751), then ``setpo.setpo_advantages`` with that Ā given (``base=``), s of every group
  from the same embeddings and λ in ``setpo_lambda_units``; this process's slice replaces TRL's advantages.
  ``_log_setpo_batch`` then logs the metrics below.

Embedding locally and gathering vectors (rather than gathering texts and embedding everything everywhere)
spreads the embedding work over the processes; the result is the same. With ``setpo_lambda = 0`` the
advantages are TRL's, bit for bit (nothing is added). Generation is TRL's: ``use_vllm=True`` on a GPU, and
without vLLM ``generate`` with each prompt's forward pass shared by its G rollouts (``_generate_single_turn``,
``setpo.trl.rollouts``; ``setpo_shared_prompt_rollouts=False`` gives TRL's own call).

Presets. ``SetPOConfig`` (GRPO), ``SetPOGSPOConfig`` and ``SetPODAPOConfig`` are ``GRPOConfig`` subclasses
whose defaults come from ``setpo.presets.PRESETS``: the clip range, ratio level, loss aggregation, learning
rate and the paper's λ (GRPO 0.05, GSPO 0.1, DAPO 0.2; ``config_for("countdown")`` gives λ = 0.5).
TRL's ``loss_type`` names the aggregation: the presets' "token-mean" (verl's default, used by the paper's
GRPO and DAPO) is TRL's "dapo", and "seq-mean-token-mean" (GSPO) is TRL's "grpo". DAPO's dynamic sampling
(drop and refill groups whose rewards are all equal) is not part of TRL's GRPOTrainer and is not done here.

Logged per step (TRL's ``_metrics``; they reach ``trainer.state.log_history`` and any reporter):
``setpo/s_mean``, ``setpo/s_std``, ``setpo/lambda_s_over_adv`` (mean |λ s| / mean |Ā|),
``setpo/pairwise_similarity`` (mean off-diagonal kernel within groups), ``setpo/distinct_correct``
(mean number of distinct correct responses per group; "correct" is total reward >= ``setpo_correct_reward``
and "distinct" is by the trainer's ``solution_key``, the stripped text by default) and
``setpo/flat_group_fraction`` (groups whose rewards are all equal: GRPO's advantage is 0 there, so λ·s is the
whole signal; r̃ under DRA), ``setpo/groups_without_marginal`` (groups whose set, after the gate and the rows
with nothing to read, has fewer than 3 rows, so s = 0 there) and, under DRA, ``setpo/dra_scale_mean`` (mean of
1 / (1 + Σ_{j≠i} k)); with
``setpo_monitor`` the exploit monitor's ``setpo/s_length_corr`` and, with an answer reader,
``setpo/unread_fraction`` and ``setpo/s_unread_gap`` (``setpo.reads.ExploitMonitor``). s statistics
are of the raw term, before ``setpo_lambda_units`` rescales it. Wall-clock seconds per phase are kept in
``trainer.setpo_seconds``, never in the metrics, so that log_history stays deterministic.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import inspect
import time

import torch
from accelerate.utils import gather_object
from transformers import TrainerCallback
from trl import GRPOTrainer
from trl.extras.profiling import profiling_context
from trl.models import unwrap_model_for_generation
from trl.trainer.utils import nanstd

from setpo.advantages import (base_advantages, estimator_group_minimum, flat_groups, setpo_advantages,
                              term_in_lambda_units)
from setpo.completions import completion_text
from setpo.diversity import dra_rewards
from setpo.embed import Embedder, check_embedder_spec, load_embedder, resolve_reader
from setpo.groups import Groups
from setpo.metrics import mean_pairwise_similarity
from setpo.reads import ExploitMonitor, check_kernel_reads, kernel_texts
from setpo.trl.config import SetPOConfig
from setpo.trl.rollouts import (FastPathRefused, completion_lists, note_fallback, prompt_runs, rollout_refusal,
                                shared_prompt_generate)
from setpo.trl.shared_prefix import SharedPrefixModel, shared_pass_refusal


def gather_embeddings(accelerator, embedder: Embedder, completions, prompts=None) -> tuple[torch.Tensor, list[str]]:
    """Embed this process's completions and gather the rows of every process, in process order.

    Embedding locally and gathering vectors (rather than gathering texts and embedding everything everywhere)
    spreads the embedding work over the processes. An embedder with ``uses_prompts = True`` (the verifier's
    ``SolutionKeyEmbedder``) is called as ``embedder(texts, prompts=prompt_texts)``, the prompts' texts read
    by ``completion_text`` like the completions'; ``prompts`` (aligned with completions) is then required.
    Returns ((N_all, d) on the accelerator's device, local texts).
    """
    texts = [completion_text(c) for c in completions]
    if getattr(embedder, "uses_prompts", False):
        if prompts is None:
            raise ValueError(f"{type(embedder).__name__} needs the prompts (uses_prompts = True); pass prompts=")
        emb = embedder(texts, prompts=[completion_text(p) for p in prompts])
    else:
        emb = embedder(texts)
    return accelerator.gather(emb.to(accelerator.device)), texts


def _default_solution_key(text: str) -> Hashable:
    return text.strip()


def group_diversity_stats(emb: torch.Tensor, correct: Sequence[bool], keys: Sequence[Hashable | None],
                          group_size: int, readable: Sequence[bool] | None = None) -> dict[str, float]:
    """Mean within-group pairwise similarity and mean number of distinct correct responses per group.

    emb: (N, d) with N = B * group_size, groups contiguous. correct: (N,) bools. keys: (N,) solution keys
    (None = no solution, never counted). readable: (N,) bools, the rows with text for the kernel to read (None:
    all); the similarity is over those alone (rows with nothing to read all embed "" and would count as
    identical), over groups with two or more of them, NaN when no group has two.
    Returns {"pairwise_similarity", "distinct_correct"}.
    """
    n = emb.shape[0]
    if n % group_size or len(correct) != n or len(keys) != n or (readable is not None and len(readable) != n):
        raise ValueError(f"{n} embedding rows, {len(correct)} correct flags and {len(keys)} keys do not form "
                         f"groups of {group_size}")
    if readable is None or all(readable):
        sim = mean_pairwise_similarity(emb, group_size=group_size)
    else:
        rows = torch.as_tensor(list(readable), dtype=torch.bool)
        gid = torch.arange(n) // group_size
        counts = torch.bincount(gid[rows], minlength=n // group_size)
        keep = rows & (counts[gid] >= 2)
        sim = (mean_pairwise_similarity(emb[keep.to(emb.device)], index=gid[keep].tolist()) if bool(keep.any())
               else float("nan"))
    distinct = [len({keys[i] for i in range(b, b + group_size) if correct[i] and keys[i] is not None})
                for b in range(0, n, group_size)]
    return {"pairwise_similarity": sim, "distinct_correct": sum(distinct) / len(distinct)}


#: The denominator's ε in TRL's group normalisation (r - mean) / (std + 1e-4), used for ``setpo_estimator`` too.
TRL_EPS = 1e-4

#: The phases of ``SetPOTrainer.setpo_seconds``.
PHASES = ("generation", "embedding", "update")


class _OptimizerStepClock(TrainerCallback):
    """Adds the time from the last ``training_step`` to the end of the optimizer step (gradient clipping, the
    step itself) to the trainer's "update" seconds: Trainer runs these outside ``training_step``."""

    def __init__(self, trainer: "SetPOTrainer"):
        self.trainer = trainer

    def on_optimizer_step(self, args, state, control, **kwargs):
        tr = self.trainer
        if tr._setpo_step_end is not None:
            _synchronize(tr.accelerator.device)
            tr.setpo_seconds["update"] += time.perf_counter() - tr._setpo_step_end
            tr._setpo_step_end = None


def _synchronize(device) -> None:
    """Wait for queued GPU work, so that wall-clock seconds land in the phase that queued it (no numeric effect)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


class SetPOTrainer(GRPOTrainer):
    """TRL's GRPOTrainer with SetPO's diversity marginal added after TRL's own group normalisation.

    Takes GRPOTrainer's arguments; ``args`` must be a ``SetPOConfig`` (or a subclass). Extra keywords:
    embedder: an ``Embedder`` (texts -> (N, d)); None loads ``args.embedder`` on first use. An embedder with
        ``uses_prompts = True`` (``setpo.embed.SolutionKeyEmbedder``, the verifier's kernel) is also given
        the prompts' texts.
    solution_key: text -> hashable key or None, identifying a response's solution for the
        ``setpo/distinct_correct`` metric (e.g. the canonical form of a Countdown expression).
    answer_reader: completion text -> the part the reward reads, or None (``setpo.reads``); takes precedence
        over ``args.setpo_answer_reader``. What the kernel reads (``setpo_kernel_reads``), the correctness gate
        (``setpo_gate_reward``) and the exploit monitor (``setpo_monitor``) are described in ``SetPOConfig``:
        rows with nothing to read or below the gate are left out of the diversity sets (``term_rows`` of
        ``setpo_advantages``) and get s = 0.

    Baselines, by config (``SetPOConfig``):

    - ``setpo_reward_adjustment="dra"``: DRA-GRPO (Chen et al. 2025, "DRA-GRPO", arXiv 2505.09655). In
      ``_calculate_rewards`` every gathered reward, each reward function's column, is multiplied by
      ``1 / (1 + Σ_{j≠i} k(o_i, o_j))`` over its group (``setpo.diversity.dra_rewards`` of ones, on the
      completions' embeddings), i.e. r̃_i = r_i / (1 + Σ_{j≠i} k(o_i, o_j)); the weighted total is scaled the
      same. TRL then normalises r̃ as it would r. The embeddings are made once per batch and reused for λ·s
      and the metrics; "correct" and TRL's logged reward metrics and completions table keep the original
      rewards. Logs ``setpo/dra_scale_mean``, the mean factor. With λ = 0 this is DRA-GRPO; with λ > 0, both.
    - ``setpo_estimator``: "trl" keeps TRL's advantages bit for bit; a ``setpo.advantages`` name (e.g.
      "pass@4": Pass@k Training's closed-form group advantage, Chen et al. 2025, arXiv 2508.10751) replaces
      them with ``base_advantages`` of the gathered weighted total reward (r̃ under DRA), groups of
      ``num_generations``, ε = ``TRL_EPS``; unscorable rows are left out of their group and get 0. In eval,
      groups too small for the estimator keep TRL's advantages. λ·s is added after.

    After each generation batch ``last_setpo_batch`` holds the gathered texts, rewards (the original total),
    s and embeddings (CPU tensors), for callbacks that record what the policy samples over training; under DRA
    also "rewards_adjusted" (the total of r̃) and "dra_scale".

    ``setpo_seconds`` = {"generation", "embedding", "update"}: wall-clock seconds accumulated over training
    (train mode only). generation: inside ``_generate_and_score_completions`` (rollouts, rewards, TRL's
    normalisation, SetPO's term) minus embedding; embedding: in embedder calls; update: ``training_step`` (and
    the optimizer step after it) minus the other two. On a GPU the phase boundaries synchronise the device so
    that queued work is timed where it was queued. Accounting only: no numeric result and nothing in
    ``_metrics`` / ``log_history`` depends on it.
    """

    def __init__(self, *args, embedder: Embedder | None = None,
                 solution_key: Callable[[str], Hashable | None] | None = None,
                 answer_reader: Callable[[str], str | None] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        if not isinstance(self.args, SetPOConfig):
            raise ValueError(f"SetPOTrainer needs a SetPOConfig (or subclass) as args, got {type(self.args).__name__}")
        self.answer_reader = resolve_reader(answer_reader if answer_reader is not None
                                            else self.args.setpo_answer_reader)
        check_kernel_reads(self.args.setpo_kernel_reads, self.answer_reader, "SetPOConfig.setpo_")
        self.exploit_monitor = ExploitMonitor(window=self.args.setpo_monitor_window)
        if isinstance(embedder, str):  # a spec, as in SetPOConfig.embedder: checked now, loaded on first use
            check_embedder_spec(embedder, "SetPOTrainer(embedder=...)")
            self._embedder_spec = embedder
            embedder = None
        elif embedder is not None and not callable(embedder):
            raise ValueError(f"SetPOTrainer(embedder=...) must be an embedder (texts -> (N, d) tensor) or a spec "
                             f"string such as 'key' or 'hash', got a {type(embedder).__name__}")
        else:
            self._embedder_spec = self.args.embedder
            if embedder is None:  # the config's spec will be loaded: its folder must be here
                check_embedder_spec(self._embedder_spec, "SetPOConfig.embedder")
        self._embedder = embedder
        self.solution_key = solution_key or _default_solution_key
        self._setpo_stash: dict[str, Any] | None = None
        self.last_setpo_batch: dict[str, Any] | None = None
        self.setpo_seconds: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self._clock = {"generation": 0.0, "embedding": 0.0}  # all modes, for subtracting nested phases
        self._setpo_step_end: float | None = None
        self.add_callback(_OptimizerStepClock(self))

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            device = self.args.embedder_device or str(self.accelerator.device)
            self._embedder = load_embedder(self._embedder_spec, device=device,
                                           batch_size=self.args.embedder_batch_size)
        return self._embedder

    @property
    def setpo_dra(self) -> bool:
        return self.args.setpo_reward_adjustment == "dra"

    @property
    def setpo_active(self) -> bool:
        """Whether embeddings are needed: λ != 0, diversity logging, or DRA's reward rescaling."""
        return self.args.setpo_lambda != 0 or self.args.setpo_log_diversity or self.setpo_dra

    def _group_size(self) -> tuple[str, int]:
        mode = "train" if self.model.training else "eval"
        return mode, (self.num_generations if mode == "train" else self.num_generations_eval)

    def _embed(self, completions, prompts) -> dict[str, Any]:
        """``gather_embeddings`` of what the kernel reads (``setpo_kernel_reads``), timed as "embedding".

        Returns {"emb": (N_all, d) gathered, "texts": local completion texts, "answers": local reader answers
        or None, "readable": (N_all,) bool gathered, whether a row had anything for the kernel to read}."""
        t0 = time.perf_counter()
        texts = [completion_text(c) for c in completions]
        read, readable, answers = kernel_texts(texts, self.args.setpo_kernel_reads, self.answer_reader)
        emb, _ = gather_embeddings(self.accelerator, self.embedder, read, prompts)
        readable = self.accelerator.gather(torch.tensor(readable, device=self.accelerator.device))
        _synchronize(self.accelerator.device)
        dt = time.perf_counter() - t0
        self._clock["embedding"] += dt
        if self.model.training:
            self.setpo_seconds["embedding"] += dt
        return {"emb": emb, "texts": texts, "answers": answers, "readable": readable}

    def training_step(self, model, inputs, num_items_in_batch):
        t0, nested0 = time.perf_counter(), self._clock["generation"] + self._clock["embedding"]
        output = super().training_step(model, inputs, num_items_in_batch)
        _synchronize(self.accelerator.device)
        self._setpo_step_end = t1 = time.perf_counter()
        nested = self._clock["generation"] + self._clock["embedding"] - nested0
        self.setpo_seconds["update"] += (t1 - t0) - nested
        return output

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, *args, **kwargs):
        """TRL's rollouts, with each prompt's forward pass shared by its G rollouts (``setpo.trl.rollouts``)
        where TRL would call plain ``generate``: ``setpo_shared_prompt_rollouts`` on, no vLLM, no paged /
        continuous batching (TRL 1.6's ``use_transformers_paged``, later ``use_transformers_continuous_batching``),
        no images or multimodal inputs, and some prompt repeated. The same samples as TRL's path up to float
        rounding (the rollouts module says why); anything else goes to TRL, and so does a model or generation
        config the shared rollouts would not sample exactly for (``rollout_refusal``: sliding-window or other
        non-full-attention cache layers, dropout in train mode, beams ...), with the reason logged once."""
        paged = (getattr(self, "use_transformers_continuous_batching", False)
                 or getattr(self, "use_transformers_paged", False))
        if not (self.args.setpo_shared_prompt_rollouts and not self.use_vllm and images is None
                and not multimodal_fields and not paged and len(prompt_runs(prompt_ids)[0]) < len(prompt_ids)):
            return super()._generate_single_turn(prompt_ids, images, multimodal_fields, *args, **kwargs)
        refusal = rollout_refusal(self.model, self.generation_config)
        if refusal is None:
            # TRL >= 1.16 passes the gradient-checkpointing settings, to switch checkpointing off while generating
            unwrap_parameters = inspect.signature(unwrap_model_for_generation).parameters
            unwrap_options = ({"gradient_checkpointing_kwargs": self.args.gradient_checkpointing_kwargs}
                              if "gradient_checkpointing_kwargs" in unwrap_parameters else {})
            try:
                with (profiling_context(self, "transformers.generate"),
                      unwrap_model_for_generation(self.model_wrapped, self.accelerator,
                                                  gather_deepspeed3_params=self.args.ds3_gather_for_generation,
                                                  generation_kwargs=self.generation_kwargs,
                                                  **unwrap_options) as unwrapped_model,
                      torch.no_grad(),
                      self._dist.summon_full_params(self.model_wrapped, recurse=False)):
                    new_tokens = shared_prompt_generate(unwrapped_model, prompt_ids, self._tokenizer.pad_token_id,
                                                        getattr(self, "pad_to_multiple_of", None),
                                                        generation_config=self.generation_config)
            except FastPathRefused as err:  # raised before anything random ran: TRL's path samples as it would
                refusal = str(err)
            else:
                eos = getattr(self, "eos_token_ids", None) or [self._tokenizer.eos_token_id]
                return completion_lists(new_tokens, eos), None
        note_fallback(self, "setpo_shared_prompt_rollouts", refusal)
        return super()._generate_single_turn(prompt_ids, images, multimodal_fields, *args, **kwargs)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        stash = {"completions": completions, "rewards_per_func": rewards_per_func, "emb": None, "texts": None,
                 "answers": None, "readable": None,
                 "lengths": self.accelerator.gather(torch.tensor([len(ids) for ids in completion_ids_list],
                                                                 device=self.accelerator.device))}
        mode, group_size = self._group_size()
        # SetPO's term needs groups of >= 3, DRA's rescaling >= 2; embed once, here, for both
        needs_emb = (self.args.setpo_lambda != 0 or self.args.setpo_log_diversity) and group_size >= 3
        if self.setpo_dra and group_size >= 2:
            needs_emb = True
        if needs_emb:
            stash.update(self._embed(completions, prompts))
        if self.setpo_dra and group_size >= 2:
            # r̃_i = r_i / (1 + Σ_{j≠i} k(o_i, o_j)) (DRA-GRPO, arXiv 2505.09655): the factor is dra_rewards of ones
            e = stash["emb"]
            scale = dra_rewards(torch.ones(e.shape[0], dtype=torch.float64, device=e.device), e,
                                group_size=group_size)
            stash["dra_scale"] = scale
            rewards_per_func = (rewards_per_func.double() * scale.to(rewards_per_func.device).unsqueeze(1)) \
                .to(rewards_per_func.dtype)
        stash["rewards_used"] = rewards_per_func
        self._setpo_stash = stash
        return rewards_per_func

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        # TRL runs every row's prompt through the model; with setpo_share_prompt_pass each distinct prompt goes
        # through once (setpo.trl.shared_prefix), for the loss, the old policy and the reference alike, where that
        # is the same pass (shared_pass_refusal); otherwise TRL's own pass runs and the reason is logged once.
        # Router logits are refused for every call of a trainer that computes a load-balancing loss (TRL's
        # aux_loss_enabled), not only the loss's, so that the old policy's log-probs come from the same pass.
        shared = None
        if self.args.setpo_share_prompt_pass:
            call = inspect.signature(super()._get_per_token_logps_and_entropies).bind_partial(
                model, input_ids, attention_mask, logits_to_keep, *args, **kwargs).arguments
            router_logits = bool(call.get("compute_aux_loss")) or bool(getattr(self, "aux_loss_enabled", False))
            refusal = shared_pass_refusal(model, router_logits=router_logits)
            if refusal is None:
                model = shared = SharedPrefixModel(model, input_ids.shape[1] - logits_to_keep)
            else:
                note_fallback(self, "setpo_share_prompt_pass", refusal)
        out = super()._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep,
                                                         *args, **kwargs)
        for refusal in (shared.refusals if shared is not None else []):
            note_fallback(self, "setpo_share_prompt_pass", refusal)
        return out

    def _generate_and_score_completions(self, inputs):
        t0, emb0 = time.perf_counter(), self._clock["embedding"]
        try:
            return self._setpo_generate_and_score(inputs)
        finally:
            _synchronize(self.accelerator.device)
            dt = (time.perf_counter() - t0) - (self._clock["embedding"] - emb0)
            self._clock["generation"] += dt
            if self.model.training:
                self.setpo_seconds["generation"] += dt

    def _setpo_generate_and_score(self, inputs):
        self._setpo_stash = None
        output = super()._generate_and_score_completions(inputs)
        if not self.setpo_active and self.args.setpo_estimator == "trl":
            return output
        if self._setpo_stash is None:
            raise RuntimeError("SetPOTrainer: TRL did not score completions through _calculate_rewards; "
                               "this TRL version is not supported")
        stash, self._setpo_stash = self._setpo_stash, None
        mode, group_size = self._group_size()
        rewards_per_func = stash["rewards_per_func"]          # original, gathered (N_all, F)
        weights = self.reward_weights.to(rewards_per_func.device).unsqueeze(0)
        unscorable = torch.isnan(rewards_per_func).all(dim=1)
        total = (rewards_per_func * weights).nansum(dim=1)    # original weighted total
        total_used = (stash["rewards_used"] * weights).nansum(dim=1)  # what TRL normalised: r̃ under DRA
        if self.setpo_dra:
            self._restore_logged_rewards(rewards_per_func, unscorable, mode)
        adv = self._setpo_advantages(output["advantages"], stash["emb"], total_used, unscorable, group_size,
                                     self._term_rows(stash["readable"], total, unscorable))
        output["advantages"] = adv["local"]
        if adv["changed"]:
            self._replace_logged_advantages(adv["all"].cpu())
        if adv["s"] is not None:
            self._log_setpo_batch(stash, adv, total, total_used, unscorable, mode, group_size)
        elif stash["emb"] is not None and self.setpo_dra:
            self._dra_metrics(stash, mode)
        return output

    def _term_rows(self, readable: torch.Tensor | None, total: torch.Tensor, unscorable: torch.Tensor
                   ) -> torch.Tensor | None:
        """(N_all,) bool, the rows that form the diversity sets: those with text for the kernel to read and, with
        ``setpo_gate_reward`` τ, Ω⁺ = {r_i >= τ}: a total (original, weighted) reward >= τ from at least one reward
        function (a row no reward function scored has no r_i; TRL's nansum would read it as 0 and let it pass
        τ <= 0); None when that is every row."""
        if readable is None:
            return None
        rows = readable.to(total.device)
        if self.args.setpo_gate_reward is not None:
            rows = rows & (total >= self.args.setpo_gate_reward) & ~unscorable.to(total.device)
        return None if bool(rows.all()) else rows

    def _setpo_advantages(self, trl_advantages: torch.Tensor, emb: torch.Tensor | None, total_used: torch.Tensor,
                          unscorable: torch.Tensor, group_size: int, term_rows: torch.Tensor | None = None
                          ) -> dict[str, Any]:
        """Â of this generation batch: ``setpo.setpo_advantages`` with Ā = TRL's own normalised advantages (or
        the ``setpo_estimator``'s, replacing them), gathered from every process, and λ·s added.

        trl_advantages: (n_local,) TRL's advantages of this process's rows; emb: (N_all, d) gathered, or None;
        total_used, unscorable: (N_all,) the total reward TRL normalised and the rows no reward function scored
        (they get s = 0, as TRL gives them no advantage); term_rows: (N_all,) bool, the rows that form the
        diversity sets (``_term_rows``; None: all). Returns {"local": (n_local,) Â of this process,
        "all": (N_all,) Â, "base": (N_all,) Ā, "s": (N_all,) the raw term or None when there is none (no
        embeddings, or groups < 3), "local_rows": this process's slice, "changed": whether Â differs from
        what TRL logged}. With no term and no replacing estimator this is TRL's tensor itself; elementwise
        arithmetic, so this process's slice and the gathered batch agree bit for bit."""
        n_local = trl_advantages.shape[0]
        pi = self.accelerator.process_index
        local = slice(pi * n_local, (pi + 1) * n_local)
        replaced = None
        if self.args.setpo_estimator != "trl" and group_size >= estimator_group_minimum(self.args.setpo_estimator):
            replaced = self._estimator_advantages(total_used, unscorable, group_size).to(trl_advantages.device,
                                                                                          trl_advantages.dtype)
        out = {"local": trl_advantages, "all": replaced, "base": replaced, "s": None, "local_rows": local,
               "changed": replaced is not None}
        if replaced is not None:
            out["local"] = replaced[local]
        if emb is None or group_size < 3:
            return out  # no SetPO term: eval with groups < 3, or only the estimator replaced
        base = replaced if replaced is not None else self.accelerator.gather(trl_advantages)
        lam = self.args.setpo_lambda
        adv_all, s = setpo_advantages(None, emb, group_size=group_size, base=base, lam=lam,
                                      diversity=self.args.setpo_diversity, lam_units=self.args.setpo_lambda_units,
                                      without_term=unscorable, term_rows=term_rows, return_marginals=True)
        out.update(all=adv_all, base=base, s=s, changed=out["changed"] or lam != 0,
                   in_sets=torch.ones_like(s, dtype=torch.bool) if term_rows is None else term_rows.to(s.device))
        if lam != 0:
            out["local"] = adv_all[local]
        return out

    def _log_setpo_batch(self, stash: dict[str, Any], adv: dict[str, Any], total: torch.Tensor,
                         total_used: torch.Tensor, unscorable: torch.Tensor, mode: str, group_size: int) -> None:
        """The ``setpo/*`` metrics of one generation batch (computed on the gathered batch, identical on every
        process; "correct" is of the original rewards) and ``last_setpo_batch``."""
        s, emb, local = adv["s"], stash["emb"], adv["local_rows"]
        lam = self.args.setpo_lambda
        correct = (total >= self.args.setpo_correct_reward) & ~unscorable.to(total.device)
        all_texts = gather_object(stash["texts"])
        keys = [self.solution_key(t) for t in all_texts]
        readable = None if stash["readable"] is None else stash["readable"].tolist()
        stats = group_diversity_stats(emb.float(), correct.tolist(), keys, group_size, readable)
        m = self._metrics[mode]
        m["setpo/s_mean"].append(float(s.mean()))
        m["setpo/s_std"].append(float(s.std()) if s.numel() > 1 else 0.0)
        # mean |λ·s| over mean |Ā|, each first averaged over this process's rows, then over the processes
        base_local = adv["base"][local]
        lam_s_local = lam * term_in_lambda_units(s, self.args.setpo_lambda_units)[local].to(base_local.dtype)
        ratio = self.accelerator.gather(torch.stack([lam_s_local.abs().mean(), base_local.abs().mean()])
                                        .reshape(1, 2)).mean(0)
        m["setpo/lambda_s_over_adv"].append(float(ratio[0] / ratio[1]) if float(ratio[1]) > 0 else float("nan"))
        m["setpo/pairwise_similarity"].append(stats["pairwise_similarity"])
        m["setpo/distinct_correct"].append(stats["distinct_correct"])
        # groups whose normalised rewards (r̃ under DRA) are all equal: the base advantage is 0 there and λ·s is
        # the whole signal
        flat = flat_groups(total_used.double(), group_size=group_size)
        m["setpo/flat_group_fraction"].append(float(flat.double().mean()))
        # groups whose set (Ω, or Ω⁺ under the gate, minus rows with nothing to read) has < 3 rows: s = 0 there
        members = adv["in_sets"].view(-1, group_size).sum(-1)
        m["setpo/groups_without_marginal"].append(float((members < 3).sum()))
        if self.args.setpo_monitor:
            answers = None if stash["answers"] is None else gather_object(stash["answers"])
            watched = self.exploit_monitor.observe(
                s, stash["lengths"].tolist(), adv["in_sets"].tolist(), answers, all_texts,
                lam=lam if mode == "train" else 0.0, kernel_reads=self.args.setpo_kernel_reads,
                groups=[i // group_size for i in range(s.shape[0])])
            for name, value in watched.items():
                m[name].append(value)
        self.last_setpo_batch = {"texts": all_texts, "rewards": total.cpu(), "s": s.cpu(),
                                 "emb": emb.float().cpu(), "group_size": group_size, "mode": mode,
                                 "in_sets": adv["in_sets"].cpu()}
        if self.setpo_dra:
            self._dra_metrics(stash, mode)
            self.last_setpo_batch.update(rewards_adjusted=total_used.cpu(), dra_scale=stash["dra_scale"].cpu())

    def _dra_metrics(self, stash: dict[str, Any], mode: str) -> None:
        if "dra_scale" in stash:
            self._metrics[mode]["setpo/dra_scale_mean"].append(float(stash["dra_scale"].mean()))

    def _estimator_advantages(self, total: torch.Tensor, unscorable: torch.Tensor, group_size: int) -> torch.Tensor:
        """``base_advantages(setpo_estimator)`` of the gathered totals (N_all,), groups of ``group_size``.

        Unscorable rows (every reward None) are left out of their group (TRL excludes them from its baseline
        too) and get 0, as do groups left with fewer scorable rows than the estimator needs."""
        name = self.args.setpo_estimator
        n = total.shape[0]
        out = torch.zeros(n, dtype=torch.float32, device=total.device)
        gid = torch.arange(n, device=total.device) // group_size
        ok = ~unscorable.to(total.device)
        enough = (ok.view(-1, group_size).sum(-1) >= estimator_group_minimum(name))[gid] & ok
        if not bool(enough.any()):
            return out
        rows = enough.nonzero().flatten()
        r = total[rows].float()
        if bool(enough.all()):
            groups = Groups.build(n, group_size=group_size, device=r.device)
        else:
            groups = Groups.build(rows.numel(), index=gid[rows].tolist(), device=r.device)
        out[rows] = base_advantages(r, groups, name, TRL_EPS).to(out.dtype)
        return out

    def _restore_logged_rewards(self, rewards_per_func: torch.Tensor, unscorable: torch.Tensor, mode: str) -> None:
        """TRL logged r̃ (what it normalised) as its reward metrics and completions-table rewards; show the
        original task rewards there instead, so that reward curves compare across methods."""
        m = self._metrics[mode]
        for i, name in enumerate(self.reward_func_names):
            m[f"rewards/{name}/mean"][-1] = torch.nanmean(rewards_per_func[:, i]).item()
            m[f"rewards/{name}/std"][-1] = nanstd(rewards_per_func[:, i]).item()
            logged = self._logs["rewards"][name]
            k = min(len(logged), rewards_per_func.shape[0])
            for _ in range(k):
                logged.pop()
            logged.extend(rewards_per_func[-k:, i].tolist() if k else [])
        rewards = (rewards_per_func * self.reward_weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)
        rewards[unscorable] = torch.nan
        m["reward"][-1] = torch.nanmean(rewards).item()
        m["reward_std"][-1] = nanstd(rewards).item()

    def _replace_logged_advantages(self, all_adv: torch.Tensor) -> None:
        """TRL logged its all-process advantages before we changed them; make the completions table show
        ``all_adv`` (N_all,), the advantages used, instead."""
        logged = self._logs["advantages"]
        m = min(len(logged), all_adv.shape[0])
        for _ in range(m):
            logged.pop()
        logged.extend(all_adv[-m:].tolist() if m else [])
