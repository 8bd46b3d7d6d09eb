"""Sampling completions from a causal LM with ``generate``: the one sampler the LM drivers share."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import torch

from setpo.records import read_json
from setpo.trl.training import weights_sha256

# tokenizer_config.json keys that say how a folder was loaded, not how it tokenizes (a trainer's copy differs in them)
LOADING_ONLY_KEYS = ("local_files_only", "name_or_path", "_name_or_path", "transformers_version")


class NucleusMask:
    """Top-p (nucleus) filtering of next-token scores, for ``generate``'s ``logits_processor``.

    Keeps the tokens that transformers' top-p keeps: with tokens in descending probability (at ``temperature``),
    token t stays when the mass of the tokens before it is below ``top_p`` (so at least the most likely one
    does); the rest get -inf. It finds them among the ``candidates`` most likely tokens (``topk``) and sorts the
    whole vocabulary only for rows whose candidates hold less than ``top_p`` of the mass, where the nucleus
    could reach past them. A logits processor runs before ``generate``'s temperature: scores come in unscaled
    and go out unscaled. scores: (B, V) -> (B, V).
    """

    def __init__(self, top_p: float, temperature: float, candidates: int = 256):
        if not 0 < top_p <= 1 or temperature <= 0 or candidates < 1:
            raise ValueError(f"need 0 < top_p <= 1, temperature > 0, candidates >= 1; got {top_p}, {temperature}, "
                             f"{candidates}")
        self.top_p, self.temperature, self.candidates = top_p, temperature, candidates

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        probs = (scores.float() / self.temperature).softmax(dim=-1)
        k = min(self.candidates, scores.shape[-1])
        top, order = probs.topk(k, dim=-1)                        # (B, k), descending
        short = top.sum(dim=-1) < self.top_p                      # the nucleus may reach past the candidates
        if short.any():
            full, full_order = probs[short].sort(dim=-1, descending=True)
            keep_full = (full.cumsum(dim=-1) - full) < self.top_p
            remove = torch.ones_like(scores, dtype=torch.bool)
            remove[short] = ~torch.zeros_like(keep_full).scatter(-1, full_order, keep_full)
        else:
            remove = torch.ones_like(scores, dtype=torch.bool)
        keep_top = (top.cumsum(dim=-1) - top) < self.top_p
        rows = ~short
        remove[rows] = remove[rows].scatter(-1, order[rows], ~keep_top[rows])
        return scores.masked_fill(remove, float("-inf"))


def stop_token_ids(model, tokenizer) -> list[int]:
    """The tokens that end a completion: the tokenizer's EOS and every EOS id of the model's generation config
    (a chat model may end a turn with a token its tokenizer does not call EOS)."""
    ids = [tokenizer.eos_token_id]
    config = getattr(model, "generation_config", None)
    extra = getattr(config, "eos_token_id", None)
    ids += extra if isinstance(extra, (list, tuple)) else [extra]
    return list(dict.fromkeys(i for i in ids if i is not None))


def model_identity(model_dir: str | Path) -> str | None:
    """What fixes the responses a model folder samples, given the seed and the sampling settings: its weight
    files (``setpo.trl.training.weights_sha256``, byte for byte), its tokenizer and chat template, and the stop
    and pad ids of its generation config. SHA-256; None for a folder without weight files. Two folders with one
    identity are one model: e.g. a trainer's copy of a model it never changed (every advantage 0) has its base
    model's identity, although the trainer rewrites the configs (``use_cache``, a list for ``eos_token_id``, the
    tokenizer's last padding)."""
    folder = Path(model_dir)
    weights = weights_sha256(folder)
    if weights is None:
        return None

    def config(name: str) -> dict:  # a damaged one: refused, the folder's file and what to do first
        path = folder / name
        return read_json(path, "give an intact model folder (a trained one: delete its run and rerun)",
                         folder.parent) if path.is_file() else {}

    def ids(value) -> list | None:
        return None if value is None else sorted(value if isinstance(value, list) else [value])

    tokenizer_config = {k: v for k, v in config("tokenizer_config.json").items() if k not in LOADING_ONLY_KEYS}
    generation = config("generation_config.json")
    # padding and truncation in tokenizer.json are the last call's settings; every call sets its own
    tokenizer = {k: v for k, v in config("tokenizer.json").items() if k not in ("padding", "truncation")}
    template = folder / "chat_template.jinja"
    digest = hashlib.sha256(weights.encode())
    digest.update(json.dumps([tokenizer, tokenizer_config, template.read_text() if template.is_file() else None,
                              ids(generation.get("eos_token_id")), ids(generation.get("pad_token_id"))],
                             sort_keys=True).encode())
    return digest.hexdigest()


