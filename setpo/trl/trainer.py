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
``setpo/pairwise_similarity`` (mean off-diagonal kernel within groups), ``setpo/distinct_correct``
(mean number of distinct correct responses per group; "correct" is total reward >= ``setpo_correct_reward``
and "distinct" is by the trainer's ``solution_key``, the stripped text by default) and
``setpo/flat_group_fraction`` (groups whose rewards are all equal: GRPO's advantage is 0 there, so λ·s is the
whole signal). s statistics are of the raw term, before ``setpo_lambda_units`` rescales it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch
from accelerate.utils import gather_object
from trl import GRPOTrainer

from setpo.completions import completion_text
from setpo.advantages import flat_groups
from setpo.diversity import diversity_term
from setpo.embed import Embedder, load_embedder
from setpo.metrics import mean_pairwise_similarity
from setpo.trl.config import SetPOConfig


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
        s = diversity_term(self.args.setpo_diversity, emb, group_size=group_size)   # (N_all,)
        # Rows no reward function could score get no advantage from TRL; keep them that way.
        unscorable = torch.isnan(rewards_per_func).all(dim=1).to(s.device)
        s = s.masked_fill(unscorable, 0.0)
        s_std = float(s.std()) if s.numel() > 1 else 0.0  # the spread for "term_std", and a metric
        term = s
        if self.args.setpo_lambda_units == "term_std":  # opt-in: λ in units of the term's spread in this batch
            term = s / s_std if s_std >= 1e-6 else torch.zeros_like(s)

        adv = output["advantages"]
        n_local = adv.shape[0]
        pi = self.accelerator.process_index
        lam = self.args.setpo_lambda
        lam_s_local = lam * term[pi * n_local:(pi + 1) * n_local].to(adv.dtype)
        base_abs = adv.abs().mean()
        if lam != 0:
            # Not setpo.advantages.combine_advantages: TRL already normalised its own advantages, and λ·s is
            # rounded once here so that the completions table logs exactly what was added. The two agree to
            # rounding (tests/test_trl.py) and at λ = 0 TRL's advantages are untouched, bit for bit.
            output["advantages"] = adv + lam_s_local
            self._patch_logged_advantages(lam * term.cpu())

        # Metrics, computed on the gathered batch (identical on every process).
        weights = self.reward_weights.to(rewards_per_func.device)
        total = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
        correct = (total >= self.args.setpo_correct_reward) & ~unscorable.to(total.device)
        all_texts = gather_object(texts)
        keys = [self.solution_key(t) for t in all_texts]
        stats = group_diversity_stats(emb.float(), correct.tolist(), keys, group_size)
        m = self._metrics[mode]
        m["setpo/s_mean"].append(float(s.mean()))
        m["setpo/s_std"].append(s_std)
        ratio = self.accelerator.gather(torch.stack([lam_s_local.abs().mean(), base_abs]).reshape(1, 2)).mean(0)
        m["setpo/lambda_s_over_adv"].append(float(ratio[0] / ratio[1]) if float(ratio[1]) > 0 else float("nan"))
        m["setpo/pairwise_similarity"].append(stats["pairwise_similarity"])
        m["setpo/distinct_correct"].append(stats["distinct_correct"])
        # groups whose rewards are all equal: GRPO's advantage is 0 there and λ·s is the whole signal
        flat = flat_groups(total.double(), group_size=group_size)
        m["setpo/flat_group_fraction"].append(float(flat.double().mean()))
        self.last_setpo_batch = {"texts": all_texts, "rewards": total.cpu(), "s": s.cpu(),
                                 "emb": emb.float().cpu(), "group_size": group_size, "mode": mode}
        return output

    def _patch_logged_advantages(self, lam_s: torch.Tensor) -> None:
        """TRL logged its all-process advantages before we added λ·s; make the completions table agree."""
        logged = self._logs["advantages"]
        m = min(len(logged), lam_s.shape[0])
        tail = [logged.pop() for _ in range(m)][::-1]
        logged.extend((torch.tensor(tail, dtype=lam_s.dtype) + lam_s[-m:]).tolist() if m else [])
