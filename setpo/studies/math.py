"""Training and evaluation on math word problems with TRL: the driver behind notebook 04.

GRPO vs SetPO+GRPO (GSPO / DAPO one switch away, ``setpo.presets``) on one machine with TRL's
``GRPOTrainer`` (``setpo.trl.SetPOTrainer``), vLLM for generation when there is a GPU, and a tiny randomly
initialised Qwen2 model with a character-level ChatML tokenizer on a CPU, where the numbers mean nothing
but every code path runs. Data, template and reward come from ``envs.math``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from envs.math import MathProblem, load_math_problems, math_reward, qwen_math_messages, smoke_problems, to_trl_records
from setpo.records import markdown_table, read_json, read_records, write_json
from setpo.studies.sampling import sample_completions
from setpo.studies.tiny_models import make_tiny_model
from setpo.trl.rewards import math_reward_func


def load_tokenizer(model_path: str | Path):
    """The model's tokenizer, left-padded for generation; it must have a chat template."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_path), local_files_only=True)
    if tok.chat_template is None:
        raise ValueError(f"the tokenizer at {model_path} has no chat template; the Qwen-Math prompt needs one")
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def chat_prompts(tokenizer, questions: Sequence[str]) -> list[str]:
    """Questions rendered with the Qwen-Math template by the tokenizer's chat template, ready to generate."""
    return [tokenizer.apply_chat_template(qwen_math_messages(q), tokenize=False, add_generation_prompt=True)
            for q in questions]


