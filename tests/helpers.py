"""Shared test helpers. tests/ has no __init__.py, so pytest's default (prepend) import mode puts this folder
on sys.path and test files import these as ``from helpers import ...``."""

from transformers import TrainerCallback


class StopAt(TrainerCallback):
    """Raises KeyboardInterrupt at the start of step ``at`` (or at the end of training with ``at="end"``): an
    interruption from inside the Trainer, like a killed process (checkpoints up to then already saved)."""

    def __init__(self, at=None):
        self.at = at

    def on_step_begin(self, args, state, control, **kw):
        if state.global_step == self.at:
            raise KeyboardInterrupt

    def on_train_end(self, args, state, control, **kw):
        if self.at == "end":
            raise KeyboardInterrupt


#: log_history keys that hold wall-clock times, which differ between two otherwise identical runs.
TIME_KEYS = {"step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second"}


def run_records(run_dir) -> dict:
    """What a finished TRL run folder records, minus wall-clock times: two runs that trained the same way
    (one interrupted and resumed, one straight through) give equal dicts."""
    import json
    from pathlib import Path

    run_dir = Path(run_dir)
    hist = json.loads((run_dir / "log_history.json").read_text())
    done = json.loads((run_dir / "final" / "done.json").read_text())
    return {"log_history": [{k: v for k, v in h.items() if k not in TIME_KEYS} for h in hist],
            "done": {k: v for k, v in done.items() if k != "seconds"},
            "probes": (run_dir / "probes.jsonl").read_text() if (run_dir / "probes.jsonl").exists() else None}
