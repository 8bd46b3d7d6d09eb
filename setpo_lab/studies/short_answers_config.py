"""The short-answer study's settings: the base table's (``BaseTableConfig``) and the study's
(``ShortAnswerStudyConfig``, with its presets). Why each default is what it is: docs/studies/short_answers.md."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from functools import partial
from pathlib import Path
from typing import ClassVar

from setpo.embed import check_embedder_spec
from setpo.envs.short_answers import KINDS, STUDY_KINDS, TaskSpec, sample_tasks
from setpo.presets import LAMBDA_UNITS
from setpo.records import read_json
from setpo_lab.studies.arguments import check_fields
from setpo_lab.studies.stages import refusal

PROG = "python -m setpo_lab run short_answers"
#: the most new tokens a completion may have: an answer is one short line, and more is a typo that would allocate
#: a cache of that length for every sample
MAX_NEW_TOKENS = 1024


@dataclass(frozen=True)
class BaseTableConfig:
    """What ``short_answers._base_table`` measures.

    model_path: a local model folder; None: the packaged SmolLM2-135M-Instruct (``setpo.models``).
    kinds: task kinds of ``setpo.envs.short_answers``. per_kind: training prompts per kind. n: samples per prompt.
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
        _check_kinds(self.kinds)
        check_fields(self, count=("per_kind", "n", "max_new_tokens", "group_size"), seed=("seed",),
                     positives=("temperatures",))


def _check_kinds(kinds) -> None:
    """A ValueError unless ``kinds`` is a non-empty tuple or list of known kind names (a single string, which
    would be read letter by letter, says how to write it)."""
    if isinstance(kinds, str):
        raise ValueError(f"kinds must be a list of task kinds, got the string {kinds!r}; write kinds=({kinds!r},) "
                         f"(on the command line: --set 'kinds=[\"{kinds}\"]')")
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise ValueError(f"unknown task kinds {unknown}; kinds: {', '.join(KINDS)}")


#: fields that may change while a folder's results are reused: where the results go and how often it saves
REUSE_NEUTRAL_FIELDS = ("run_dir", "save_steps")


