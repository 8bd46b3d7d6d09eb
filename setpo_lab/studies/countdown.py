"""Countdown on a laptop: a small language model trained with GRPO and SetPO+GRPO on 2 CPU cores.

The paper's Countdown study (arXiv 2602.01062: Qwen2.5-3B, GRPO vs SetPO+GRPO, G in {3, 7}, KL beta in
{0.001, 0.005}, lambda = 0.5, pass@k from 64 samples at T = 0.5 and 1.0, top-p 0.9) at a size one CPU runs
in under an hour, on the same engine that trains real models (TRL, through ``setpo.trl.SetPOTrainer``).
This module runs the study and its command; its text format, data and embedders are ``countdown_data``, its
training drivers ``countdown_training``, its settings ``countdown_config``, its report ``countdown_results``.

What is ours to decide (design choices, written down here):

- Model: a Qwen2-architecture causal LM built from a config (4 layers, hidden 128 by default, about 1M
  parameters), no pretrained weights.
- Tokenizer: expression level. Every integer up to 999 is one token (longer digit runs split into chunks of
  three), every other ASCII character is one token, and ``<answer>`` / ``</answer>`` are one token each. A
  ``tokenizers`` WordLevel model wrapped in ``PreTrainedTokenizerFast``, so TRL and ``generate`` use it
  like any other; it round-trips text exactly.
- Prompt: compact, not the TinyZero English prompt (a from-scratch model cannot read English):
  ``"3 7 25 50 = 82\\n"``. Completion: ``"<answer>(50-25)*3+7</answer>"`` then end-of-sequence. The reward is
  ``setpo.envs.countdown.score_answer`` (1.0 correct, 0.1 well-formed but wrong, 0.0 no answer), as in the paper.
- Problems: 3 or 4 numbers in [1, 20], targets in [1, 50] (``setpo.envs.countdown.generate_instances``); smaller
  than the public data's [1, 100] so that most problems have several distinct solutions (about 5 on
  average with 4 numbers) and a 1M-parameter model can learn them. Train, validation and test splits share
  no problem; settings are chosen on the validation split only, and each model is evaluated on the test
  split once, only after every validation search is settled.
- Warm start: supervised fine-tuning (TRL's ``SFTTrainer``, loss on the completion only) on solver
  solutions, up to ``sft_solutions_per_problem`` distinct (canonical) solutions per training problem, so
  the warm-start policy spreads over several modes; RL then decides whether it keeps them.
- RL: every run starts from the same warm start; runs with the same seed see the same prompts in the same
  order, so GRPO and SetPO differ by seed in pairs. ``rl_prompts_per_step`` prompts x G rollouts per generation
  batch, split into two optimizer steps (``steps_per_generation = 2``) so that the second mini-batch is
  off-policy and the clip range matters. Checkpoints come every ``rl_save_steps`` steps, an even number: only
  at generation boundaries does a resumed run generate the same rollouts as an uninterrupted one.
  The learning rate is far above the paper's 1e-6 (that is for a 3B pretrained model; a 1M-parameter
  model from scratch needs ~1e-4).
- Cells, seeds, methods and the validation search: ``setpo_lab.studies.countdown_config`` (the main cell
  G = 7, β = 0.001 over ``rl_seeds``; the paper-faithful SetPO, the one chosen on validation, and the local
  pairwise penalty next to GRPO). Embedders: all-MiniLM-L6-v2 ("default", the paper-faithful run's), the same
  centred on the warm-start completions ("centered:default"), hashed character n-grams ("hash"); the paper's
  Qwen3-Embedding-0.6B by path. ``diagnostics.json`` shows how well each separates solutions
  (``setpo.diagnostics``).
- Evaluation: unbiased pass@k (``setpo.pass_at_k``) from n = 64 samples per test problem, k = 1..64, at
  T = 0.5 and 1.0 with top-p 0.9; at T = 1.0 the "diversity width" (problems with >= 2 distinct correct
  solutions) and "average modes" (mean distinct correct solutions over solved problems), with
  ``setpo.envs.countdown.distinct_correct_solutions`` (distinct = canonical form, ``setpo.envs.countdown``).

Run everything with one command (resumable: finished stages are skipped, RL resumes from its last
checkpoint, every evaluation is cached; a run killed at any moment and started again gives the same models
and records as an uninterrupted one, and one started with a different configuration is refused):

    make countdown      # python -m setpo_lab.cli countdown --full --out results/countdown

which runs ``python -m setpo_lab run countdown --full --out results/countdown`` on the pinned floating-point
path (``setpo_lab.repro.arithmetic``; ``--full`` refuses to start without it): a study of several sittings gets
whatever machine each sitting gets, and torch's AVX2 and AVX-512 kernels give other weights.

``results/countdown`` is kept in git without its models, except the warm start's (``results/.gitignore``):
a study longer than one sitting resumes from a new checkout. Every model is evaluated as soon as it is
trained (the validation search's on their own seeds, the test split's once every search is settled), so a
new checkout needs a model again only when a run was killed between its training and its evaluations; it
trains it again and refuses it unless it matches the recorded weights (``stages.restore_model``), or with
``--redo`` makes that run and its evaluations again on this machine.

``--smoke`` runs the same pipeline at toy size in seconds (used by the tests and notebook 03).
Outputs under ``--out``: ``config.json``, ``identity.json``, ``data.json`` (the splits), ``sft/`` and
``rl/<run>/`` (models, checkpoints, ``final/done.json`` with the weights' SHA-256, ``log_history.json``,
``timings.json``, ``probes.jsonl``: samples on fixed validation problems over training),
``diagnostics.json``, ``val/<run>_T1.json`` and ``selection.json`` (the validation search),
``eval/<run>_T<temp>.json`` (the test split), ``results.json`` (every run's row and the paired differences,
``countdown_results.summarize``) and ``results.md``. With a judge (``--judge-url URL --judge-model NAME`` or
``--judge-path DIR``), stage "judge" adds the LLM-judged diversity of the main cell's methods at T = 1
(``_judge_runs``) to both, its verdicts cached in ``judge_cache.jsonl``; without one it does nothing.
"""