@dataclass
class MathRunConfig:
    """One notebook-04 study: every knob, with the paper's math settings as defaults (PAPERS.md).

    model_path: MODEL_PATH, a local base model (Qwen2.5-Math-1.5B/7B); None builds a tiny random Qwen2 in
        ``run_dir/tiny_model`` (CPU runs: the numbers then mean nothing).
    embedder: EMBEDDING_MODEL_PATH (paper: Qwen3-Embedding-0.6B), or "default" / "hash" (``setpo.embed``).
    train_file, val_file: TRAIN_FILE, VAL_FILE; None generates ``smoke_problems`` (train_limit / val_limit
        or 256 / 64 of them).
    algo: "grpo", "gspo" or "dapo" (``setpo.presets``; clip, ratio level, loss aggregation, lr, λ).
    lam: λ of the SetPO run (None: the preset's). The baseline run is the same with λ = 0.
    num_generations (G), temperature, max_completion_length, beta (KL), prompts_per_step (global batch, in
        prompts), num_train_epochs: the paper's 6, 0.9, 756, 1e-4, 64, 2. lr: the preset's unless set.
    micro_batch: completions per forward/backward pass; gradient accumulation fills the step, so each
        generation batch is exactly one optimizer step (on-policy).
    max_steps: > 0 stops early (smoke runs). save_steps: checkpoint interval; a rerun resumes from the last.
    use_vllm: TRL's vLLM generation (colocated); None = when CUDA and vllm are both available.
    eval_k, eval_temperature, eval_top_p: Pass@1 as avg@k (paper: k = 64, T = 0.5, top-p 0.9).
    eval_limit: evaluate the first N validation problems only (None: all).
    n_probe, probe_samples, probe_every: responses to the first n_probe validation questions sampled every
        probe_every steps at the rollout temperature, for the embedding-trajectory figure.
    run_dir: where models, checkpoints, logs and evaluations go.
    passk_file: PASSK_FILE, a local AIME-style file (e.g. AIME24's 30 problems) for the large-budget pass@k
        comparison of the base model, the baseline and SetPO; None generates ``passk_limit`` problems.
    passk_max: the largest k (the paper's large budget: 256); n = passk_max samples per problem at
        T = eval_temperature, top-p eval_top_p, and pass@k for k = 1..passk_max by the unbiased estimator.
    passk_limit: keep the first N pass@k problems (None: all of the file; 30 generated ones without a file).
    """

    model_path: str | None = None
    embedder: str = "default"
    train_file: str | None = None
    val_file: str | None = None
    algo: str = "grpo"
    lam: float | None = None
    num_generations: int = 6
    temperature: float = 0.9
    max_completion_length: int = 756
    beta: float = 1e-4
    prompts_per_step: int = 64
    micro_batch: int = 8
    num_train_epochs: float = 2.0
    max_steps: int = -1
    lr: float | None = None
    save_steps: int = 50
    use_vllm: bool | None = None
    vllm_gpu_memory_utilization: float = 0.3
    eval_k: int = 64
    eval_temperature: float = 0.5
    eval_top_p: float = 0.9
    eval_limit: int | None = None
    train_limit: int | None = None
    val_limit: int | None = None
    n_probe: int = 4
    probe_samples: int = 8
    probe_every: int = 20
    seed: int = 0
    run_dir: str = "runs/qwen_math"
    passk_file: str | None = None
    passk_max: int = 256
    passk_limit: int | None = None

    def __post_init__(self):
        from setpo.presets import get_preset

        get_preset(self.algo)
        if self.num_generations < 3:
            raise ValueError(f"SetPO needs num_generations >= 3, got {self.num_generations}")
        if (self.prompts_per_step * self.num_generations) % self.micro_batch:
            raise ValueError(f"prompts_per_step * num_generations ({self.prompts_per_step * self.num_generations}) "
                             f"must be a multiple of micro_batch ({self.micro_batch})")
        for name in ("eval_k", "probe_samples", "probe_every", "save_steps", "prompts_per_step", "n_probe",
                     "passk_max"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    @classmethod
    def cpu_demo(cls, smoke: bool = False, **overrides) -> "MathRunConfig":
        """The CPU setting: tiny random model, generated problems, short completions, a few steps."""
        base = dict(model_path=None, train_file=None, val_file=None, embedder="hash" if smoke else "default",
                    max_completion_length=16 if smoke else 48, prompts_per_step=2 if smoke else 4,
                    micro_batch=6, max_steps=2 if smoke else 30, save_steps=1 if smoke else 10,
                    eval_k=2 if smoke else 8, eval_limit=4 if smoke else 32, train_limit=32 if smoke else 256,
                    val_limit=8 if smoke else 64, n_probe=2 if smoke else 4, probe_samples=3 if smoke else 8,
                    probe_every=1 if smoke else 10, passk_max=4 if smoke else 32, passk_limit=2 if smoke else 16)
        return cls(**{**base, **overrides})

    @property
    def lam_value(self) -> float:
        from setpo.presets import get_preset

        return get_preset(self.algo).lam if self.lam is None else float(self.lam)

    def runs(self) -> dict[str, float]:
        """Run label -> λ: the plain baseline and SetPO, with identical everything else."""
        name = self.algo.upper()
        return {name: 0.0, f"SetPO+{name}": self.lam_value}


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _vllm_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def uses_vllm(cfg: MathRunConfig) -> bool:
    """Whether generation goes through vLLM: ``cfg.use_vllm``, or (None) when CUDA and vllm are available."""
    return (_cuda() and _vllm_available()) if cfg.use_vllm is None else bool(cfg.use_vllm)


def in_fresh_process(fn, *args, **kwargs):
    """Run ``fn(*args, **kwargs)`` in a newly spawned Python process and return its result.

    Used for everything that starts a vLLM engine: an engine keeps its GPU memory and distributed state until
    its process exits, so each training run and each evaluation gets its own process and the next one
    starts clean.
    """
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args, **kwargs).result()


def resolve_model_path(cfg: MathRunConfig) -> Path:
    """MODEL_PATH if given (it must exist), else the tiny model under ``run_dir``."""
    if cfg.model_path:
        p = Path(cfg.model_path).expanduser()
        if not p.is_dir():
            raise FileNotFoundError(f"no model directory at {str(p)!r}; set MODEL_PATH to a local copy, e.g. "
                                    "`huggingface-cli download Qwen/Qwen2.5-Math-1.5B --local-dir <dir>`, or leave "
                                    "it None for the tiny random model")
        return p
    return make_tiny_model(Path(cfg.run_dir) / "tiny_model", seed=cfg.seed)


def load_study_problems(cfg: MathRunConfig) -> tuple[list[MathProblem], list[MathProblem]]:
    """(train, validation) problems from TRAIN_FILE / VAL_FILE, or generated ones."""
    train = (load_math_problems(cfg.train_file, limit=cfg.train_limit) if cfg.train_file
             else smoke_problems(cfg.train_limit or 256, seed=cfg.seed))
    val = (load_math_problems(cfg.val_file, limit=cfg.val_limit) if cfg.val_file
           else smoke_problems(cfg.val_limit or 64, seed=cfg.seed + 1))
    return train, val


