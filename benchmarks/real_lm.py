"""The real model's rollouts and RL step on this machine, against the machine's own roofline, side by side.

Model: SmolLM2-135M-Instruct (``setpo.models``, float32), 2 CPU threads. Two RL shapes (``--shape`` fields):

- "short answers": 8 prompts x G = 8, a ~100-token chat prompt (a system message with one worked example, then
  the question), at most 32 new tokens: the shape of a study on tasks with short verifiable answers;
- "GSM8K": 4 prompts x G = 4, notebook 04's Qwen-Math chat prompt over GSM8K training questions, at most 192
  new tokens (``MathRunConfig.cpu_real``).

Roofline (measured here, not assumed): the bandwidth a decode step can use (a matrix-vector product over a
float32 matrix the size of the model's weights) and matmul throughput in float32 and bfloat16 (products of the
model's own shapes). From them: the floor of one decode step at batch B and context c, max(weight bytes + KV
bytes read) / bandwidth, 2 x params x B / matmul throughput), and of a whole rollout (one pass over each
distinct prompt plus every decode step); of a training step, 6 x params x tokens / float32 throughput.

Rollout paths, each on one generation batch of the shape, the same seed for all (new tokens per second, the
tokens TRL keeps: up to and including the end token):

- (a) "TRL default": ``SetPOTrainer._generate_single_turn`` with ``setpo_shared_prompt_rollouts=False``, i.e.
  TRL's own call of ``generate`` (what SetPOTrainer did before the switch existed);
- (b) the trainer's CPU default (``setpo.trl.rollouts.shared_prompt_generate``): each prompt's forward pass
  once, its KV cache copied to its G rows, the cache allocated once for the whole generation (no copy of the
  cache per step) and decode attention on the grouped KV heads as they are (no copy to every query head);
  "shared prompt alone": the first without the other two; "static KV cache": TRL's
  ``cache_implementation="static"``; "bfloat16 weights": the default path on a bfloat16 copy of the model (not
  exact: rows identical to (a) are counted); "2 steps' prompts in one batch": a generation batch twice as large
  (TRL's ``generation_batch_size``: weight reads amortised over more rows, samples a step staler);
  "torch.compile" of the decode step (static cache) with ``--compile`` only: its compile time is minutes on 2
  cores, more than a short run saves.
- (c) the roofline's rollout floor.

RL step: one optimizer step (TRL's ``step_time``: generation, rewards, advantages, embedding, loss and
backward) of a GRPO trainer (λ = 0, nothing embedded) and a SetPO+GRPO trainer (λ = 0.05, MiniLM-L6 embedder,
``setpo.embed.load_embedder("default")``), at the short-answer shape, both with the default rollouts.

Targets (PASS / FAIL): rollout tokens/s of the trainer's default path >= 3 x TRL's default, or within 1.5 x of
the roofline's floor, at each shape; SetPO step <= 1.10 x GRPO step.

Usage: ``.venv/bin/python benchmarks/real_lm.py`` (about 8 minutes on 2 cores), ``--model DIR`` (default: the
packaged model, prepared on first use), ``--no-step``, ``--compile``; ``--smoke``: the tiny random model at tiny
shapes, every path once (seconds), ``--out DIR``.
"""

from __future__ import annotations

import copy
import functools
import statistics
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from harness import options, report
from setpo.repro.records import markdown_table

THREADS = 2
ROLLOUT_TARGET, ROOFLINE_TARGET, STEP_TARGET = 3.0, 1.5, 1.10
DEFAULT_PATH = "(b) shared prompt + preallocated KV + grouped attention [trainer default]"


@dataclass(frozen=True)
class Shape:
    """One RL generation batch: ``prompts`` x ``G`` rollouts of at most ``new_tokens`` tokens; prompts of
    about ``prompt_tokens`` tokens (the short-answer prompt is padded with examples to reach it; GSM8K's are real)."""

    name: str
    prompts: int
    G: int
    prompt_tokens: int
    new_tokens: int


SHORT = Shape("short answers", prompts=8, G=8, prompt_tokens=100, new_tokens=32)
GSM8K = Shape("GSM8K", prompts=4, G=4, prompt_tokens=0, new_tokens=192)  # prompt length: the real prompts'
SMOKE_SHAPES = (Shape("short answers", 2, 3, 24, 6), Shape("GSM8K", 2, 2, 0, 8))