from __future__ import annotations

import functools
import shutil
import sys
import time
from dataclasses import fields, replace
from pathlib import Path
from typing import Callable, Sequence

import torch

from setpo.envs.countdown import make_prompt
from setpo.records import read_json, write_json
from setpo.trl.training import DONE_FILE, quiet_libraries
from setpo_lab.repro.agreement import bitwise_agreement, machines_used
from setpo_lab.repro.provenance import run_identity
from setpo_lab.studies import judging
from setpo_lab.studies.arguments import StudyCommand, run_command
from setpo_lab.studies.countdown_config import (  # noqa: F401  (load_config: the study's public API)
    CountdownLMConfig,
    RLRun,
    claim_folder,
    load_config,
)

from setpo_lab.studies.countdown_data import (
    CountdownData,
    diagnose_embedders,
    evaluate_samples,
    make_data,
    resolve_embedder,
    sft_examples,
)
from setpo_lab.studies.countdown_results import results_markdown, summarize
from setpo_lab.studies.countdown_training import evaluate_model, sample_eval, train_rl, train_sft
from setpo_lab.studies.stages import (
    RestoreMismatch,
    StudyResult,
    chosen_stages,
    claim_identity,
    print_flushed,
    refusal,
    stage_done,
    write_report,
)

# --------------------------------------------------------------------------------------------------
# The study
# --------------------------------------------------------------------------------------------------


STAGES = ("train", "evaluate", "judge")  # train: the warm start, then the RL runs
STUDY_OUTPUTS = ("sft", "rl", "val", "eval", "diagnostics.json", "selection.json", "results.json", "results.md",
                 "replication")
# The code that makes the study's runs (``setpo_lab.repro.provenance``): this module and all it imports, except the
# modules that only summarise, draw or judge finished runs (editing them changes no run, so it must not make
# a long study's runs unusable).
IDENTITY_MODULES = ("setpo_lab.studies.countdown",)
NOT_IN_IDENTITY = ("setpo_lab.studies.countdown_results", "setpo_lab.studies.figures",
                   "setpo_lab.studies.static_render", "setpo_lab.studies.judging", "setpo.judge")


def study_identity(cfg: CountdownLMConfig) -> dict:
    """The identity every output of this study is made at: its thread count, the code that makes its runs
    (each file's hash, with the commit and whether the tree was dirty) and the result-bearing package versions."""
    return run_identity(cfg.threads, IDENTITY_MODULES, NOT_IN_IDENTITY)


