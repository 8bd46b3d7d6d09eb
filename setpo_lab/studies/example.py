"""The smallest complete study, written as the contributing guide's example of the engine: does SetPO keep more
distinct right answers than GRPO on a many-answer short-answer kind ("name a number between a and b")?

Its own: config, tasks and reward (``setpo.envs.short_answers``), a probe's record, a model's score, the report. The
engine's: the training stage and RL run (``engine.train_stage``, ``train_setpo``), the probes (``probe_sampler``),
sampling (``sample_evaluation``) and its cache (``stages.cached_evaluation``), the command (``arguments.StudyCommand``)
and the intervals (``intervals``).

    python -m setpo_lab run example --smoke --out runs/example   # a tiny random model: every path, in a minute
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path

from setpo.embed import check_embedder_spec
from setpo.envs.short_answers import KINDS, parse_answer, sample_tasks, task_messages, to_trl_records
from setpo.trl.rewards import short_answer_reward
from setpo_lab.studies.arguments import StudyCommand, check_fields
from setpo_lab.studies.engine import probe_sampler, sample_evaluation, train_setpo, train_stage
from setpo_lab.studies.intervals import interval_text, paired_ci
from setpo_lab.studies.stages import cached_evaluation, chosen_stages, claim_folder, print_flushed, write_report
from setpo_lab.studies.toolkit import chat_prompts, load_model, model_folder
from setpo_lab.studies.trainer_arguments import rl_trainer_args

STAGES = ("train", "evaluate", "report")
REMEDY = "give an intact model folder (a trained run's: delete the run and rerun)"


@dataclass(frozen=True)
class ExampleConfig:
    """GRPO (λ = 0) and SetPO+GRPO (λ = ``lam``) on ``seeds``, each run ``steps`` steps of ``prompts`` prompts ×
    ``group`` samples; every model scored on ``eval_prompts`` test prompts × ``eval_n`` samples."""

    run_dir: str = "runs/example"
    model_path: str | None = None  # None: a tiny random Qwen2 (setpo.trl.tiny_models), where numbers mean nothing
    kind: str = "between"
    seeds: tuple[int, ...] = (0, 1, 2)
    lam: float = 0.5
    steps: int = 20
    prompts: int = 4
    group: int = 8
    max_new_tokens: int = 8
    eval_prompts: int = 16
    eval_n: int = 16
    embedder: str = "hash"

    def __post_init__(self):
        object.__setattr__(self, "seeds", tuple(self.seeds))
        check_fields(self, count=("steps", "prompts", "max_new_tokens", "eval_prompts", "eval_n"), group=("group",),
                     seeds=("seeds",))
        if isinstance(self.lam, bool) or not isinstance(self.lam, (int, float)) or not 0 <= self.lam <= 10:
            raise ValueError(f"lam must be a number in [0, 10], got {self.lam!r}")  # NaN too: no comparison holds
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        check_embedder_spec(self.embedder)  # here, before the folder is claimed: nothing is written for a bad one

    @classmethod
    def smoke(cls, **overrides) -> ExampleConfig:
        return replace(cls(seeds=(0, 1), steps=2, prompts=2, group=3, eval_prompts=2, eval_n=2), **overrides)

    def runs(self) -> dict[str, tuple[float, int]]:
        """label -> (λ, seed), paired by seed."""
        return {f"{name}_s{seed}": (lam, seed) for seed in self.seeds for name, lam in (("grpo", 0.0), ("setpo", self.lam))}


def base_model(cfg: ExampleConfig) -> Path:
    from setpo.trl.tiny_models import make_tiny_model  # imports transformers
    return model_folder(cfg.model_path, remedy=REMEDY, otherwise=lambda: make_tiny_model(Path(cfg.run_dir) / "tiny"))


def train_run(cfg: ExampleConfig, label: str, log=print_flushed) -> Path:
    """One RL run (resumable), through the engine; the study gives its model, trainer arguments, rows and probes."""
    lam, seed = cfg.runs()[label]
    out = Path(cfg.run_dir) / "train" / label

    def fit(final: Path) -> None:
        import torch
        tokenizer, model = load_model(base_model(cfg), torch.float32, remedy=REMEDY, tiny=cfg.model_path is None)
        probes = sample_tasks([cfg.kind], "val", 2, seed=0)
        args = rl_trainer_args("grpo", out, seed=seed, save_steps=max(1, cfg.steps // 2), setpo_lambda=lam,
                               embedder=cfg.embedder, num_generations=cfg.group, temperature=1.0, beta=0.0,
                               max_completion_length=cfg.max_new_tokens, max_steps=cfg.steps, learning_rate=1e-5,
                               per_device_train_batch_size=cfg.prompts * cfg.group, gradient_checkpointing=False)
        record = lambda j, task, text: {"probe": j, "text": text, "answer": parse_answer(text),  # noqa: E731
                                        "reward": float(task.is_right(parse_answer(text)))}
        train_setpo(out, final, model=model, tokenizer=tokenizer, args=args, reward=short_answer_reward,
                    rows=to_trl_records(sample_tasks([cfg.kind], "train", 64, seed=0)), embedder=None,
                    probes=probe_sampler(tokenizer, probes, chat_prompts(tokenizer, probes, task_messages), 4, record,
                                         seed=seed, temperature=1.0, max_new_tokens=cfg.max_new_tokens,
                                         add_special_tokens=False),
                    probe_every=max(1, cfg.steps // 4), record={"label": label, "lam": lam, "seed": seed}, log=log,
                    describe=f"[{label}] λ={lam:g}, seed {seed}, {cfg.steps} steps")

    return train_stage(out, f"[{label}]", f"run {label}", fit, log)


def evaluate(cfg: ExampleConfig, label: str, model_dir: Path) -> dict:
    """The model's samples on the test prompts, scored: pass@1 and distinct right answers per prompt (cached)."""
    def score() -> dict:
        import torch
        tasks = sample_tasks([cfg.kind], "test", cfg.eval_prompts, seed=0)
        tokenizer, model = load_model(model_dir, torch.float32, remedy=REMEDY, tiny=cfg.model_path is None)
        texts = sample_evaluation(model, tokenizer, chat_prompts(tokenizer, tasks, task_messages), cfg.eval_n, seed=1,
                                  temperature=1.0, max_new_tokens=cfg.max_new_tokens, add_special_tokens=False)
        right = [[a for a in map(parse_answer, xs) if task.is_right(a)] for task, xs in zip(tasks, texts, strict=True)]
        return {"label": label, "pass_at_1": sum(map(len, right)) / (len(tasks) * cfg.eval_n),
                "distinct_right": sum(len(set(r)) for r in right) / len(tasks), "texts": texts}

    return cached_evaluation(Path(cfg.run_dir) / "eval" / f"{label}.json", score, remedy="delete it and rerun")


