"""Rollouts that share each prompt's forward pass across its G samples: ``generate``'s samples at a fraction of
its prompt work.

An RL generation batch holds every prompt G times in a row (TRL's ``RepeatSampler``). Plain ``generate`` runs
the whole left-padded batch through the model, so each prompt's tokens go through it G times although the G
copies give the same keys and values. Here each distinct prompt goes through once: its tokens but the last
make a KV cache (``prompt_cache``), the cache's rows are copied to the rows that repeat the prompt, and
``generate`` continues from there: it processes the last prompt token of every row and samples as usual.

What it samples. Every row has the same padded length, positions, attention mask and cache contents as under
plain ``generate`` (up to float rounding: the cached keys and values come from a batch of P distinct prompts
instead of P·G rows, and the last prompt token is processed on its own instead of in the prompt's pass), and
``generate`` draws from torch's RNG in the same order and shapes (one multinomial over (B, V) per step). So the
same seed gives the same tokens unless a draw falls within rounding of a boundary between two tokens'
cumulative probabilities (about 1e-6 per token: tests/test_rollouts.py finds the samples equal token for
token). It is not bitwise by construction, and no path that skips G - 1 of the prompt passes can be.

Where it is used (``rollout_refusal``). The argument above holds for a model whose every cache layer is
transformers' plain full-attention ``DynamicLayer``, with no dropout drawing random numbers while it runs, and for
the ``generate`` options that act on the same input ids and logits (temperature, top-k/p, min-p, typical-p,
repetition penalty, n-gram and word bans: tests/test_fast_path_fallbacks.py finds them equal token for token).
Anything else is refused with a reason, before the model runs: a sliding-window or chunked layer (it keeps only
the last window - 1 prompt tokens, so the preallocated copy would hold the wrong positions: Mistral and Qwen2 with
a window shorter than the prompt sampled other tokens, Gemma-2 crashed), linear-attention or hybrid layers, any
other cache class; dropout > 0 in train mode (the prompt pass would draw its masks in other shapes than
``generate``'s); beams, several return sequences per row, a cache implementation of ``generate``'s own, and the
other options ``sampling_refusal`` lists. ``SetPOTrainer`` then runs TRL's own ``generate`` and logs the reason
once (``note_fallback``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext

import torch
from transformers.cache_utils import DynamicLayer

logger = logging.getLogger(__name__)


class FastPathRefused(ValueError):
    """A shared-prompt fast path cannot give the plain path's result for this model or these options; the message
    says why. Raised before anything that draws random numbers has run, so the caller can take the plain path."""


def _configured(model):
    """``model``, or the module a wrapper without a config holds (DDP's and DeepSpeed's ``.module``)."""
    while getattr(model, "config", None) is None and isinstance(getattr(model, "module", None), torch.nn.Module):
        model = model.module
    return model


def text_config(model):
    """The decoder's config of ``model`` (a multimodal model's text config), or None when it has none."""
    config = getattr(_configured(model), "config", None)
    if config is None:
        return None
    get = getattr(config, "get_text_config", None)
    if get is None:
        return config
    try:
        return get(decoder=True)
    except TypeError:  # an older signature without ``decoder``
        return get()


def cache_refusal(model) -> str | None:
    """Why ``model``'s KV cache is not all plain full-attention ``DynamicLayer`` layers (None when it is), read
    from its config: ``layer_types`` other than "full_attention" (sliding, chunked, linear attention, mamba,
    hybrid ...), or, without ``layer_types``, a ``sliding_window`` / ``attention_chunk_size``, or an
    encoder-decoder model. Where transformers can build the model's ``DynamicCache`` from the config, every layer
    it builds must be a ``DynamicLayer`` itself (not a subclass). The caches a forward pass returns are checked
    again where they are used (``cache_layers_refusal``)."""
    config = text_config(model)
    if config is None:
        return f"{type(model).__name__} has no config to read its attention layers from"
    if getattr(config, "is_encoder_decoder", False):
        return "an encoder-decoder model"
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        other = sorted({str(t) for t in layer_types} - {"full_attention"})
        if other:
            return f"attention layers of type {', '.join(other)} (only full_attention layers are shared exactly)"
    else:
        for name in ("sliding_window", "attention_chunk_size"):
            if getattr(config, name, None) is not None:
                return f"{name}={getattr(config, name)} (only full-attention layers are shared exactly)"
    try:
        from transformers.cache_utils import DynamicCache

        layers = DynamicCache(config=_configured(model).config).layers
    except Exception:  # a config transformers cannot build a cache from: the returned cache is checked instead
        layers = []
    return cache_layers_refusal(layers) if layers else None


def cache_layers_refusal(layers) -> str | None:
    """Why these cache layers are not all plain ``DynamicLayer`` (exactly that class), or None."""
    if layers is None:
        return "the model's cache has no per-layer keys and values"
    other = sorted({type(layer).__name__ for layer in layers if type(layer) is not DynamicLayer})
    if other:
        return f"cache layers of type {', '.join(other)} (only full-attention DynamicLayer layers are shared exactly)"
    return None


#: config fields that hold a dropout probability; "classifier"/"summary" heads are not part of a causal LM's pass
_DROPOUT_SUFFIXES = ("dropout", "dropout_prob", "dropout_rate", "pdrop")
_NOT_LM_DROPOUT = ("classifier_dropout", "summary_first_dropout")


def dropout_refusal(model) -> str | None:
    """Why ``model`` would draw dropout masks while it runs (None when it would not): in train mode, a dropout
    probability > 0 in its config (``attention_dropout``, ``resid_pdrop``, ...) or any ``torch.nn.Dropout``
    module (a LoRA adapter's among them) in train mode with p > 0. A shared pass draws those masks in other
    shapes than the plain pass (and rows that share a prompt would share its masks), so it is not the same pass."""
    for name, module in (model.named_modules() if isinstance(model, torch.nn.Module) else []):
        if isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.training and module.p > 0:
            return f"dropout p={module.p} at {name or type(model).__name__} in train mode"
    if not getattr(model, "training", False):
        return None
    config = text_config(model)
    for field, value in sorted(vars(config).items()) if config is not None else []:
        if field.endswith(_DROPOUT_SUFFIXES) and field not in _NOT_LM_DROPOUT and isinstance(value, (int, float)) \
                and not isinstance(value, bool) and value > 0:
            return f"{field}={value} in train mode"
    return None


def _generation_value(config, fallback, name):
    value = getattr(config, name, None)
    return getattr(fallback, name, None) if value is None and fallback is not None else value


#: generate options the shared-prompt rollouts do not give exactly: (field, is it on?, why)
_REFUSED_OPTIONS = (
    ("num_beams", lambda v: v is not None and v > 1, "beam search"),
    ("num_beam_groups", lambda v: v is not None and v > 1, "group beam search"),
    ("num_return_sequences", lambda v: v is not None and v > 1,
     "several sequences per row (generate expands the rows after the cache is built)"),
    ("penalty_alpha", lambda v: v is not None and v > 0, "contrastive search"),
    ("dola_layers", lambda v: v is not None, "DoLa decoding"),
    ("prompt_lookup_num_tokens", lambda v: v is not None, "prompt-lookup decoding"),
    ("assistant_early_exit", lambda v: v is not None, "assisted decoding"),
    ("constraints", lambda v: bool(v), "constrained beam search"),
    ("force_words_ids", lambda v: bool(v), "constrained beam search"),
    ("token_healing", lambda v: bool(v), "token healing (it rewrites the prompt)"),
    ("prefill_chunk_size", lambda v: v is not None, "chunked prefill"),
    ("cache_implementation", lambda v: v is not None, "a cache implementation of generate's own"),
    ("use_cache", lambda v: v is False, "use_cache=False"),
    ("return_dict_in_generate", lambda v: bool(v), "return_dict_in_generate (the rollouts return token ids)"),
)


def sampling_refusal(generation_config, model=None) -> str | None:
    """Why ``generate`` with ``generation_config`` (its unset fields read from ``model.generation_config``, as
    ``generate`` reads them) would not sample what it samples from a shared prompt cache, or None. What is left
    acts on the same input ids and logits either way (temperature, top-k/p, min-p, typical-p, epsilon/eta
    cutoffs, repetition penalties, n-gram and word bans, suppressed tokens, sequence bias, minimum and forced
    lengths, guidance, watermarking)."""
    fallback = getattr(model, "generation_config", None)
    for name, on, why in _REFUSED_OPTIONS:
        value = _generation_value(generation_config, fallback, name)
        if on(value):
            return f"generate option {name}={value!r}: {why}"
    return None


def rollout_refusal(model, generation_config=None) -> str | None:
    """Why ``shared_prompt_generate`` would not sample what ``model.generate`` samples (None when it would, up to
    float rounding): ``cache_refusal``, ``dropout_refusal`` or ``sampling_refusal``, in that order."""
    if generation_config is None:
        generation_config = getattr(model, "generation_config", None)
    return cache_refusal(model) or dropout_refusal(model) or sampling_refusal(generation_config, model)


def note_fallback(owner, switch: str, reason: str) -> None:
    """Log once per ``owner`` (a trainer), switch and reason that ``switch`` was not used and why."""
    seen = owner.__dict__.setdefault("setpo_fallbacks", set())
    if (switch, reason) not in seen:
        seen.add((switch, reason))
        logger.warning("SetPO: %s not used (TRL's own path instead): %s", switch, reason)


def prompt_runs(prompt_ids: Sequence[Sequence[int]]) -> tuple[list[list[int]], list[int]]:
    """Runs of consecutive equal prompts: (the distinct prompt of each run, each run's length).
    ``[a, a, b, b, b, a]`` -> ``([a, b, a], [2, 3, 1])``."""
    prompts: list[list[int]] = []
    counts: list[int] = []
    for ids in prompt_ids:
        ids = list(ids)
        if prompts and prompts[-1] == ids:
            counts[-1] += 1
        else:
            prompts.append(ids)
            counts.append(1)
    return prompts, counts


def left_pad(prompt_ids: Sequence[Sequence[int]], pad_token_id: int,
             pad_to_multiple_of: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded (input_ids, attention_mask), both (B, L) int64, L the longest prompt rounded up to
    ``pad_to_multiple_of``: TRL's padding of a generation batch."""
    if not prompt_ids or any(len(p) == 0 for p in prompt_ids):
        raise ValueError("left_pad needs at least one prompt and no empty prompt")
    length = max(len(p) for p in prompt_ids)
    if pad_to_multiple_of:
        length = -(-length // pad_to_multiple_of) * pad_to_multiple_of
    ids = torch.full((len(prompt_ids), length), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(prompt_ids), length), dtype=torch.long)
    for i, p in enumerate(prompt_ids):
        ids[i, length - len(p):] = torch.tensor(list(p), dtype=torch.long)
        mask[i, length - len(p):] = 1
    return ids, mask


def prompt_cache(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, counts: Sequence[int] | int,
                 capacity: int | None = None) -> dict:
    """``generate``'s inputs for ``counts[i]`` samples of prompt row i that reuse one pass over it.

    input_ids, attention_mask: (P, L) left-padded, L >= 2 or a one-token prompt batch (then nothing is cached and
    the rows are simply repeated). counts: samples per row (an int: the same for every row). The prompts but
    their last token go through the model once, with the positions ``generate`` gives left-padded rows
    (cumulative mask - 1); the cache's rows are repeated; ``generate`` then processes only the last prompt
    token of each copy before sampling. capacity: the positions the cache will hold in all (prompt and new
    tokens); given, its layers are ``PreallocatedLayer`` of that size, and a cache whose layers are not all plain
    ``DynamicLayer`` (a sliding window's layer holds only the last window - 1 positions) raises
    ``FastPathRefused`` instead. Returns {"input_ids", "attention_mask": (B, L), "past_key_values"} with
    B = sum(counts), rows in prompt order.
    """
    rows = input_ids.shape[0]
    per_row = [counts] * rows if isinstance(counts, int) else list(counts)
    if len(per_row) != rows or any(c < 1 for c in per_row):
        raise ValueError(f"counts must give >= 1 sample for each of the {rows} prompts, got {counts!r}")
    index = torch.repeat_interleave(torch.arange(rows, device=input_ids.device),
                                    torch.tensor(per_row, device=input_ids.device))
    out = {"input_ids": input_ids[index], "attention_mask": attention_mask[index]}
    if input_ids.shape[1] < 2:
        return out
    positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    past = model(input_ids=input_ids[:, :-1], attention_mask=attention_mask[:, :-1],
                 position_ids=positions[:, :-1], use_cache=True).past_key_values
    if capacity is not None:
        refusal = cache_layers_refusal(getattr(past, "layers", None))
        if refusal is not None:
            raise FastPathRefused(f"the prompt cache cannot be preallocated: {refusal}")
    if all(c == per_row[0] for c in per_row):
        past.batch_repeat_interleave(per_row[0])
    else:
        past.batch_select_indices(index)
    if capacity is not None:
        past.layers = [PreallocatedLayer(layer.keys, layer.values, capacity) for layer in past.layers]
    out["past_key_values"] = past
    return out


def shared_prompt_generate(model, prompt_ids: Sequence[Sequence[int]], pad_token_id: int,
                           pad_to_multiple_of: int | None = None, *, preallocate: bool = True,
                           grouped_attention: bool = True, **generate_kwargs) -> torch.Tensor:
    """``model.generate`` over the left-padded ``prompt_ids`` (B prompts, consecutive repeats shared, see the
    module docstring), returning the new tokens only: (B, T) int64, rows in ``prompt_ids`` order, padded
    after the end of each row as ``generate`` pads them. ``generate_kwargs`` go to ``generate`` as they are
    (e.g. ``generation_config=``). Runs under ``torch.no_grad``; tensors go to the model's device.

    preallocate: the KV cache is allocated once for prompt + ``max_new_tokens`` positions (``PreallocatedLayer``)
    instead of being copied into a new tensor at every step. grouped_attention: decode steps attend with
    ``grouped_query_sdpa`` (``grouped_decode_attention``). Both leave every computed value as it was; they
    remove copies (the benchmark ``benchmarks/real_lm.py`` measures each).

    Raises ``FastPathRefused`` where the result would not be ``generate``'s (``rollout_refusal``; the module
    docstring), before anything has drawn a random number: the caller then runs plain ``generate``."""
    refusal = rollout_refusal(model, generate_kwargs.get("generation_config"))
    if refusal is None:
        refusal = sampling_refusal(_kwargs_config(generate_kwargs))
    if refusal is not None:
        raise FastPathRefused(refusal)
    unique, counts = prompt_runs(prompt_ids)
    ids, mask = left_pad(unique, pad_token_id, pad_to_multiple_of)
    device = model.device
    config = generate_kwargs.get("generation_config") or model.generation_config
    new_tokens = generate_kwargs.get("max_new_tokens", config.max_new_tokens)
    capacity = ids.shape[1] + new_tokens if preallocate and new_tokens is not None else None
    with torch.no_grad(), (grouped_decode_attention(model) if grouped_attention else nullcontext()):
        inputs = prompt_cache(model, ids.to(device), mask.to(device), counts, capacity=capacity)
        out = model.generate(**inputs, **generate_kwargs)
    return out[:, ids.shape[1]:]


def _kwargs_config(generate_kwargs: dict):
    """The ``generate`` options passed as keywords next to ``generation_config``, as an object with those fields."""
    from types import SimpleNamespace

    return SimpleNamespace(**{k: v for k, v in generate_kwargs.items() if k != "generation_config"})


class PreallocatedLayer(DynamicLayer):
    """A KV cache layer (transformers' ``DynamicLayer`` interface, as ``generate`` uses it) whose keys and values
    live in buffers of ``capacity`` positions: a step writes its tokens in place and attention reads a view of
    the filled prefix, where ``DynamicLayer`` concatenates the whole cache into a new tensor at every step (on a
    CPU, mostly fresh pages the kernel has to zero). The same values either way. keys, values: (B, H_kv, n, D)."""

    is_compileable = False

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, capacity: int):
        super().__init__()
        batch, heads, n, dim = keys.shape
        if capacity < n:
            raise ValueError(f"capacity {capacity} is below the {n} positions already cached")
        self._keys = keys.new_empty(batch, heads, capacity, dim)
        self._values = values.new_empty(batch, heads, capacity, dim)
        self._keys[:, :, :n] = keys
        self._values[:, :, :n] = values
        self.length, self.capacity = n, capacity
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
        self.keys, self.values = self._keys[:, :, :n], self._values[:, :, :n]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        end = self.length + key_states.shape[-2]
        if end > self.capacity:
            raise ValueError(f"the cache holds {self.capacity} positions; {end} were asked for")
        self._keys[:, :, self.length:end] = key_states
        self._values[:, :, self.length:end] = value_states
        self.length = end
        self.keys, self.values = self._keys[:, :, :end], self._values[:, :, :end]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def get_mask_sizes(self, query_length) -> tuple[int, int]:
        # transformers >= 5.10 passes the query length; older releases pass the cache positions (a tensor)
        if isinstance(query_length, torch.Tensor):
            query_length = query_length.shape[0]
        return self.length + query_length, 0

    def get_max_cache_shape(self) -> int:
        return -1

    def _refuse(self, *args, **kwargs):
        raise NotImplementedError("a PreallocatedLayer serves one sampling run of generate; it does not reorder, "
                                  "select, repeat or crop its rows")

    batch_repeat_interleave = batch_select_indices = reorder_cache = crop = _refuse


def completion_lists(completion_ids: torch.Tensor, eos_token_ids: Sequence[int]) -> list[list[int]]:
    """Each row of ``completion_ids`` (B, T) up to and including its first end token (any of ``eos_token_ids``),
    or whole when it has none: TRL's cut of a generated batch into completions."""
    is_end = torch.isin(completion_ids, torch.tensor(list(eos_token_ids), device=completion_ids.device))
    length = torch.where(is_end.any(dim=1), is_end.int().argmax(dim=1) + 1, completion_ids.shape[1])
    return [row[:n].tolist() for row, n in zip(completion_ids.cpu(), length.cpu().tolist())]


#: the name ``grouped_decode_attention`` registers its attention function under (transformers' AttentionInterface)
GROUPED_SDPA = "setpo_grouped_sdpa"


def grouped_query_sdpa(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                       is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention, with a one-token query (a decode step) of grouped-query attention run on
    the cached keys and values as they are, instead of on copies repeated to every query head.

    query: (B, H, q, D); key, value: (B, H_kv, S, D); attention_mask: None or (B, 1, q, S). With q = 1 and
    r = H / H_kv > 1, query head h = k·r + j reads kv head k (transformers' ``repeat_kv`` order), so the r heads
    of kv head k become r query rows of one (B, H_kv, r, D) product: the same dot products, without the
    (B, H, S, D) copy of keys and values that ``repeat_kv`` makes on every layer at every step (with a padding
    mask, transformers repeats them on a CPU). Anything else goes to transformers' own SDPA function.
    Returns ((B, q, H, D), None), as transformers' attention functions do.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    batch, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    if q_len != 1 or heads == kv_heads or dropout or kwargs.get("output_attentions", False):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    grouped = query.reshape(batch, kv_heads, heads // kv_heads, dim)
    out = torch.nn.functional.scaled_dot_product_attention(grouped, key, value, attn_mask=attention_mask, scale=scaling)
    return out.reshape(batch, heads, 1, dim).transpose(1, 2).contiguous(), None


@contextmanager
def grouped_decode_attention(model) -> Iterator[None]:
    """Within the block, a model on transformers' "sdpa" attention runs its decode steps with
    ``grouped_query_sdpa`` (registered under ``GROUPED_SDPA``, with SDPA's masks); any other model is left as
    it is. The model's implementation is restored on the way out, also after an error."""
    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        yield
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(GROUPED_SDPA, grouped_query_sdpa)
    AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)
    model.set_attn_implementation(GROUPED_SDPA)
    try:
        yield
    finally:
        model.set_attn_implementation("sdpa")
