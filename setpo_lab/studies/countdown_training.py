"""The Countdown study's training drivers: the warm start (``train_sft``), one RL run (``train_rl``), and the test
and validation evaluations (``sample_eval``, ``evaluate_model``), each resumable and made at the study's identity
(``setpo_lab.studies.countdown`` runs them). The frame of each training stage and the RL run itself are the
engine's (``setpo_lab.studies.engine``)."""


from __future__ import annotations

import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Sequence

import torch

from setpo.envs.countdown import CountdownInstance, extract_answer, score_answer
from setpo.records import write_json
from setpo.trl.rewards import countdown_reward
from setpo.trl.tiny_models import build_model, build_tokenizer
from setpo_lab.studies.countdown_config import STEPS_PER_GENERATION, CountdownLMConfig, RLRun
from setpo_lab.studies.countdown_data import (
    CountdownData,
    evaluate_samples,
    prompt_text,
    rl_rows,
    sft_examples,
    solution_key,
)
from setpo_lab.studies.engine import probe_sampler, sample_evaluation, train_setpo, train_stage
from setpo_lab.studies.toolkit import load_model
from setpo_lab.studies.trainer_arguments import rl_trainer_args, run_arguments
from setpo_lab.studies.stages import (
    cached_evaluation,
    has_model,
    print_flushed,
    refusal,
    stage_done,
)


def train_sft(cfg: CountdownLMConfig, data: CountdownData, out_dir: Path, log=print_flushed, examples=None,
              identity: dict | None = None, redo: bool = False) -> Path:
    """Warm start by supervised fine-tuning on solver solutions; returns the final model directory.
    examples: the study's ``sft_examples``, or a function making them, when at hand (None: made here).
    identity: the run identity (``study_identity``) the folder must have been made at (None: not checked);
    ``redo``: remake it if not."""
    def fit_warm_start(final: Path) -> None:
        from datasets import Dataset  # the engine (datasets, TRL, transformers): imported when a stage trains,
        from trl import SFTConfig, SFTTrainer  # so that reading a finished study (notebook 03) stays light

        from setpo.trl import train_resumable

        tokenizer = build_tokenizer()
        model = build_model(tokenizer, cfg.model, seed=cfg.seed)
        rows = examples() if callable(examples) else examples  # the study's, made only when SFT trains
        if rows is None:
            rows = sft_examples(data.train, cfg.sft_solutions_per_problem, cfg.seed, log)
        log(f"[sft] {len(rows)} examples from {len(data.train)} problems, "
            f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters")
        steps_per_epoch = math.ceil(len(rows) / cfg.sft_batch_size)
        args = SFTConfig(
            output_dir=str(out_dir), num_train_epochs=cfg.sft_epochs, learning_rate=cfg.sft_lr,
            per_device_train_batch_size=cfg.sft_batch_size, lr_scheduler_type="cosine",
            warmup_steps=min(50, steps_per_epoch), weight_decay=0.01, max_length=cfg.model.max_position_embeddings,
            completion_only_loss=True,
            save_strategy="steps", save_steps=max(1, steps_per_epoch // 2), gradient_checkpointing=False,
            **run_arguments(cfg.seed, on_cpu=not torch.cuda.is_available()))
        trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows),
                             processing_class=tokenizer)
        train_resumable(trainer, tokenizer, out_dir, final, {"examples": len(rows)}, log,
                        f"[sft]: {steps_per_epoch} steps per epoch, {cfg.sft_epochs:g} epochs")

    return train_stage(out_dir, "[sft] the warm start", "the warm start", fit_warm_start, log, identity, redo)


def _load_trained(model_dir: Path):
    """(tokenizer, float32 model) of a finished stage; a damaged folder is a ValueError naming it."""
    if stage_done(model_dir) and not has_model(model_dir):
        raise refusal("recorded as trained, but its model is not here (a study folder keeps its records, not its "
                      "models)", model_dir, "rerun with the stage that trains it (--stages train,evaluate): it is "
                      "trained again and checked against the recorded weights")
    # damaged weights, config, tokenizer: one message
    return load_model(model_dir, torch.float32, root=Path(model_dir).parents[1], tiny=True,
                      remedy=f"delete {Path(model_dir).parent.name} and rerun to train that stage again")


def _countdown_probes(cfg: CountdownLMConfig, probes: Sequence[CountdownInstance], tokenizer):
    """What a run samples at its probes (``engine.probe_sampler``): ``cfg.probe_samples`` completions at T = 1 per
    fixed probe problem, as {"problem", "numbers", "target", "text", "expression", "reward", "canonical"}
    records."""
    def record(j: int, inst: CountdownInstance, text: str) -> dict:
        return {"problem": j, "numbers": list(inst.numbers), "target": inst.target, "text": text,
                "expression": extract_answer(text), "reward": score_answer(text, inst.numbers, inst.target),
                "canonical": solution_key(text)}

    return probe_sampler(tokenizer, probes, [prompt_text(p) for p in probes], cfg.probe_samples, record,
                         seed=cfg.seed, temperature=1.0)


