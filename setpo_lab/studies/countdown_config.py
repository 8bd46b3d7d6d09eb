"""The Countdown study's configuration: every setting in one dataclass, and the RL runs it implies.

Design (ours; the paper's study is Qwen2.5-3B on the public data, see ``setpo_lab.studies.countdown``):

- The *grid* is the paper's Table 3: G ∈ {3, 7} × KL β ∈ {0.001, 0.005}, each run evaluated at T ∈ {0.5, 1.0}.
  The *main cell* is G = 7, β = 0.001; every method runs there over ``rl_seeds`` (paired: same warm start, same
  seed, so differences are paired), and GRPO and the chosen SetPO+GRPO (the headline) also over
  ``headline_seeds`` (none by default; a list that may grow on an existing folder, ``GROWABLE_FIELDS``, when the
  record's ``noise`` says the headline needs more seeds). The other cells (``other_cells``) run GRPO and the chosen SetPO+GRPO over
  the first ``grid_seeds`` seeds.
- Methods in the main cell: GRPO; SetPO+GRPO chosen on the validation split; SetPO+GRPO as the paper has it
  (``paper_embedder``, λ = ``paper_lambda`` = 0.5, absolute); and the baselines, each at its own
  validation-chosen setting: the local pairwise penalty (``setpo.diversity``'s second registered term, λ from
  ``pairwise_lambdas``), DRA-GRPO's reward rescaling (``setpo.diversity.dra_rewards``, embedder from
  ``dra_embedders``), Pass@k Training's group advantage (``setpo.advantages.pass_at_k``, k from ``passk_ks``);
  and the perfect-kernel ceiling: SetPO+GRPO with the verifier's kernel (k = 1 for the same solution, else 0;
  λ from ``ceiling_lambdas``), a diagnostic, never a candidate for "chosen".
- The validation search runs in the main cell over ``search_seeds`` seeds of its own (``SEARCH_SEED_BASE``,
  1000, 1001, ...: never among the seeds of the runs the test split evaluates, so a search model is needed
  only for its validation evaluation, made as soon as it is trained, and the seeds that choose are not the
  seeds that report) and scores each candidate by its mean over them on the validation split at T = 1: SetPO candidates are ``search_embedders`` ×
  ``search_lambdas`` with λ in units of the term's batch spread (``setpo_lambda_units="term_std"``, our
  opt-in), plus the paper-faithful run. The one chosen has the highest mean validation pass@``eval_samples``
  among those whose mean pass@1 is at most ``max_pass1_loss`` below GRPO's (none qualifying: the highest
  pass@k, flagged); the seed-to-seed spread is recorded beside it. The test split evaluates a model only after
  every search is settled. The λ grid is (0.05, 0.15)σ for SetPO, the pairwise penalty and the ceiling: at
  0.5σ the runs collapse (validation pass@1 far below GRPO's) and SetPO at 0.15σ is already near the 2-point
  pass@1 floor, so a larger λ leaves the search only the paper-faithful run to pick
  (docs/reproducibility/countdown-history.md, "The first search").
- A run is made by its settings, its thread count (``threads``) and the code (``setpo_lab.repro.provenance``): all are
  part of its identity. The replication (``replication_threads``, 0 for none) runs the whole study again,
  search included, at another thread count, in ``<out>/replication``: another floating-point summation order
  acts like another seed. Its grid has ``replication_grid_seeds`` seeds a cell (default 1): a compute budget
  cuts grid seeds first, and the main study keeps ``grid_seeds`` = 3.
"""

from __future__ import annotations

import json
import math
import typing
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from setpo.embed import check_embedder_spec
from setpo.presets import PRESETS
from setpo.records import read_json, write_json
from setpo_lab.studies import stages
from setpo_lab.studies.arguments import check_fields
from setpo_lab.studies.judging import JUDGE_FIELDS, JudgeSettings, check_judge_fields, judge_configured, without_judge
from setpo.trl.tiny_models import ModelSize

