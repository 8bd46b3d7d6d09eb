"""Countdown on a laptop: a small language model trained with GRPO and SetPO+GRPO on 2 CPU cores.

The paper's Countdown study (arXiv 2602.01062: Qwen2.5-3B, GRPO vs SetPO+GRPO, G in {3, 7}, KL beta in
{0.001, 0.005}, lambda = 0.5, pass@k from 64 samples at T = 0.5 and 1.0, top-p 0.9) at a size one CPU runs
in under an hour, on the same engine that trains real models (TRL, through ``setpo.trl.SetPOTrainer``).

What is ours to decide (design choices, written down here):

- Model: a Qwen2-architecture causal LM built from a config (4 layers, hidden 128 by default, about 1M
  parameters), no pretrained weights.
- Tokenizer: expression level. Every integer up to 999 is one token (longer digit runs split into chunks of
  three), every other ASCII character is one token, and ``<answer>`` / ``</answer>`` are one token each. A
  ``tokenizers`` WordLevel model wrapped in ``PreTrainedTokenizerFast``, so TRL and ``generate`` use it
  like any other; it round-trips text exactly.
- Prompt: compact, not the TinyZero English prompt (a from-scratch model cannot read English):
  ``"3 7 25 50 = 82\\n"``. Completion: ``"<answer>(50-25)*3+7</answer>"`` then end-of-sequence. The reward is
  ``envs.countdown.score_answer`` (1.0 correct, 0.1 well-formed but wrong, 0.0 no answer), as in the paper.
- Problems: 3 or 4 numbers in [1, 20], targets in [1, 50] (``envs.countdown.generate_instances``); smaller
  than the public data's [1, 100] so that most problems have several distinct solutions (about 5 on
  average with 4 numbers) and a 1M-parameter model can learn them. Train, validation and test splits share
  no problem; settings were chosen on the validation split only, and the test split is evaluated once.
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
- Cells, seeds, methods and the validation search: ``setpo.studies.countdown_config`` (the main cell
  G = 7, β = 0.001 over ``rl_seeds``; the paper-faithful SetPO, the one chosen on validation, and the local
  pairwise penalty next to GRPO). Embedders: all-MiniLM-L6-v2 ("default", the paper-faithful run's), the same
  centred on the warm-start completions ("centered:default"), hashed character n-grams ("hash"); the paper's
  Qwen3-Embedding-0.6B by path. ``diagnostics.json`` shows how well each separates solutions
  (``setpo.diagnostics``).
- Evaluation: unbiased pass@k (``setpo.pass_at_k``) from n = 64 samples per test problem, k = 1..64, at
  T = 0.5 and 1.0 with top-p 0.9; at T = 1.0 the "diversity width" (problems with >= 2 distinct correct
  solutions) and "average modes" (mean distinct correct solutions over solved problems), with
  ``envs.countdown.distinct_correct_solutions`` (distinct = canonical form, ``envs.countdown``).

Run everything with one command (resumable: finished stages are skipped, RL resumes from its last
checkpoint, every evaluation is cached; a run killed at any moment and started again gives the same models
and records as an uninterrupted one, and one started with a different configuration is refused):

    .venv/bin/python -m setpo.studies.countdown --full --out runs/countdown

``--smoke`` runs the same pipeline at toy size in seconds (used by the tests and notebook 03).
Outputs under ``--out``: ``config.json``, ``data.json`` (the splits), ``sft/`` and ``rl/<run>/`` (models,
checkpoints, ``log_history.json``, ``probes.jsonl``: samples on fixed validation problems over training),
``diagnostics.json``, ``val/<run>_T1.json`` and ``selection.json`` (the validation search),
``eval/<run>_T<temp>.json`` (the test split), ``results.json`` (every run's row and the paired differences,
``countdown_results.summarize``) and ``results.md``. With a judge (``--judge-url URL --judge-model NAME`` or
``--judge-path DIR``), stage "judge" adds the LLM-judged diversity of the main cell's methods at T = 1
(``judge_runs``) to both, its verdicts cached in ``judge_cache.jsonl``; without one it does nothing.
"""

