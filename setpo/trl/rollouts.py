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
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext

import torch
from transformers.cache_utils import DynamicLayer


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
    tokens); given, its layers are ``PreallocatedLayer`` of that size. Returns {"input_ids", "attention_mask":
    (B, L), "past_key_values"} with B = sum(counts), rows in prompt order.
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
    remove copies (the benchmark ``benchmarks/real_lm.py`` measures each)."""
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