def report(cfg: ExampleConfig, results: dict[str, dict]) -> str:
    """SetPO+GRPO − GRPO per seed, each metric's mean with its 95% t-interval over seeds (``results.md``/``.json``)."""
    rows = {metric: paired_ci([(results[f"setpo_s{s}"], results[f"grpo_s{s}"]) for s in cfg.seeds],
                              lambda r, m=metric: r[m], differences="per_seed") for metric in ("distinct_right", "pass_at_1")}
    lines = [f"SetPO+GRPO − GRPO over {len(cfg.seeds)} seeds (kind {cfg.kind}, λ = {cfg.lam:g})", "",
             "| metric | difference [95% CI] |", "|---|---|"]
    lines += [f"| {metric} | {interval_text(d)} |" for metric, d in rows.items()]
    write_report(cfg.run_dir, {"config": {f.name: getattr(cfg, f.name) for f in fields(cfg)}, "differences": rows},
                 "\n".join(lines) + "\n")
    return "\n".join(lines)


def run_study(cfg: ExampleConfig, stages=None, *, log=print_flushed) -> dict:
    """The stages named (None: all), each finished piece reused; {"table"} when the report ran."""
    chosen = chosen_stages(stages, STAGES)
    claim_folder(cfg.run_dir, {f.name: getattr(cfg, f.name) for f in fields(cfg)}, record="config.json",
                 results=("train", "eval", "results.json"), remedy="use another --out, or delete that folder")
    finals = {label: (train_run(cfg, label, log) if "train" in chosen else Path(cfg.run_dir) / "train" / label / "final")
              for label in cfg.runs()}
    results = {label: evaluate(cfg, label, final) for label, final in finals.items()  # report alone reads the cache
               } if {"evaluate", "report"} & set(chosen) else {}
    return {"table": report(cfg, results)} if "report" in chosen and results else {}


def _run(cfg: ExampleConfig, stages, args) -> int:
    from setpo.trl import quiet_libraries  # imports TRL
    quiet_libraries()
    return print(run_study(cfg, stages).get("table", "")) or 0


COMMAND = StudyCommand("example", {"default": ExampleConfig, "smoke": ExampleConfig.smoke}, STAGES, _run,
                       default_preset="default", fields=frozenset(f.name for f in fields(ExampleConfig)) - {"run_dir"},
                       options=("model_path",), doc=__doc__)
