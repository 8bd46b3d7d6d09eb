"""Steps every study that runs a real model shares, written once: which model folder a study runs
(``model_folder``), loading it (``load_tokenizer``, ``load_causal_lm``, both: ``load_model``) and how its prompts are rendered for a chat
model (``chat_prompts``).

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


def load_tokenizer(folder: str | Path, *, remedy: str, root: str | Path | None = None, tiny: bool = False):
    """The tokenizer of a local model folder, read offline. A folder that does not load is refused with the folder
    and ``remedy`` first, then a short cause in our words (``setpo.refusals.loading``), never the library's own
    text; the refusal names the folder from ``root`` (default: the folder's parent).

    ``tiny``: a tiny model's tokenizer (``setpo.trl.tiny_models``), read as the PreTrainedTokenizerFast it was saved
    as. AutoTokenizer would follow the folder's model config (qwen2) to Qwen2Tokenizer, which splits the same text
    into other tokens ("1 2 + 3 =" loses its spaces), so a run trained on it is another run."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast  # the engine: imported when a model is loaded

    from setpo.refusals import loading

    with loading(folder, remedy, expected="model folder", root=Path(folder).parent if root is None else root):
        return (PreTrainedTokenizerFast if tiny else AutoTokenizer).from_pretrained(str(folder), local_files_only=True)


def load_causal_lm(folder: str | Path, dtype, *, remedy: str, root: str | Path | None = None):
    """The causal LM in ``dtype`` of a local model folder, read offline; refused like ``load_tokenizer``."""
    from transformers import AutoModelForCausalLM  # the engine: imported when a model is loaded

    from setpo.refusals import loading

    with loading(folder, remedy, expected="model folder", root=Path(folder).parent if root is None else root):
        return AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True, dtype=dtype)


def load_model(folder: str | Path, dtype, *, remedy: str, root: str | Path | None = None, tiny: bool = False):
    """(tokenizer, causal LM in ``dtype``) of a local model folder (``load_tokenizer``, ``load_causal_lm``)."""
    return (load_tokenizer(folder, remedy=remedy, root=root, tiny=tiny),
            load_causal_lm(folder, dtype, remedy=remedy, root=root))


def chat_prompts(tokenizer, items: Sequence, messages: Callable[[object], list[dict]]) -> list[str]:
    """Each item's chat ``messages(item)`` rendered by the tokenizer's chat template, ready to generate."""
    return [tokenizer.apply_chat_template(messages(item), tokenize=False, add_generation_prompt=True)
            for item in items]