def trl_args(cfg: MathRunConfig, lam: float, output_dir: str | Path):
    """The ``setpo.trl`` config of one run: the preset's loss settings, the paper's sampling, our batch shape."""
    from setpo.trl import config_for

    cuda = _cuda()
    use_vllm = uses_vllm(cfg)
    completions = cfg.prompts_per_step * cfg.num_generations
    extra = {} if cfg.lr is None else {"learning_rate": cfg.lr}
    if use_vllm:
        extra.update(use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=cfg.vllm_gpu_memory_utilization)
    return config_for(
        cfg.algo, output_dir=str(output_dir), setpo_lambda=lam, embedder=cfg.embedder,
        num_generations=cfg.num_generations,
        temperature=cfg.temperature, top_p=1.0, max_completion_length=cfg.max_completion_length, beta=cfg.beta,
        per_device_train_batch_size=cfg.micro_batch, gradient_accumulation_steps=completions // cfg.micro_batch,
        num_train_epochs=cfg.num_train_epochs, max_steps=cfg.max_steps, lr_scheduler_type="constant",
        warmup_steps=0, save_strategy="steps", save_steps=cfg.save_steps, save_total_limit=1, logging_steps=1,
        report_to=[], use_cpu=not cuda, bf16=cuda, gradient_checkpointing=cuda and cfg.model_path is not None,
        seed=cfg.seed, data_seed=cfg.seed, disable_tqdm=True, dataloader_num_workers=0, **extra)


def sample_responses(model, tokenizer, questions: Sequence[str], n: int, temperature: float, top_p: float,
                     max_new_tokens: int, seed: int = 0, batch_sequences: int = 64) -> list[list[str]]:
    """n responses per question, prompted with the Qwen-Math template (``setpo.studies.sampling.sample_completions``)."""
    return sample_completions(model, tokenizer, chat_prompts(tokenizer, questions), n, temperature, top_p,
                              max_new_tokens, seed=seed, batch_sequences=batch_sequences, add_special_tokens=False)


def probe_sampler(cfg: MathRunConfig, probes: Sequence[MathProblem], tokenizer):
    """``sample(model, step)`` for ``setpo.trl.probe_callback``: responses to fixed probe questions, as
    {"probe", "question", "answer", "text", "reward"} records."""

    def sample(model, step: int) -> list[dict]:
        texts = sample_responses(model, tokenizer, [p.question for p in probes], cfg.probe_samples,
                                 cfg.temperature, 1.0, cfg.max_completion_length, seed=cfg.seed + step)
        return [{"probe": j, "question": prob.question, "answer": prob.answer, "text": t,
                 "reward": math_reward(t, prob.answer)}
                for j, (prob, samples) in enumerate(zip(probes, texts)) for t in samples]

    return sample


def train_run(cfg: MathRunConfig, label: str, lam: float, train: Sequence[MathProblem],
              probes: Sequence[MathProblem], embedder=None, callbacks: Sequence = (), log=print) -> Path:
    """Train one run (λ = 0: the baseline) from the base model; resumes from its last checkpoint.

    Writes under ``run_dir/<label>/``: checkpoints, ``final/`` (model + tokenizer + done.json),
    ``log_history.json`` and ``probes.jsonl``. A finished run is not retrained. Returns ``final/``.
    """
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    from setpo.trl import SetPOTrainer, probe_callback, train_resumable

    out = Path(cfg.run_dir) / label.replace("+", "_")
    final = out / "final"
    if (final / "done.json").is_file():
        return final
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "run_config.json", {"label": label, "lambda": lam, "config": vars(cfg)})  # the record
    model_path = resolve_model_path(cfg)
    tokenizer = load_tokenizer(model_path)
    # float32 master weights (bf16 autocast on a GPU): at lr 1e-6 an update is far below bf16's resolution
    model = AutoModelForCausalLM.from_pretrained(str(model_path), local_files_only=True, dtype=torch.float32)
    args = trl_args(cfg, lam, out)
    trainer = SetPOTrainer(model=model, reward_funcs=math_reward_func, args=args,
                           train_dataset=Dataset.from_list(to_trl_records(train)), processing_class=tokenizer,
                           embedder=embedder,
                           callbacks=[probe_callback(probe_sampler(cfg, probes, tokenizer), out / "probes.jsonl",
                                                     cfg.probe_every, at_end=True), *callbacks])
    train_resumable(trainer, tokenizer, out, final, {"label": label, "lam": lam}, log,
                    f"[{label}] λ={lam}, G={cfg.num_generations}, {cfg.prompts_per_step} prompts/step, "
                    f"vLLM={args.use_vllm}")
    del trainer, model
    if _cuda():
        torch.cuda.empty_cache()  # the next run in this process starts with the memory free
    return final