STEPS_PER_GENERATION = 2  # optimizer steps per generated batch (TRL's steps_per_generation)
SEARCH_SEED_BASE = 1000   # the validation search's seeds: 1000, 1001, ... (apart from every seed the test reports)
BASELINE_EMBEDDER = "hash"  # λ = 0 runs embed only to log diversity curves; hashing is cheap and weight-free
CEILING_EMBEDDER = "verifier"  # the verifier's kernel: 1 for the same solution (canonical form), else 0


def _short(embedder: str) -> str:
    return {"default": "minilm", "centered:default": "minilm-centred"}.get(embedder, embedder.replace(":", ""))


@dataclass(frozen=True)
class RLRun:
    """One RL run from the warm start. lam = 0 with the defaults is the plain baseline of ``preset``."""

    preset: str = "grpo"           # a key of setpo.presets.PRESETS: clip range, ratio level, aggregation
    group_size: int = 7
    beta: float = 0.001
    lam: float = 0.0
    seed: int = 0
    embedder: str = BASELINE_EMBEDDER
    term: str = "setpo"            # "setpo" (the paper's marginal) or "pairwise" (the local baseline)
    units: str = "absolute"        # "absolute" (the paper) or "term_std" (λ in units of the term's spread)
    adjust: str = "none"           # "dra": DRA-GRPO's reward rescaling (SetPOConfig.setpo_reward_adjustment)
    estimator: str = "trl"         # "trl" (TRL's GRPO normalisation) or "pass@K" (Pass@k Training)

    @property
    def method(self) -> str:
        base = self.preset.upper()
        if self.adjust == "dra":
            return f"DRA-{base}"
        if self.estimator != "trl":
            return "Pass@k training"
        if not self.lam:
            return base
        return f"{'SetPO' if self.term == 'setpo' else 'Pairwise'}+{base}"

    @property
    def is_ceiling(self) -> bool:
        """The perfect-kernel diagnostic (the verifier's kernel), not a method one could deploy."""
        return self.embedder == CEILING_EMBEDDER and bool(self.lam)

    @property
    def variant(self) -> str:
        """The method with its settings, without the seed: runs of one variant differ only by seed."""
        if self.adjust == "dra":
            return f"{self.method} ({_short(self.embedder)})"
        if self.estimator != "trl":
            return f"{self.method} (k={self.estimator.partition('@')[2]})"
        if not self.lam:
            return self.method
        return f"{self.method} (λ={self.lam:g}{'σ' if self.units == 'term_std' else ''}, {_short(self.embedder)})"

    @property
    def name(self) -> str:
        base = f"{self.preset}_G{self.group_size}_b{self.beta:g}_s{self.seed}"
        if self.adjust == "dra":
            return f"{base}_dra_{_short(self.embedder)}"
        if self.estimator != "trl":
            return f"{base}_{self.estimator.replace('@', '')}"
        if not self.lam:
            return base
        return f"{base}_{self.term}{self.lam:g}{'sd' if self.units == 'term_std' else ''}_{_short(self.embedder)}"

    @property
    def needs_embeddings(self) -> bool:
        return bool(self.lam) or self.adjust != "none"

    def trainer_settings(self) -> dict:
        """This run under ``setpo.trl.config_for(self.preset, ...)``'s names: the one place the study's names (its
        record's: results.json rows are read back as ``RLRun(**row["run"])``) meet the TRL plug-in's (prefixed
        ``setpo_`` among GRPOConfig's own fields). The seed goes to TRL with the study's common arguments."""
        return {"num_generations": self.group_size, "beta": self.beta, "setpo_lambda": self.lam,
                "embedder": self.embedder, "setpo_diversity": self.term, "setpo_lambda_units": self.units,
                "setpo_reward_adjustment": self.adjust, "setpo_estimator": self.estimator}

    def with_seed(self, seed: int) -> "RLRun":
        return replace(self, seed=seed)

    def in_cell(self, group_size: int, beta: float, seed: int | None = None) -> "RLRun":
        return replace(self, group_size=group_size, beta=beta, seed=self.seed if seed is None else seed)


