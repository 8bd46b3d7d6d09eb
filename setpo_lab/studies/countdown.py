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

which runs ``python -m setpo_lab.studies.countdown --full --out results/countdown`` on the pinned floating-point
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
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Callable, Sequence

import torch

from setpo.envs.arguments import Parser
from setpo.envs.countdown import (
    CountdownInstance,
    canonical_form,
    distinct_correct_solutions,
    extract_answer,
    make_prompt,
    make_splits,
    score_answer,
    solve,
)
from setpo.diagnostics import diagnose_embedder
from setpo.embed import CenteredEmbedder, SolutionKeyEmbedder, load_embedder
from setpo.metrics import diversity_width_and_average_modes, pass_at_k
from setpo_lab.repro.arithmetic import require_pinned
from setpo_lab.repro.provenance import run_identity
from setpo.records import read_json, write_json, write_text
from setpo.refusals import loading
from setpo_lab.studies import judging
from setpo_lab.studies.arguments import add_stage_and_set_arguments, parsed_stages, set_overrides
from setpo_lab.studies.countdown_config import (  # noqa: F401  (load_config: the study's public API)
    CEILING_EMBEDDER,
    STEPS_PER_GENERATION,
    CountdownLMConfig,
    RLRun,
    claim_folder,
    load_config,
)
from setpo_lab.studies.countdown_results import results_markdown, summarize, with_replication
from setpo_lab.studies.sampling import sample_completions
from setpo_lab.studies.stages import (
    Progress,
    RestoreMismatch,
    StudyResult,
    check_restored,
    chosen_stages,
    claim_identity,
    has_model,
    print_flushed,
    refusal,
    restore_model,
    reusable_record,
    run_records,
    stage_done,
)
from setpo.trl.rewards import countdown_reward
from setpo.trl.tiny_models import ANSWER_CLOSE, ANSWER_OPEN, build_model, build_tokenizer
from setpo.trl.training import DONE_FILE, quiet_libraries


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


def parse_prompt(prompt: str) -> tuple[tuple[int, ...], int]:
    """(numbers, target) of a compact prompt ``"3 7 25 50 = 82\\n"`` (``prompt_text``'s inverse)."""
    left, sep, right = prompt.partition("=")
    try:
        if not sep:
            raise ValueError
        return tuple(int(v) for v in left.split()), int(right.strip())
    except ValueError:
        raise ValueError(f"not a Countdown prompt of the form '3 7 25 = 82': {prompt[:60]!r}") from None


def verifier_key(prompt: str, completion: str) -> tuple[str, str]:
    """The perfect kernel's solution identity (the ceiling, ``CEILING_EMBEDDER``): a correct answer is its
    solution's canonical form (``setpo.envs.countdown.canonical_form``), anything else its whitespace-normalised text,
    so that two responses are "the same" exactly when the verifier cannot tell them apart."""
    numbers, target = parse_prompt(prompt)
    if score_answer(completion, numbers, target) == 1.0:
        return "solution", canonical_form(extract_answer(completion))
    return "text", " ".join(completion.split())


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


def evaluate_samples(instances: Sequence[CountdownInstance], samples: Sequence[Sequence[str]]) -> dict:
    """pass@k (k = 1..n), accuracy and the diversity numbers from n samples per problem.

    Returns {"n", "correct" (per problem), "distinct" (per problem), "pass_at_k" (list, k = 1..n, mean over
    problems), "accuracy" (mean fraction correct = pass@1), "diversity_width", "average_modes",
    "average_modes_all" (over all problems, unsolved counting 0)}.
    """
    n = len(samples[0]) if samples else 0
    if len(samples) != len(instances) or any(len(s) != n for s in samples) or n == 0:
        raise ValueError("samples must hold the same number (>= 1) of completions for every instance")
    correct, distinct = [], []
    for inst, texts in zip(instances, samples):
        correct.append(sum(score_answer(t, inst.numbers, inst.target) == 1.0 for t in texts))
        distinct.append(len(distinct_correct_solutions(texts, inst.numbers, inst.target)))
    curve = [sum(pass_at_k(n, c, k) for c in correct) / len(correct) for k in range(1, n + 1)]
    width, modes = diversity_width_and_average_modes(distinct)
    _, modes_all = diversity_width_and_average_modes(distinct, over="all")
    return {"n": n, "correct": correct, "distinct": distinct, "pass_at_k": curve, "accuracy": curve[0],
            "diversity_width": width, "average_modes": modes, "average_modes_all": modes_all}