def _generate_vllm(model_dir: str, prompts: list[str], k: int, temperature: float, top_p: float,
                   max_new_tokens: int, seed: int, gpu_memory_utilization: float) -> list[list[str]]:
    """k samples per (already templated) prompt with vLLM; run it through ``in_fresh_process``."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=model_dir, seed=seed, gpu_memory_utilization=gpu_memory_utilization)
    params = SamplingParams(n=k, temperature=temperature, top_p=top_p, max_tokens=max_new_tokens, seed=seed,
                            skip_special_tokens=True)
    return [[o.text for o in out.outputs] for out in llm.generate(prompts, params)]


def train_runs(cfg: MathRunConfig, train: Sequence[MathProblem], probes: Sequence[MathProblem], embedder=None,
               log=print) -> dict[str, Path]:
    """Every run of ``cfg.runs()`` (baseline, then SetPO), each with ``train_run``; label -> final model dir.

    With vLLM each run trains in its own spawned process (``in_fresh_process``; the embedder is then loaded
    there from ``cfg.embedder``), otherwise in this one with the given embedder.
    """
    finals = {}
    for label, lam in cfg.runs().items():
        if uses_vllm(cfg):
            log(f"[{label}] training in a fresh process (vLLM)")
            finals[label] = in_fresh_process(train_run, cfg, label, lam, list(train), list(probes))
        else:
            finals[label] = train_run(cfg, label, lam, train, probes, embedder=embedder, log=log)
    return finals


def evaluate_avg_at_k(cfg: MathRunConfig, model_dir: str | Path, problems: Sequence[MathProblem],
                      cache: str | Path | None = None) -> dict:
    """Pass@1 as avg@k: k samples per problem at T = eval_temperature, top-p eval_top_p, mean fraction correct.

    Also the unbiased pass@j curve for j = 1..k (``setpo.pass_at_k``) and avg@k per data source. Generation
    by vLLM when ``use_vllm`` resolves true, else ``generate``. Cached as JSON in ``cache`` when given.
    Returns {"avg_at_k", "k", "per_source", "pass_at_k", "correct", "n_problems", "examples", "seconds"}.
    """
    from setpo.metrics import pass_at_k

    if cache is not None and Path(cache).is_file():
        return read_json(Path(cache), "delete it to evaluate again")
    problems = list(problems[:cfg.eval_limit] if cfg.eval_limit else problems)
    tokenizer = load_tokenizer(model_dir)
    t0 = time.time()
    if uses_vllm(cfg):
        prompts = chat_prompts(tokenizer, [p.question for p in problems])
        # The evaluation process holds the GPU alone (training has exited), so vLLM may take most of it.
        texts = in_fresh_process(_generate_vllm, str(model_dir), prompts, cfg.eval_k, cfg.eval_temperature,
                                 cfg.eval_top_p, cfg.max_completion_length, cfg.seed + 1, 0.85)
    else:
        import torch
        from transformers import AutoModelForCausalLM

        cuda = _cuda()
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True,
                                                     dtype=torch.bfloat16 if cuda else torch.float32)
        model.to("cuda" if cuda else "cpu")
        texts = sample_responses(model, tokenizer, [p.question for p in problems], cfg.eval_k,
                                 cfg.eval_temperature, cfg.eval_top_p, cfg.max_completion_length, seed=cfg.seed + 1)
    correct = [sum(math_reward(t, p.answer) for t in ts) for p, ts in zip(problems, texts)]
    k = cfg.eval_k
    per_source: dict[str, list[float]] = {}
    for p, c in zip(problems, correct):
        per_source.setdefault(p.source, []).append(c / k)
    result = {
        "avg_at_k": sum(c / k for c in correct) / len(correct), "k": k,
        "per_source": {s: sum(v) / len(v) for s, v in per_source.items()},
        "pass_at_k": [sum(pass_at_k(k, int(c), j) for c in correct) / len(correct) for j in range(1, k + 1)],
        "correct": correct, "n_problems": len(problems), "temperature": cfg.eval_temperature,
        "top_p": cfg.eval_top_p, "examples": [ts[:2] for ts in texts[:3]], "seconds": time.time() - t0,
    }
    if cache is not None:
        Path(cache).parent.mkdir(parents=True, exist_ok=True)
        write_json(Path(cache), result)
    return result


def load_passk_problems(cfg: MathRunConfig) -> list[MathProblem]:
    """The pass@k problems: PASSK_FILE (an AIME-style file), or generated ones (seeded apart from train/val)."""
    if cfg.passk_file:
        return load_math_problems(cfg.passk_file, limit=cfg.passk_limit)
    return smoke_problems(cfg.passk_limit or 30, seed=cfg.seed + 2)


def evaluate_pass_at_k(cfg: MathRunConfig, models: Mapping[str, str | Path], problems: Sequence[MathProblem],
                       cache_dir: str | Path | None = None) -> dict[str, dict]:
    """pass@k for k = 1..passk_max of each model (label -> model folder; e.g. the base model, GRPO, SetPO).

    n = passk_max samples per problem (``evaluate_avg_at_k`` with eval_k = passk_max, every problem), so each
    curve is the unbiased estimator at every k from one set of samples. Cached per model in ``cache_dir``.
    Returns label -> ``evaluate_avg_at_k``'s result (``pass_at_k[k-1]`` is pass@k).
    """
    from dataclasses import replace

    pcfg = replace(cfg, eval_k=cfg.passk_max, eval_limit=None)
    out = {}
    for label, model_dir in models.items():
        name = label.replace("+", "_").replace(" ", "_")
        cache = None if cache_dir is None else Path(cache_dir) / f"passk_{name}.json"
        out[label] = evaluate_avg_at_k(pcfg, model_dir, problems, cache=cache)
    return out


def pass_at_k_figure(results: Mapping[str, dict], title: str = ""):
    """pass@k against k (log scale, powers of two marked) for each model, the base model in grey, dashed."""
    from setpo.studies.figures import BASELINE_COLOUR, SETPO_COLOURS, line_grid

    lines, i = [], 0
    for label, r in results.items():
        ks = list(range(1, len(r["pass_at_k"]) + 1))
        if label.lower().startswith("base"):
            style = {"color": "#7f7f7f", "dash": "dash"}
        else:
            style = {"color": BASELINE_COLOUR if i == 0 else SETPO_COLOURS[(i - 1) % 4]}
            i += 1
        lines.append({"x": ks, "y": r["pass_at_k"], "name": label, **style})
    k_max = max(len(r["pass_at_k"]) for r in results.values())
    ticks = [2 ** j for j in range(k_max.bit_length()) if 2 ** j <= k_max]
    n = next(iter(results.values()))["n_problems"]
    return line_grid([{"title": f"pass@k on {n} problems (n = {k_max} samples each)", "lines": lines}], cols=1,
                     x_title="k (samples)", y_title="pass@k", log_x=True, x_ticks=ticks, title=title,
                     panel_px=(640, 400))


def pass_at_k_table(results: Mapping[str, dict], ks: Sequence[int] = (1, 4, 16, 64, 256)) -> str:
    """pass@k in % per model (rows) at the given k (columns, those within the sampled n), as markdown."""
    k_max = min(len(r["pass_at_k"]) for r in results.values())
    ks = [k for k in ks if k <= k_max] or [k_max]
    return markdown_table([{"model": label, **{f"pass@{k}": f"{100 * r['pass_at_k'][k - 1]:.1f}" for k in ks}}
                           for label, r in results.items()])


def read_probes(path: str | Path) -> list[dict]:
    """The records a run's probe callback wrote (``probes.jsonl``; a last line cut short by a kill is dropped,
    ``setpo.records.read_records``)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"no probe file at {p}; train the run first")
    return read_records(p)