from __future__ import annotations

import ast
import functools
import math
import random
import shutil
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable, Sequence

import torch

from envs.countdown import (
    CountdownInstance,
    canonical_form,
    extract_answer,
    make_prompt,
    make_splits,
    score_answer,
    solve,
)
from setpo.diagnostics import diagnose_embedder
from setpo.embed import CenteredEmbedder, load_embedder
from setpo.records import read_json, write_json, write_text
from setpo.studies.countdown_config import (  # noqa: F401  (load_config: the study's public API)
    STEPS_PER_GENERATION,
    CountdownLMConfig,
    RLRun,
    claim_folder,
    load_config,
)
from setpo.studies import judging
from setpo.studies.arguments import Parser, add_stage_and_set_arguments, parsed_stages, set_overrides
from setpo.studies.countdown_results import evaluate_samples, results_markdown, summarize  # noqa: F401 (public API)
from setpo.studies.sampling import sample_completions
from setpo.studies.stages import Progress, chosen_stages, refusal, stage_done, unreadable
from setpo.trl.tiny_models import ANSWER_CLOSE, ANSWER_OPEN, build_model, build_tokenizer
from setpo.trl.rewards import countdown_reward
from setpo.trl.training import DONE_FILE, quiet_libraries


def _log(*args) -> None:
    print(*args, flush=True)  # flushed, so a long run's progress shows when stdout is a file


# --------------------------------------------------------------------------------------------------
# Tokenizer, model, text format
# --------------------------------------------------------------------------------------------------


def prompt_text(inst: CountdownInstance) -> str:
    """The compact prompt, e.g. ``"3 7 25 50 = 82\\n"``."""
    return " ".join(str(v) for v in inst.numbers) + f" = {inst.target}\n"


def answer_text(expression: str) -> str:
    return f"{ANSWER_OPEN}{expression}{ANSWER_CLOSE}"


def solution_key(text: str) -> str | None:
    """Canonical form of a completion's answer (the trainer counts it only when the reward says correct)."""
    answer = extract_answer(text)
    return None if answer is None else canonical_form(answer)


# --------------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------------


@dataclass
class CountdownData:
    train: list[CountdownInstance]
    val: list[CountdownInstance]
    test: list[CountdownInstance]


def make_data(cfg: CountdownLMConfig) -> CountdownData:
    """Disjoint train / validation / test problems (validation carved from the training draw)."""
    train, test = make_splits(cfg.n_train + cfg.n_val, cfg.n_test, cfg.seed, num_numbers=cfg.num_numbers,
                              number_range=cfg.number_range, target_range=cfg.target_range)
    return CountdownData(train[:cfg.n_train], train[cfg.n_train:], test)


def sft_examples(instances: Sequence[CountdownInstance], solutions_per_problem: int, seed: int,
                 log=None) -> list[dict]:
    """Prompt-completion pairs: up to ``solutions_per_problem`` distinct solver solutions per problem.

    Problems with more solutions get a seeded random subset, so the warm start sees several modes of many
    problems without over-weighting the problems that have dozens. log: a progress line at most every 10 s
    (solving the study's 3000 problems takes about 40 s on a laptop core).
    """
    if solutions_per_problem < 1:
        raise ValueError(f"solutions_per_problem must be >= 1, got {solutions_per_problem}")
    rng = random.Random(seed)
    out = []
    if log is not None:
        log(f"[data] solving {len(instances)} problems for their distinct solutions")
        instances = Progress(log, "[data] solved", len(instances)).over(instances)
    for inst in instances:
        sols = solve(inst.numbers, inst.target)
        if len(sols) > solutions_per_problem:
            sols = rng.sample(sols, solutions_per_problem)
        out.extend({"prompt": prompt_text(inst), "completion": answer_text(s)} for s in sols)
    rng.shuffle(out)
    return out