@dataclass
class CountdownLMConfig(JudgeSettings):  # + the optional judge's fields (judging.JudgeSettings)
    """Every setting of the Countdown study, recorded in ``<out>/config.json``.

    Data: ``n_train`` / ``n_val`` / ``n_test`` problems (disjoint), ``num_numbers`` numbers per problem in
    ``number_range``, targets in ``target_range``, drawn with ``seed``. Model: ``model``. SFT: ``sft_*``.
    RL: ``rl_*``, the cells and methods above. Evaluation: ``eval_samples`` per problem, top-p ``eval_top_p``;
    every run at T = 1, and the warm start, GRPO and the chosen SetPO+GRPO (every cell, every seed) also at the
    other ``eval_temperatures`` (``temperatures``).
    Probes: ``probe_samples`` samples on ``n_probe`` validation problems every ``probe_every`` RL steps.
    Judge (optional, stage "judge"): ``judge_url`` + ``judge_model`` (a server) or ``judge_path`` (a local model),
    ``judge_limit``, ``judge_samples``; see ``setpo_lab.studies.judging``. None: no judge.
    """

    out: str = "results/countdown"  # kept in git (results/.gitignore leaves the models out): a new checkout resumes
    seed: int = 0
    threads: int = 2
    replication_threads: int = 1   # the replication's thread count; 0: no replication
    replication_grid_seeds: int = 1  # the replication's grid_seeds (the budget's cut: grid seeds go first)
    # data
    n_train: int = 3000
    n_val: int = 200
    n_test: int = 400
    num_numbers: tuple[int, ...] = (3, 4)
    number_range: tuple[int, int] = (1, 20)
    target_range: tuple[int, int] = (1, 50)
    # model
    model: ModelSize = field(default_factory=ModelSize)
    # supervised warm start
    sft_solutions_per_problem: int = 4
    sft_epochs: float = 3.0
    sft_lr: float = 2e-3
    sft_batch_size: int = 64
    # RL
    rl_steps: int = 100
    rl_prompts_per_step: int = 16
    rl_lr: float = 1e-4
    rl_temperature: float = 1.0
    rl_max_completion_length: int = 24
    rl_save_steps: int = 20        # a multiple of STEPS_PER_GENERATION (checkpoints at generation boundaries)
    main_group_size: int = 7
    main_beta: float = 0.001
    rl_seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    headline_seeds: tuple[int, ...] = ()  # more seeds for the headline pair only (GRPO, chosen SetPO; main cell)
    other_cells: tuple[tuple[int, float], ...] = ((3, 0.001), (3, 0.005), (7, 0.005))
    grid_seeds: int = 3            # the first grid_seeds of rl_seeds run in the other cells
    paper_embedder: str = "default"
    paper_lambda: float = PRESETS["countdown"].lam
    # validation search (main cell, search_seeds seeds of its own from SEARCH_SEED_BASE, validation split, T = 1)
    search_seeds: int = 2
    search_embedders: tuple[str, ...] = ("default", "centered:default", "hash")
    search_lambdas: tuple[float, ...] = (0.05, 0.15)  # in σ units; why no larger: the module docstring
    pairwise_lambdas: tuple[float, ...] = (0.05, 0.15)
    dra_embedders: tuple[str, ...] = ("default", "centered:default", "hash")
    passk_ks: tuple[int, ...] = (2, 4)
    ceiling_lambdas: tuple[float, ...] = (0.05, 0.15)
    max_pass1_loss: float = 0.02
    extra_presets: tuple[str, ...] = ()
    # evaluation
    eval_samples: int = 64
    eval_temperatures: tuple[float, ...] = (0.5, 1.0)
    eval_top_p: float = 0.9
    eval_batch_sequences: int = 1024
    n_probe: int = 3
    probe_samples: int = 16
    probe_every: int = 10

    def __post_init__(self):
        if isinstance(self.model, dict):
            unknown = set(self.model) - {f.name for f in fields(ModelSize)}
            if unknown:
                raise ValueError(f"model: unknown fields {sorted(unknown)}; known: {[f.name for f in fields(ModelSize)]}")
            self.model = ModelSize(**self.model)
        for name in ("num_numbers", "number_range", "target_range", "rl_seeds", "headline_seeds", "search_embedders",
                     "search_lambdas",
                     "pairwise_lambdas", "dra_embedders", "passk_ks", "ceiling_lambdas", "extra_presets",
                     "eval_temperatures"):
            value = getattr(self, name)
            if not isinstance(value, (list, tuple)):
                raise ValueError(f"{name} must be a list, got {value!r}")
            setattr(self, name, tuple(value))
        if not isinstance(self.other_cells, (list, tuple)) or any(
                not isinstance(c, (list, tuple)) or len(c) != 2 for c in self.other_cells):
            raise ValueError(f"other_cells must be a list of [G, beta] pairs, got {self.other_cells!r}")
        self.other_cells = tuple((c[0], float(c[1]) if isinstance(c[1], int) and not isinstance(c[1], bool)
                                  else c[1]) for c in self.other_cells)
        _check_types(self)
        _check_types(self.model, "model.")
        check_fields(self, count=("threads", "n_train", "n_val", "n_test", "sft_solutions_per_problem",
                                  "sft_batch_size", "rl_steps", "rl_prompts_per_step", "rl_max_completion_length",
                                  "rl_save_steps", "eval_samples", "eval_batch_sequences", "n_probe", "probe_samples",
                                  "probe_every"),
                     positive=("sft_epochs", "sft_lr", "rl_lr", "rl_temperature", "paper_lambda"),
                     positives=("search_lambdas", "pairwise_lambdas", "ceiling_lambdas", "eval_temperatures"),
                     seeds=("rl_seeds",))
        if len(set(self.headline_seeds)) != len(self.headline_seeds) or set(self.headline_seeds) & set(self.rl_seeds):
            raise ValueError(f"headline_seeds must be distinct and not among rl_seeds {self.rl_seeds}, got "
                             f"{self.headline_seeds}")
        for name in ("grid_seeds", "replication_grid_seeds"):
            if not 1 <= getattr(self, name) <= len(self.rl_seeds):
                raise ValueError(f"{name} must be in [1, len(rl_seeds) = {len(self.rl_seeds)}], got {getattr(self, name)}")
        if not 1 <= self.search_seeds <= 100:
            raise ValueError(f"search_seeds must be in [1, 100] (the search's own seeds, from {SEARCH_SEED_BASE}), got "
                             f"{self.search_seeds}")
        reported = set(self.rl_seeds) | set(self.headline_seeds)
        if reported & set(self.search_seed_list):
            raise ValueError(f"rl_seeds and headline_seeds must not use the validation search's seeds "
                             f"{self.search_seed_list} (the seeds that choose are not the seeds that report), got "
                             f"{sorted(reported & set(self.search_seed_list))}")
        if self.replication_threads < 0 or self.replication_threads == self.threads:
            raise ValueError(f"replication_threads must be 0 (no replication) or a thread count other than threads "
                             f"= {self.threads} (the replication is the study at another floating-point path), got "
                             f"{self.replication_threads}")
        if not self.dra_embedders or not self.search_embedders:
            raise ValueError("dra_embedders and search_embedders must name embedders")
        named = [("paper_embedder", self.paper_embedder), *(("search_embedders", e) for e in self.search_embedders),
                 *(("dra_embedders", e) for e in self.dra_embedders)]
        for where, spec in named:  # before the folder is claimed, not when a run loads it
            if spec != CEILING_EMBEDDER:  # "centered:<spec>": <spec> minus its mean (countdown_data.resolve_embedder)
                check_embedder_spec(spec.removeprefix("centered:") if isinstance(spec, str) else spec, where)
        if not 0 <= self.max_pass1_loss <= 1:
            raise ValueError(f"max_pass1_loss must be in [0, 1], got {self.max_pass1_loss}")
        if not 0 < self.eval_top_p <= 1:
            raise ValueError(f"eval_top_p must be in (0, 1], got {self.eval_top_p}")
        if 1.0 not in self.eval_temperatures:
            raise ValueError(f"eval_temperatures must hold 1.0 (the record compares the methods at T = 1), got "
                             f"{self.eval_temperatures}")
        betas = (self.main_beta, *(b for _, b in self.other_cells))
        if any(not math.isfinite(b) or b < 0 for b in betas):
            raise ValueError(f"KL betas must be finite numbers >= 0, got {betas}")
        for name in ("number_range", "target_range"):
            lo, hi = getattr(self, name)
            if not 1 <= lo <= hi:
                raise ValueError(f"{name} must be (low, high) with 1 <= low <= high, got {getattr(self, name)}")
        if self.rl_save_steps % STEPS_PER_GENERATION:
            raise ValueError(f"rl_save_steps must be a multiple of {STEPS_PER_GENERATION} (the optimizer steps that "
                             f"share one generated batch: a checkpoint between them cannot be resumed exactly), "
                             f"got {self.rl_save_steps}")
        for g in (self.main_group_size, *(g for g, _ in self.other_cells)):
            if g < 3:
                raise ValueError(f"SetPO needs group sizes >= 3, got {g}")
            if self.rl_prompts_per_step * g % STEPS_PER_GENERATION:
                raise ValueError(f"rl_prompts_per_step * G must be a multiple of {STEPS_PER_GENERATION} (one batch "
                                 f"feeds {STEPS_PER_GENERATION} optimizer steps), got {self.rl_prompts_per_step} * {g}")
        if not self.passk_ks or any(not 1 <= k <= self.main_group_size for k in self.passk_ks):
            raise ValueError(f"passk_ks must be non-empty, each k in [1, main_group_size = {self.main_group_size}] "
                             f"(Pass@k training runs in the main cell), got {self.passk_ks}")
        for p in self.extra_presets:
            if p not in PRESETS:
                raise ValueError(f"unknown preset {p!r} in extra_presets; known: {sorted(PRESETS)}")
        if self.n_val < self.n_probe:
            raise ValueError("need n_val >= n_probe")
        check_judge_fields(self, self.eval_samples)
        if judge_configured(self) and 1.0 not in self.eval_temperatures:
            raise ValueError(f"the judge judges the responses sampled at T = 1; keep 1.0 in eval_temperatures, got "
                             f"{self.eval_temperatures}")

    @classmethod
    def smoke(cls, out: str = "runs/countdown_smoke", **kw) -> "CountdownLMConfig":
        """Toy size: the whole pipeline in well under a minute (tests, notebook SMOKE mode)."""
        base = dict(out=out, n_train=48, n_val=4, n_test=4, model=ModelSize(32, 1, 2, 1, 64, 48),
                    sft_epochs=1.0, sft_batch_size=32, rl_steps=2, rl_prompts_per_step=2, rl_save_steps=2,
                    main_group_size=3, rl_seeds=(0, 1), other_cells=((4, 0.005),), grid_seeds=1, search_seeds=1,
                    paper_embedder="hash", search_embedders=("hash",), search_lambdas=(1.0,), pairwise_lambdas=(1.0,),
                    dra_embedders=("hash",), passk_ks=(2,), ceiling_lambdas=(1.0,), replication_threads=0,
                    eval_samples=8, eval_temperatures=(0.5, 1.0), n_probe=1, probe_samples=4, probe_every=1)
        return cls(**{**base, **kw})

    # ---- the runs the study makes -------------------------------------------------------------------------

    def main_cell(self, **kw) -> RLRun:
        """A run in the main cell with the first seed; keywords set lam, embedder, term, units, preset, ..."""
        return RLRun(**{"group_size": self.main_group_size, "beta": self.main_beta, "seed": self.rl_seeds[0], **kw})

    @property
    def search_seed_list(self) -> tuple[int, ...]:
        return tuple(SEARCH_SEED_BASE + i for i in range(self.search_seeds))

    def paper_run(self) -> RLRun:
        return self.main_cell(lam=self.paper_lambda, embedder=self.paper_embedder)

    def search_runs(self) -> list[RLRun]:
        """The SetPO candidates of the validation search (the paper-faithful run among them), first seed."""
        runs = [self.paper_run()]
        runs += [self.main_cell(lam=lam, embedder=e, units="term_std")
                 for e in self.search_embedders for lam in self.search_lambdas]
        return runs

    def pairwise_runs(self, embedder: str) -> list[RLRun]:
        """The pairwise-penalty candidates, with the embedder the SetPO search chose."""
        return [self.main_cell(lam=lam, embedder=embedder, term="pairwise", units="term_std")
                for lam in self.pairwise_lambdas]

    def dra_runs(self) -> list[RLRun]:
        """DRA-GRPO's candidates: its reward rescaling with each of ``dra_embedders`` (its only setting)."""
        return [self.main_cell(adjust="dra", embedder=e) for e in self.dra_embedders]

    def passk_runs(self) -> list[RLRun]:
        """Pass@k Training's candidates: its group advantage for each k of ``passk_ks``."""
        return [self.main_cell(estimator=f"pass@{k}") for k in self.passk_ks]

    def ceiling_runs(self) -> list[RLRun]:
        """The perfect-kernel ceiling's candidates: SetPO+GRPO with the verifier's kernel, each of ``ceiling_lambdas``."""
        return [self.main_cell(lam=lam, embedder=CEILING_EMBEDDER, units="term_std") for lam in self.ceiling_lambdas]

    def searches(self, setpo_embedder: str | None = None) -> dict[str, list[RLRun]]:
        """Every validation search, by the method it settles: "setpo", and (given the embedder the SetPO search
        chose) "pairwise", "dra", "passk", "ceiling"."""
        out = {"setpo": self.search_runs()}
        if setpo_embedder is not None:
            out.update(pairwise=self.pairwise_runs(setpo_embedder), dra=self.dra_runs(), passk=self.passk_runs(),
                       ceiling=self.ceiling_runs())
        return out

    def final_runs(self, chosen: dict[str, RLRun]) -> list[RLRun]:
        """Every run the test split evaluates. chosen: the validation-chosen run of each search ("setpo",
        "pairwise", "dra", "passk", "ceiling"; any may be missing). The main cell's methods over every seed (and
        GRPO and the chosen SetPO over ``headline_seeds`` too), then the other cells (GRPO and the chosen SetPO, the first ``grid_seeds`` seeds), then the extra presets (first
        seed)."""
        variants = [self.main_cell(), chosen["setpo"], self.paper_run(),
                    *(chosen[k] for k in ("pairwise", "dra", "passk", "ceiling") if k in chosen)]
        runs = [v.with_seed(s) for s in self.rl_seeds for v in dict.fromkeys(variants)]
        runs += [v.with_seed(s) for s in self.headline_seeds for v in (self.main_cell(), chosen["setpo"])]
        for g, beta in self.other_cells:
            for s in self.rl_seeds[:self.grid_seeds]:
                runs += [self.main_cell().in_cell(g, beta, s), chosen["setpo"].in_cell(g, beta, s)]
        for preset in self.extra_presets:
            runs += [self.main_cell(preset=preset), replace(chosen["setpo"], preset=preset)]
        return list(dict.fromkeys(runs))

    def temperatures(self, run: RLRun | None, chosen: RLRun) -> tuple[float, ...]:
        """The temperatures a run is evaluated at: every one of ``eval_temperatures`` for the warm start (None),
        GRPO and the chosen SetPO (``chosen``; the grid's two methods) in any cell; T = 1 only for the main
        cell's other methods."""
        grid_method = run is None or run.variant == "GRPO" or run.in_cell(chosen.group_size, chosen.beta,
                                                                          chosen.seed) == chosen
        return self.eval_temperatures if grid_method else (1.0,)


