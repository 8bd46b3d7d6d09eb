"""Running a TRL trainer as a study stage: resume from the newest checkpoint, save, record, and probe the policy."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from setpo.records import write_json


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


def quiet_libraries() -> None:
    """Silence per-step progress bars and info chatter of datasets / transformers (logs stay)."""
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
