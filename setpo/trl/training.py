"""Running a TRL trainer as a study stage: resume from the newest checkpoint, save, record, and probe the policy.

What "resumable" promises here: a run killed at any moment and started again ends with the same weights and
records as a run that was never interrupted (on the CPU, bit for bit). That takes four things the Trainer
does not do on its own:

- checkpoints are written aside (``.checkpoint-staging/``) and renamed into place, so a ``checkpoint-*``
  folder is always complete; an incomplete one (from a kill during an older, non-atomic save) is ignored;
- GRPO-style trainers save only at generation boundaries: TRL generates one batch for ``steps_per_generation``
  optimizer steps and does not checkpoint the buffered rollouts, so a checkpoint in between would make the
  resumed run generate different ones;
- the probe sampler leaves torch's global RNG alone (the rollouts draw from it), and the probe file is cut
  back to the checkpoint's step on resume (the steps after it are probed again, identically);
- damaged or missing files are errors that name the file and what to do: each checkpoint carries a list of the
  files it was saved with (``MANIFEST``), and a resume refuses a checkpoint that has lost one, since the Trainer
  would quietly carry on without it (no ``rng_state.pth``: other rollouts; no ``optimizer.pt``: a fresh
  optimizer) and the run would no longer match an uninterrupted one.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from setpo.records import read_records, write_json, write_text
from setpo.refusals import cannot_load, file_refusal

STAGING = ".checkpoint-staging"  # not matched by the Trainer's "checkpoint-*" globs
MANIFEST = "setpo_checkpoint_files.json"  # {"files": {relative path: bytes}}, written into each checkpoint last

# What a resume reads from a checkpoint saved before manifests existed (transformers' Trainer: the weights, the
# optimizer, the LR scheduler, the RNG states, the trainer state). Each entry: alternatives, any one suffices.
_RESUME_NEEDS = (
    ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json",
     "adapter_model.safetensors", "adapter_model.bin"),
    ("optimizer.pt",),
    ("scheduler.pt",),
    ("rng_state.pth", "rng_state_0.pth"),
    ("trainer_state.json",),
)


def _checkpoint_step(path: Path) -> int | None:
    name = path.name
    if not name.startswith("checkpoint-") or not name[len("checkpoint-"):].isdigit():
        return None
    return int(name[len("checkpoint-"):])


def last_checkpoint(folder: Path) -> str | None:
    """The newest complete ``checkpoint-*`` under ``folder`` (the Trainer's own layout), or None.

    A folder without ``trainer_state.json`` (the file the Trainer writes last) is incomplete and ignored.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return None
    found = [(step, p) for p in folder.iterdir() if p.is_dir() and (step := _checkpoint_step(p)) is not None
             and (p / "trainer_state.json").is_file()]
    return str(max(found)[1]) if found else None


def write_manifest(checkpoint: Path) -> None:
    """Record every file of a just-saved ``checkpoint`` with its size in ``checkpoint/MANIFEST``."""
    checkpoint = Path(checkpoint)
    files = {f.relative_to(checkpoint).as_posix(): f.stat().st_size for f in sorted(checkpoint.rglob("*"))
             if f.is_file() and f.name != MANIFEST}
    write_json(checkpoint / MANIFEST, {"files": files})


def check_checkpoint(checkpoint: Path) -> None:
    """Raise a ValueError naming the first missing or damaged file of ``checkpoint`` and what to do.

    Missing: a file the checkpoint's ``MANIFEST`` lists (or, for a checkpoint saved without one, a file a resume
    reads: weights, optimizer.pt, scheduler.pt, rng_state.pth, trainer_state.json). Damaged: a size other than
    the manifest's, or a truncated safetensors, torch zip archive or JSON file. Reads headers and zip
    directories only, so it is cheap for big models."""
    from safetensors import safe_open

    checkpoint = Path(checkpoint)
    # each refusal leads with the file (relative to the run folder) and what to do, then a short cause in our words,
    # the same whatever bytes are damaged (setpo.refusals), never the library's text
    root = checkpoint.parent
    remedy = f"delete {checkpoint.name} to resume from an earlier checkpoint (or the run folder to start over)"
    manifest = checkpoint / MANIFEST
    if manifest.is_file():
        try:
            listed = json.loads(manifest.read_text())["files"]
            listed = {str(name): int(size) for name, size in listed.items()}
        except Exception as e:  # noqa: BLE001 - any failure to read is reported the same way
            raise cannot_load(manifest, e, remedy, expected="checkpoint file list", root=root) from None
        for name, size in listed.items():
            f = checkpoint / name
            if not f.is_file():
                raise file_refusal(f, "is missing", remedy, root=root, detail="the checkpoint was saved with it, and "
                                   "resuming without it would not continue the same run")
            if f.stat().st_size != size:
                raise file_refusal(f, "is damaged", remedy, root=root,
                                   detail=f"cause: {f.stat().st_size} bytes, {size} when saved")
    else:
        for names in _RESUME_NEEDS:
            if not any((checkpoint / n).is_file() for n in names):
                raise file_refusal(checkpoint / names[0], "is missing", remedy, root=root,
                                   detail="a resume reads it; without it the run would not continue the same way")
    expected = {".json": "JSON file", ".safetensors": "safetensors file", ".pt": "torch checkpoint",
                ".pth": "torch checkpoint", ".bin": "torch checkpoint"}
    for f in sorted(checkpoint.rglob("*")):
        if not f.is_file():
            continue
        try:
            if f.suffix == ".json":
                json.loads(f.read_text())
            elif f.suffix == ".safetensors":
                with safe_open(str(f), "pt"):
                    pass
            elif f.suffix in (".pt", ".pth", ".bin"):
                with zipfile.ZipFile(f) as z:  # torch.save's format: a truncated file has no central directory
                    if f.stat().st_size < 64 * 2**20 and z.testzip() is not None:
                        raise ValueError("a member fails its CRC check")
        except Exception as e:  # noqa: BLE001 - any failure to read is reported the same way
            raise cannot_load(f, e, remedy, expected=expected.get(f.suffix, "checkpoint file"), root=root) from None


def generation_aligned_save_steps(args) -> int | None:
    """``args.save_steps`` rounded up to a multiple of the optimizer steps one generation batch feeds (TRL's
    ``steps_per_generation`` x ``num_iterations``, in optimizer steps); None when there is nothing to align
    (not a GRPO-style config, not saving by steps, or save_steps given as a fraction)."""
    per_generation = getattr(args, "steps_per_generation", None)
    if not per_generation or str(getattr(args.save_strategy, "value", args.save_strategy)) != "steps":
        return None
    if not args.save_steps or args.save_steps < 1:
        return None
    micro = per_generation * getattr(args, "num_iterations", 1)      # micro-batches per generation batch
    accumulation = args.gradient_accumulation_steps
    block = math.lcm(micro, accumulation) // accumulation            # optimizer steps per generation batch
    return math.ceil(int(args.save_steps) / block) * block


def _atomic_checkpoints(trainer) -> None:
    """Make ``trainer`` write each checkpoint into a staging folder and rename it into place when complete."""
    from transformers.trainer_utils import rotate_checkpoints

    if getattr(trainer, "_setpo_atomic", False):
        return
    original = trainer._save_checkpoint

    def save(model, trial=None):
        out = Path(trainer.args.output_dir)
        staging = out / STAGING
        shutil.rmtree(staging, ignore_errors=True)
        name = f"checkpoint-{trainer.state.global_step}"
        trainer.args.output_dir = str(staging)
        try:
            original(model, trial)
        finally:
            trainer.args.output_dir = str(out)
        if trainer.args.should_save:
            write_manifest(staging / name)  # last, so a checkpoint with a manifest is complete
            target = out / name
            if target.exists():  # an incomplete leftover of an earlier, killed save at this step
                shutil.rmtree(target)
            os.replace(staging / name, target)
            shutil.rmtree(staging, ignore_errors=True)
            rotate_checkpoints(str(out), trainer.args.save_total_limit)

    trainer._save_checkpoint = save
    trainer._setpo_atomic = True


def progress_callback(log: Callable[[str], Any], label: str, every_s: float = 10.0):
    """A TrainerCallback that calls ``log`` with one line (step, reward or loss, seconds per step) at most every
    ``every_s`` seconds and at the last step, so a long run shows it is alive also when the Trainer's own
    progress bar is off and stdout is a file or a notebook."""
    from transformers import TrainerCallback

    from setpo.groups import check_real

    every_s = check_real(every_s, "every_s", minimum=0)
    if not callable(log):
        raise ValueError(f"log must be a callable taking one line, got {type(log).__name__}")

    class ProgressCallback(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            self.t0 = self.last = time.time()
            self.first = state.global_step
            self.seen = {}  # GRPO logs the reward only on the steps that generate: keep the latest

        def on_log(self, args, state, control, logs=None, **kw):
            now, logs = time.time(), logs or {}
            if "reward" not in logs and "loss" not in logs:  # the end-of-training summary
                return
            self.seen.update({k: logs[k] for k in ("reward", "loss") if isinstance(logs.get(k), (int, float))})
            if now - self.last < every_s and state.global_step < state.max_steps:
                return
            self.last = now
            done = state.global_step - self.first
            parts = [f"{label} step {state.global_step}/{state.max_steps}"]
            parts += [f"{key} {value:.3f}" for key, value in self.seen.items()]
            if done:
                parts.append(f"{(now - self.t0) / done:.2f} s/step")
            log(", ".join(parts))

    return ProgressCallback()


#: written into a run's final folder last, when its model and records are all there: the run is finished.
DONE_FILE = "done.json"
WEIGHT_FILES = _RESUME_NEEDS[0]  # the names a saved model's weights may have


def is_done(final) -> bool:
    """Whether ``train_resumable`` finished the run whose final folder is ``final`` (its ``DONE_FILE``)."""
    return (Path(final) / DONE_FILE).is_file()


def weights_sha256(final) -> str | None:
    """SHA-256 of the weight files a final folder holds (``WEIGHT_FILES``, in name order), None when it holds
    none: what ``done.json`` records, so that a model trained again can be checked against it bit for bit."""
    files = sorted(p for p in Path(final).glob("*") if p.name in WEIGHT_FILES and p.is_file())
    if not files:
        return None
    digest = hashlib.sha256()
    for path in files:
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def train_resumable(trainer, tokenizer, out_dir: Path, final: Path, record: dict, log=None, describe: str = "") -> Path:
    """Train to the end, resuming from the newest complete checkpoint in ``out_dir``; save model and tokenizer
    to ``final`` with ``done.json`` ({"seconds", "steps", "weights_sha256", **record}) and the run's
    ``log_history.json``.

    Any TRL/transformers trainer whose ``output_dir`` is ``out_dir``. Checkpoints are written atomically and,
    for GRPO-style trainers, only at generation boundaries (``save_steps`` is rounded up to a multiple of the
    optimizer steps per generation batch, and ``log`` says so). Per-step metric dicts go to log_history.json
    (ending with a summary of the whole run, the same for a resumed run as for an uninterrupted one) rather
    than the console; with ``log``, a line reports the start or resume and a progress line comes at
    most every 10 s (step, reward or loss).
    """
    from transformers.trainer_callback import PrinterCallback

    out_dir = Path(out_dir)
    say = log if log is not None else (lambda *_: None)
    trainer.remove_callback(PrinterCallback)
    aligned = generation_aligned_save_steps(trainer.args)
    if aligned is not None and aligned != trainer.args.save_steps:
        say(f"{describe.split(':')[0]}: save_steps {trainer.args.save_steps} -> {aligned} (checkpoints only at "
            "generation boundaries, where no generated rollouts are buffered)")
        trainer.args.save_steps = aligned
    _atomic_checkpoints(trainer)
    shutil.rmtree(out_dir / STAGING, ignore_errors=True)  # what a killed save left behind
    resume = last_checkpoint(out_dir)
    if resume is not None:
        check_checkpoint(Path(resume))
    if log is not None:
        trainer.add_callback(progress_callback(log, describe.split(":")[0] or "train"))
        log(describe + (f", resuming from {Path(resume).name}" if resume else ""))
    t0 = time.time()
    if resume is not None and _finished(Path(resume)):
        # The Trainer would take one more step from a checkpoint at max_steps; load it instead.
        from transformers import TrainerState

        trainer._load_from_checkpoint(resume)
        trainer.state = TrainerState.load_from_json(str(Path(resume) / "trainer_state.json"))
    else:
        trainer.train(resume_from_checkpoint=resume)
    trainer.save_model(str(final))
    tokenizer.save_pretrained(str(final))
    write_json(out_dir / "log_history.json", _whole_run_history(trainer.state))
    write_json(Path(final) / DONE_FILE, {"seconds": time.time() - t0, "steps": trainer.state.global_step,
                                         "weights_sha256": weights_sha256(final), **record})
    return Path(final)


def _finished(checkpoint: Path) -> bool:
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    return bool(state.get("max_steps")) and state["global_step"] >= state["max_steps"]


def _whole_run_history(state) -> list[dict]:
    """The per-step log entries and one summary of the whole run. The Trainer's own summary (train_loss,
    train_runtime, ...) covers only the last session, so a resumed run's would differ from an uninterrupted
    run's; this one is the mean step loss over every step (wall-clock time is in done.json)."""
    steps = [h for h in state.log_history if "train_runtime" not in h]
    losses = [h["loss"] for h in steps if isinstance(h.get("loss"), (int, float))]
    summary = {"train_loss": sum(losses) / len(losses) if losses else None, "total_flos": state.total_flos,
               "epoch": state.epoch, "step": state.global_step}
    return steps + [summary]


def probe_callback(sample: Callable[[Any, int], list[dict]], path: Path, every: int, at_end: bool = False):
    """A TrainerCallback recording what the policy samples on fixed probes, for trajectory plots.

    At step 0, every ``every`` steps (and at the last step when ``at_end``) it calls ``sample(model, step)``
    and appends the returned JSON-able records, each with its "step", to ``path`` (JSONL). ``sample`` must not
    touch torch's global RNG (``sample_completions`` forks it), or probing would change the rollouts.

    A run that starts again keeps exactly the records of the steps its checkpoint covers (a fresh start keeps
    none) and probes the later steps again, so the file ends as an uninterrupted run's would: no step skipped
    or doubled, and half a line from a kill mid-write is gone.
    """
    from transformers import TrainerCallback

    from setpo.groups import check_int

    every = check_int(every, "every", minimum=1)
    if not callable(sample):
        raise ValueError(f"sample must be a callable (model, step) -> records, got {type(sample).__name__}")
    path = Path(path)

    class ProbeCallback(TrainerCallback):
        def _record(self, model, step: int) -> None:
            records = sample(model, step)
            with path.open("a") as f:  # one write per step
                f.write("".join(json.dumps({"step": step, **r}) + "\n" for r in records))

        def on_train_begin(self, args, state, control, model=None, **kw):
            start = state.global_step
            kept = [r for r in read_records(path) if start and r["step"] <= start]
            write_text(path, "".join(json.dumps(r) + "\n" for r in kept))
            if start == 0:
                self._record(model, 0)

        def on_step_end(self, args, state, control, model=None, **kw):
            if state.global_step % every == 0 or (at_end and state.global_step == state.max_steps):
                self._record(model, state.global_step)

    return ProbeCallback()


def quiet_libraries() -> None:
    """Silence per-step progress bars and info chatter of datasets / transformers (logs stay)."""
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()


__all__ = ["MANIFEST", "check_checkpoint", "generation_aligned_save_steps", "last_checkpoint", "probe_callback",
           "progress_callback", "quiet_libraries", "read_records", "train_resumable", "write_manifest"]