#: the study's sizes: "committed" (the README's numbers), "notebook" (the size of notebook 04's own run) and
#: "smoke" (the test's, for a tiny model given as model_path)
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
        # every field is checked here, before a folder is claimed: a setting refused only when the first run used
        # it left config.json behind, and the rerun with it fixed was refused as another configuration's folder
        check_fields(self, seeds=("seeds",), positive=("lam", "lr", "temperature"),  # lam: the SetPO runs' λ
                     count=("steps", "prompts_per_step", "train_per_kind", "eval_per_kind", "eval_n", "probe_samples",
                            "probe_every", "max_new_tokens", "save_steps", "probe_per_kind"),
                     group=("group_size",), seed=("eval_seed",), flag=("bf16",))
        if self.max_new_tokens > MAX_NEW_TOKENS:
            raise ValueError(f"max_new_tokens must be at most {MAX_NEW_TOKENS} (an answer is one short line), got "
                             f"{self.max_new_tokens}")
        if self.lam_units not in LAMBDA_UNITS:
            raise ValueError(f"lam_units must be one of {LAMBDA_UNITS}, got {self.lam_units!r}")
        if self.model_path is not None and (not isinstance(self.model_path, str) or not self.model_path.strip()):
            raise ValueError(f"model_path must be a folder or None, got {self.model_path!r}")
        check_embedder_spec(self.embedder)
        _check_kinds(self.kinds)

    #: the study's presets, and the command that runs one (a subclass names its own)
    PRESETS: ClassVar[dict] = STUDY_PRESETS
    COMMAND: ClassVar[str] = PROG

    @classmethod
    def preset(cls, name: str, **overrides):
        """One of the class's ``PRESETS`` with ``overrides`` (run_dir, model_path, ...)."""
        if name not in cls.PRESETS:
            raise ValueError(f"unknown preset {name!r}; presets: {', '.join(cls.PRESETS)}")
        return replace(cls(), **{**cls.PRESETS[name], **overrides})

    @classmethod
    def presets(cls) -> dict:
        """The class's ``PRESETS`` as a study command's factories (name -> config from fields)."""
        return {name: partial(cls.preset, name) for name in cls.PRESETS}

    def command(self) -> str:
        """The command line that makes this study: its preset, folder and model."""
        name = next((n for n in self.PRESETS
                     if self.preset(n, run_dir=self.run_dir, model_path=self.model_path) == self), None)
        if name is None:
            return f"{self.COMMAND} (a config outside the presets: see config.json) --out {self.run_dir}"
        model = f" --model-path {self.model_path}" if self.model_path else ""
        return f"{self.COMMAND} --preset {name} --out {self.run_dir}{model}"

    @classmethod
    def from_record(cls, config: dict) -> "ShortAnswerStudyConfig":
        """The config a record's ``config`` (JSON: tuples came back as lists) was made with."""
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in config.items()})

    def train_tasks(self) -> list[TaskSpec]:
        """The training pool: the same for every run (a seed orders it)."""
        return sample_tasks(self.kinds, "train", self.train_per_kind, seed=0)

    def eval_tasks(self) -> list[TaskSpec]:
        """The prompts every model is evaluated on: the test split (the cure study's pilot: validation)."""
        return sample_tasks(self.kinds, getattr(self, "eval_split", "test"), self.eval_per_kind, seed=0)

    def methods(self) -> dict[str, float]:
        """Method -> λ: GRPO (λ = 0) and SetPO+GRPO."""
        return {"GRPO": 0.0, "SetPO+GRPO": self.lam}

    def trainer_settings(self, method: str) -> dict:
        """The ``SetPOConfig`` fields a method sets on top of the study's GRPO settings: its λ."""
        return {"setpo_lambda": self.methods()[method]}

    def run_labels(self) -> dict[str, tuple[str, int]]:
        """Run label ("grpo_s0", "setpo_s0", ...) -> (method, seed), seeds paired."""
        return {f"{_slug(m)}_s{s}": (m, s) for s in self.seeds for m in self.methods()}

    #: what a run of the study writes in its folder besides config.json (``stages.claim_folder``'s results)
    RESULTS: ClassVar[tuple[str, ...]] = ("train", "eval", "results.json")

    def reused_folder(self, label: str) -> str | None:
        """The folder run ``label`` comes from when another study's is reused: this study trains every run."""
        return None

    def run_folder(self, label: str) -> Path:
        """Where run ``label`` lives: ``train/<label>`` of the study's folder, or of the folder it reuses runs from
        (``CureStudyConfig.reuse_from``, for the committed study's arms)."""
        return Path(self.reused_folder(label) or self.run_dir) / "train" / label

    def eval_path(self, label: str, folder: str = "eval") -> Path:
        """``<folder>/<label>.json`` of the study's folder, or, for the study evaluation of a run (or the base
        model) the cure study reuses, of the folder it reuses from."""
        source = self.reused_folder(label) if folder == "eval" else None
        return Path(source or self.run_dir) / folder / f"{label}.json"

    def check_reusable(self) -> None:
        """Nothing to check: no run is reused."""

    def hard_labels(self) -> list[str]:
        """The runs evaluated on a harder pass@k set besides the study's test prompts: none."""
        return []

    def extra_evaluations(self) -> list[tuple[str, list[TaskSpec], int, set[str]]]:
        """The evaluations besides the study's test prompts, in order: (folder, prompts, samples each, the labels
        evaluated, "base" for the base model); the cure study's pass@k set is one."""
        hard = set(self.hard_labels())
        return [("eval_hard", self.hard_tasks(), self.hard_n, hard | {"base"})] if hard else []


def _slug(method: str) -> str:
    return "grpo" if method == "GRPO" else "setpo"


@dataclass(frozen=True)
class _Arm:
    """One training method of the short-answer studies: its name in tables and what it sets on top of GRPO's
    settings (``SetPOConfig`` fields; λ comes from the study's config, ``lam_field``)."""

    method: str
    lam_field: str | None = None          # the config field that holds this arm's λ (None: λ = 0)
    settings: tuple[tuple[str, object], ...] = ()