def warm_start_texts(cfg: CountdownLMConfig, data: CountdownData | None = None, log=None) -> list[str]:
    """The warm-start completions, the reference a "centered:" embedder subtracts the mean of. data: the
    study's ``CountdownData`` when at hand (None: made again from ``cfg``, the same problems)."""
    train = (data if data is not None else make_data(cfg)).train
    return [e["completion"] for e in sft_examples(train, cfg.sft_solutions_per_problem, cfg.seed, log)]


def rl_rows(instances: Sequence[CountdownInstance]) -> list[dict]:
    return [{"prompt": prompt_text(i), "numbers": list(i.numbers), "target": i.target} for i in instances]


# --------------------------------------------------------------------------------------------------
# Training drivers
# --------------------------------------------------------------------------------------------------


def _common_args(cfg: CountdownLMConfig, seed: int | None = None) -> dict:
    seed = cfg.seed if seed is None else seed
    return dict(report_to=[], use_cpu=not torch.cuda.is_available(), bf16=False, seed=seed,
                data_seed=seed, save_total_limit=1, save_only_model=False, disable_tqdm=True,
                logging_steps=1, dataloader_num_workers=0)


def train_sft(cfg: CountdownLMConfig, data: CountdownData, out_dir: Path, log=_log) -> Path:
    """Warm start by supervised fine-tuning on solver solutions; returns the final model directory."""
    from datasets import Dataset  # the engine (datasets, TRL, transformers): imported when a stage trains, so
    from trl import SFTConfig, SFTTrainer  # that reading a finished study (notebook 03) stays light

    from setpo.trl import train_resumable

    final = out_dir / "final"
    if stage_done(final):
        return final
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, cfg.model, seed=cfg.seed)
    examples = sft_examples(data.train, cfg.sft_solutions_per_problem, cfg.seed, log)
    log(f"[sft] {len(examples)} examples from {len(data.train)} problems, "
        f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters")
    steps_per_epoch = math.ceil(len(examples) / cfg.sft_batch_size)
    args = SFTConfig(
        output_dir=str(out_dir), num_train_epochs=cfg.sft_epochs, learning_rate=cfg.sft_lr,
        per_device_train_batch_size=cfg.sft_batch_size, lr_scheduler_type="cosine", warmup_steps=min(50, steps_per_epoch),
        weight_decay=0.01, max_length=cfg.model.max_position_embeddings, completion_only_loss=True,
        save_strategy="steps", save_steps=max(1, steps_per_epoch // 2), gradient_checkpointing=False,
        **_common_args(cfg))
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(examples),
                         processing_class=tokenizer)
    train_resumable(trainer, tokenizer, out_dir, final, {"examples": len(examples)}, log,
                    f"[sft]: {steps_per_epoch} steps per epoch, {cfg.sft_epochs:g} epochs")
    _clean_checkpoints(out_dir)
    return final


def _clean_checkpoints(folder: Path) -> None:
    for ckpt in folder.glob("checkpoint-*"):
        shutil.rmtree(ckpt, ignore_errors=True)


def load_trained(model_dir: Path):
    """(tokenizer, float32 model) of a finished stage; a damaged folder is a ValueError naming it."""
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast  # the engine, when a model is loaded

    try:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(model_dir), local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True, dtype=torch.float32)
    except Exception as e:  # noqa: BLE001 - truncated safetensors, missing or damaged config: all unusable
        raise unreadable(model_dir, e, f"delete {Path(model_dir).parent} and rerun to train that stage again") from None
    return tokenizer, model


def probe_sampler(cfg: CountdownLMConfig, probes: Sequence[CountdownInstance], tokenizer):
    """``sample(model, step)`` for ``setpo.trl.probe_callback``: ``cfg.probe_samples`` completions at T = 1 per
    fixed probe problem, as {"problem", "numbers", "target", "text", "expression", "reward", "canonical"}
    records."""
    probes = list(probes)

    def sample(model, step: int) -> list[dict]:
        samples = sample_completions(model, tokenizer, [prompt_text(p) for p in probes], cfg.probe_samples,
                                     temperature=1.0, seed=cfg.seed + step)
        return [{"problem": j, "numbers": list(inst.numbers), "target": inst.target, "text": t,
                 "expression": extract_answer(t), "reward": score_answer(t, inst.numbers, inst.target),
                 "canonical": solution_key(t)}
                for j, (inst, texts) in enumerate(zip(probes, samples)) for t in texts]

    return sample


