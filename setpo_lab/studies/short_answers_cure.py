"""The short-answer study, extended: does SetPO keep more right answers than GRPO once its term is kept where the
reward reads? (docs/studies/short_answers.md)

The committed study found SetPO+GRPO's diversity paid in text after the answer line. This study trains, from the
same base model, tasks and budget, the arms of ``setpo_lab.studies.short_answers_config.ARMS``: SetPO with the answer
embedded by MiniLM, SetPO with the answer-key kernel, the answer-key kernel gated to right answers
(``setpo.reads``), and Pass@k Training (a peer known to keep pass@k); the committed study's GRPO and
whole-completion SetPO runs are reused from its folder when their training settings agree. Each arm's λ comes from
the pilot (``--preset pilot``: the validation split, never test).

Stages (resumable; a finished piece is never redone): ``train`` every (arm, seed) run; ``evaluate`` every model
on the study's test prompts (``eval/``) and the base model and ``hard_arms`` on the harder pass@k prompts
(``eval_hard/``); ``report`` (``short_answers_cure_results``). ``--rerun LABEL`` trains one recorded run
again in a scratch folder and says whether it came back bit for bit (exit status 1 if not).

    python -m setpo_lab.studies.short_answers_cure --preset pilot --out results/short_answers/pilot
    python -m setpo_lab.studies.short_answers_cure --preset cure --out results/short_answers/cure
    python -m setpo_lab.studies.short_answers_cure --preset cure --out results/short_answers/cure --rerun key_gated_s0
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import asdict, fields
from pathlib import Path

from setpo.envs.short_answers import TaskSpec, sample_tasks
from setpo.records import read_json
from setpo_lab.studies.short_answers import base_model_folder, evaluate_model, rerun_status, run_folder, train_run
from setpo_lab.studies.short_answers_config import (CURE_PRESETS, CURE_PROG, REUSE_NEUTRAL_FIELDS, CureStudyConfig,
                                                ShortAnswerStudyConfig)
from setpo_lab.studies.stages import StudyResult, chosen_stages, claim_folder, print_flushed, refusal, stage_done

STAGES = ("train", "evaluate", "report")


def hard_tasks(cfg: CureStudyConfig) -> list[TaskSpec]:
    """The pass@k prompts: ``hard_per_kind`` test prompts of each of ``hard_kinds``."""
    return sample_tasks(cfg.hard_kinds, "test", cfg.hard_per_kind, seed=0) if cfg.hard_kinds else []


def hard_labels(cfg: CureStudyConfig) -> list[str]:
    """The runs evaluated on the pass@k prompts (the base model's "base" besides)."""
    return [label for label, (method, _) in cfg.run_labels().items() if cfg.arm_of(method) in cfg.hard_arms]


def check_reusable(cfg: CureStudyConfig) -> None:
    """Refuse to reuse ``reuse_from``'s runs unless that study trained with this study's settings and seeds and
    evaluated on the same test prompts and samples."""
    path = Path(cfg.reuse_from) / "config.json"
    saved = ShortAnswerStudyConfig.from_record(read_json(path, "give reuse_from a finished short-answer study"))
    mine = ShortAnswerStudyConfig(**{f.name: getattr(cfg, f.name) for f in fields(ShortAnswerStudyConfig)})
    differ = sorted(f for f in (*cfg.training_fields(), "seeds", "eval_per_kind", "eval_n", "eval_seed")
                    if getattr(saved, f) != getattr(mine, f))
    if differ or cfg.eval_split != "test":
        raise refusal(f"was made with other settings ({', '.join(differ) or 'eval_split'}), so its runs are not "
                      f"this study's", path, "set reuse_from=None to train every arm here, or match its settings")


def run_cure(cfg: CureStudyConfig, stages: Sequence[str] | str | None = None, *,
             log=print_flushed) -> StudyResult:
    """The stages in order (None: all); returns each run's final folder by label and the report's summary."""
    from setpo.embed import load_embedder

    t0 = time.time()
    chosen = chosen_stages(stages, STAGES)
    claim_folder(cfg.run_dir, asdict(cfg), REUSE_NEUTRAL_FIELDS, record="config.json",
                 results=("train", "eval", "eval_hard", "results.json"),
                 remedy="use another --out, or delete that folder and rerun")
    if cfg.reuse_from:
        check_reusable(cfg)
    embedder = load_embedder(cfg.embedder)
    labels = list(cfg.run_labels())
    hard = set(hard_labels(cfg)) if cfg.hard_kinds else set()
    finals = {label: run_folder(cfg, label) / "final" for label in labels}
    if "train" in chosen:
        def evaluated(label: str) -> bool:
            done = (Path(cfg.reused_folder(label) or cfg.run_dir) / "eval" / f"{label}.json").exists()
            return done and (label not in hard or (Path(cfg.run_dir) / "eval_hard" / f"{label}.json").exists())

        finals = {label: train_run(cfg, label, embedder=embedder, log=log,
                                   need_model="evaluate" in chosen and not evaluated(label)) for label in labels}
    if "evaluate" in chosen:
        base = base_model_folder(cfg.model_path)
        evaluate_model(cfg, "base", base, embedder, log)
        if hard:
            evaluate_model(cfg, "base", base, embedder, log, tasks=hard_tasks(cfg), n=cfg.hard_n, folder="eval_hard")
        for label, final in finals.items():
            if not stage_done(final):
                raise ValueError(f"run {label} is not trained: {final}; run the train stage first")
            evaluate_model(cfg, label, final, embedder, log)
            if label in hard:
                evaluate_model(cfg, label, final, embedder, log, tasks=hard_tasks(cfg), n=cfg.hard_n,
                               folder="eval_hard")
    summary = {}
    if "report" in chosen:
        from setpo_lab.studies.short_answers_cure_results import report

        summary = report(cfg, log=log)
    return StudyResult("short_answers_cure", Path(cfg.run_dir), finals, summary, time.time() - t0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog=CURE_PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the study's folder (its config.json claims it for one setting)")
    ap.add_argument("--preset", default="cure", help=f"{' | '.join(CURE_PRESETS)} (default: cure)")
    ap.add_argument("--model-path", default=None, help="a local model folder (default: the packaged SmolLM2)")
    ap.add_argument("--stages", default=None, help=f"comma-separated, of {', '.join(STAGES)} (default: all)")
    ap.add_argument("--rerun", default=None, metavar="LABEL",
                    help="train one recorded run (e.g. key_gated_s0) again in a scratch folder and compare it with "
                         "the record (weights and every logged step), instead of running the stages")
    args = ap.parse_args(argv)
    cfg = CureStudyConfig.preset(args.preset, run_dir=args.out, model_path=args.model_path)
    if args.rerun:
        return rerun_status(cfg, args.rerun)
    result = run_cure(cfg, args.stages)
    if result.summary:
        from setpo_lab.studies.short_answers_cure_results import results_markdown

        print(results_markdown(result.summary), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
