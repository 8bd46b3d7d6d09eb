"""Tiny Qwen2-architecture models built from a config, for CPU runs of the same code that trains real models.

Two tokenizers: ``build_tokenizer`` (Countdown: every number up to ``max_number`` and every ASCII character a
token) and ``build_chat_tokenizer`` (characters plus Qwen's ChatML specials and chat template, for the math
study). ``build_model`` makes a freshly initialised ``Qwen2ForCausalLM`` of a ``ModelSize``;
``make_tiny_model`` writes one to a folder, so everything downstream loads it by path like a real model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch

ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
MAX_NUMBER_TOKEN = 999


def _piece_tokenizer(pieces: list[str], split_regex: str, **special_tokens):
    """A left-padded fast tokenizer whose vocabulary is ``pieces``: text is split by ``split_regex`` into
    pieces, each looked up whole (WordLevel), and decoding concatenates them (so ASCII text round-trips)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(pieces)}, unk_token=special_tokens["unk_token"]))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(split_regex), behavior="isolated")
    tok.decoder = decoders.Fuse()
    out = PreTrainedTokenizerFast(tokenizer_object=tok, **special_tokens)
    out.padding_side = "left"  # generation pads prompts on the left
    return out


def build_tokenizer(max_number: int = MAX_NUMBER_TOKEN):
    """Expression-level tokenizer: integers 10..max_number and every ASCII character are single tokens.

    Pre-tokenisation splits text into ``<answer>``, ``</answer>``, runs of up to three digits, and single
    characters; a WordLevel model maps each piece to its id (a number above max_number is split into
    pieces that are, so nothing is unknown except non-ASCII characters); the Fuse decoder concatenates
    pieces back, so decode(encode(text)) == text for ASCII text.
    """
    if max_number < 9:
        raise ValueError(f"max_number must be >= 9, got {max_number}")
    chars = ["\n", "\t"] + [chr(c) for c in range(32, 127)]
    numbers = [str(i) for i in range(10, max_number + 1)]
    pieces = [PAD, EOS, UNK, ANSWER_OPEN, ANSWER_CLOSE] + chars + numbers
    digits = "{1,%d}" % len(str(max_number))
    return _piece_tokenizer(pieces, rf"<answer>|</answer>|\d{digits}|[\s\S]", pad_token=PAD, eos_token=EOS,
                            unk_token=UNK)


@dataclass
class ModelSize:
    """Shape of the Qwen2-architecture model (transformers ``Qwen2Config`` fields)."""

    hidden_size: int = 128
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 384
    max_position_embeddings: int = 64


def build_model(tokenizer, size: ModelSize = ModelSize(), seed: int = 0):  # noqa: B008 (read, never changed)
    """A freshly initialised Qwen2ForCausalLM (float32, tied embeddings) for ``tokenizer``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=size.hidden_size, num_hidden_layers=size.num_hidden_layers,
        num_attention_heads=size.num_attention_heads, num_key_value_heads=size.num_key_value_heads,
        intermediate_size=size.intermediate_size, max_position_embeddings=size.max_position_embeddings,
        tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None, use_cache=True,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>'"
    " + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
_CHAT_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>")


def build_chat_tokenizer():
    """Character-level tokenizer with Qwen's ChatML special tokens and chat template, for the tiny model.

    Every printable ASCII character, newline and tab is one token; ``<|im_start|>``, ``<|im_end|>`` (end of
    a turn, the EOS) and ``<|endoftext|>`` (padding) are one token each; anything else is ``<unk>``. Decoding
    concatenates pieces, so ASCII text round-trips exactly. **Design choice**: a random model has nothing to
    gain from a real vocabulary, and a 100-token one keeps the tiny model tiny.
    """
    pieces = list(_CHAT_SPECIALS) + ["\n", "\t"] + [chr(c) for c in range(32, 127)]
    specials = "|".join(re.escape(t) for t in _CHAT_SPECIALS)
    out = _piece_tokenizer(pieces, rf"{specials}|[\s\S]", pad_token="<|endoftext|>", eos_token="<|im_end|>",
                           unk_token="<unk>", additional_special_tokens=["<|im_start|>"])
    out.chat_template = CHATML_TEMPLATE
    return out


# Shape of the randomly initialised Qwen2ForCausalLM used without MODEL_PATH (about 0.4M parameters):
# head_dim = hidden_size / num_attention_heads = 64, a size every attention kernel (and vLLM) supports.
TINY_QWEN2 = ModelSize(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                       intermediate_size=256, max_position_embeddings=1024)


def make_tiny_model(path: str | Path, size: ModelSize = TINY_QWEN2, seed: int = 0) -> Path:
    """Write a tiny random Qwen2 model and its chat tokenizer to ``path`` (reused if already there).

    Everything downstream loads models by path (TRL builds its KL reference model from it), exactly as with
    a real MODEL_PATH.
    """
    p = Path(path)
    if (p / "config.json").is_file() and (p / "tokenizer.json").is_file():
        return p
    tokenizer = build_chat_tokenizer()
    model = build_model(tokenizer, size, seed=seed)
    p.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(p))
    tokenizer.save_pretrained(str(p))
    return p