def train_rl(cfg: CountdownLMConfig, run: RLRun, data: CountdownData, init_dir: Path, out_dir: Path,
           embedder=None, log=_log, callbacks: Sequence = ()) -> Path:
    """One GRPO / SetPO / pairwise-penalty run from the warm start; resumes from its last checkpoint. Returns
    the final model's folder.

    embedder: the Embedder ``run.embedder`` names, shared across runs (None: load it by name; "centered:..."
    needs the study's, see ``resolve_embedder``). The run's seed sets TRL's sampling and prompt order.
    callbacks: extra TrainerCallbacks (the tests use one to interrupt a run).
    """
    from datasets import Dataset  # the engine, imported when a run trains (see train_sft)

    from setpo.trl import SetPOTrainer, config_for, probe_callback, train_resumable

    final = out_dir / "final"
    if stage_done(final):
        return final
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer, model = load_trained(init_dir)
    tokenizer.padding_side = "left"
    g = run.group_size
    per_step = cfg.rl_prompts_per_step * g  # validated by the config: a multiple of STEPS_PER_GENERATION
    args = config_for(
        run.preset, output_dir=str(out_dir), setpo_lambda=run.lam, learning_rate=cfg.rl_lr, num_generations=g,
        beta=run.beta, per_device_train_batch_size=per_step // STEPS_PER_GENERATION,
        steps_per_generation=STEPS_PER_GENERATION,
        max_steps=cfg.rl_steps, max_completion_length=cfg.rl_max_completion_length,
        temperature=cfg.rl_temperature, top_p=1.0, embedder=run.embedder, setpo_diversity=run.term,
        setpo_lambda_units=run.units, lr_scheduler_type="constant", warmup_steps=0, save_strategy="steps",
        save_steps=cfg.rl_save_steps, gradient_checkpointing=False, **_common_args(cfg, run.seed))
    probes = probe_callback(probe_sampler(cfg, data.val[:cfg.n_probe], tokenizer), out_dir / "probes.jsonl",
                            cfg.probe_every)
    trainer = SetPOTrainer(model=model, reward_funcs=countdown_reward, args=args,
                           train_dataset=Dataset.from_list(rl_rows(data.train)), processing_class=tokenizer,
                           embedder=embedder, solution_key=solution_key, callbacks=[probes, *callbacks])
    train_resumable(trainer, tokenizer, out_dir, final, {"run": asdict(run)}, log,
                    f"[rl] {run.name}: {run.variant}, G={g}, beta={run.beta}, seed={run.seed}")
    _clean_checkpoints(out_dir)
    return final


def sample_eval(cfg: CountdownLMConfig, model_dir: Path, instances: Sequence[CountdownInstance],
                temperature: float, label: str = "", log=None) -> list[list[str]]:
    """The ``cfg.eval_samples`` completions per problem an evaluation scores (seeded: sampling again gives them
    again). log: a progress line at most every 10 s."""
    tokenizer, model = load_trained(model_dir)
    progress = None if log is None else Progress(log, f"[eval] {label}: problems sampled", len(instances)).step
    return sample_completions(model, tokenizer, [prompt_text(i) for i in instances], cfg.eval_samples,
                              temperature, cfg.eval_top_p, cfg.rl_max_completion_length,
                              batch_sequences=cfg.eval_batch_sequences, seed=cfg.seed + 1, progress=progress)


