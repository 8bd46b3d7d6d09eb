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