def train_rl(cfg: CountdownLMConfig, run: RLRun, data: CountdownData, init_dir: Path | Callable[[], Path],
             out_dir: Path, embedder=None, log=print_flushed, callbacks: Sequence = (), identity: dict | None = None,
             redo: bool = False, make_embedder: Callable[[], object] | None = None) -> Path:
    """One RL run from the warm start (GRPO, SetPO, the pairwise penalty, DRA-GRPO, Pass@k training, the
    perfect-kernel ceiling); resumes from its last checkpoint. Returns the final model's folder.

    init_dir: the warm start's final folder, or a function returning it, called only when the run trains (the
    study's trains the warm start again when its model is not here). embedder: the Embedder ``run.embedder``
    names, shared across runs (None: load it by name; "centered:..." and the ceiling's "verifier" need the
    study's, see ``resolve_embedder``); make_embedder: a function returning it instead, called only when the run
    trains, so that a finished run loads no embedder. The run's seed sets TRL's
    sampling and prompt order. callbacks: extra TrainerCallbacks (the tests use one to interrupt a run).
    identity: the run identity the folder must have been made at (None: not checked); ``redo``: remake it if
    not. Writes ``timings.json`` beside the run: seconds of generation, embedding and update (this invocation's;
    ``resumed`` says whether earlier ones did part of the run).
    """
    def fit_rl_run(final: Path) -> None:
        from setpo.trl.training import last_checkpoint

        warm_start = init_dir() if callable(init_dir) else init_dir
        run_embedder = make_embedder() if make_embedder is not None else embedder
        out_dir.mkdir(parents=True, exist_ok=True)
        resumed = last_checkpoint(out_dir) is not None
        tokenizer, model = _load_trained(warm_start)
        tokenizer.padding_side = "left"
        g = run.group_size
        per_step = cfg.rl_prompts_per_step * g  # validated by the config: a multiple of STEPS_PER_GENERATION
        args = rl_trainer_args(
            run.preset, out_dir, seed=run.seed, save_steps=cfg.rl_save_steps, on_cpu=not torch.cuda.is_available(),
            **run.trainer_settings(), learning_rate=cfg.rl_lr,
            per_device_train_batch_size=per_step // STEPS_PER_GENERATION,
            steps_per_generation=STEPS_PER_GENERATION, max_steps=cfg.rl_steps,
            max_completion_length=cfg.rl_max_completion_length, temperature=cfg.rl_temperature,
            gradient_checkpointing=False)
        t0 = time.time()
        trainer = train_setpo(
            out_dir, final, model=model, tokenizer=tokenizer, args=args, reward=countdown_reward,
            rows=rl_rows(data.train), embedder=run_embedder, solution_key=solution_key,
            probes=_countdown_probes(cfg, data.val[:cfg.n_probe], tokenizer), probe_every=cfg.probe_every,
            callbacks=callbacks, record={"run": asdict(run)}, log=log,
            describe=f"[rl] {run.name}: {run.variant}, G={g}, beta={run.beta}, seed={run.seed}")
        write_json(out_dir / "timings.json",
                   {**trainer.setpo_seconds, "seconds": time.time() - t0, "resumed": resumed})

    return train_stage(out_dir, f"[rl] {run.name}", f"run {run.name}", fit_rl_run, log, identity, redo)


def sample_eval(cfg: CountdownLMConfig, model_dir: Path, instances: Sequence[CountdownInstance],
                temperature: float, label: str = "", log=None) -> list[list[str]]:
    """The ``cfg.eval_samples`` completions per problem an evaluation scores (seeded: sampling again gives them
    again). log: a progress line at most every 10 s."""
    tokenizer, model = _load_trained(model_dir)
    return sample_evaluation(model, tokenizer, [prompt_text(i) for i in instances], cfg.eval_samples,
                             seed=cfg.seed + 1, log=log, label=f"eval {label}", temperature=temperature,
                             top_p=cfg.eval_top_p, max_new_tokens=cfg.rl_max_completion_length,
                             batch_sequences=cfg.eval_batch_sequences)


def evaluate_model(cfg: CountdownLMConfig, model_dir: Path | Callable[[], Path],
                   instances: Sequence[CountdownInstance], temperature: float, path: Path, log=None,
                   texts_file: Path | None = None, identity: dict | None = None, redo: bool = False) -> dict:
    """Sample ``cfg.eval_samples`` completions per problem (``sample_eval``) and score them; cached in ``path``
    with the run identity it was made at (a cache made at another is refused, or with ``redo`` made again).
    model_dir: the model's folder, or a function training it and returning it, called only when the evaluation
    is not cached (a resumed study trains no model whose evaluations it has). texts_file: where to keep the
    completions (for the judge; None keeps none)."""
    def evaluate() -> dict:
        t0 = time.time()
        samples = sample_eval(cfg, model_dir() if callable(model_dir) else model_dir, instances, temperature,
                              path.stem, log)
        if texts_file is not None:
            write_json(texts_file, samples)
        result = evaluate_samples(instances, samples)
        result.update(temperature=temperature, top_p=cfg.eval_top_p, seconds=time.time() - t0,
                      examples=[s[:4] for s in samples[:5]])
        return result

    return cached_evaluation(path, evaluate, identity=identity, redo=redo,
                             remedy="delete it and rerun to evaluate again")
