"""The real model's rollouts and RL step on this machine, against the machine's own roofline, side by side.

Model: SmolLM2-135M-Instruct (``setpo.models``, float32), 2 CPU threads. Two RL shapes (``--shape`` fields):

- "short answers": 8 prompts x G = 8, a ~100-token chat prompt (a system message with one worked example, then
  the question), at most 32 new tokens: the shape of a study on tasks with short verifiable answers;
- "GSM8K": 4 prompts x G = 4, notebook 06's Qwen-Math chat prompt over GSM8K training questions, at most 192
  new tokens (``MathRunConfig.cpu_real``).

Roofline (measured here, not assumed): the bandwidth a decode step can use (a matrix-vector product over a
float32 matrix the size of the model's weights) and matmul throughput in float32 and bfloat16 (products of the
model's own shapes). From them: the floor of one decode step at batch B and context c, max(weight bytes + KV
bytes read) / bandwidth, 2 x params x B / matmul throughput), and of a whole rollout (one pass over each
distinct prompt plus every decode step); of a training step's update, ``update_floor``: 6 FLOPs per parameter and
position over what the step computes (no LM head at prompt positions, each distinct prompt once with the shared
prompt pass, the tokens actually generated), at the throughput of the step's precision.

Rollout paths, each on one generation batch of the shape, the same seed for all (new tokens per second, the
tokens TRL keeps: up to and including the end token):

- (a) "TRL default": ``SetPOTrainer._generate_single_turn`` with ``setpo_shared_prompt_rollouts=False``, i.e.
  TRL's own call of ``generate`` (what SetPOTrainer did before the switch existed);
- (b) the trainer's CPU default (``setpo.trl.rollouts.shared_prompt_generate``): each prompt's forward pass
  once, its KV cache copied to its G rows, the cache allocated once for the whole generation (no copy of the
  cache per step) and decode attention on the grouped KV heads as they are (no copy to every query head);
  "shared prompt alone": the first without the other two; "static KV cache": TRL's
  ``cache_implementation="static"``; "bfloat16 weights": the default path on a bfloat16 copy of the model (not
  exact: its "max Δ log p" shows it); "2 steps' prompts in one batch": a generation batch twice as large
  (TRL's ``generation_batch_size``: weight reads amortised over more rows, samples a step staler);
  "torch.compile" of the decode step (static cache) with ``--compile`` only: its compile time is minutes on 2
  cores, more than a short run saves.
- (c) the roofline's rollout floor.

Equality with (a): the same batch and seed, so an exact path samples (a)'s tokens; "max Δ log p" is the largest
difference between a path's and (a)'s log-probability of a sampled token, over each row's common prefix
(``SampledLogProbs``, recorded inside ``generate`` on every path), and "exact" says whether it is within float32
rounding (``EXACT_LOGPROB_TOL``). Equal tokens alone cannot tell: bfloat16 weights usually sample the same tokens.
Tokens counted are the ones generated: each row up to and including its end token (``generate`` stops when every
row has ended).

RL step (``STEP_SETUPS``): one optimizer step of the short-answer study's own trainer (its ``trainer_args``:
8 prompts x G = 8, at most 24 new tokens, bf16 autocast, β = 0, its tasks, reward and MiniLM embedder), as TRL runs
it by default (``generate``, every row's prompt pass) and in the study's setup (shared-prompt rollouts and prompt
pass), GRPO and SetPO+GRPO: TRL's ``step_time``, SetPOTrainer's phases, tokens generated and their rate, and the
update's floor.

Targets (PASS / FAIL): rollout tokens/s of the trainer's default path >= 3 x TRL's default, or within 1.5 x of
the roofline's floor, at each shape; SetPO step <= 1.10 x GRPO step (the study's setup).

Usage: ``.venv/bin/python benchmarks/real_lm.py`` (about 8 minutes on 2 cores), ``--model DIR`` (default: the
packaged model, prepared on first use), ``--no-step``, ``--compile``; ``--smoke``: the tiny random model at tiny
shapes, every path once (seconds), ``--out DIR``.
"""

from __future__ import annotations

import functools
import statistics
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from harness import options, report
from setpo.records import markdown_table

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
    # weights and x are bound as default arguments: the name weights is deleted below, once this call has returned
    stream_s = _seconds(lambda weights=weights, x=x: torch.mv(weights, x), 2 if smoke else 5)
    bandwidth = weights.numel() * 4 / stream_s / 1e9
    del weights
    tokens = 64 if smoke else 1024
    out = {"bandwidth_GBps": bandwidth, "stream_bytes": rows * hidden * 4}
    for dtype, key in ((torch.float32, "fp32_GFLOPs"), (torch.bfloat16, "bf16_GFLOPs")):
        a = torch.randn(tokens, hidden, dtype=dtype)
        w_up = torch.randn(hidden, intermediate, dtype=dtype)
        w_down = torch.randn(intermediate, hidden, dtype=dtype)
        s = _seconds(lambda a=a, w_up=w_up, w_down=w_down: (a @ w_up) @ w_down, 2 if smoke else 5)
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




