"""Steps every study that runs a real model shares, written once: which model folder a study runs
(``model_folder``) and how its prompts are rendered for a chat model (``chat_prompts``).

Not part of the Countdown study's code (its identity): no module that study imports imports this one.
Heavy packages (transformers, setpo.models) are imported inside the functions."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path


def model_folder(path: str | Path | None, *, remedy: str, packaged: str | None = None,
                 otherwise: Callable[[], Path] | None = None) -> Path:
    """The model a study runs: ``path`` when given (``~`` expanded; not a folder: FileNotFoundError naming it and
    ``remedy``), else the packaged model ``packaged`` (``setpo.models.prepared_folder``: prepared once, quietly;
    a missing package is a one-line install instruction), else ``otherwise()``."""
    if path:
        folder = Path(path).expanduser()
        if not folder.is_dir():
            raise FileNotFoundError(f"no model folder at {str(folder)!r}; {remedy}")
        return folder
    if packaged is not None or otherwise is None:
        from setpo.models import DEFAULT_MODEL, prepared_folder

        return prepared_folder(packaged or DEFAULT_MODEL, log=lambda *_: None)
    return otherwise()


def chat_prompts(tokenizer, items: Sequence, messages: Callable[[object], list[dict]]) -> list[str]:
    """Each item's chat ``messages(item)`` rendered by the tokenizer's chat template, ready to generate."""
    return [tokenizer.apply_chat_template(messages(item), tokenize=False, add_generation_prompt=True)
            for item in items]