def _check_types(obj, prefix: str = "") -> None:
    """A ValueError naming the first field of a config dataclass whose value has the wrong type (``--set
    rl_steps=abc`` fails here, before any work, not when the RL stage reads it)."""
    hints = typing.get_type_hints(type(obj))

    def ok(value, hint) -> bool:
        if hint is int:
            return isinstance(value, int) and not isinstance(value, bool)
        if hint is float:
            return isinstance(value, (int, float)) and not isinstance(value, bool)
        if hint is str:
            return isinstance(value, str)
        if typing.get_origin(hint) is tuple:
            args = typing.get_args(hint)
            if len(args) == 2 and args[1] is Ellipsis:
                return all(ok(v, args[0]) for v in value)
            return len(value) == len(args) and all(ok(v, a) for v, a in zip(value, args))
        return isinstance(value, hint) if isinstance(hint, type) else True

    for f in fields(obj):
        value, hint = getattr(obj, f.name), hints[f.name]
        if not ok(value, hint):
            raise ValueError(f"{prefix}{f.name} must be {getattr(hint, '__name__', hint)}, got {value!r}")


# Fields that may differ from the config a study folder was made with (``setpo_lab.studies.stages.claim_folder``
# says what every study's REUSE_NEUTRAL_FIELDS means): where the folder is seen from, how often checkpoints are
# written, and the judge (it judges what the evaluation sampled; not in config.json at all). Everything else
# must match to reuse a folder; the thread count too, since it changes the floating-point path (and with it
# the weights).
REUSE_NEUTRAL_FIELDS = ("out", "rl_save_steps", *JUDGE_FIELDS)