def trajectory_figure(probes_by_run: Mapping[str, Sequence[dict]], embedder, method: str = "umap", seed: int = 0,
                      title_note: str = ""):
    """Embedding trajectories of the responses to fixed prompts over training, one panel per run.

    probes_by_run: run label -> probe records (``read_probes``). All responses of all runs are embedded with
    ``embedder`` and projected together (``setpo.studies.figures.project_texts``), so panels share one map; the
    figure is the shared ``setpo.studies.figures.trajectory_figure``: colour is the training step, marker shape
    the probe prompt, filled = correct; hovering shows the response.
    Returns (plotly Figure, {"points": {label: {"xy", "step"}}, "steps", "method", "frame"}).
    """
    import pandas as pd

    from setpo.studies.figures import project_texts
    from setpo.studies.figures import trajectory_figure as build

    labels = list(probes_by_run)
    records = [(label, r) for label in labels for r in probes_by_run[label]]
    if not records:
        raise ValueError("no probe records to plot")
    xy = project_texts([r["text"] for _, r in records], embedder, method=method, seed=seed)
    frame = pd.DataFrame([{"panel": label, "step": r["step"], "x": x, "y": y, "correct": bool(r["reward"]),
                           "group": r["probe"], "hover": _hover_text(r["text"])}
                          for (label, r), (x, y) in zip(records, xy)])
    fig = build(frame, group_name="prompt", panel_px=(520, 470),
                title="Responses to fixed prompts over training "
                      f"({method.upper()} of their embeddings; shape: prompt, filled: correct){title_note}")
    points = {label: {"xy": xy[frame.panel == label].tolist(), "step": frame.step[frame.panel == label].tolist()}
              for label in labels}
    return fig, {"points": points, "steps": sorted(set(frame.step)), "method": method, "frame": frame}


