"""Randomly initialised models shaped like the paper's, and SetPO's step-time overhead measured with them.

The paper trains Qwen2.5-Math-1.5B or 7B with Qwen3-Embedding-0.6B as the embedder (docs/studies/math.md).
Random weights cost the same compute as trained ones, so a model built from the same config measures the same
step time without downloading anything. Used by ``scripts/gpu_check.py`` (paper sizes on a GPU) and by
``benchmarks/trl_step.py`` (the same parameter ratios, scaled down to what two CPU cores run in minutes).

- ``word_tokenizer(vocab)``: a fast tokenizer whose pieces are the words ``w0 w1 ...``; random token ids
  decode to text of one word per token, which the embedder's word tokenizer reads back one token per word,
  so a response of L tokens is embedded as L tokens, as with real models sharing a vocabulary style.
- ``build_policy(shape, ...)``: a Qwen2 causal LM from a config, saved to a folder (TRL builds the KL
  reference model from the policy's path).
- ``RandomEmbedder``: a Qwen3 encoder from a config with last-token pooling (Qwen3-Embedding's pooling),
  texts sorted by length and embedded in micro-batches so that padding stays small.
- ``step_times(...)``: TRL's ``GRPOTrainer`` and ``SetPOTrainer`` trained side by side, interleaved, and
  TRL's own ``step_time`` of every optimizer step after a warm-up.
"""

from __future__ import annotations

import copy
import hashlib
import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from setpo.embed import DedupEmbedder
from setpo.presets import PAPER_RUN, PRESETS