def _replication_config(cfg: CountdownLMConfig) -> CountdownLMConfig | None:
    """The replication: the same study at ``cfg.replication_threads`` threads in ``<out>/replication``, its grid
    over ``cfg.replication_grid_seeds`` seeds (None: none)."""
    if not cfg.replication_threads:
        return None
    return replace(cfg, out=str(Path(cfg.out) / "replication"), threads=cfg.replication_threads, replication_threads=0,
                   grid_seeds=cfg.replication_grid_seeds)


def _select_on_validation(cfg: CountdownLMConfig, grpo: dict | Sequence[dict],
                          candidates: dict[RLRun, dict | Sequence[dict]]) -> tuple[RLRun, dict]:
    """The candidate with the highest mean validation pass@n among those whose mean pass@1 is at most
    ``cfg.max_pass1_loss`` below GRPO's (ties: the smaller λ); none qualifying: the highest pass@n, flagged.

    grpo and each candidate's value: its validation evaluation, or one per search seed (means over them; the
    record keeps every seed's numbers and the spread, max - min, beside each mean)."""
    as_list = lambda v: [v] if isinstance(v, dict) else list(v)  # noqa: E731
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    grpo = as_list(grpo)
    floor = mean([g["accuracy"] for g in grpo]) - cfg.max_pass1_loss
    rows = {}
    for run, evals in candidates.items():
        evals = as_list(evals)
        passn = [e["pass_at_k"][-1] for e in evals]
        rows[run.name] = {"variant": run.variant, "pass1": mean([e["accuracy"] for e in evals]), "passn": mean(passn),
                          "average_modes": mean([e["average_modes"] for e in evals]),
                          "passn_by_seed": passn, "passn_spread": max(passn) - min(passn)}
        rows[run.name]["qualifies"] = rows[run.name]["pass1"] >= floor
    pool = [run for run in candidates if rows[run.name]["qualifies"]] or list(candidates)
    best = max(pool, key=lambda run: (rows[run.name]["passn"], -run.lam))
    return best, {"grpo": {"pass1": mean([g["accuracy"] for g in grpo]), "passn": mean([g["pass_at_k"][-1] for g in grpo]),
                           "passn_by_seed": [g["pass_at_k"][-1] for g in grpo]},
                  "candidates": rows, "chosen": best.name, "qualified": rows[best.name]["qualifies"],
                  "seeds": len(grpo),
                  "rule": f"max mean validation pass@{cfg.eval_samples} at T=1 over {len(grpo)} seed(s) with mean "
                          f"pass@1 >= GRPO's - {cfg.max_pass1_loss}"}


def run_study(cfg: CountdownLMConfig, stages: Sequence[str] | None = None, *, log=print_flushed,
              redo: bool = False) -> StudyResult:
    """The whole study, resumable: data, warm start and (stage "train") embedder diagnostics, the validation
    searches and every RL run (seeds, cells), the test split (each model once, after every search is settled)
    and the record (stage "evaluate"); then
    the same again as the replication (``_replication_config``). Runs exactly the ``stages`` named (None: all); a
    stage whose input another stage makes refuses to start until that one has finished. Every output is made at the
    study's identity (``study_identity``): one made at another is refused naming what differs, or with ``redo``
    made again. Returns (``StudyResult``) the summary (``results.json``, the replication's inside; {} without
    "evaluate") and its rows by run name."""
    t0 = time.time()
    summary = _run_one(cfg, log, stages, redo)
    replica = _replication_config(cfg)
    if replica is not None:
        log(f"[replication] the whole study again at {replica.threads} thread(s) in {replica.out}")
        replicated = _run_one(replica, log, stages, redo)
        if summary:
            summary = _write_summary(Path(cfg.out), _with_replication(summary, replicated), log)
    runs: dict[str, list[dict]] = {}
    for row in summary.get("runs", []):
        runs.setdefault(row["name"], []).append(row)
    return StudyResult("countdown", Path(cfg.out), runs, summary, time.time() - t0)


def _with_replication(summary: dict, replicated: dict) -> dict:
    """The primary study's summary with its replication's inside (``replication``), its rows marked
    ``replication: 1``; ``agreement``: the headline of both, side by side; ``identical``: how much of what
    both made is the same bit for bit (``bitwise_agreement``); ``machines``: of both."""
    rep = {**replicated, "runs": [{**r, "replication": 1} for r in replicated["runs"]]}
    head = lambda s: next((p for p in s["paired"] if p["primary"]), None)  # noqa: E731
    return {**summary, "replication": rep, "machines": machines_used(summary["runs"] + rep["runs"]),
            "identical": bitwise_agreement(summary["config"]["out"], replicated["config"]["out"]),
            "agreement": {"primary": {"threads": summary["config"]["threads"], "chosen": summary["chosen"],
                                      "headline": head(summary)},
                          "replication": {"threads": replicated["config"]["threads"], "chosen": replicated["chosen"],
                                          "headline": head(replicated)}}}