def load_config(out: str | Path) -> CountdownLMConfig:
    """The config a study was run with (``<out>/config.json``)."""
    path = Path(out) / "config.json"
    saved = read_json(path, f"restore it or delete {Path(out)} to start over")
    if saved.get("rl_save_steps", 0) % STEPS_PER_GENERATION:  # a folder from before the rule; result-neutral
        saved["rl_save_steps"] += STEPS_PER_GENERATION - saved["rl_save_steps"] % STEPS_PER_GENERATION
    return CountdownLMConfig(**saved)


# Fields a finished or running study may extend: a longer list whose start is the old one adds runs and changes
# none that exist (each run depends on its own settings and seed only), so the noise measured at 5 seeds can
# decide how many more the headline needs without starting over.
GROWABLE_FIELDS = ("headline_seeds",)


def claim_folder(cfg: CountdownLMConfig) -> None:
    """Write ``<out>/config.json`` for a new study, or check that the folder's study has the same config
    (``setpo_lab.studies.stages.claim_folder``): a folder made with another config is refused, naming the differing
    fields, and so is a folder holding results but no config.json (nothing says which config made them). A
    ``GROWABLE_FIELDS`` list that only grew is accepted and recorded."""
    path = Path(cfg.out) / "config.json"
    config = without_judge(asdict(cfg))
    grown = []
    if path.exists():
        saved = read_json(path, f"restore it or delete {Path(cfg.out)} to start over")
        grown = [name for name in GROWABLE_FIELDS if list(saved.get(name, [])) != list(config[name])
                 and list(config[name])[:len(saved.get(name, []))] == list(saved.get(name, []))]
    stages.claim_folder(cfg.out, config, (*REUSE_NEUTRAL_FIELDS, *grown),
                        results=("sft", "rl", "eval", "results.json"),
                        remedy="use another --out, or delete that folder and rerun")
    if grown:
        write_json(path, json.loads(json.dumps(config)))