def rl_rows(instances: Sequence[CountdownInstance]) -> list[dict]:
    return [{"prompt": prompt_text(i), "numbers": list(i.numbers), "target": i.target} for i in instances]


# --------------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------------


def resolve_embedder(spec: str, reference_texts: Sequence[str] | Callable[[], Sequence[str]], cache: dict):
    """The embedder a run names, loaded once per study: "centered:<spec>" is ``<spec>`` minus its mean over
    ``reference_texts`` (the warm-start completions), ``setpo.embed.CenteredEmbedder``; "verifier" is the
    perfect kernel (``verifier_key`` through ``setpo.embed.SolutionKeyEmbedder``); anything else goes to
    ``load_embedder``. reference_texts may be a function returning them, called only when a "centered:"
    embedder is built (the study's costs a solver pass over the training problems)."""
    if spec not in cache:
        if spec == CEILING_EMBEDDER:
            cache[spec] = SolutionKeyEmbedder(verifier_key)
            return cache[spec]
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


# --------------------------------------------------------------------------------------------------
# Training drivers: the warm start (``train_sft``), one RL run (``train_rl``), and the test and
# validation evaluations (``sample_eval``, ``evaluate_model``), each resumable and made at the
# study's identity
# --------------------------------------------------------------------------------------------------


def _common_args(cfg: CountdownLMConfig, seed: int | None = None) -> dict:
    seed = cfg.seed if seed is None else seed
    return dict(report_to=[], use_cpu=not torch.cuda.is_available(), bf16=False, seed=seed,
                data_seed=seed, save_total_limit=1, save_only_model=False, disable_tqdm=True,
                logging_steps=1, dataloader_num_workers=0)


def train_sft(cfg: CountdownLMConfig, data: CountdownData, out_dir: Path, log=print_flushed, examples=None,
              identity: dict | None = None, redo: bool = False) -> Path:
    """Warm start by supervised fine-tuning on solver solutions; returns the final model directory.
    examples: the study's ``sft_examples``, or a function making them, when at hand (None: made here).
    identity: the run identity (``study_identity``) the folder must have been made at (None: not checked);
    ``redo``: remake it if not."""
    def fit_warm_start(final: Path) -> None:
        from datasets import Dataset  # the engine (datasets, TRL, transformers): imported when a stage trains,
        from trl import SFTConfig, SFTTrainer  # so that reading a finished study (notebook 03) stays light

        from setpo.trl import train_resumable

        tokenizer = build_tokenizer()
        model = build_model(tokenizer, cfg.model, seed=cfg.seed)
        rows = examples() if callable(examples) else examples  # the study's, made only when SFT trains
        if rows is None:
            rows = sft_examples(data.train, cfg.sft_solutions_per_problem, cfg.seed, log)
        log(f"[sft] {len(rows)} examples from {len(data.train)} problems, "
            f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters")
        steps_per_epoch = math.ceil(len(rows) / cfg.sft_batch_size)
        args = SFTConfig(
            output_dir=str(out_dir), num_train_epochs=cfg.sft_epochs, learning_rate=cfg.sft_lr,
            per_device_train_batch_size=cfg.sft_batch_size, lr_scheduler_type="cosine",
            warmup_steps=min(50, steps_per_epoch), weight_decay=0.01, max_length=cfg.model.max_position_embeddings,
            completion_only_loss=True,
            save_strategy="steps", save_steps=max(1, steps_per_epoch // 2), gradient_checkpointing=False,
            **_common_args(cfg))
        trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows),
                             processing_class=tokenizer)
        train_resumable(trainer, tokenizer, out_dir, final, {"examples": len(rows)}, log,
                        f"[sft]: {steps_per_epoch} steps per epoch, {cfg.sft_epochs:g} epochs")

    return train_stage(out_dir, "[sft] the warm start", "the warm start", fit_warm_start, log, identity, redo)


