"""One forward pass per prompt in GRPO's loss, instead of one per rollout.

GRPO scores G rollouts of each prompt: TRL's loss runs the model over prompt + completion for every row, so the
prompt goes through the model G times. With short answers the prompt is most of each row (a ~90-token chat
prompt before a ~7-token answer), so most of a training step's FLOPs redo the same prompt. ``SharedPrefixModel``
wraps the model for TRL's ``_get_per_token_logps_and_entropies``: it runs each distinct prompt once (all but its
last token, with gradients), selects that key/value cache for every row that shares the prompt, and runs only
the last prompt token and the completion on top of it. Gradients flow back through the selected cache into the
one prompt pass, so loss and gradients are those of the full pass up to floating-point rounding (other matrix
shapes, other summation order): the logged numbers of a run differ in the last bits, as between two BLAS
libraries, and a run keeps one setting.

Why the output lines up with TRL's: both TRL's fused LM head (labels, from the end) and its older logits path
(``logits_to_keep``, then ``[:, -logits_to_keep:]``) read the last positions of the output; the continuation
holds exactly the last ``completion_len + 1`` positions of the full pass, each seeing the same tokens at the
same positions. Positions: TRL passes no ``position_ids``, so a decoder numbers positions from the cache
length, 0..L-1 in both computations; the attention mask is the full one (left padding stays masked).

Scope: decoder-only text models whose forward takes ``past_key_values`` and returns a cache whose every layer
is transformers' plain full-attention ``DynamicLayer``; rows with images or other extra model inputs go
through the plain path (``supports``). Where the shared pass would not be the full pass, it is not used
(``shared_pass_refusal``: ``SetPOTrainer`` then runs TRL's own pass and logs why once): sliding-window, chunked,
linear-attention or hybrid layers (``setpo.trl.rollouts.cache_refusal``); dropout > 0 in train mode (the masks
would be drawn in other shapes, and rows that share a prompt would share its masks); router logits (an MoE
model's load-balancing loss would see the router logits of the B·(C + 1) tokens the continuation runs against
the mask of all B·(P + C), and TRL 1.16 asks for them whenever the config has a router loss coefficient).
"""

from __future__ import annotations

import torch

from setpo.trl.rollouts import cache_layers_refusal, cache_refusal, dropout_refusal, text_config

#: model inputs the shared pass understands; anything else (pixel values, token type ids) takes the plain path
TEXT_INPUTS = frozenset({"input_ids", "attention_mask", "labels", "fused_lm_head", "logits_to_keep",
                         "output_router_logits", "use_cache"})


def supports(model_inputs: dict) -> bool:
    """Whether a call's inputs are plain text that ``SharedPrefixModel`` can split (router logits are not
    split: ``shared_pass_refusal``)."""
    return set(model_inputs) <= TEXT_INPUTS and not model_inputs.get("output_router_logits")


def shared_pass_refusal(model, router_logits: bool = False) -> str | None:
    """Why ``SharedPrefixModel(model)`` would not give the full pass's log-probs and gradients (None when it
    would, up to float rounding): cache layers other than full-attention ``DynamicLayer``, dropout in train mode,
    or router logits (asked for by the caller, ``router_logits=True``, or by the model's config, which TRL's
    fused LM head follows)."""
    if router_logits:
        return "router logits are asked for (an MoE load-balancing loss); they would cover the continuation only"
    config = text_config(model)
    if config is not None and getattr(config, "output_router_logits", False):
        return "the config asks for router logits (output_router_logits=True); they would cover the continuation only"
    return cache_refusal(model) or dropout_refusal(model)


def distinct_prompts(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(first, inverse): for (B, P) left-padded prompts, the row index of each distinct prompt's first
    occurrence (U,) and, for every row, which distinct prompt it is (B,), so ``first[inverse]`` picks for each
    row a row with the same prompt. Two rows share a prompt when their ids and mask agree at every position."""
    key = torch.where(prompt_mask.bool(), prompt_ids, torch.full_like(prompt_ids, -1))
    _, inverse = torch.unique(key, dim=0, return_inverse=True)
    first = torch.full((int(inverse.max()) + 1,), key.shape[0], dtype=torch.long, device=key.device)
    first = first.scatter_reduce(0, inverse, torch.arange(key.shape[0], device=key.device), reduce="amin")
    return first, inverse


def select_rows(cache, rows: torch.Tensor) -> None:
    """Replace every layer's keys and values (B', H, T, D) by their rows ``rows`` (B,), in place.

    ``index_select``, not the cache's own ``batch_select_indices`` (``keys[rows]``): the gradient of advanced
    indexing is an accumulating ``index_put_``, which on the CPU adds the rows that share a prompt with atomic
    adds in whatever order the threads reach them, so a run would not repeat bit for bit; ``index_select``'s
    gradient, ``index_add_``, adds them in row order."""
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise ValueError(f"the shared prompt pass needs a cache with per-layer keys and values (transformers' "
                         f"DynamicCache), got {type(cache).__name__}")
    for layer in layers:
        layer.keys = layer.keys.index_select(0, rows)
        layer.values = layer.values.index_select(0, rows)


class SharedPrefixModel(torch.nn.Module):
    """``model`` as TRL's loss calls it, with each distinct prompt run once (module docstring).

    prompt_len: the (padded) prompt length P of the rows this wrapper will see: input_ids is (B, P + C) with
    the completion in the last C columns. A call whose rows all have distinct prompts, or whose inputs are
    not plain text, runs ``model`` unchanged, and so does one the shared pass would not give exactly
    (``shared_pass_refusal``; also a cache the prompt pass returns with other layers than ``DynamicLayer``):
    ``refusals`` then lists why, for the caller to report.
    """

    def __init__(self, model: torch.nn.Module, prompt_len: int):
        super().__init__()
        self.model = model
        self.prompt_len = int(prompt_len)
        self.refusals: list[str] = []

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kwargs):
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask, **kwargs}
        p = self.prompt_len
        if not supports(inputs) or not 1 < p < input_ids.shape[1]:
            return self.model(**inputs)
        refusal = shared_pass_refusal(self.model)
        if refusal is not None:
            self.refusals.append(refusal)
            return self.model(**inputs)
        first, inverse = distinct_prompts(input_ids[:, :p], attention_mask[:, :p])
        if len(first) == input_ids.shape[0]:
            return self.model(**inputs)
        ids, mask = input_ids[first, :p - 1], attention_mask[first, :p - 1]
        cache = self.model(input_ids=ids, attention_mask=mask, use_cache=True).past_key_values
        refusal = cache_layers_refusal(getattr(cache, "layers", None))
        if refusal is not None:  # nothing random has run (no dropout): the plain pass is still the plain pass
            self.refusals.append(refusal)
            return self.model(**inputs)
        select_rows(cache, inverse)
        rest = {k: v for k, v in kwargs.items() if k not in ("labels", "logits_to_keep", "use_cache")}
        if "labels" in kwargs:
            rest["labels"] = kwargs["labels"][:, p - 1:]
        if "logits_to_keep" in kwargs:
            rest["logits_to_keep"] = kwargs["logits_to_keep"]
        return self.model(input_ids=input_ids[:, p - 1:], attention_mask=attention_mask,
                          past_key_values=cache, use_cache=False, **rest)