SHORT_SYSTEM = ("Answer with the final answer only, on one line, and nothing else.\n"
                "Example. Question: A box holds 12 pencils. How many pencils are in 3 boxes? Answer: 36")
SHORT_QUESTIONS = [f"Question: A shelf holds {a} books and {b} more are added each day. How many books are on it "
                   f"after {c} days? Answer with a number." for a, b, c in
                   [(12, 3, 4), (40, 7, 2), (5, 9, 6), (23, 4, 5), (17, 8, 3), (31, 2, 9), (8, 6, 7), (50, 5, 5),
                    (14, 3, 8), (27, 6, 4), (9, 9, 9), (60, 1, 3)]]


# ------------------------------------------------------------------------------------------------ roofline


def _seconds(fn, repeats: int) -> float:
    fn()  # warm-up: allocation, kernel selection
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def roofline(params: int, hidden: int, intermediate: int, smoke: bool) -> dict:
    """Measured bandwidth (GB/s) and matmul throughput (GFLOP/s, float32 and bfloat16) of this machine."""
    torch.manual_seed(0)
    rows = max(1, (params if not smoke else 2_000_000) // hidden)
    weights = torch.randn(rows, hidden)
    x = torch.randn(hidden)
    stream_s = _seconds(lambda: torch.mv(weights, x), 2 if smoke else 5)
    bandwidth = weights.numel() * 4 / stream_s / 1e9
    del weights
    tokens = 64 if smoke else 1024
    out = {"bandwidth_GBps": bandwidth, "stream_bytes": rows * hidden * 4}
    for dtype, key in ((torch.float32, "fp32_GFLOPs"), (torch.bfloat16, "bf16_GFLOPs")):
        a = torch.randn(tokens, hidden, dtype=dtype)
        w_up = torch.randn(hidden, intermediate, dtype=dtype)
        w_down = torch.randn(intermediate, hidden, dtype=dtype)
        s = _seconds(lambda: (a @ w_up) @ w_down, 2 if smoke else 5)
        out[key] = 2 * 2 * tokens * hidden * intermediate / s / 1e9
    return out


def kv_bytes_per_token(config) -> int:
    """Bytes of keys and values one token of context keeps over all layers (float32)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * 4


def rollout_floor(roof: dict, params: int, kv_token: int, shape: Shape, prompt_len: int, new_tokens: int) -> float:
    """Seconds a rollout of ``shape`` cannot beat here: one pass over each distinct prompt (compute-bound) and
    ``new_tokens`` decode steps over B = prompts x G rows, each bounded by its weight + KV reads and its FLOPs."""
    flops = roof["fp32_GFLOPs"] * 1e9
    bandwidth = roof["bandwidth_GBps"] * 1e9
    rows = shape.prompts * shape.G
    total = 2 * params * shape.prompts * prompt_len / flops
    for t in range(new_tokens):
        read = params * 4 + rows * (prompt_len + t) * kv_token
        total += max(read / bandwidth, 2 * params * rows / flops)
    return total


def train_floor(roof: dict, params: int, shape: Shape, prompt_len: int, new_tokens: int) -> float:
    """Seconds of the loss's forward and backward (6 x params x tokens at float32 throughput), rollouts excluded."""
    return 6 * params * shape.prompts * shape.G * (prompt_len + new_tokens) / (roof["fp32_GFLOPs"] * 1e9)


# ------------------------------------------------------------------------------------------------ prompts


def shape_prompts(tok, shape: Shape) -> list[str]:
    """``shape.prompts`` chat prompts: GSM8K training questions in notebook 04's Qwen-Math template, or the short-
    answer prompt (system message with one example, a question) padded with worked examples to ~prompt_tokens."""
    if shape.name == "GSM8K":
        from envs.math import gsm8k_file, load_math_problems
        from setpo.studies.math import chat_prompts

        return chat_prompts(tok, [p.question for p in load_math_problems(gsm8k_file("train"), limit=shape.prompts)])
    out = []
    for i in range(shape.prompts):
        question = SHORT_QUESTIONS[i % len(SHORT_QUESTIONS)]
        system = SHORT_SYSTEM
        while True:
            text = tok.apply_chat_template([{"role": "system", "content": system}, {"role": "user", "content": question}],
                                           tokenize=False, add_generation_prompt=True)
            if len(tok(text, add_special_tokens=False)["input_ids"]) >= shape.prompt_tokens or len(system) > 4000:
                break
            system += " Example. Question: 7 + 5? Answer: 12"
        out.append(text)
    return out


# ------------------------------------------------------------------------------------------------ trainers


def _trainer(model, tok, tmp: str, shape: Shape, *, generation_batch: int | None = None, embedder=None,
             lam: float = 0.0, **config):
    from datasets import Dataset

    from setpo.trl import SetPOTrainer, config_for
    from setpo.studies.math_config import MathRunConfig

    rows = shape.prompts * shape.G
    micro = min(rows, 8)
    args = config_for("grpo", output_dir=tmp, num_generations=shape.G, per_device_train_batch_size=micro,
                      gradient_accumulation_steps=rows // micro, max_completion_length=shape.new_tokens,
                      temperature=MathRunConfig.cpu_real().temperature, top_p=1.0, beta=0.0, max_steps=1,
                      logging_steps=1, report_to=[], bf16=False, use_cpu=True, save_strategy="no", seed=0,
                      disable_tqdm=True, gradient_checkpointing=False, learning_rate=1e-5, setpo_lambda=lam,
                      setpo_log_diversity=embedder is not None, generation_batch_size=generation_batch, **config)
    data = Dataset.from_list([{"prompt": p} for p in shape_prompts(tok, shape)])
    return SetPOTrainer(model=model, reward_funcs=lambda completions, **_: [float(len(c) % 3) for c in completions],
                        args=args, train_dataset=data, processing_class=tok, embedder=embedder)


@contextmanager
def shared_options(**options):
    """Within the block, SetPOTrainer's shared-prompt rollouts run with these ``shared_prompt_generate`` options."""
    import setpo.trl.trainer as trainer_module

    original = trainer_module.shared_prompt_generate
    trainer_module.shared_prompt_generate = functools.partial(original, **options)
    try:
        yield
    finally:
        trainer_module.shared_prompt_generate = original


def time_rollout(trainer, prompts: list[str], G: int, seed: int = 0) -> tuple[float, list[list[int]]]:
    """Seconds of one ``_generate_single_turn`` over ``prompts`` x G (each prompt G times in a row, as TRL's
    sampler hands them over), and the completions' token ids."""
    ids = trainer.processing_class(prompts, add_special_tokens=False)["input_ids"]
    batch = [p for p in ids for _ in range(G)]
    trainer.model.train()
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    completions, _ = trainer._generate_single_turn(batch, None, {}, G)
    return time.perf_counter() - t0, completions


def rollout_rows(model, tok, tmp: str, shape: Shape, prompt_len: int, roof: dict, params: int, kv_token: int,
                 compile_decode: bool) -> list[dict]:
    """Every rollout path at ``shape``: tokens/s, seconds, speed-up over TRL's default, floor / seconds."""
    prompts = shape_prompts(tok, shape)
    rows, reference = [], None

    def add(path: str, trainer, batch_prompts=prompts, exact: bool = True, extra: dict | None = None):
        nonlocal reference
        print(f"  {shape.name}: {path} ...", flush=True)
        seconds, completions = time_rollout(trainer, batch_prompts, shape.G)
        tokens = sum(len(c) for c in completions)
        row = {"shape": shape.name, "path": path, "rows": len(completions), "new_tokens": tokens,
               "seconds": seconds, "tokens_per_s": tokens / seconds}
        if reference is None:
            reference = completions
        elif len(completions) == len(reference):  # the same batch: the same RNG draws
            same = sum(a == b for a, b in zip(reference, completions[:len(reference)]))
            row["rows_equal_to_trl_default"] = f"{same}/{len(reference)}"
        row["exact"] = exact
        floor_shape = Shape(shape.name, len(batch_prompts), shape.G, prompt_len, shape.new_tokens)
        row["floor_s"] = rollout_floor(roof, params, kv_token, floor_shape, prompt_len,
                                       max(1, round(tokens / len(completions))))
        row.update(extra or {})
        rows.append(row)

    add("(a) TRL default (generate)", _trainer(model, tok, tmp, shape, setpo_shared_prompt_rollouts=False))
    add(DEFAULT_PATH, _trainer(model, tok, tmp, shape))
    with shared_options(preallocate=False, grouped_attention=False):
        add("(b) shared prompt alone (DynamicCache, repeated KV heads)", _trainer(model, tok, tmp, shape))
    add("(b) static KV cache", _trainer(model, tok, tmp, shape, setpo_shared_prompt_rollouts=False,
                                        cache_implementation="static"))
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    add("(b) trainer default on bfloat16 weights", _trainer(bf16, tok, tmp, shape), exact=False)
    del bf16
    if shape.name != "GSM8K":  # a 2x batch at 192 tokens is minutes; the short shape shows the scaling
        more = (prompts * 2)[:shape.prompts * 2]
        big = _trainer(model, tok, tmp, shape, generation_batch=len(more) * shape.G)
        add("(b) trainer default, 2 steps' prompts in one batch", big, batch_prompts=more, exact=True)
    if compile_decode:
        from transformers import CompileConfig

        compiled = _trainer(model, tok, tmp, shape, setpo_shared_prompt_rollouts=False, cache_implementation="static")
        compiled.generation_config.disable_compile = False  # TRL turns transformers' compile of the decode step off
        compiled.generation_config.compile_config = CompileConfig()
        compiled.generation_config.compile_config._compile_all_devices = True  # transformers skips CPUs otherwise
        t0 = time.perf_counter()
        time_rollout(compiled, prompts[:1], shape.G)  # the compile (and a first run)
        add("(b) torch.compile, static KV cache", compiled, extra={"compile_s": time.perf_counter() - t0})
    base = rows[0]["tokens_per_s"]
    for r in rows:
        r["speedup"] = r["tokens_per_s"] / base
        r["floor_over_seconds"] = r["floor_s"] / r["seconds"]
    return rows


def step_rows(model, tok, tmp: str, shape: Shape, smoke: bool) -> list[dict]:
    """One optimizer step of GRPO and of SetPO+GRPO (λ = 0.05, MiniLM; hashed n-grams in a smoke run), the
    same model, data and seed; TRL's step_time and SetPOTrainer's phase seconds."""
    from transformers.trainer_callback import PrinterCallback

    from setpo.embed import load_embedder

    embedder = load_embedder("hash" if smoke else "default", device="cpu")
    rows = []
    setpo_label = "SetPO+GRPO (hashed n-grams)" if smoke else "SetPO+GRPO (MiniLM-L6)"
    for label, kwargs in (("GRPO", {}), (setpo_label, {"embedder": embedder, "lam": 0.05})):
        print(f"  RL step at {shape.name}: {label} ...", flush=True)
        tr = _trainer(copy.deepcopy(model), tok, tmp, shape, **kwargs)
        tr.remove_callback(PrinterCallback)
        tr.train()
        (step,) = [h["step_time"] for h in tr.state.log_history if "step_time" in h]
        rows.append({"trainer": label, "step_s": step, **{f"{k}_s": v for k, v in tr.setpo_seconds.items()}})
    return rows


# ------------------------------------------------------------------------------------------------ report


def main(argv=None) -> str:
    def more(ap):
        ap.add_argument("--model", default=None, help="model folder (default: the packaged SmolLM2-135M-Instruct)")
        ap.add_argument("--no-step", action="store_true", help="skip the whole-RL-step rows")
        ap.add_argument("--compile", action="store_true", help="also time torch.compile of the decode step")

    args = options(__doc__, argv, more)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from setpo.trl import quiet_libraries

    torch.set_num_threads(THREADS)
    quiet_libraries()
    with tempfile.TemporaryDirectory() as tmp:
        if args.smoke:
            from setpo.trl.tiny_models import make_tiny_model

            folder = make_tiny_model(Path(tmp) / "tiny")
            shapes = SMOKE_SHAPES
        else:
            from setpo.models import prepared_folder

            folder = Path(args.model) if args.model else prepared_folder()
            shapes = (SHORT, GSM8K)
        tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True, dtype=torch.float32)
        cfg = model.config
        params = sum(p.numel() for p in model.parameters())  # tied: the LM head counted once, as it is read once
        print("  roofline ...", flush=True)
        roof = roofline(params, cfg.hidden_size, cfg.intermediate_size, args.smoke)
        kv_token = kv_bytes_per_token(cfg)
        rollouts, floors = [], []
        for shape in shapes:
            lengths = [len(tok(p, add_special_tokens=False)["input_ids"]) for p in shape_prompts(tok, shape)]
            prompt_len = max(lengths)
            rows = shape.prompts * shape.G
            floors.append({"shape": shape.name, **asdict(shape), "prompt_len": prompt_len,
                           "decode_step_floor_ms": 1e3 * rollout_floor(roof, params, kv_token,
                                                                       Shape("", 1, rows, prompt_len, 1), 0, 1),
                           "rollout_floor_s": rollout_floor(roof, params, kv_token, shape, prompt_len,
                                                            shape.new_tokens),
                           "train_floor_s": train_floor(roof, params, shape, prompt_len, shape.new_tokens)})
            rollouts += rollout_rows(model, tok, tmp, shape, prompt_len, roof, params, kv_token, args.compile)
        steps = [] if args.no_step else step_rows(model, tok, tmp, shapes[0], args.smoke)

    targets = []
    for shape in shapes:
        mine = [r for r in rollouts if r["shape"] == shape.name]
        default, fast = mine[0], next(r for r in mine if r["path"] == DEFAULT_PATH)
        met = fast["speedup"] >= ROLLOUT_TARGET or fast["seconds"] <= ROOFLINE_TARGET * fast["floor_s"]
        targets.append({"target": f"{shape.name}: rollout tokens/s >= {ROLLOUT_TARGET:g} x TRL default or within "
                                  f"{ROOFLINE_TARGET:g} x of the roofline",
                        "measured": f"{fast['speedup']:.2f} x TRL default; {fast['seconds'] / fast['floor_s']:.2f} "
                                    f"x the floor (default: {default['seconds'] / default['floor_s']:.2f} x)",
                        "met": "PASS" if met else "FAIL"})
    if steps:
        ratio = steps[1]["step_s"] / steps[0]["step_s"]
        targets.append({"target": f"SetPO step <= {STEP_TARGET:g} x GRPO step ({shapes[0].name})",
                        "measured": f"{ratio:.3f}", "met": "PASS" if ratio <= STEP_TARGET else "FAIL"})

    text = [f"Model: {folder.name} ({params / 1e6:.1f}M parameters, float32), {THREADS} CPU threads, torch "
            f"{torch.__version__}.", "",
            f"Roofline (measured): bandwidth {roof['bandwidth_GBps']:.1f} GB/s (matrix-vector product over "
            f"{roof['stream_bytes'] / 1e6:.0f} MB); matmul {roof['fp32_GFLOPs']:.0f} GFLOP/s float32, "
            f"{roof['bf16_GFLOPs']:.0f} GFLOP/s bfloat16 (the model's MLP shapes). "
            f"Weights {params * 4 / 1e6:.0f} MB, KV cache {kv_token / 1e3:.1f} kB per token of context.", "",
            markdown_table([{"shape": f["shape"], "batch": f"{f['prompts']} x G={f['G']}",
                             "prompt tokens (max)": f["prompt_len"], "new tokens (max)": f["new_tokens"],
                             "decode step floor (ms)": f"{f['decode_step_floor_ms']:.1f}",
                             "rollout floor (s)": f"{f['rollout_floor_s']:.2f}",
                             "training floor (s)": f"{f['train_floor_s']:.2f}"} for f in floors]), "",
            "Rollouts (one generation batch, same seed for every path; floor: the roofline for the tokens sampled):",
            "", markdown_table([{"shape": r["shape"], "path": r["path"], "rows": r["rows"], "new tokens": r["new_tokens"],
                                 "s": f"{r['seconds']:.2f}", "tokens/s": f"{r['tokens_per_s']:.1f}",
                                 "vs (a)": f"{r['speedup']:.2f}x", "floor (s)": f"{r['floor_s']:.2f}",
                                 "of roofline": f"{r['floor_over_seconds']:.0%}",
                                 "same rows as (a)": r.get("rows_equal_to_trl_default", "–"),
                                 **({"compile (s)": f"{r['compile_s']:.0f}"} if "compile_s" in r else {})}
                                for r in rollouts])]
    if steps:
        text += ["", f"One RL optimizer step at {shapes[0].name} (TRL's step_time; phases from SetPOTrainer):", "",
                 markdown_table([{"trainer": s["trainer"], "step (s)": f"{s['step_s']:.1f}",
                                  "generation (s)": f"{s['generation_s']:.1f}", "embedding (s)": f"{s['embedding_s']:.2f}",
                                  "update (s)": f"{s['update_s']:.1f}"} for s in steps])]
    text += ["", markdown_table(targets)]
    table = "\n".join(text)
    report(args, "real_lm", table, {"roofline": roof, "floors": floors, "rollouts": rollouts, "steps": steps,
                                    "targets": targets})
    return table


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"({time.time() - t0:.0f}s)")