def evaluate_model(cfg: CountdownLMConfig, model_dir: Path, instances: Sequence[CountdownInstance],
                   temperature: float, path: Path, log=None, texts_file: Path | None = None) -> dict:
    """Sample ``cfg.eval_samples`` completions per problem (``sample_eval``) and score them; cached in ``path``.
    texts_file: where to keep the completions (for the judge; None keeps none)."""
    if path.exists():
        return read_json(path, "delete it and rerun to evaluate again")
    t0 = time.time()
    samples = sample_eval(cfg, model_dir, instances, temperature, path.stem, log)
    if texts_file is not None:
        write_json(texts_file, samples)
    result = evaluate_samples(instances, samples)
    result.update(temperature=temperature, top_p=cfg.eval_top_p, seconds=time.time() - t0,
                  examples=[s[:4] for s in samples[:5]])
    write_json(path, result)
    return result


# --------------------------------------------------------------------------------------------------
# The study
# --------------------------------------------------------------------------------------------------


STAGES = ("sft", "rl", "eval", "judge")


def resolve_embedder(spec: str, reference_texts: Sequence[str] | Callable[[], Sequence[str]], cache: dict):
    """The embedder a run names, loaded once per study: "centered:<spec>" is ``<spec>`` minus its mean over
    ``reference_texts`` (the warm-start completions), ``setpo.embed.CenteredEmbedder``; anything else goes to
    ``load_embedder``. reference_texts may be a function returning them, called only when a "centered:"
    embedder is built (the study's costs a solver pass over the training problems)."""
    if spec not in cache:
        base, centred = (spec.partition(":")[2], True) if spec.startswith("centered:") else (spec, False)
        embedder = load_embedder(base)
        if centred:
            embedder = CenteredEmbedder(embedder, reference_texts() if callable(reference_texts) else reference_texts)
        cache[spec] = embedder
    return cache[spec]


def surface_variants(expression: str, n: int, rng: random.Random) -> list[str]:
    """n texts of one solution written differently: operands of + and * swapped at random, spacing varied.
    The same solution for ``canonical_form``; what an embedder should put close together."""
    def swap(node):
        for child in ast.iter_child_nodes(node):
            swap(child)
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)) and rng.random() < 0.5:
            node.left, node.right = node.right, node.left
        return node

    out = []
    for _ in range(n):
        text = ast.unparse(swap(ast.parse(expression, mode="eval")))
        out.append(text if rng.random() < 0.5 else text.replace(" ", ""))
    return out


def diagnose_embedders(cfg: CountdownLMConfig, data: CountdownData, embedders: dict,
                       reference: Sequence[str] | Callable[[], Sequence[str]], max_problems: int = 40) -> dict:
    """``setpo.diagnostics.diagnose_embedder`` for every embedder the study uses, on validation problems with
    at least 4 distinct solutions: up to 6 solutions each, 3 surface variants per solution."""
    rng = random.Random(cfg.seed)
    problems = []
    for inst in data.val:
        sols = solve(inst.numbers, inst.target)
        if len(sols) >= 4:
            picked = rng.sample(sols, min(6, len(sols)))
            problems.append([(answer_text(v), s) for s in picked for v in surface_variants(s, 3, rng)])
        if len(problems) >= max_problems:
            break
    specs = dict.fromkeys((cfg.paper_embedder, *cfg.search_embedders))
    return {spec: diagnose_embedder(resolve_embedder(spec, reference, embedders), problems) for spec in specs}


def select_on_validation(cfg: CountdownLMConfig, grpo: dict, candidates: dict[RLRun, dict]) -> tuple[RLRun, dict]:
    """The candidate with the highest validation pass@n among those whose pass@1 is at most
    ``cfg.max_pass1_loss`` below GRPO's (ties: the smaller λ); none qualifying: the highest pass@n, flagged."""
    floor = grpo["accuracy"] - cfg.max_pass1_loss
    rows = {run.name: {"variant": run.variant, "pass1": r["accuracy"], "passn": r["pass_at_k"][-1],
                       "average_modes": r["average_modes"], "qualifies": r["accuracy"] >= floor}
            for run, r in candidates.items()}
    pool = [run for run in candidates if rows[run.name]["qualifies"]] or list(candidates)
    best = max(pool, key=lambda run: (candidates[run]["pass_at_k"][-1], -run.lam))
    return best, {"grpo": {"pass1": grpo["accuracy"], "passn": grpo["pass_at_k"][-1]}, "candidates": rows,
                  "chosen": best.name, "qualified": rows[best.name]["qualifies"],
                  "rule": f"max validation pass@{cfg.eval_samples} at T=1 with pass@1 >= GRPO's - {cfg.max_pass1_loss}"}