def train_stage(out_dir: Path, label: str, what: str, fit: Callable[[Path], None], log, identity: dict | None,
                redo: bool) -> Path:
    """The frame of every training stage (the warm start, each RL run), around ``fit(final)``, which trains
    into ``final = out_dir/final``: claim the folder at ``identity`` (``redo``: remake what was made at
    another); a stage already done is returned untrained; one recorded as done whose model is not here
    (``restore_model``: a study kept in git without its models) is trained again, its records kept, and its
    new weights checked against the recorded ones (``check_restored``). The one place a stage's folder is claimed
    at the identity. label: the log's prefix; what: the stage, in refusals. Returns the final model's folder."""
    final = out_dir / "final"
    claim_identity(out_dir, identity, redo)
    recorded = restore_model(final)
    if stage_done(final):
        return final
    kept = run_records(out_dir) if recorded is not None else {}
    if recorded is not None:
        log(f"{label}: its model is not here (a study folder keeps its records, not its models): "
            "training it again, to the recorded weights")
    fit(final)
    for ckpt in out_dir.glob("checkpoint-*"):
        shutil.rmtree(ckpt, ignore_errors=True)
    check_restored(final, recorded, what, kept)
    return final


def load_trained(model_dir: Path):
    """(tokenizer, float32 model) of a finished stage; a damaged folder is a ValueError naming it."""
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast  # the engine, when a model is loaded

    if stage_done(model_dir) and not has_model(model_dir):
        raise refusal("recorded as trained, but its model is not here (a study folder keeps its records, not its "
                      "models)", model_dir, "rerun with the stage that trains it (--stages sft,rl,eval): it is "
                      "trained again and checked against the recorded weights")
    with loading(model_dir, f"delete {Path(model_dir).parent.name} and rerun to train that stage again",
                 expected="model folder", root=Path(model_dir).parents[1]):  # damaged weights, config: one message
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(model_dir), local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True, dtype=torch.float32)
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


def train_rl(cfg: CountdownLMConfig, run: RLRun, data: CountdownData, init_dir: Path | Callable[[], Path],
             out_dir: Path, embedder=None, log=print_flushed, callbacks: Sequence = (), identity: dict | None = None,
             redo: bool = False, make_embedder: Callable[[], object] | None = None) -> Path:
    """One RL run from the warm start (GRPO, SetPO, the pairwise penalty, DRA-GRPO, Pass@k training, the
    perfect-kernel ceiling); resumes from its last checkpoint. Returns the final model's folder.

    init_dir: the warm start's final folder, or a function returning it, called only when the run trains (the
    study's trains the warm start again when its model is not here). embedder: the Embedder ``run.embedder``
    names, shared across runs (None: load it by name; "centered:..." and the ceiling's "verifier" need the
    study's, see ``resolve_embedder``); make_embedder: a function returning it instead, called only when the run
    trains, so that a finished run loads no embedder. The run's seed sets TRL's
    sampling and prompt order. callbacks: extra TrainerCallbacks (the tests use one to interrupt a run).
    identity: the run identity the folder must have been made at (None: not checked); ``redo``: remake it if
    not. Writes ``timings.json`` beside the run: seconds of generation, embedding and update (this invocation's;
    ``resumed`` says whether earlier ones did part of the run).
    """
    def fit_rl_run(final: Path) -> None:
        from datasets import Dataset  # the engine, imported when a run trains (see train_sft)

        from setpo.trl import SetPOTrainer, config_for, probe_callback, train_resumable
        from setpo.trl.training import last_checkpoint

        warm_start = init_dir() if callable(init_dir) else init_dir
        run_embedder = make_embedder() if make_embedder is not None else embedder
        out_dir.mkdir(parents=True, exist_ok=True)
        resumed = last_checkpoint(out_dir) is not None
        tokenizer, model = load_trained(warm_start)
        tokenizer.padding_side = "left"
        g = run.group_size
        per_step = cfg.rl_prompts_per_step * g  # validated by the config: a multiple of STEPS_PER_GENERATION
        args = config_for(
            run.preset, **run.trainer_settings(), output_dir=str(out_dir), learning_rate=cfg.rl_lr,
            per_device_train_batch_size=per_step // STEPS_PER_GENERATION, steps_per_generation=STEPS_PER_GENERATION,
            max_steps=cfg.rl_steps, max_completion_length=cfg.rl_max_completion_length,
            temperature=cfg.rl_temperature, top_p=1.0, lr_scheduler_type="constant", warmup_steps=0, save_strategy="steps",
            save_steps=cfg.rl_save_steps, gradient_checkpointing=False, **_common_args(cfg, run.seed))
        probes = probe_callback(probe_sampler(cfg, data.val[:cfg.n_probe], tokenizer), out_dir / "probes.jsonl",
                                cfg.probe_every)
        trainer = SetPOTrainer(model=model, reward_funcs=countdown_reward, args=args,
                               train_dataset=Dataset.from_list(rl_rows(data.train)), processing_class=tokenizer,
                               embedder=run_embedder, solution_key=solution_key, callbacks=[probes, *callbacks])
        t0 = time.time()
        train_resumable(trainer, tokenizer, out_dir, final, {"run": asdict(run)}, log,
                        f"[rl] {run.name}: {run.variant}, G={g}, beta={run.beta}, seed={run.seed}")
        write_json(out_dir / "timings.json",
                   {**trainer.setpo_seconds, "seconds": time.time() - t0, "resumed": resumed})

    return train_stage(out_dir, f"[rl] {run.name}", f"run {run.name}", fit_rl_run, log, identity, redo)