# ------------------------------------------------------------------------------------------------ prompts


def shape_prompts(tok, shape: Shape) -> list[str]:
    """``shape.prompts`` chat prompts: GSM8K training questions in notebook 06's Qwen-Math template, or the short-
    answer prompt (system message with one example, a question) padded with worked examples to ~prompt_tokens."""
    if shape.name == "GSM8K":
        from setpo.envs.math import gsm8k_file, load_math_problems, qwen_math_messages
        from setpo_lab.studies.toolkit import chat_prompts

        return chat_prompts(tok, [p.question for p in load_math_problems(gsm8k_file("train"), limit=shape.prompts)],
                            qwen_math_messages)
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


def load_model(folder: Path, dtype):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True, dtype=dtype)


def _trainer(model, tok, tmp: str, shape: Shape, *, generation_batch: int | None = None, embedder=None,
             lam: float = 0.0, **config):
    from datasets import Dataset

    from setpo.trl import SetPOTrainer, config_for
    from setpo_lab.studies.math_config import MathRunConfig

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


class SampledLogProbs:
    """A logits processor that records, for every row and step, the log-probability of the token the row samples
    there, under the scores ``generate`` samples from: at each step it keeps that step's log-normaliser and scores,
    and reads the sampled token's value at the next step (the token is then the last input id) or, for the last
    step, from the completions (``finish``). Two paths that sample from the same distributions record the same
    values up to float rounding; one that computes other distributions (bfloat16 weights) records other values."""

    def __init__(self):
        self.values: list[torch.Tensor] = []  # one (B,) per step but the last
        self._last = None

    def __call__(self, input_ids, scores):
        if self._last is not None:
            self.values.append(self._chosen(input_ids[:, -1]))
        self._last = (scores, torch.logsumexp(scores.float(), dim=-1))
        return scores

    def _chosen(self, tokens: torch.Tensor) -> torch.Tensor:
        scores, norm = self._last
        return scores.float().gather(1, tokens.view(-1, 1).to(scores.device)).squeeze(1) - norm

    def finish(self, completions: list[list[int]]) -> list[list[float]]:
        """Per row, the log-probabilities of its completion's tokens (as many as it has)."""
        steps = len(self.values) + (self._last is not None)
        last = torch.tensor([c[steps - 1] if len(c) >= steps else 0 for c in completions])
        table = torch.stack([*self.values, self._chosen(last)], dim=1) if steps else torch.zeros(len(completions), 0)
        return [table[i, :len(c)].tolist() for i, c in enumerate(completions)]


@contextmanager
def recording(model):
    """Within the block, ``model.generate`` (the call TRL's path and the shared-prompt path both make) records
    ``SampledLogProbs``; yields the recorder."""
    from transformers import LogitsProcessorList

    recorder = SampledLogProbs()
    model.generate = functools.partial(type(model).generate, model,
                                       logits_processor=LogitsProcessorList([recorder]))
    try:
        yield recorder
    finally:
        del model.generate  # the class's method again


def time_rollout(trainer, prompts: list[str], G: int, seed: int = 0) -> tuple[float, list[list[int]], list]:
    """Seconds of one ``_generate_single_turn`` over ``prompts`` x G (each prompt G times in a row, as TRL's
    sampler hands them over), the completions' token ids, and each sampled token's log-probability
    (``SampledLogProbs``: a log-sum-exp over the vocabulary a step, the same work on every path)."""
    ids = trainer.processing_class(prompts, add_special_tokens=False)["input_ids"]
    batch = [p for p in ids for _ in range(G)]
    trainer.model.train()
    torch.manual_seed(seed)
    with recording(trainer.model) as recorder:
        t0 = time.perf_counter()
        completions, _ = trainer._generate_single_turn(batch, None, {}, G)
        seconds = time.perf_counter() - t0
    return seconds, completions, recorder.finish(completions)


EXACT_LOGPROB_TOL = 1e-3  # float32 rounding of another batch composition: ~1e-5; bfloat16 weights: ~1e-2 and more


def logprob_gap(reference: tuple[list, list], path: tuple[list, list]) -> float:
    """The largest |Δ log-probability| of a sampled token between a path and the reference, over each row's
    common prefix (the positions where both sampled the same tokens so far, so the distributions are comparable)."""
    (ref_ids, ref_lp), (ids, lp) = reference, path
    gap = 0.0
    for a, b, la, lb in zip(ref_ids, ids, ref_lp, lp, strict=True):
        for t in range(min(len(a), len(b))):
            if a[t] != b[t]:
                break
            gap = max(gap, abs(la[t] - lb[t]))
    return gap