#: the arms, by the slug that starts their run labels ("grpo_s0", "key_gated_s3", ...)
ARMS = {
    "grpo": _Arm("GRPO"),
    "setpo": _Arm("SetPO+GRPO", "lam"),  # the whole completion, the study's embedder: the committed arm
    "answer": _Arm("SetPO, answer by MiniLM", "lam_answer",
                   (("embedder", "default"), ("setpo_kernel_reads", "answer"),
                    ("setpo_answer_reader", "setpo.envs.short_answers:answer_key"))),
    "key": _Arm("SetPO, answer key", "lam_key",
                (("embedder", "key"), ("setpo_kernel_reads", "answer"),
                 ("setpo_answer_reader", "setpo.envs.short_answers:answer_key"))),
    "key_gated": _Arm("SetPO, answer key, right only", "lam_key_gated",
                      (("embedder", "key"), ("setpo_kernel_reads", "answer"),
                       ("setpo_answer_reader", "setpo.envs.short_answers:answer_key"), ("setpo_gate_reward", 1.0))),
    "passk": _Arm("Pass@k Training", None, (("setpo_estimator", "pass@4"),)),
    # the confirmatory study's peers (results/short_answers/confirm/PLAN.md), each at its paper's default
    "fgrpo": _Arm("F-GRPO (focal, γ = 0.5)", None, (("setpo_estimator", "focal:grpo"),)),
    "obe_batch": _Arm("Outcome-based exploration, batch", "lam_obe",
                      (("embedder", "key"), ("setpo_kernel_reads", "answer"),
                       ("setpo_answer_reader", "setpo.envs.short_answers:answer_key"),
                       ("setpo_diversity", "outcome_batch"), ("setpo_lambda_units", "absolute"))),
}

#: the cure study's sizes: "cure" (the record), "pilot" (λ of each new arm on the validation split), "smoke"
CURE_PRESETS = {
    "cure": {},
    # the arms' own λ are unused under a λ grid: pinned to the values the committed pilot was made with, so that its
    # command still claims results/short_answers/pilot after the record's λ changed
    "pilot": dict(seeds=(0,), arms=("grpo", "answer", "key", "key_gated"), lam_grid=(0.15, 0.5), eval_split="val",
                  eval_per_kind=4, eval_n=32, hard_kinds=(), reuse_from=None, lam_answer=0.15, lam_key=0.15,
                  lam_key_gated=0.15),
    # the MiniLM answer arm again, at smaller λ: in the pilot neither 0.15σ nor 0.5σ kept its pass@1 within 0.05 of
    # GRPO's (GRPO's seed-0 run is trained again here, beside it, and must match the pilot's on the same prompts)
    "pilot_answer": dict(seeds=(0,), arms=("grpo", "answer"), lam_grid=(0.02, 0.05), eval_split="val",
                         eval_per_kind=4, eval_n=32, hard_kinds=(), reuse_from=None, lam_answer=0.15, lam_key=0.5,
                         lam_key_gated=0.5),
    # notebook 04's own run: GRPO and the gated answer-key arm on 2 seeds at the study's "notebook" size (the
    # harder pass@k set and the other arms come from the committed record)
    "notebook": dict(STUDY_PRESETS["notebook"], arms=("grpo", "key_gated"), hard_kinds=(), reuse_from=None),
    "smoke": dict(seeds=(0,), steps=2, prompts_per_step=2, group_size=4, train_per_kind=2,
                  kinds=("between", "add_1x1"), eval_per_kind=1, eval_n=4, probe_per_kind=1, probe_samples=3,
                  probe_every=1, max_new_tokens=6, embedder="hash", bf16=False, save_steps=1,
                  arms=("grpo", "setpo", "key_gated", "passk"), hard_kinds=("add_3x2",), hard_per_kind=1,
                  hard_n=8, reuse_from=None),
}