def sample_eval(cfg: CountdownLMConfig, model_dir: Path, instances: Sequence[CountdownInstance],
                temperature: float, label: str = "", log=None) -> list[list[str]]:
    """The ``cfg.eval_samples`` completions per problem an evaluation scores (seeded: sampling again gives them
    again). log: a progress line at most every 10 s."""
    tokenizer, model = load_trained(model_dir)
    progress = None if log is None else Progress(log, f"[eval] {label}: problems sampled", len(instances)).step
    return sample_completions(model, tokenizer, [prompt_text(i) for i in instances], cfg.eval_samples,
                              temperature, cfg.eval_top_p, cfg.rl_max_completion_length,
                              batch_sequences=cfg.eval_batch_sequences, seed=cfg.seed + 1, progress=progress)


def evaluate_model(cfg: CountdownLMConfig, model_dir: Path | Callable[[], Path],
                   instances: Sequence[CountdownInstance], temperature: float, path: Path, log=None,
                   texts_file: Path | None = None, identity: dict | None = None, redo: bool = False) -> dict:
    """Sample ``cfg.eval_samples`` completions per problem (``sample_eval``) and score them; cached in ``path``
    with the run identity it was made at (a cache made at another is refused, or with ``redo`` made again).
    model_dir: the model's folder, or a function training it and returning it, called only when the evaluation
    is not cached (a resumed study trains no model whose evaluations it has). texts_file: where to keep the
    completions (for the judge; None keeps none)."""
    cached = reusable_record(path, identity, redo, "delete it and rerun to evaluate again")
    if cached is not None:
        return cached
    model_dir = model_dir() if callable(model_dir) else model_dir
    t0 = time.time()
    samples = sample_eval(cfg, model_dir, instances, temperature, path.stem, log)
    if texts_file is not None:
        write_json(texts_file, samples)
    result = evaluate_samples(instances, samples)
    result.update(temperature=temperature, top_p=cfg.eval_top_p, seconds=time.time() - t0,
                  examples=[s[:4] for s in samples[:5]])
    if identity is not None:
        result["identity"] = identity
    write_json(path, result)
    return result


# --------------------------------------------------------------------------------------------------
# The study
# --------------------------------------------------------------------------------------------------


STAGES = ("sft", "rl", "eval", "judge")
SEARCHES = ("setpo", "pairwise", "dra", "passk", "ceiling")  # the validation searches, in the order they run
STUDY_OUTPUTS = ("sft", "rl", "val", "eval", "diagnostics.json", "selection.json", "results.json", "results.md",
                 "replication")
# The code that makes the study's runs (``setpo_lab.repro.provenance``): this module and all it imports, except the
# modules that only summarise, draw or judge finished runs (editing them changes no run, so it must not make
# a long study's runs unusable).
IDENTITY_MODULES = ("setpo_lab.studies.countdown",)
NOT_IN_IDENTITY = ("setpo_lab.studies.countdown_results", "setpo_lab.studies.figures", "setpo_lab.studies.static_render",
                   "setpo_lab.studies.judging", "setpo.judge")