def run_study(cfg: CountdownLMConfig, log=_log, stages: Sequence[str] = STAGES) -> dict:
    """The whole study, resumable: data, warm start (stage "sft"), embedder diagnostics, the validation search
    and every RL run (seeds, cells; stage "rl"), then the test split once and the record (stage "eval").
    Runs exactly the ``stages`` named; a stage whose input another stage makes refuses to start until that one
    has finished. Returns the summary (``results.json``; {} without "eval")."""
    stages = chosen_stages(stages, STAGES)
    out = Path(cfg.out)
    claim_folder(cfg)
    t0 = time.time()
    log(f"[data] {cfg.n_train} training, {cfg.n_val} validation and {cfg.n_test} test problems (seed {cfg.seed})")
    torch.set_num_threads(cfg.threads)
    quiet_libraries()
    data = make_data(cfg)
    write_json(out / "data.json", {k: [[list(i.numbers), i.target] for i in getattr(data, k)]
                                    for k in ("train", "val", "test")})
    sft_final = train_sft(cfg, data, out / "sft", log=log) if "sft" in stages else out / "sft" / "final"
    if stages == ["sft"]:
        return {}
    _require(sft_final, "sft")
    if "rl" in stages:
        runs, chosen, selection = _train_everything(cfg, data, sft_final, log, t0)
    else:
        runs, chosen, selection = _trained_runs(cfg)
    judge = "judge" in stages and judging.judge_configured(cfg)
    if "eval" not in stages:
        if not judge:
            return {}
        summary = read_json(_require(out / "results.json", "eval"), "delete it and rerun --stages eval")
        return _write_summary(out, {**summary, "judged": judge_runs(cfg, data, runs, log)}, log)
    # the test split, once, after every run has finished
    models = {"sft": sft_final, **{run.name: _require(out / "rl" / run.name / "final", "rl") for run in runs}}
    (out / "eval").mkdir(exist_ok=True)
    results = {}
    for name, mdir in models.items():
        run = next((r for r in runs if r.name == name), None)
        both = run is None or (run.seed == cfg.rl_seeds[0] and run.group_size == cfg.main_group_size
                               and run.beta == cfg.main_beta and run.preset == "grpo")
        for temp in (cfg.eval_temperatures if both else (1.0,)):
            t = time.time()
            path = out / "eval" / f"{name}_T{temp:g}.json"
            r = evaluate_model(cfg, mdir, data.test, temp, path, log,
                               texts_file=judging.texts_path(path) if judge and temp == 1.0 else None)
            results[f"{name}_T{temp:g}"] = r
            log(f"[eval] {name} T={temp:g}: pass@1 {r['accuracy']:.3f}, pass@{r['n']} {r['pass_at_k'][-1]:.3f}, "
                f"width {r['diversity_width']}, modes {r['average_modes']:.2f} ({time.time() - t:.0f}s)")
    diagnostics = read_json(out / "diagnostics.json", "delete it and rerun --stages rl to diagnose again")
    summary = summarize(cfg, runs, chosen, results, selection, diagnostics)
    if judge:
        summary["judged"] = judge_runs(cfg, data, runs, log)
    _write_summary(out, summary, log)
    log(f"[study] finished in {time.time() - t0:.0f}s")
    return summary


def _write_summary(out: Path, summary: dict, log) -> dict:
    write_json(out / "results.json", summary)
    write_text(out / "results.md", results_markdown(summary))
    log(results_markdown(summary))
    return summary


def judge_runs(cfg: CountdownLMConfig, data: CountdownData, runs: Sequence[RLRun], log=_log, judge=None) -> dict:
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