@dataclass(frozen=True)
class Shape:
    """A decoder's shape (the fields of a Qwen2 / Qwen3 config that decide its compute)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    head_dim: int | None = None
    tie: bool = True

    def scaled(self, hidden: int, layers: int, heads: int, kv_heads: int, vocab: int) -> Shape:
        """The same proportions at another width (intermediate / hidden kept)."""
        return replace(self, hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads, vocab=vocab,
                       intermediate=round(self.intermediate / self.hidden * hidden / 8) * 8,
                       head_dim=hidden // heads)


#: The configs of the paper's models (their config.json files on the Hugging Face hub).
QWEN25_MATH_1_5B = Shape(hidden=1536, layers=28, heads=12, kv_heads=2, intermediate=8960, vocab=151936, tie=True)
QWEN25_MATH_7B = Shape(hidden=3584, layers=28, heads=28, kv_heads=4, intermediate=18944, vocab=152064, tie=False)
QWEN3_EMBEDDING_0_6B = Shape(hidden=1024, layers=28, heads=16, kv_heads=8, intermediate=3072, vocab=151669,
                             head_dim=128, tie=True)


def word_tokenizer(vocab: int):
    """A left-padding fast tokenizer of ``vocab`` pieces: <pad>, <unk>, <eos>, then words w3 ... w{vocab-1}."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    pieces = ["<pad>", "<unk>", "<eos>"] + [f"w{i}" for i in range(3, vocab)]
    tok = Tokenizer(models.WordLevel({p: i for i, p in enumerate(pieces)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    out = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", eos_token="<eos>")
    out.padding_side = "left"
    return out


def _config(kind: str, shape: Shape, tokenizer):
    from transformers import Qwen2Config, Qwen3Config

    cls = Qwen2Config if kind == "qwen2" else Qwen3Config
    extra = {} if shape.head_dim is None else {"head_dim": shape.head_dim}
    return cls(vocab_size=shape.vocab, hidden_size=shape.hidden, num_hidden_layers=shape.layers,
               num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
               intermediate_size=shape.intermediate, tie_word_embeddings=shape.tie, max_position_embeddings=4096,
               pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
               bos_token_id=tokenizer.eos_token_id, **extra)


def n_params(model) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def build_policy(shape: Shape, tokenizer, folder: str | Path, seed: int = 0, save_dtype=torch.bfloat16,
                 device: str = "cpu") -> int:
    """A random Qwen2 causal LM of ``shape`` saved (with the tokenizer) to ``folder``; returns its parameters.
    device: where the weights are initialised (a GPU initialises 1.5B parameters in seconds, a CPU in a minute)."""
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(_config("qwen2", shape, tokenizer))
    count = n_params(model)
    model.to(save_dtype).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    del model
    return count


class RandomEmbedder(DedupEmbedder):
    """A random Qwen3 encoder of ``shape`` as a setpo embedder (last-token pooling, like Qwen3-Embedding).

    Texts are embedded longest first in micro-batches of ``micro_batch``, each padded to its own longest
    text, so padding costs little whatever the mix of lengths; bf16 on a GPU, float32 on the CPU.
    """

    def __init__(self, shape: Shape, device: str = "cpu", micro_batch: int = 32, max_length: int = 1024,
                 seed: int = 0, init_device: str | None = None):
        """init_device: where the random weights are drawn (default ``device``); the same seed gives the same
        weights only on the same kind of device, so compare devices with init_device="cpu" for both."""
        from transformers import Qwen3Model

        self.tokenizer = word_tokenizer(shape.vocab)
        torch.manual_seed(seed)
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
        with torch.device(init_device or device):
            model = Qwen3Model(_config("qwen3", shape, self.tokenizer))
        self.model = model.to(device=device, dtype=dtype).eval()
        self.params = n_params(self.model)
        self.device, self.micro_batch, self.max_length = device, micro_batch, max_length
        self.dim, self.batch_size = shape.hidden, 1 << 30  # DedupEmbedder hands over every unique text at once
        self.shape = shape

    def _embed_unique(self, texts: list[str]) -> torch.Tensor:
        ids = self.tokenizer(texts, add_special_tokens=False, truncation=True, max_length=self.max_length)["input_ids"]
        order = sorted(range(len(texts)), key=lambda i: -len(ids[i]))
        out = torch.empty(len(texts), self.dim)
        with torch.inference_mode():
            for s in range(0, len(order), self.micro_batch):
                rows = order[s:s + self.micro_batch]
                batch = self.tokenizer.pad({"input_ids": [ids[i] or [self.tokenizer.eos_token_id] for i in rows]},
                                           return_tensors="pt").to(self.device)
                hidden = self.model(**batch).last_hidden_state[:, -1]  # left padding: the last token is real
                out[rows] = torch.nn.functional.normalize(hidden.float(), dim=-1).cpu()
        return out

    def __repr__(self) -> str:
        return f"RandomEmbedder({self.params / 1e6:.1f}M params, device={self.device})"


def _reward(completions, **_):
    """A cheap reward that varies within groups (0/1 from a hash of the text), so no group is flat."""
    return [float(hashlib.blake2b(str(c).encode(), digest_size=1).digest()[0] & 1) for c in completions]


def prompts_dataset(n: int, length: int, vocab: int, seed: int = 0):
    """``n`` prompts of ``length`` random words (TRL's standard, non-conversational format)."""
    from datasets import Dataset

    g = torch.Generator().manual_seed(seed)
    words = torch.randint(3, vocab, (n, length), generator=g).tolist()
    return Dataset.from_list([{"prompt": " ".join(f"w{w}" for w in row)} for row in words])


@dataclass
class StepSetting:
    """What one optimizer step does (both trainers get exactly this; SetPO adds λ·s and the embedding)."""

    prompts_per_step: int = 8      # the paper's 64, cut to what one benchmark step affords
    num_generations: int = PAPER_RUN.num_generations
    micro_batch: int = 24
    max_completion_length: int = PAPER_RUN.max_completion_length
    prompt_length: int = 64
    steps: int = 3
    warmup: int = 1
    rounds: int = 1
    beta: float = PAPER_RUN.beta
    lam: float = PRESETS["grpo"].lam
    threads: int | None = None


def _trainer(kind: str, model, tokenizer, dataset, out: str, embedder, st: StepSetting, device: str):
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from setpo.presets import PRESETS
    from setpo.trl import TRL_LOSS_TYPE, SetPOTrainer, config_for

    completions = st.prompts_per_step * st.num_generations
    cuda = device.startswith("cuda")
    common = dict(output_dir=out, num_generations=st.num_generations, per_device_train_batch_size=st.micro_batch,
                  gradient_accumulation_steps=max(1, completions // st.micro_batch),
                  max_completion_length=st.max_completion_length, max_steps=st.warmup + st.steps, logging_steps=1,
                  report_to=[], bf16=cuda, use_cpu=not cuda, save_strategy="no", beta=st.beta, temperature=1.0,
                  seed=0, disable_tqdm=True, learning_rate=1e-6, dataloader_num_workers=0)
    if kind == "grpo":
        args = GRPOConfig(**common, loss_type=TRL_LOSS_TYPE[PRESETS["grpo"].loss_agg])
        tr = GRPOTrainer(model=model, reward_funcs=_reward, args=args, train_dataset=dataset,
                         processing_class=tokenizer)
    else:
        args = config_for("grpo", setpo_lambda=st.lam, **common)
        tr = SetPOTrainer(model=model, reward_funcs=_reward, args=args, train_dataset=dataset,
                          processing_class=tokenizer, embedder=embedder)
    tr.remove_callback(PrinterCallback)
    return tr


def step_times(policy_dir: str | Path, tokenizer, embedder, st: StepSetting, device: str = "cpu") -> dict:
    """Median TRL ``step_time`` of GRPO and of SetPO+GRPO (embedder included), interleaved in one process.

    Each round trains a fresh GRPO trainer and a fresh SetPO trainer (order reversed every round) from the
    same random policy for ``warmup + steps`` optimizer steps; the first ``warmup`` steps of each are dropped.
    tokenizer: the ``word_tokenizer`` the policy was built with, passed as an object (reloaded from the
    policy's folder, transformers would pick Qwen2's tokenizer class for a "qwen2" config and lose the words).
    Returns {"grpo_s", "setpo_s", "ratio", "grpo_steps", "setpo_steps", "policy_params", "embedder_params"}.
    """
    import tempfile

    from transformers import AutoModelForCausalLM

    from setpo.trl import quiet_libraries

    quiet_libraries()
    if st.threads:
        torch.set_num_threads(st.threads)
    base = AutoModelForCausalLM.from_pretrained(str(policy_dir), local_files_only=True, dtype=torch.float32)
    data = prompts_dataset(st.prompts_per_step * (st.warmup + st.steps) * 2, st.prompt_length,
                           len(tokenizer))
    times: dict[str, list[float]] = {"grpo": [], "setpo": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(st.rounds):
            for kind in ("grpo", "setpo") if r % 2 == 0 else ("setpo", "grpo"):
                model = copy.deepcopy(base).to(device)
                tr = _trainer(kind, model, tokenizer, data, tmp, embedder, st, device)
                tr.train()
                times[kind].extend([h["step_time"] for h in tr.state.log_history if "step_time" in h][st.warmup:])
                del tr, model
                if device.startswith("cuda"):
                    torch.cuda.empty_cache()
    grpo, setpo = statistics.median(times["grpo"]), statistics.median(times["setpo"])
    return {"grpo_s": round(grpo, 4), "setpo_s": round(setpo, 4), "ratio": round(setpo / grpo, 4),
            "grpo_steps": times["grpo"], "setpo_steps": times["setpo"], "policy_params": n_params(base),
            "embedder_params": getattr(embedder, "params", None), "setting": asdict(st)}


def embed_seconds(embedder, n: int, length: int, vocab: int, repeats: int = 3) -> float:
    """Median seconds to embed ``n`` distinct random responses of ``length`` words (the embedder's share of
    one SetPO step, measured on its own)."""
    g = torch.Generator().manual_seed(1)
    texts = [" ".join(f"w{w}" for w in row) for row in torch.randint(3, vocab, (n, length), generator=g).tolist()]
    out = []
    for r in range(repeats + 1):
        t0 = time.perf_counter()
        embedder([t + f" w{3 + r}" for t in texts])  # fresh texts each time
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return statistics.median(out[1:])


def params_of(shape: Shape, kind: str = "qwen2") -> int:
    """Parameter count of a shape without building it (a meta-device model)."""
    from transformers import Qwen2ForCausalLM, Qwen3Model

    tok = type("T", (), {"pad_token_id": 0, "eos_token_id": 2})()
    with torch.device("meta"):
        m = (Qwen2ForCausalLM if kind == "qwen2" else Qwen3Model)(_config(kind, shape, tok))
    return n_params(m)


__all__ = ["QWEN25_MATH_1_5B", "QWEN25_MATH_7B", "QWEN3_EMBEDDING_0_6B", "RandomEmbedder", "Shape", "StepSetting",
           "build_policy", "embed_seconds", "n_params", "params_of", "prompts_dataset", "step_times",
           "word_tokenizer"]


def main(argv=None) -> list[dict]:
    """As a benchmark (``make bench`` runs every script here): the parameter counts of the shapes it provides, from
    meta-device models (nothing allocated), to ``runs/bench/paper_shapes.md`` / ``.json``. ``--smoke`` is the same
    (it takes a second)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from harness import options, report
    from setpo.records import markdown_table

    args = options(__doc__, argv)
    rows = [{"model": f"{name}-shaped", "kind": kind, "parameters": params_of(shape, kind), **asdict(shape)}
            for name, shape, kind in (("Qwen2.5-Math-1.5B", QWEN25_MATH_1_5B, "qwen2"),
                                      ("Qwen2.5-Math-7B", QWEN25_MATH_7B, "qwen2"),
                                      ("Qwen3-Embedding-0.6B", QWEN3_EMBEDDING_0_6B, "qwen3"))]
    shown = [{"model": r["model"], "parameters": f"{r['parameters'] / 1e9:.3f}B"} for r in rows]
    report(args, "paper_shapes", "The paper's models, built from their configs:\n\n" + markdown_table(shown),
           {"rows": rows})
    return rows


if __name__ == "__main__":
    main()