@dataclass(frozen=True)
class CureStudyConfig(ShortAnswerStudyConfig):
    """The short-answer study extended with arms that keep SetPO's term where the reward reads (``ARMS``), a
    peer that is known to keep pass@k, and a harder pass@k test set. The training settings it shares with the
    committed study are the committed study's, so that study's GRPO and SetPO+GRPO runs are reused
    (``reuse_from``) when their configs agree on every training field.

    arms: slugs of ``ARMS``. lam_answer, lam_key, lam_key_gated: λ of those arms (``lam_units`` as the study's),
    chosen by the pilot on the validation split. lam_grid: the pilot's λ values (each a run per seed).
    eval_split: "test" (the record) or "val" (the pilot). hard_kinds, hard_per_kind, hard_n: the pass@k set
    (test split); hard_arms: the arms evaluated on it, with the base model (the whole-completion arm is left out:
    its models would have to be trained again, and it is not a candidate cure). reuse_from: the committed study's folder, whose runs of arms "grpo" and "setpo" are used as
    they are (None: train them here).
    """

    run_dir: str = "runs/short_answers_cure"
    arms: tuple[str, ...] = ("grpo", "setpo", "answer", "key", "key_gated", "passk")
    # λ (in lam_units) chosen by the pilots on the validation split: key 0.5σ and key_gated 0.5σ
    # (results/short_answers/pilot); answer 0.05σ (results/short_answers/pilot_answer: neither 0.15σ nor 0.5σ kept
    # its pass@1 within 0.05 of GRPO's)
    lam_answer: float = 0.05
    lam_key: float = 0.5
    lam_key_gated: float = 0.5
    lam_grid: tuple[float, ...] = ()
    eval_split: str = "test"
    # base pass@64 0.54 and 0.50 on 24 train prompts (results/short_answers/hard_kinds): inside 0.3-0.8, one sum
    # and one product, each the nearest its family has to the middle of that range
    hard_kinds: tuple[str, ...] = ("add_3x2", "times_2x1")
    hard_per_kind: int = 24
    hard_n: int = 128
    hard_arms: tuple[str, ...] = ("grpo", "answer", "key", "key_gated", "passk")
    reuse_from: str | None = "results/short_answers/study"

    def __post_init__(self):
        super().__post_init__()
        unknown = [a for a in self.arms if a not in ARMS]
        if unknown or not self.arms:
            raise ValueError(f"unknown arms {unknown}; arms: {', '.join(ARMS)}")
        if self.eval_split not in ("test", "val"):
            raise ValueError(f"eval_split must be 'test' or 'val' (never train), got {self.eval_split!r}")
        if self.hard_kinds:
            _check_kinds(self.hard_kinds)
        check_fields(self, positive=("lam_answer", "lam_key", "lam_key_gated"),
                     positives=("lam_grid",) if self.lam_grid else ())  # () is no grid

    PRESETS: ClassVar[dict] = CURE_PRESETS
    COMMAND: ClassVar[str] = f"{PROG}_cure"

    def methods(self) -> dict[str, float]:
        """Method -> λ, one per arm (the pilot: one per arm and λ of its grid)."""
        return {self.method_name(a, lam): lam for a, lam in self.arm_lams()}

    def arm_lams(self) -> list[tuple[str, float]]:
        """(arm, λ) of every method: the pilot's grid for each arm with a λ, else each arm's own λ."""
        out = []
        for arm in self.arms:
            field_ = ARMS[arm].lam_field
            lams = self.lam_grid if self.lam_grid and field_ else (getattr(self, field_) if field_ else 0.0,)
            out += [(arm, lam) for lam in lams]
        return out

    def method_name(self, arm: str, lam: float) -> str:
        return f"{ARMS[arm].method} λ={lam:g}" if self.lam_grid and ARMS[arm].lam_field else ARMS[arm].method

    def run_labels(self) -> dict[str, tuple[str, int]]:
        labels = {}
        for s in self.seeds:
            for arm, lam in self.arm_lams():
                slug = f"{arm}{lam:g}" if self.lam_grid and ARMS[arm].lam_field else arm
                labels[f"{slug}_s{s}"] = (self.method_name(arm, lam), s)
        return labels

    def arm_of(self, method: str) -> str:
        return next(a for a, lam in self.arm_lams() if self.method_name(a, lam) == method)

    def trainer_settings(self, method: str) -> dict:
        arm = self.arm_of(method)
        return {"setpo_lambda": self.methods()[method], **dict(ARMS[arm].settings)}

    RESULTS: ClassVar[tuple[str, ...]] = ("train", "eval", "eval_hard", "results.json")

    def hard_tasks(self) -> list[TaskSpec]:
        """The pass@k prompts: ``hard_per_kind`` test prompts of each of ``hard_kinds``."""
        return sample_tasks(self.hard_kinds, "test", self.hard_per_kind, seed=0) if self.hard_kinds else []

    def hard_labels(self) -> list[str]:
        """The runs evaluated on the pass@k prompts (the base model's "base" besides): those of ``hard_arms``."""
        if not self.hard_kinds:
            return []
        return [label for label, (method, _) in self.run_labels().items() if self.arm_of(method) in self.hard_arms]

    def check_reusable(self) -> None:
        """Refuse to reuse ``reuse_from``'s runs unless that study trained with this study's settings and seeds and
        evaluated on the same test prompts and samples."""
        if not self.reuse_from:
            return
        path = Path(self.reuse_from) / "config.json"
        saved = ShortAnswerStudyConfig.from_record(read_json(path, "give reuse_from a finished short-answer study"))
        mine = ShortAnswerStudyConfig(**{f.name: getattr(self, f.name) for f in fields(ShortAnswerStudyConfig)})
        differ = sorted(f for f in (*self.training_fields(), "seeds", "eval_per_kind", "eval_n", "eval_seed")
                        if getattr(saved, f) != getattr(mine, f))
        if differ or self.eval_split != "test":
            raise refusal(f"was made with other settings ({', '.join(differ) or 'eval_split'}), so its runs are not "
                          f"this study's", path, "set reuse_from=None to train every arm here, or match its settings")

    def reused_folder(self, label: str) -> str | None:
        """The folder run ``label`` (or the base model's study evaluation, "base") comes from when it is reused:
        ``reuse_from`` for the committed study's arms, else None (made here)."""
        if self.reuse_from is None:
            return None
        if label == "base":
            return self.reuse_from
        method, _ = self.run_labels()[label]
        return self.reuse_from if self.arm_of(method) in REUSED_ARMS else None

    def training_fields(self) -> dict:
        """The fields a run's training depends on (what a reused run must agree on)."""
        shared = [f.name for f in fields(ShortAnswerStudyConfig)
                  if f.name not in ("run_dir", "save_steps", "seeds", "eval_per_kind", "eval_n", "eval_seed")]
        return {f: getattr(self, f) for f in shared}