def rollout_rows(model, folder: Path, tok, tmp: str, shape: Shape, prompt_len: int, roof: dict, params: int,
                 kv_token: int, compile_decode: bool) -> list[dict]:
    """Every rollout path at ``shape``: tokens/s, seconds, speed-up over TRL's default, floor / seconds."""
    prompts = shape_prompts(tok, shape)
    rows, reference = [], None

    def add(path: str, trainer, batch_prompts=prompts, exact: bool = True, extra: dict | None = None):
        nonlocal reference
        print(f"  {shape.name}: {path} ...", flush=True)
        seconds, completions, logprobs = time_rollout(trainer, batch_prompts, shape.G)
        tokens = sum(len(c) for c in completions)  # generated: each row up to and including its end token
        row = {"shape": shape.name, "path": path, "rows": len(completions), "new_tokens": tokens,
               "seconds": seconds, "tokens_per_s": tokens / seconds}
        if reference is None:
            reference = (completions, logprobs)
        elif len(completions) == len(reference[0]):  # the same batch: the same RNG draws
            same = sum(a == b for a, b in zip(reference[0], completions, strict=True))
            row["rows_equal_to_trl_default"] = f"{same}/{len(reference[0])}"
            row["logprob_gap"] = logprob_gap(reference, (completions, logprobs))
            row["measured_exact"] = row["logprob_gap"] <= EXACT_LOGPROB_TOL
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
    # loaded afresh: a deep copy of ``model`` would carry the forward that accelerate's prepare_model set on it,
    # which still calls the float32 original (this benchmark's bfloat16 row measured float32 weights that way)
    bf16 = load_model(folder, torch.bfloat16)
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


STEP_SETUPS = {  # name -> (study method, what changes from the study's own trainer settings)
    "GRPO, TRL default: generate, every row's prompt pass": ("GRPO", {"setpo_shared_prompt_rollouts": False,
                                                                     "setpo_share_prompt_pass": False}),
    "GRPO, the study's setup: shared rollouts and prompt pass": ("GRPO", {}),
    "SetPO+GRPO, the study's setup": ("SetPO+GRPO", {}),
}


def study_step_rows(folder: Path, tmp: str, roof: dict, smoke: bool) -> list[dict]:
    """One optimizer step of the short-answer study's own trainer (``setpo_lab.studies.short_answers.trainer_args``:
    8 prompts x G = 8, 24 new tokens, bf16 autocast, its tasks, reward and embedder; the smoke preset's tiny
    sizes with ``smoke``) under each of ``STEP_SETUPS``, the same model, data and seed: TRL's step_time,
    SetPOTrainer's phases, the tokens generated, and the floor of the update (``update_floor``)."""
    from dataclasses import replace

    from datasets import Dataset
    from transformers import AutoTokenizer
    from transformers.trainer_callback import PrinterCallback

    from setpo.envs.short_answers import task_messages, to_trl_records
    from setpo.embed import load_embedder
    from setpo_lab.studies.short_answers import trainer_args
    from setpo_lab.studies.toolkit import chat_prompts
    from setpo_lab.studies.short_answers_config import ShortAnswerStudyConfig
    from setpo.trl import SetPOTrainer
    from setpo.trl.rewards import short_answer_reward

    cfg = replace(ShortAnswerStudyConfig.preset("smoke" if smoke else "committed"), steps=1, save_steps=10**6)
    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    embedder = load_embedder(cfg.embedder, device="cpu")
    tasks = cfg.train_tasks()
    prompt_len = statistics.mean(len(tok(p, add_special_tokens=False)["input_ids"])
                                 for p in chat_prompts(tok, tasks, task_messages))
    rows = []
    for name, (method, changes) in STEP_SETUPS.items():
        print(f"  RL step, {name} ...", flush=True)
        args = trainer_args(cfg, cfg.trainer_settings(method), 0, Path(tmp) / "step")
        for key, value in changes.items():
            setattr(args, key, value)
        model = load_model(folder, torch.float32)
        trainer = SetPOTrainer(model=model, reward_funcs=short_answer_reward, args=args, processing_class=tok,
                               train_dataset=Dataset.from_list(to_trl_records(tasks)),
                               embedder=embedder if args.embedder == cfg.embedder else None)
        trainer.remove_callback(PrinterCallback)
        trainer.train()
        (log,) = [h for h in trainer.state.log_history if "step_time" in h]
        completions = cfg.prompts_per_step * cfg.group_size
        generated = log["completions/mean_length"] * completions
        phases = trainer.setpo_seconds
        floor = update_floor(roof, model, cfg.prompts_per_step, completions, prompt_len, generated,
                             shared_prompt=args.setpo_share_prompt_pass, bf16=cfg.bf16)
        rows.append({"trainer": name, "step_s": log["step_time"], "generated_tokens": generated,
                     "generation_tokens_per_s": generated / phases["generation"], "update_floor_s": floor,
                     **{f"{k}_s": v for k, v in phases.items()}})
    return rows