def study_identity(cfg: CountdownLMConfig) -> dict:
    """The identity every output of this study is made at: its thread count, the code that makes its runs
    (each file's hash, with the commit and whether the tree was dirty) and the result-bearing package versions."""
    return run_identity(cfg.threads, IDENTITY_MODULES, NOT_IN_IDENTITY)


def replication_config(cfg: CountdownLMConfig) -> CountdownLMConfig | None:
    """The replication: the same study at ``cfg.replication_threads`` threads in ``<out>/replication``, its grid
    over ``cfg.replication_grid_seeds`` seeds (None: none)."""
    if not cfg.replication_threads:
        return None
    return replace(cfg, out=str(Path(cfg.out) / "replication"), threads=cfg.replication_threads, replication_threads=0,
                   grid_seeds=cfg.replication_grid_seeds)


def select_on_validation(cfg: CountdownLMConfig, grpo: dict | Sequence[dict],
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
    """The whole study, resumable: data, warm start (stage "sft"), embedder diagnostics, the validation searches
    and every RL run (seeds, cells; stage "rl"), the test split (each model once, after every search is settled)
    and the record (stage "eval"); then
    the same again as the replication (``replication_config``). Runs exactly the ``stages`` named (None: all); a
    stage whose input another stage makes refuses to start until that one has finished. Every output is made at the
    study's identity (``study_identity``): one made at another is refused naming what differs, or with ``redo``
    made again. Returns (``StudyResult``) the summary (``results.json``, the replication's inside; {} without
    "eval") and its rows by run name."""
    t0 = time.time()
    summary = _run_one(cfg, log, stages, redo)
    replica = replication_config(cfg)
    if replica is not None:
        log(f"[replication] the whole study again at {replica.threads} thread(s) in {replica.out}")
        replicated = _run_one(replica, log, stages, redo)
        if summary:
            summary = _write_summary(Path(cfg.out), with_replication(summary, replicated), log)
    runs: dict[str, list[dict]] = {}
    for row in summary.get("runs", []):
        runs.setdefault(row["name"], []).append(row)
    return StudyResult("countdown", Path(cfg.out), runs, summary, time.time() - t0)


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
    # The warm start, trained when stage "sft" runs and not done; a done one whose model is not here (a new
    # checkout of a study kept in git) is trained again only when a run or an evaluation needs it.
    warm_start = (functools.cache(lambda: train_sft(cfg, data, out / "sft", log=log, examples=examples,
                                                     identity=identity, redo=redo))
                  if "sft" in stages else lambda: sft_final)
    if "sft" in stages and not stage_done(sft_final):
        warm_start()
    if stages == ["sft"]:
        return {}
    _require(sft_final, "sft")
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

    if "rl" in stages:
        runs, chosen, selection = _train_everything(cfg, data, warm_start, log, t0, reference, identity, redo,
                                                    test_split if "eval" in stages else None)
    else:
        runs, chosen, selection = _trained_runs(cfg)
    if "eval" not in stages:
        if not judge:
            return {}
        summary = read_json(_require(out / "results.json", "eval"), "delete it and rerun --stages eval")
        return _write_summary(out, {**summary, "judged": judge_runs(cfg, data, runs, log)}, log)
    # the test split: each model once, only after every validation search is settled (made as each final run
    # finishes when stage "rl" runs too, so that a resumed study needs no model it has already evaluated)
    test_split("sft", None, warm_start, chosen)
    for run in runs:
        test_split(run.name, run, _require(out / "rl" / run.name / "final", "rl"), chosen)
    diagnostics = read_json(out / "diagnostics.json", "delete it and rerun --stages rl to diagnose again")
    summary = summarize(cfg, runs, chosen, results, selection, diagnostics, stage_timings(cfg, runs))
    if judge:
        summary["judged"] = judge_runs(cfg, data, runs, log)
    _write_summary(out, summary, log)
    log(f"[study] {out} finished in {time.time() - t0:.0f}s")
    return summary


def stage_timings(cfg: CountdownLMConfig, runs: Sequence[RLRun]) -> dict:
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
    write_json(out / "results.json", summary)
    write_text(out / "results.md", results_markdown(summary))
    log(results_markdown(summary))
    return summary


def judge_runs(cfg: CountdownLMConfig, data: CountdownData, runs: Sequence[RLRun], log=print_flushed, judge=None) -> dict:
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
    """Stage "rl": embedder diagnostics, the validation searches (GRPO, the SetPO candidates, then with the
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
            forget_run(out, run.name)
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
    setpo, selection = select_on_validation(cfg, grpo_val, {r: validate(r) for r in cfg.search_runs()})
    chosen["setpo"] = setpo
    for key, candidates in cfg.searches(setpo.embedder).items():
        if key != "setpo":
            chosen[key], selection[key] = select_on_validation(cfg, grpo_val, {r: validate(r) for r in candidates})
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


def forget_run(out: Path, name: str) -> None:
    """Delete run ``name`` of the study in ``out``: its folder and its evaluations (validation and test), so that
    it is made again as a new run (``--redo`` after a model that cannot be restored bit for bit)."""
    shutil.rmtree(out / "rl" / name, ignore_errors=True)
    for split in ("val", "eval"):
        for path in (out / split).glob(f"{name}_T*.json"):
            path.unlink()


def _trained_runs(cfg: CountdownLMConfig):
    """What stage "rl" chose, read back from ``selection.json``, for an "eval" without "rl"."""
    path = Path(cfg.out) / "selection.json"
    if not path.exists():
        raise refusal("stage 'rl' has not finished (no validation search recorded)", path,
                      "run that stage first (--stages rl), then rerun")
    selection = read_json(path, "delete it and rerun --stages rl to search again")
    setpo = next(r for r in cfg.search_runs() if r.name == selection["chosen"])
    chosen = {"setpo": setpo}
    for key, candidates in cfg.searches(setpo.embedder).items():
        if key != "setpo" and key in selection:
            chosen[key] = next(r for r in candidates if r.name == selection[key]["chosen"])
    return cfg.final_runs(chosen), chosen, selection


def parse_args(argv=None) -> tuple[CountdownLMConfig, list[str], bool]:
    """The config and stages a command line asks for, every value checked before any work starts."""
    p = Parser(prog="python -m setpo_lab.studies.countdown", description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--full", action="store_true", help="the study at its documented size")
    mode.add_argument("--smoke", action="store_true", help="toy size, seconds")
    p.add_argument("--out", default=None, help="output folder (default results/countdown, kept in git without its "
                                               "models, or runs/countdown_smoke)")
    add_stage_and_set_arguments(p, STAGES, "rl_steps=100 'rl_seeds=[0,1,2,3,4]' 'search_embedders=[\"hash\"]'")
    judging.add_judge_arguments(p)
    p.add_argument("--redo", action="store_true",
                   help="remake what was made at another thread count, code or package versions (refused otherwise)")
    a = p.parse_args(argv)
    stages = parsed_stages(p, a.stages, STAGES)
    overrides = set_overrides(p, a.set, {f.name for f in fields(CountdownLMConfig)})
    overrides.update(judging.judge_overrides(a, p, stages))
    try:
        if a.smoke:
            cfg = CountdownLMConfig.smoke(**({"out": a.out} if a.out else {}), **overrides)
        else:
            cfg = CountdownLMConfig(**({"out": a.out} if a.out else {}), **overrides)
        if a.full:  # a study of several sittings, on whatever machine each gets: one floating-point path
            require_pinned("python -m setpo_lab.studies.countdown --full")
    except (TypeError, ValueError) as e:
        p.error(str(e))
    return cfg, stages, a.redo


def run_command(cfg: CountdownLMConfig, stages: Sequence[str], redo: bool) -> int:
    """``run_study`` for a command line already parsed (``parse_args``): exit status 0, or 1 with a refusal
    (another config's folder, a stage not run, a judge down) as one line on stderr."""
    try:
        run_study(cfg, stages=stages, redo=redo)
    except ValueError as err:
        print(f"python -m setpo_lab.studies.countdown: error: {err}", file=sys.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    """``python -m setpo_lab.studies.countdown ARGS``: the arguments parsed once, then the study."""
    return run_command(*parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
