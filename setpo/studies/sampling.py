"""Sampling completions from a causal LM with ``generate``: the one sampler the LM drivers share."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def sample_completions(model, tokenizer, prompts: Sequence[str], n: int, temperature: float, top_p: float = 1.0,
                       max_new_tokens: int = 24, seed: int = 0, batch_sequences: int = 1024,
                       add_special_tokens: bool = True, progress=None) -> list[list[str]]:
    """n sampled completions per prompt (text after the prompt, special tokens dropped), in prompt order.

    Runs on the model's device. Prompts go in batches of about ``batch_sequences`` sequences, each seeded from
    ``seed`` and its position, so the samples do not depend on what ran before, and torch's global RNG is
    forked around them, so what runs after does not depend on the sampling either (a probe taken during
    training leaves the rollouts alone). ``add_special_tokens=False``
    for prompts already rendered by a chat template (which holds every special token). The model's
    train/eval mode is restored afterwards, also when generation fails. progress: called with the number of
    prompts each batch finished (e.g. ``setpo.studies.stages.Progress.step``).
    """
    if n < 1 or temperature <= 0 or not 0 < top_p <= 1:
        raise ValueError(f"need n >= 1, temperature > 0 and 0 < top_p <= 1, got {n}, {temperature}, {top_p}")
    was_training = model.training
    model.eval()
    per_batch = max(1, batch_sequences // n)
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
                torch.manual_seed(seed * 1_000_003 + b)
                gen = model.generate(**enc, do_sample=True, temperature=temperature, top_p=top_p, top_k=0,
                                     max_new_tokens=max_new_tokens, num_return_sequences=n,
                                     pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
                texts = tokenizer.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
                out.extend(texts[i * n:(i + 1) * n] for i in range(len(chunk)))
                if progress is not None:
                    progress(len(chunk))
    finally:
        model.train(was_training)
    return out