#: the confirmatory study's sizes: "confirm" (the record its plan describes) and "smoke" (a tiny model, the tests')
CONFIRM_PRESETS = {
    "confirm": {},
    "smoke": dict(CURE_PRESETS["smoke"], arms=("grpo", "key_gated", "fgrpo", "obe_batch"), seeds=(100, 101),
                  peer_seeds=(100,), hard_arms=("grpo", "key_gated", "fgrpo", "obe_batch"),
                  heldout_candidates=("odd", "above"), heldout_select_per_kind=1, heldout_per_kind=1,
                  heldout_min_right=0.0, heldout_max_right=1.0, heldout_min_distinct=0.0, plan=None),
}


@dataclass(frozen=True)
class ConfirmStudyConfig(CureStudyConfig):
    """The confirmatory test of the cure (results/short_answers/confirm/PLAN.md): the cure study's settings with
    fresh seeds, the gated answer key against GRPO on ``seeds``, the peers (``PEER_ARMS``) on ``peer_seeds``, the
    pass@k set, and many-answer kinds no training pool holds, kept by measuring the base model on their train split.

    peer_seeds: the seeds of the arms in ``PEER_ARMS`` (a subset of ``seeds``). lam_obe: outcome-based exploration's
    c (absolute units, its paper's). heldout_candidates: the kinds measured; heldout_select_per_kind: train prompts
    per kind measured (``eval_n`` samples each); a kind is kept when its share of right samples lies in
    [heldout_min_right, heldout_max_right] and its mean distinct right answers per prompt is at least
    heldout_min_distinct; heldout_per_kind: test prompts per kept kind every model is evaluated on. plan: the
    plan's file, whose SHA-256 the record pins at its first run (None: no plan, the smoke preset).
    """

    run_dir: str = "runs/short_answers_confirm"
    seeds: tuple[int, ...] = tuple(range(100, 112))
    arms: tuple[str, ...] = ("grpo", "key_gated", "fgrpo", "obe_batch")
    peer_seeds: tuple[int, ...] = (100, 101, 102, 103, 104)
    lam_obe: float = 0.2
    hard_arms: tuple[str, ...] = ("grpo", "key_gated", "fgrpo", "obe_batch")
    reuse_from: str | None = None
    heldout_candidates: tuple[str, ...] = ("odd", "ends_in", "above")
    heldout_select_per_kind: int = 16
    heldout_per_kind: int = 6
    heldout_min_right: float = 0.10
    heldout_max_right: float = 0.90
    heldout_min_distinct: float = 2.0
    plan: str | None = "results/short_answers/confirm/PLAN.md"

    #: the arms trained on ``peer_seeds`` only
    PEER_ARMS: ClassVar[tuple[str, ...]] = ("fgrpo", "obe_batch")

    def __post_init__(self):
        super().__post_init__()
        check_fields(self, positive=("lam_obe",), seeds=("peer_seeds",), share=("heldout_min_right", "heldout_max_right"),
                     count=("heldout_select_per_kind", "heldout_per_kind"), nonnegative=("heldout_min_distinct",))
        if not set(self.peer_seeds) <= set(self.seeds):
            raise ValueError(f"peer_seeds must be some of seeds {self.seeds}, got {self.peer_seeds}")
        if self.heldout_candidates:
            _check_kinds(self.heldout_candidates)
        trained = set(self.kinds)
        if trained & set(self.heldout_candidates):
            raise ValueError(f"held-out kinds must be kinds no training pool holds, got {self.heldout_candidates}")

    PRESETS: ClassVar[dict] = CONFIRM_PRESETS
    COMMAND: ClassVar[str] = f"{PROG}_confirm"
    RESULTS: ClassVar[tuple[str, ...]] = ("train", "eval", "eval_hard", "eval_heldout", "heldout_selection",
                                          "heldout_kinds.json", "plan.json", "results.json")

    def run_labels(self) -> dict[str, tuple[str, int]]:
        """The cure study's labels, the peers' only on ``peer_seeds``."""
        return {label: (method, seed) for label, (method, seed) in super().run_labels().items()
                if self.arm_of(method) not in self.PEER_ARMS or seed in self.peer_seeds}

    def heldout_tasks(self) -> list[TaskSpec]:
        """The held-out prompts: ``heldout_per_kind`` test prompts of each kind the base model's measurement kept
        (``heldout_kinds.json``; none before it is made)."""
        path = Path(self.run_dir) / "heldout_kinds.json"
        kept = read_json(path, "delete it and rerun to measure the candidates again")["kept"] if path.exists() else []
        return sample_tasks(kept, "test", self.heldout_per_kind, seed=0) if kept else []

    def extra_evaluations(self) -> list[tuple[str, list[TaskSpec], int, set[str]]]:
        heldout = self.heldout_tasks()
        labels = set(self.run_labels()) | {"base"}
        return super().extra_evaluations() + ([("eval_heldout", heldout, self.eval_n, labels)] if heldout else [])

    def check_reusable(self) -> None:
        """Nothing is reused: every run is made here, on fresh seeds."""
        if self.reuse_from is not None:
            raise ValueError("the confirmatory study trains every run on fresh seeds: reuse_from must be None")
#: the arms the committed study trained, reused from it (``reuse_from``)
REUSED_ARMS = ("grpo", "setpo")