def _train_everything(cfg: CountdownLMConfig, data: CountdownData, sft_final: Path, log, t0: float):
    """Stage "rl": embedder diagnostics, the validation search (GRPO, the SetPO candidates, the pairwise
    penalty), then every run the test split evaluates. Returns (those runs, the chosen SetPO run, the record
    of the search)."""
    out = Path(cfg.out)
    embedders: dict = {}
    reference = functools.cache(lambda: warm_start_texts(cfg, data, log))  # only a "centered:" embedder needs it

    def train(run: RLRun) -> Path:
        final = out / "rl" / run.name / "final"
        t = time.time()
        if not stage_done(final):  # a finished run needs no embedder (train_rl would return at once)
            final = train_rl(cfg, run, data, sft_final, out / "rl" / run.name,
                             embedder=resolve_embedder(run.embedder, reference, embedders), log=log)
        log(f"[rl] {run.name} ready ({time.time() - t:.0f}s, study {time.time() - t0:.0f}s)")
        return final

    def validate(run: RLRun) -> dict:
        return evaluate_model(cfg, train(run), data.val, 1.0, out / "val" / f"{run.name}_T1.json", log)

    if not (out / "diagnostics.json").exists():
        write_json(out / "diagnostics.json", diagnose_embedders(cfg, data, embedders, reference))
    (out / "val").mkdir(exist_ok=True)
    grpo_val = validate(cfg.main_cell())
    chosen, selection = select_on_validation(cfg, grpo_val, {r: validate(r) for r in cfg.search_runs()})
    pairwise, pair_selection = select_on_validation(
        cfg, grpo_val, {r: validate(r) for r in cfg.pairwise_runs(chosen.embedder)})
    selection["pairwise"] = pair_selection
    write_json(out / "selection.json", selection)
    log(f"[select] chosen on validation: {chosen.variant}; pairwise baseline: {pairwise.variant}")
    runs = cfg.final_runs(chosen, pairwise)
    for run in runs:
        train(run)
    return runs, chosen, selection


def _trained_runs(cfg: CountdownLMConfig):
    """What stage "rl" chose, read back from ``selection.json``, for an "eval" without "rl"."""
    path = Path(cfg.out) / "selection.json"
    if not path.exists():
        raise refusal("stage 'rl' has not finished (no validation search recorded)", path,
                      "run that stage first (--stages rl), then rerun")
    selection = read_json(path, "delete it and rerun --stages rl to search again")
    chosen = next(r for r in cfg.search_runs() if r.name == selection["chosen"])
    pairwise = next(r for r in cfg.pairwise_runs(chosen.embedder) if r.name == selection["pairwise"]["chosen"])
    return cfg.final_runs(chosen, pairwise), chosen, selection


def parse_args(argv=None) -> tuple[CountdownLMConfig, list[str]]:
    """The config and stages a command line asks for, every value checked before any work starts."""
    p = Parser(prog="python -m setpo.studies.countdown", description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--full", action="store_true", help="the study at its documented size")
    mode.add_argument("--smoke", action="store_true", help="toy size, seconds")
    p.add_argument("--out", default=None, help="output folder (default runs/countdown or runs/countdown_smoke)")
    add_stage_and_set_arguments(p, STAGES, "rl_steps=100 'rl_seeds=[0,1,2,3,4]' 'search_embedders=[\"hash\"]'")
    judging.add_judge_arguments(p)
    a = p.parse_args(argv)
    stages = parsed_stages(p, a.stages, STAGES)
    overrides = set_overrides(p, a.set, {f.name for f in fields(CountdownLMConfig)})
    overrides.update(judging.judge_overrides(a, p, stages))
    try:
        if a.smoke:
            cfg = CountdownLMConfig.smoke(**({"out": a.out} if a.out else {}), **overrides)
        else:
            cfg = CountdownLMConfig(**({"out": a.out} if a.out else {}), **overrides)
    except (TypeError, ValueError) as e:
        p.error(str(e))
    return cfg, stages


def main(argv=None) -> int:
    cfg, stages = parse_args(argv)
    try:
        run_study(cfg, stages=stages)
    except ValueError as err:  # a refusal (another config's folder, a stage not run, a judge down): one line
        print(f"python -m setpo.studies.countdown: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