def _run_one(cfg: CountdownLMConfig, log, stages: Sequence[str] | None, redo: bool) -> dict:
    stages = chosen_stages(stages, STAGES)
    out = Path(cfg.out)
    claim_folder(cfg)
    identity = study_identity(cfg)
    claim_identity(out, identity, redo, outputs=[o for o in STUDY_OUTPUTS if o != "replication"])
    t0 = time.time()
    log(f"[data] {cfg.n_train} training, {cfg.n_val} validation and {cfg.n_test} test problems (seed {cfg.seed}), "
        f"{cfg.threads} thread(s)")
    torch.set_num_threads(cfg.threads)
    quiet_libraries()
    data = make_data(cfg)
    write_json(out / "data.json", {k: [[list(i.numbers), i.target] for i in getattr(data, k)]
                                   for k in ("train", "val", "test")})
    # one solver pass per invocation: the warm start's examples and the "centered:" embedders' reference
    examples = functools.cache(lambda: sft_examples(data.train, cfg.sft_solutions_per_problem, cfg.seed, log))
    sft_final = out / "sft" / "final"
    # The warm start, trained when stage "train" runs and not done; a done one whose model is not here (a new
    # checkout of a study kept in git) is trained again only when a run or an evaluation needs it.
    warm_start = (functools.cache(lambda: train_sft(cfg, data, out / "sft", log=log, examples=examples,
                                                    identity=identity, redo=redo))
                  if "train" in stages else lambda: sft_final)
    if "train" in stages and not stage_done(sft_final):
        warm_start()
    _require(sft_final, "train")
    reference = lambda: [e["completion"] for e in examples()]  # noqa: E731
    judge = "judge" in stages and judging.judge_configured(cfg)
    results = {}

    def test_split(name: str, run: RLRun | None, mdir: Path | Callable[[], Path], chosen: dict[str, RLRun]) -> None:
        """Evaluate one model on the test split at its temperatures (cached; ``mdir``: as ``evaluate_model``'s)."""
        (out / "eval").mkdir(exist_ok=True)
        temps = cfg.temperatures(run, chosen["setpo"])
        if callable(mdir) and any(not (out / "eval" / f"{name}_T{temp:g}.json").exists() for temp in temps):
            mdir = mdir()  # trained (or restored, or with --redo remade) before any of its evaluations is read
        for temp in temps:
            t = time.time()
            path = out / "eval" / f"{name}_T{temp:g}.json"
            r = evaluate_model(cfg, mdir, data.test, temp, path, log,
                               texts_file=judging.texts_path(path) if judge and temp == 1.0 else None,
                               identity=identity, redo=redo)
            if f"{name}_T{temp:g}" not in results:
                log(f"[eval] {name} T={temp:g}: pass@1 {r['accuracy']:.3f}, pass@{r['n']} {r['pass_at_k'][-1]:.3f}, "
                    f"width {r['diversity_width']}, modes {r['average_modes']:.2f} ({time.time() - t:.0f}s)")
            results[f"{name}_T{temp:g}"] = r

    if "train" in stages:
        runs, chosen, selection = _train_everything(cfg, data, warm_start, log, t0, reference, identity, redo,
                                                    test_split if "evaluate" in stages else None)
    else:
        runs, chosen, selection = _trained_runs(cfg)
    if "evaluate" not in stages:
        if not judge:
            return {}
        summary = read_json(_require(out / "results.json", "evaluate"), "delete it and rerun --stages evaluate")
        return _write_summary(out, {**summary, "judged": _judge_runs(cfg, data, runs, log)}, log)
    # the test split: each model once, only after every validation search is settled (made as each final run
    # finishes when stage "train" runs too, so that a resumed study needs no model it has already evaluated)
    test_split("sft", None, warm_start, chosen)
    for run in runs:
        test_split(run.name, run, _require(out / "rl" / run.name / "final", "train"), chosen)
    diagnostics = read_json(out / "diagnostics.json", "delete it and rerun --stages train to diagnose again")
    summary = summarize(cfg, runs, chosen, results, selection, diagnostics, _stage_timings(cfg, runs))
    if judge:
        summary["judged"] = _judge_runs(cfg, data, runs, log)
    _write_summary(out, summary, log)
    log(f"[study] {out} finished in {time.time() - t0:.0f}s")
    return summary