def prompt_cache(model, enc, n: int) -> dict:
    """``generate``'s inputs for n samples of each prompt in ``enc`` (left-padded) that reuse one pass over it:
    ``setpo.trl.rollouts.prompt_cache`` (the trainer's rollouts share it) on the encoding's ids and mask."""
    from setpo.trl.rollouts import prompt_cache as shared_prompt_cache  # imports transformers: a model is loaded

    return shared_prompt_cache(model, enc["input_ids"], enc["attention_mask"], n)


def batch_prompts(n: int, batch_sequences: int) -> int:
    """Prompts per generation batch of ``sample_completions``: about ``batch_sequences`` sequences, at least one prompt."""
    return max(1, batch_sequences // n)


def sample_completions(model, tokenizer, prompts: Sequence[str], n: int, temperature: float, top_p: float = 1.0,
                       max_new_tokens: int = 24, seed: int = 0, batch_sequences: int = 1024,
                       add_special_tokens: bool = True, progress=None, first_index: int = 0,
                       share_prompt: bool = False, fast_nucleus: bool = False) -> list[list[str]]:
    """n sampled completions per prompt (text after the prompt, special tokens dropped), in prompt order.

    Runs on the model's device. Prompts go in batches of about ``batch_sequences`` sequences, each seeded from
    ``seed`` and its position, so the samples do not depend on what ran before, and torch's global RNG is
    forked around them, so what runs after does not depend on the sampling either (a probe taken during
    training leaves the rollouts alone). ``add_special_tokens=False``
    for prompts already rendered by a chat template (which holds every special token). The model's
    train/eval mode is restored afterwards, also when generation fails. progress: called with the number of
    prompts each batch finished (e.g. ``setpo_lab.studies.stages.Progress.step``). first_index: the position of
    ``prompts[0]`` in a longer list sampled piece by piece (seeds follow the position in that list, so sampling
    it in pieces of whole batches gives what one call would; ``batch_prompts`` is the piece size).
    share_prompt: run each prompt through the model once and give its n samples copies of that cache
    (``prompt_cache``), instead of ``generate``'s n forward passes over the same prompt: for long prompts and
    large n most of the work (255 of 256 prompt passes at n = 256). The same samples up to floating-point
    rounding, not bit for bit, so a study keeps one setting. Generation stops at the tokenizer's EOS and every
    EOS of the model's generation config (``stop_token_ids``). fast_nucleus: top-p by ``NucleusMask`` (a top-k
    candidate set) instead of transformers' sort of the whole vocabulary per step, which is a third of a step at
    256 sequences and a 49k vocabulary; the same nucleus up to float rounding at its edge, so again one setting
    per study.
    """
    if n < 1 or temperature <= 0 or not 0 < top_p <= 1:
        raise ValueError(f"need n >= 1, temperature > 0 and 0 < top_p <= 1, got {n}, {temperature}, {top_p}")
    was_training = model.training
    model.eval()
    per_batch = batch_prompts(n, batch_sequences)
    out: list[list[str]] = []
    device = torch.device(model.device)
    fork = torch.random.fork_rng(devices=[] if device.type == "cpu" else [device.index or 0],
                                 device_type="cuda" if device.type == "cpu" else device.type)
    try:
        with fork, torch.inference_mode():
            for b in range(0, len(prompts), per_batch):
                chunk = list(prompts[b:b + per_batch])
                enc = tokenizer(chunk, return_tensors="pt", padding=True, padding_side="left",
                                add_special_tokens=add_special_tokens).to(model.device)
                torch.manual_seed(seed * 1_000_003 + first_index + b)
                inputs = prompt_cache(model, enc, n) if share_prompt else {**enc, "num_return_sequences": n}
                if fast_nucleus and top_p < 1:
                    from transformers import LogitsProcessorList  # the engine; a model is already loaded

                    inputs["logits_processor"] = LogitsProcessorList([NucleusMask(top_p, temperature)])
                gen = model.generate(**inputs, do_sample=True, temperature=temperature,
                                     top_p=1.0 if fast_nucleus else top_p, top_k=0,
                                     max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                                     eos_token_id=stop_token_ids(model, tokenizer))
                texts = tokenizer.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
                out.extend(texts[i * n:(i + 1) * n] for i in range(len(chunk)))
                if progress is not None:
                    progress(len(chunk))
    finally:
        model.train(was_training)
    return out
