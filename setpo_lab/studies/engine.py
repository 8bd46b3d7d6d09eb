"""What every language-model study does the same way around one RL run, written once: the frame of a training stage
(``train_stage``: claim the folder, skip a finished stage, train again a recorded one whose model is not here and
check its weights), one RL run through the TRL adapter (``train_setpo``: SetPO's trainer, the probes and the
resumable loop), what a run samples at fixed prompts while it trains (``probe_sampler``), and the samples an
evaluation scores (``sample_evaluation``: with progress lines, resumable batch by batch).

A study brings only what is its own: its trainer arguments (``trainer_arguments.rl_trainer_args``), reward,
training rows, prompts, sampling settings and the record of one probe sample. The Countdown, math and short-answer
studies (and the contributing guide's example study) train and sample through these four. torch, transformers, TRL and datasets are imported when a run trains."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from setpo.records import append_record, read_records
from setpo_lab.studies.stages import (Progress, check_restored, claim_identity, has_model, heartbeat, restore_model,
                                      run_records, stage_done)


def train_stage(out_dir: Path, label: str, what: str, fit: Callable[[Path], None], log, identity: dict | None = None,
                redo: bool = False, *, need_model: bool = True, can_train: Callable[[], None] | None = None) -> Path:
    """The frame of every training stage (a warm start, an RL run), around ``fit(final)``, which trains into
    ``final = out_dir/final``. Returns ``final``.

    - ``out_dir`` is claimed at ``identity`` (``stages.claim_identity``; None: not checked; ``redo``: remake what
      was made at another);
    - a stage already done is returned untrained, also without its model when ``need_model`` is false (nothing
      will load it);
    - ``can_train()``, when given, is called before anything is trained and may refuse (a machine that cannot);
    - one recorded as done whose model is not here (``restore_model``: a study kept in git without its models) is
      trained again, its records kept, and its new weights checked against the recorded ones (``check_restored``);
    - the ``checkpoint-*`` folders that let an interrupted run resume are deleted once ``final`` is made: nothing
      reads them then, and each holds weights and optimiser state (1.6 GB for the packaged SmolLM2).

    label: the log's prefix; what: the stage, in refusals."""
    final = out_dir / "final"
    claim_identity(out_dir, identity, redo)
    if stage_done(final) and (has_model(final) or not need_model):
        return final
    if can_train is not None:
        can_train()
    recorded = restore_model(final)
    kept = run_records(out_dir) if recorded is not None else {}
    if recorded is not None:
        log(f"{label}: its model is not here (a study folder keeps its records, not its models): "
            "training it again, to the recorded weights")
    fit(final)
    for ckpt in out_dir.glob("checkpoint-*"):
        shutil.rmtree(ckpt, ignore_errors=True)
    check_restored(final, recorded, what, kept)
    return final


def probe_sampler(tokenizer, items: Sequence, prompts: Sequence[str], n: int, record: Callable[[int, object, str], dict],
                  *, seed: int, **sampling) -> Callable[[object, int], list[dict]]:
    """``sample(model, step)`` for ``setpo.trl.probe_callback``: ``n`` completions of each fixed probe prompt
    (``sampling.sample_completions`` with ``sampling``, seeded ``seed + step``), one ``record(j, item, text)`` per
    sample, j the probe's position and item the study's own probe (``items[j]``, rendered as ``prompts[j]``)."""
    from setpo_lab.studies.sampling import sample_completions  # imports torch: only when a run trains

    items, prompts = list(items), list(prompts)

    def sample(model, step: int) -> list[dict]:
        texts = sample_completions(model, tokenizer, prompts, n, seed=seed + step, **sampling)
        return [record(j, item, text) for j, (item, samples) in enumerate(zip(items, texts, strict=True))
                for text in samples]

    return sample


def train_setpo(out_dir: Path, final: Path, *, model, tokenizer, args, reward, rows: Sequence[dict], embedder,
                probes: Callable[[object, int], list[dict]], probe_every: int, probes_at_end: bool = False,
                callbacks: Sequence = (), record: dict, log, describe: str, heartbeat_label: str | None = None,
                clock: Path | None = None, **trainer_options):
    """One RL run: SetPO's TRL trainer (``setpo.trl.SetPOTrainer``) with ``args`` on the training ``rows``, ``reward``
    and ``embedder``, recording ``probes`` (``probe_sampler``) to ``out_dir/probes.jsonl`` every ``probe_every``
    steps (and at the last with ``probes_at_end``), trained to the end from its last checkpoint
    (``setpo.trl.train_resumable``: ``final`` gets the model, ``done.json`` with ``record``, and ``describe`` opens
    the log). With ``heartbeat_label`` a line every 10 s shows a long step is alive (``clock``: where the sittings'
    seconds add up). trainer_options: the trainer's own (``solution_key``). Returns the trainer (its
    ``setpo_seconds``)."""
    from datasets import Dataset  # the engine: imported when a run trains

    from setpo.trl import SetPOTrainer, probe_callback, train_resumable

    trainer = SetPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=Dataset.from_list(list(rows)),
                           processing_class=tokenizer, embedder=embedder,
                           callbacks=[probe_callback(probes, out_dir / "probes.jsonl", probe_every, at_end=probes_at_end),
                                      *callbacks], **trainer_options)
    with heartbeat(log if heartbeat_label else None, heartbeat_label or "", clock=clock):
        train_resumable(trainer, tokenizer, out_dir, final, record, log, describe)
    return trainer


def sample_evaluation(model, tokenizer, prompts: Sequence[str], n: int, *, seed: int, log=None, label: str = "eval",
                      partial: Path | None = None, chunk_prompts: int | None = None, **sampling) -> list[list[str]]:
    """The ``n`` completions per prompt an evaluation scores (``sampling.sample_completions`` with ``sampling``,
    seeded ``seed``: seeds follow each prompt's position, so sampling again, or in chunks, gives them again).

    With ``log``: a progress line at most every 10 s (prompts sampled) and a heartbeat inside a long batch.
    ``partial``: a JSONL file that keeps each finished chunk of ``chunk_prompts`` prompts, so that an evaluation
    stopped part-way resumes at its next chunk with the same samples (its sittings' seconds add up beside it, in
    ``.clock.json``); None: one chunk, nothing kept."""
    from setpo_lab.studies.sampling import sample_completions  # imports torch: only when a model samples

    prompts = list(prompts)
    step = max(1, chunk_prompts or len(prompts))
    done = {int(r["first"]): r["texts"] for r in (read_records(Path(partial)) if partial and Path(partial).is_file()
                                                  else [])}
    progress = Progress(log or (lambda *_: None), f"[{label}] prompts sampled", len(prompts))
    progress.done = sum(len(texts) for texts in done.values())
    if done and log:
        log(f"[{label}] resuming: {len(done)} batch(es) already sampled ({partial})")
    with heartbeat(log, f"[{label}] sampling {len(prompts)} x {n}", lambda: f"{progress.done}/{progress.total} prompts",
                   clock=None if partial is None else Path(partial).with_suffix(".clock.json")):
        for first in range(0, len(prompts), step):
            if first in done:
                continue
            done[first] = sample_completions(model, tokenizer, prompts[first:first + step], n, seed=seed,
                                             first_index=first, progress=progress.step, **sampling)
            if partial:
                append_record(Path(partial), {"first": first, "texts": done[first]})
    return [texts for first in sorted(done) for texts in done[first]]