def _stage_timings(cfg: CountdownLMConfig, runs: Sequence[RLRun]) -> dict:
    """Where the study's time went, from what each stage recorded: the warm start's seconds, each RL run's
    generation / embedding / update seconds (``timings.json``), and each evaluation's sampling seconds."""
    out = Path(cfg.out)
    rl = {}
    for path in sorted((out / "rl").glob("*/timings.json")):
        rl[path.parent.name] = read_json(path, "delete it; it is only a record of time")
    evals = {}
    for folder in ("val", "eval"):
        for path in sorted((out / folder).glob("*.json")):
            if not path.name.endswith(".texts.json"):  # the judge's responses, not an evaluation
                evals[f"{folder}/{path.stem}"] = read_json(path, "delete it and rerun to evaluate again").get("seconds")
    sft = out / "sft" / "final" / "done.json"
    totals = {"sft": read_json(sft, "delete the sft folder and rerun").get("seconds") if sft.exists() else None}
    for phase in ("generation", "embedding", "update"):
        totals[f"rl_{phase}"] = sum(t.get(phase, 0.0) for t in rl.values())
    totals["evaluation"] = sum(v or 0.0 for v in evals.values())
    return {"totals": totals, "rl": rl, "evaluations": evals}


def _write_summary(out: Path, summary: dict, log) -> dict:
    markdown = results_markdown(summary)
    write_report(out, summary, markdown)
    log(markdown)
    return summary


def _judge_runs(cfg: CountdownLMConfig, data: CountdownData, runs: Sequence[RLRun], log=print_flushed, judge=None) -> dict:
    """Stage "judge": the LLM-judged diversity (``judging.judge_methods``) of the warm start's and the main cell's
    methods (seeds pooled) from their test-split responses at T = 1 (``judging.eval_responses``: kept by the
    evaluation, or sampled again with its seeds); verdicts cached in ``out/judge_cache.jsonl``. The judge reads
    each problem as the public English prompt states it (``make_prompt``; the model's own is too terse)."""
    out = Path(cfg.out)
    members = [("warm start (SFT)", out / "eval" / "sft_T1.json", out / "sft" / "final")] + [
        (r.variant, out / "eval" / f"{r.name}_T1.json", out / "rl" / r.name / "final") for r in runs
        if r.group_size == cfg.main_group_size and r.beta == cfg.main_beta]
    problems = [make_prompt(i.numbers, i.target, chat=True)[-1]["content"].split(" Show your reasoning")[0]
                for i in data.test]  # the task, without the format instructions of a reasoning model
    return judging.judge_evaluations(cfg, problems, members,
                                     lambda d: sample_eval(cfg, d, data.test, 1.0),
                                     lambda texts: evaluate_samples(data.test, texts)["correct"], cfg.eval_samples,
                                     out, log, judge)


def _require(final: Path, stage: str) -> Path:
    """``final`` when its stage is done (a final folder: ``stage_done``; a file: it exists); otherwise a refusal
    saying which stage to run first."""
    if not (final.is_file() if final.suffix == ".json" else stage_done(final)):
        missing = final.name if final.suffix else f"{final.name}/{DONE_FILE}"
        raise refusal(f"stage {stage!r} has not finished (no {missing})", final,
                      f"run that stage first (--stages {stage}), then rerun")
    return final