TRAINING_KEYS = (("reward", "mean reward"), ("setpo/pairwise_similarity", "within-group similarity"),
                 ("setpo/distinct_correct", "distinct correct per group"))


def training_figure(run_dirs: Mapping[str, str | Path], title: str = ""):
    """Reward, within-group similarity and distinct correct responses per group over training, as logged by
    ``SetPOTrainer`` (``log_history.json`` of each run): a panel per metric, a line per run."""
    from setpo.studies.figures import BASELINE_COLOUR, SETPO_COLOURS, line_grid

    panels = [{"title": name, "lines": []} for _, name in TRAINING_KEYS]
    for i, (label, d) in enumerate(run_dirs.items()):
        history = read_json(Path(d) / "log_history.json", "delete the run folder to train it again")
        for panel, (key, _) in zip(panels, TRAINING_KEYS):
            pts = [(h["step"], h[key]) for h in history if h.get(key) is not None]
            if pts:
                x, y = zip(*pts)
                panel["lines"].append({"x": x, "y": y, "name": label, "markers": True,
                                       "color": BASELINE_COLOUR if i == 0 else SETPO_COLOURS[(i - 1) % 4]})
    return line_grid(panels, cols=len(panels), x_title="step", title=title, panel_px=(380, 280))


def results_table(results: Mapping[str, dict], eval_k: int, note: str = "") -> str:
    """Pass@1 as avg@k per run (rows) and data source (columns), in %, as markdown."""
    sources = sorted({s for r in results.values() for s in r["per_source"]})
    table = markdown_table([{"run": label, **{s: f"{100 * r['per_source'][s]:.1f}" for s in sources},
                             f"all (avg@{eval_k})": f"{100 * r['avg_at_k']:.1f}"} for label, r in results.items()])
    return table + (f"\n\n*{note}*" if note else "")


def figure_record(cfg: MathRunConfig, command: str = "notebooks/04_qwen_math_gpu", **extra) -> dict:
    """The run record of a notebook-04 figure: config, seed, model, embedder and data by name."""
    from setpo.studies.figures import embedder_name, run_record

    uses = {"embedder": embedder_name(cfg.embedder),
            "model": cfg.model_path or "tiny random Qwen2 (setpo.studies.tiny_models; numbers mean nothing)",
            "train data": cfg.train_file or "generated (envs.math.smoke_problems)",
            "validation data": cfg.val_file or "generated (envs.math.smoke_problems)",
            "pass@k data": cfg.passk_file or "generated (envs.math.smoke_problems)",
            "generation": "vLLM" if uses_vllm(cfg) else "transformers generate"}
    return run_record(command, config=vars(cfg), seeds=[cfg.seed], uses=uses, **extra)


def _hover_text(text: str, width: int = 80, max_lines: int = 12) -> str:
    import html
    import textwrap

    lines = textwrap.wrap(text.replace("\n", " ⏎ "), width) or ["(empty)"]
    if len(lines) > max_lines:
        lines = lines[:max_lines] + ["…"]
    return "<br>".join(html.escape(line) for line in lines)