def update_floor(roof: dict, model, prompts: int, completions: int, prompt_len: float, generated: float, *,
                 shared_prompt: bool, bf16: bool) -> float:
    """Seconds the loss's forward and backward cannot beat here: 6 FLOPs per parameter and position, counting only
    what the step computes. The transformer body runs over every prompt position (each distinct prompt once with
    the shared prompt pass, every row's copy without) and every generated token; the LM head (tied to the
    embedding matrix, which is a lookup, not a product) only over the generated tokens (TRL's logits_to_keep).
    At the matmul throughput of the step's precision (bf16 autocast or float32); the reference model (β = 0)
    and the old policy's pass (one update per generation) do not run."""
    head = model.get_output_embeddings().weight.numel()
    body = sum(p.numel() for p in model.parameters()) - head
    prompt_positions = (prompts if shared_prompt else completions) * prompt_len
    flops = 6 * body * (prompt_positions + generated) + 6 * head * generated
    return flops / (roof["bf16_GFLOPs" if bf16 else "fp32_GFLOPs"] * 1e9)


# ------------------------------------------------------------------------------------------------ report


def main(argv=None) -> str:
    def more(ap):
        ap.add_argument("--model", default=None, help="model folder (default: the packaged SmolLM2-135M-Instruct)")
        ap.add_argument("--no-step", action="store_true", help="skip the whole-RL-step rows")
        ap.add_argument("--compile", action="store_true", help="also time torch.compile of the decode step")

    args = options(__doc__, argv, more)
    from transformers import AutoTokenizer

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
        model = load_model(folder, torch.float32)
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
                                                            shape.new_tokens)})
            rollouts += rollout_rows(model, folder, tok, tmp, shape, prompt_len, roof, params, kv_token, args.compile)
        steps = [] if args.no_step else study_step_rows(folder, tmp, roof, args.smoke)

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
        ratio = steps[2]["step_s"] / steps[1]["step_s"]
        targets.append({"target": f"SetPO step <= {STEP_TARGET:g} x GRPO step (the short-answer study's setup)",
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
                             "rollout floor (s)": f"{f['rollout_floor_s']:.2f}"} for f in floors]), "",
            "Rollouts (one generation batch, same seed for every path; floor: the roofline for the tokens sampled):",
            "", markdown_table([{"shape": r["shape"], "path": r["path"], "rows": r["rows"], "new tokens": r["new_tokens"],
                                 "s": f"{r['seconds']:.2f}", "tokens/s": f"{r['tokens_per_s']:.1f}",
                                 "vs (a)": f"{r['speedup']:.2f}x", "floor (s)": f"{r['floor_s']:.2f}",
                                 "of roofline": f"{r['floor_over_seconds']:.0%}",
                                 "same rows as (a)": r.get("rows_equal_to_trl_default", "–"),
                                 "max Δ log p vs (a)": f"{r['logprob_gap']:.1e}" if "logprob_gap" in r else "–",
                                 "exact": ("yes" if r["measured_exact"] else "no") if "measured_exact" in r else "–",
                                 **({"compile (s)": f"{r['compile_s']:.0f}"} if "compile_s" in r else {})}
                                for r in rollouts])]
    if steps:
        text += ["", "One RL optimizer step of the short-answer study's trainer (TRL's step_time; phases from "
                     "SetPOTrainer; update floor: ``update_floor``):", "",
                 markdown_table([{"trainer": s["trainer"], "step (s)": f"{s['step_s']:.1f}",
                                  "generation (s)": f"{s['generation_s']:.1f}",
                                  "tokens generated": f"{s['generated_tokens']:.0f}",
                                  "generated tokens/s": f"{s['generation_tokens_per_s']:.0f}",
                                  "embedding (s)": f"{s['embedding_s']:.2f}", "update (s)": f"{s['update_s']:.1f}",
                                  "update floor (s)": f"{s['update_floor_s']:.2f}",
                                  "vs TRL default step": f"{s['step_s'] / steps[0]['step_s']:.2f}x"}
                                 for s in steps])]
    text += ["", markdown_table(targets)]
    table = "\n".join(text)
    report(args, "real_lm", table, {"roofline": roof, "floors": floors, "rollouts": rollouts, "steps": steps,
                                    "targets": targets})
    return table


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"({time.time() - t0:.0f}s)")