def _train_everything(cfg: CountdownLMConfig, data: CountdownData, warm_start: Callable[[], Path], log, t0: float,
                      reference: Callable[[], Sequence[str]], identity: dict | None = None, redo: bool = False,
                      test_split: Callable[[str, RLRun | None, Path, dict], None] | None = None):
    """Stage "train", after the warm start: embedder diagnostics, the validation searches (GRPO, the SetPO candidates, then with the
    embedder SetPO chose the pairwise penalty, DRA-GRPO, Pass@k training and the perfect-kernel ceiling; each
    candidate over the search seeds), then every run the test split evaluates, each from ``warm_start()`` (the
    warm start's folder, trained again if its model is not here). Returns (those runs, the run
    chosen by each search, the record of the searches). test_split(name, run, model folder, chosen): called on
    the warm start and on each of those runs as soon as the searches are settled and it is trained (None: not)."""
    out = Path(cfg.out)
    embedders: dict = {}

    @functools.cache  # once per run and invocation (its evaluations may each ask for it)
    def trained_model(run: RLRun) -> Path:
        """Run ``run``'s final model folder: trained, resumed or restored by ``train_rl`` (which claims its folder
        at the identity), or as it is when done and here."""
        final = out / "rl" / run.name / "final"
        t = time.time()
        make = lambda: train_rl(  # noqa: E731
            cfg, run, data, warm_start, final.parent, log=log, identity=identity, redo=redo,
            make_embedder=lambda: resolve_embedder(run.embedder, reference, embedders))
        try:
            final = make()
        except RestoreMismatch:
            if not redo:
                raise
            log(f"[rl] {run.name}: its model cannot be restored on this machine; --redo: made again here, with "
                "its evaluations")
            _forget_run(out, run.name)
            final = make()
        log(f"[rl] {run.name} ready ({time.time() - t:.0f}s, study {time.time() - t0:.0f}s)")
        return final

    def validate(run: RLRun) -> list[dict]:
        return [evaluate_model(cfg, functools.partial(trained_model, r), data.val, 1.0, out / "val" / f"{r.name}_T1.json",
                               log, identity=identity, redo=redo)
                for r in (run.with_seed(s) for s in cfg.search_seed_list)]

    if not (out / "diagnostics.json").exists():
        write_json(out / "diagnostics.json", diagnose_embedders(cfg, data, embedders, reference))
    (out / "val").mkdir(exist_ok=True)
    grpo_val = validate(cfg.main_cell())
    chosen: dict[str, RLRun] = {}
    setpo, selection = _select_on_validation(cfg, grpo_val, {r: validate(r) for r in cfg.search_runs()})
    chosen["setpo"] = setpo
    for key, candidates in cfg.searches(setpo.embedder).items():
        if key != "setpo":
            chosen[key], selection[key] = _select_on_validation(cfg, grpo_val, {r: validate(r) for r in candidates})
    write_json(out / "selection.json", selection)
    log("[select] chosen on validation: " + "; ".join(f"{k}: {r.variant}" for k, r in chosen.items()))
    runs = cfg.final_runs(chosen)
    if test_split is not None:
        test_split("sft", None, warm_start, chosen)
    for run in runs:
        if test_split is None:
            trained_model(run)
        else:  # trained only if an evaluation of it is missing
            test_split(run.name, run, functools.partial(trained_model, run), chosen)
    return runs, chosen, selection


def _forget_run(out: Path, name: str) -> None:
    """Delete run ``name`` of the study in ``out``: its folder and its evaluations (validation and test), so that
    it is made again as a new run (``--redo`` after a model that cannot be restored bit for bit)."""
    shutil.rmtree(out / "rl" / name, ignore_errors=True)
    for split in ("val", "eval"):
        for path in (out / split).glob(f"{name}_T*.json"):
            path.unlink()


def _trained_runs(cfg: CountdownLMConfig):
    """What stage "train" chose, read back from ``selection.json``, for an "evaluate" without "train"."""
    path = Path(cfg.out) / "selection.json"
    if not path.exists():
        raise refusal("stage 'train' has not finished (no validation search recorded)", path,
                      "run that stage first (--stages train), then rerun")
    selection = read_json(path, "delete it and rerun --stages train to search again")
    setpo = next(r for r in cfg.search_runs() if r.name == selection["chosen"])
    chosen = {"setpo": setpo}
    for key, candidates in cfg.searches(setpo.embedder).items():
        if key != "setpo" and key in selection:
            chosen[key] = next(r for r in candidates if r.name == selection[key]["chosen"])
    return cfg.final_runs(chosen), chosen, selection


def _run(cfg: CountdownLMConfig, stages: Sequence[str], args) -> int:
    run_study(cfg, stages=stages, redo=args.redo)
    return 0


#: the study's command line (``arguments.study_parser``): ``python -m setpo_lab run countdown --full``; --full runs
#: on the pinned floating-point path (a study of several sittings, on whatever machine each gets)
COMMAND = StudyCommand(
    "countdown", {"full": CountdownLMConfig, "smoke": CountdownLMConfig.smoke}, STAGES, _run, folder="out",
    default_out={"full": "results/countdown", "smoke": "runs/countdown_smoke"},
    fields=frozenset(f.name for f in fields(CountdownLMConfig)), options=("judge", "redo"), pinned=("full",),
    doc=__doc__)

if __name__ == "__main__":
    sys.exit(run_command(COMMAND))
