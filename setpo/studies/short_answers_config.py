"""The short-answer study's settings: the base table's (``BaseTableConfig``) and the study's
(``ShortAnswerStudyConfig``, with its presets). Why each default is what it is: docs/studies/short_answers.md."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from envs.short_answers import KINDS, STUDY_KINDS

PROG = "python -m setpo.studies.short_answers"


@dataclass(frozen=True)
class BaseTableConfig:
    """What ``base_table`` measures.

    model_path: a local model folder; None: the packaged SmolLM2-135M-Instruct (``setpo.models``).
    kinds: task kinds of ``envs.short_answers``. per_kind: training prompts per kind. n: samples per prompt.
    temperatures: sampling temperatures (top-p 1). max_new_tokens: the completion limit.
    group_size: G of ``mixed_groups``. seed: prompt draw and sampling seed.
    """

    model_path: str | None = None
    kinds: tuple[str, ...] = STUDY_KINDS
    per_kind: int = 24
    n: int = 16
    temperatures: tuple[float, ...] = (0.7, 1.0)
    max_new_tokens: int = 24
    group_size: int = 8
    seed: int = 0
    split: str = field(default="train")

    def __post_init__(self):
        check_kinds(self.kinds)


def check_kinds(kinds) -> None:
    """A ValueError unless ``kinds`` is a non-empty tuple or list of known kind names (a single string, which
    would be read letter by letter, says how to write it)."""
    if isinstance(kinds, str):
        raise ValueError(f"kinds must be a tuple of task kinds, got the string {kinds!r}; write kinds=({kinds!r},)")
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise ValueError(f"unknown task kinds {unknown}; kinds: {', '.join(KINDS)}")


#: fields that may change while a folder's results are reused: where the results go and how often it saves
REUSE_NEUTRAL_FIELDS = ("run_dir", "save_steps")


#: the study's sizes: "committed" (the README's numbers), "notebook" (notebook 04's first run, about 20 minutes
#: on 2 cores) and "smoke" (the test's, for a tiny model given as model_path)
STUDY_PRESETS = {
    "committed": {},
    "notebook": dict(seeds=(0, 1), steps=20, eval_per_kind=3, eval_n=32, probe_every=5),
    "smoke": dict(seeds=(0, 1), steps=2, prompts_per_step=2, group_size=3, train_per_kind=2,
                  kinds=("between", "add_1x1"), eval_per_kind=1, eval_n=4, probe_per_kind=1, probe_samples=3,
                  probe_every=1, max_new_tokens=6, embedder="hash", bf16=False, save_steps=1),
}


@dataclass(frozen=True)
class ShortAnswerStudyConfig:
    """One study. Sizes in prompts and samples; every field is recorded with the results.

    run_dir: the study's folder. model_path: a local model folder; None: the packaged SmolLM2-135M-Instruct.
    seeds: the paired seeds. lam, lam_units: SetPO's λ (GRPO runs have λ = 0). embedder: ``setpo.embed`` spec.
    steps, prompts_per_step, group_size (G), lr, temperature, max_new_tokens: the training runs.
    kinds: task kinds; train_per_kind: the training pool per kind (train split).
    eval_per_kind, eval_n, eval_seed: test prompts per kind, samples each, the sampling seed.
    probe_per_kind, probe_samples, probe_every: validation prompts per many-answer kind sampled during training.
    bf16: bf16 autocast in training (float32 weights). save_steps: checkpoint interval.
    """

    run_dir: str = "runs/short_answers"
    model_path: str | None = None
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    lam: float = 0.15
    lam_units: str = "term_std"
    embedder: str = "default"
    steps: int = 30
    prompts_per_step: int = 8
    group_size: int = 8
    lr: float = 2e-5
    temperature: float = 1.0
    max_new_tokens: int = 24
    kinds: tuple[str, ...] = STUDY_KINDS
    train_per_kind: int = 48
    eval_per_kind: int = 6
    eval_n: int = 64
    eval_seed: int = 1234
    probe_per_kind: int = 2
    probe_samples: int = 16
    probe_every: int = 5
    bf16: bool = True
    save_steps: int = 5

    def __post_init__(self):
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds must be distinct and at least one, got {self.seeds!r}")
        if self.group_size < 3:
            raise ValueError(f"group_size must be >= 3 (SetPO's leave-one-out set), got {self.group_size}")
        if not self.lam > 0:
            raise ValueError(f"lam must be > 0 (the SetPO runs' λ; GRPO is λ = 0), got {self.lam!r}")
        for name in ("steps", "prompts_per_step", "train_per_kind", "eval_per_kind", "eval_n", "probe_samples",
                     "probe_every", "max_new_tokens", "save_steps"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {getattr(self, name)!r}")
        check_kinds(self.kinds)

    @classmethod
    def preset(cls, name: str, **overrides) -> "ShortAnswerStudyConfig":
        """One of ``STUDY_PRESETS`` with ``overrides`` (run_dir, model_path, ...)."""
        if name not in STUDY_PRESETS:
            raise ValueError(f"unknown preset {name!r}; presets: {', '.join(STUDY_PRESETS)}")
        return replace(cls(), **{**STUDY_PRESETS[name], **overrides})

    def command(self) -> str:
        """The command line that makes this study: its preset, folder and model."""
        name = next((n for n in STUDY_PRESETS
                     if self.preset(n, run_dir=self.run_dir, model_path=self.model_path) == self), None)
        if name is None:
            return f"{PROG} study (a config outside the presets: see config.json) --out {self.run_dir}"
        model = f" --model-path {self.model_path}" if self.model_path else ""
        return f"{PROG} study --preset {name} --out {self.run_dir}{model}"

    @classmethod
    def from_record(cls, config: dict) -> "ShortAnswerStudyConfig":
        """The config a record's ``config`` (JSON: tuples came back as lists) was made with."""
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in config.items()})

    def methods(self) -> dict[str, float]:
        """Method -> λ: GRPO (λ = 0) and SetPO+GRPO."""
        return {"GRPO": 0.0, "SetPO+GRPO": self.lam}

    def run_labels(self) -> dict[str, tuple[str, int]]:
        """Run label ("grpo_s0", "setpo_s0", ...) -> (method, seed), seeds paired."""
        return {f"{_slug(m)}_s{s}": (m, s) for s in self.seeds for m in self.methods()}


def _slug(method: str) -> str:
    return "grpo" if method == "GRPO" else "setpo"
