"""The short-answer study (notebook 04): does GRPO narrow a real model's answers, and does SetPO keep them?

Two commands. ``base`` measures the base model on every task kind of ``setpo.envs.short_answers`` (the table that
chose the family); ``study`` trains GRPO and SetPO+GRPO over paired seeds and compares them.

**The base table.**

A task family is in a model's competence zone when RL has a signal from the first step: a mean reward between
about 0.15 and 0.6, and most groups of G rollouts mixed (some right, some wrong), since a group whose rollouts
all score alike gets advantage 0 under GRPO. ``_base_table`` measures, per task kind and sampling temperature,
on ``per_kind`` training prompts × ``n`` samples of the base model:

- ``reward``: the mean 0/1 reward;
- ``mixed_groups``: the expected share of prompts whose group of ``group_size`` rollouts (drawn from the n
  samples without replacement) holds both a right and a wrong answer;
- ``distinct_right``: distinct right answers per prompt among the n samples (for many-answer kinds the
  quantity that mode collapse lowers);
- ``answer_line``: the share of samples whose first line is ``Answer: N`` (right or wrong);
- ``truncated``: the share of samples that reached ``max_new_tokens`` without ending (re-tokenised text).

``python -m setpo_lab run short_answers_base --out results/short_answers`` writes ``base_model.json`` (every
number and the settings) and ``base_model.md`` (the table). Samples of each (kind, temperature) are kept in
``OUT/base_samples/`` as they finish, so a stopped run resumes where it was; the folder is claimed for one
configuration (``setpo_lab.studies.stages.claim_folder``).

**The study.**

SmolLM2-135M-Instruct (``setpo.models``) learns the tasks of ``setpo.envs.short_answers`` with GRPO and with
SetPO+GRPO from the same base model, over paired seeds: a seed fixes the prompt order and the first step's
rollouts, which are then the same for both methods. Stages (each resumable; a finished piece is never redone):

- ``train``: every (method, seed) run, ``cfg.steps`` optimizer steps of ``prompts_per_step`` prompts × G
  rollouts (``setpo.trl.train_resumable``: checkpoints, ``log_history.json``, ``probes.jsonl``: samples of
  fixed validation prompts with many right answers every ``probe_every`` steps, the distinct-answers curve);
- ``evaluate``: the base model and every trained model, ``eval_n`` samples of each test prompt at the training
  temperature, from one sampling seed (the same random numbers for every model); their answers, texts and
  within-prompt similarity go to ``eval/<label>.json``;
- ``report``: ``short_answers_results.report``: tables with 95% intervals paired over seeds, the figures.

Choices (docs/studies/short_answers.md says why): GRPO's loss settings from ``setpo.trl.config_for("grpo")``
with β = 0 and a constant learning rate; SetPO's λ in units of its term's spread over the batch
(``setpo_lambda_units="term_std"``, the Countdown study's choice, λ = 0.15σ), since with the paper's absolute
λ = 0.05 the term is ~0.05 × 0.013 of an advantage here and cannot act; the loss runs each prompt once
(``setpo_share_prompt_pass``), one micro-batch per step, bf16 autocast (the CPU's bf16 matrix units).

``python -m setpo_lab run short_answers --preset committed --out results/short_answers/study`` makes the
committed record; ``--preset notebook`` is the size of notebook 04's own run and ``--preset smoke`` the test's.
``--rerun grpo_s0`` trains one recorded run again in a scratch folder and says whether it came back bit for bit.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, fields, replace
from pathlib import Path

from setpo.envs.short_answers import (MANY_ANSWER_KINDS, TaskSpec, parse_answer, sample_tasks,
                                      task_messages, to_trl_records)
from setpo.metrics import pass_at_k
from setpo.records import read_json, write_json
from setpo_lab.studies.short_answers_config import (PROG, REUSE_NEUTRAL_FIELDS, BaseTableConfig, CureStudyConfig,
                                                    ShortAnswerStudyConfig)
from setpo_lab.studies.arguments import StudyCommand, flags_as_set, run_command
from setpo_lab.studies.engine import probe_sampler, sample_evaluation, train_setpo, train_stage
from setpo_lab.studies.toolkit import chat_prompts, load_model, model_folder
from setpo_lab.studies.trainer_arguments import rl_trainer_args
from setpo_lab.studies.stages import (StudyResult, cached_evaluation, chosen_stages,
                                      claim_folder, print_flushed, refusal, stage_done)
from setpo.trl.rewards import short_answer_reward


def _mixed_share(n: int, right: int, g: int) -> float:
    """Probability that g of n samples drawn without replacement, ``right`` of them right, are not all alike."""
    if g > n:
        raise ValueError(f"group_size {g} exceeds the {n} samples per prompt")
    alike = math.comb(right, g) + math.comb(n - right, g)
    return 1.0 - alike / math.comb(n, g)


def _kind_row(tasks: list[TaskSpec], samples: list[list[str]], lengths: list[list[int]], cfg: BaseTableConfig) -> dict:
    """One row of the table: a kind's numbers over its prompts' samples (texts and their token counts)."""
    rewards, distinct, mixed, answered, cut = [], [], [], 0, 0
    for task, texts, lens in zip(tasks, samples, lengths, strict=True):
        values = [parse_answer(t) for t in texts]
        right = [task.is_right(v) for v in values]
        rewards += right
        distinct.append(len({v for v, ok in zip(values, right) if ok}))
        mixed.append(_mixed_share(len(texts), sum(right), cfg.group_size))
        answered += sum(v is not None for v in values)
        cut += sum(k >= cfg.max_new_tokens for k in lens)
    count = len(rewards)
    n = min(len(texts) for texts in samples)
    # pass@n: the share of prompts with a right answer among their n samples (unbiased, Chen et al. 2021)
    passed = [pass_at_k(len(texts), sum(task.is_right(parse_answer(t)) for t in texts), n)
              for task, texts in zip(tasks, samples)]
    return {"prompts": len(tasks), "samples": count, "reward": sum(rewards) / count,
            "pass_at_n": sum(passed) / len(passed), "mixed_groups": sum(mixed) / len(mixed),
            "distinct_right": sum(distinct) / len(distinct), "answer_line": answered / count, "truncated": cut / count}


def _base_table(cfg: BaseTableConfig, out: str | Path, *, log=print_flushed) -> dict:
    """Measure the base model on every kind at every temperature (see the module docstring); returns the record
    that ``base_model.json`` holds."""
    import torch

    from setpo_lab.studies.sampling import sample_completions

    out = Path(out)
    model_dir = base_model_folder(cfg.model_path)  # before the folder is claimed: a bad path leaves nothing
    claim_folder(out / "base_samples", asdict(cfg))
    tok, model = load_model(model_dir, torch.float32, remedy=MODEL_REMEDY)
    rows = []
    for temperature in cfg.temperatures:
        for kind in cfg.kinds:
            tasks = sample_tasks([kind], cfg.split, cfg.per_kind, cfg.seed)
            cache = out / "base_samples" / f"{kind}_T{temperature}.json"
            if cache.exists():
                samples = read_json(cache, "delete it and rerun to sample this kind again")["samples"]
            else:
                started = time.perf_counter()
                samples = sample_completions(model, tok, chat_prompts(tok, tasks, task_messages), n=cfg.n,
                                             temperature=temperature, max_new_tokens=cfg.max_new_tokens, seed=cfg.seed,
                                             add_special_tokens=False, share_prompt=True)
                cache.write_text(json.dumps({"questions": [t.question for t in tasks], "samples": samples,
                                             "seconds": time.perf_counter() - started}))
            lengths = [[len(tok(s, add_special_tokens=False)["input_ids"]) for s in texts] for texts in samples]
            row = {"kind": kind, "temperature": temperature, **_kind_row(tasks, samples, lengths, cfg)}
            log(f"T={temperature} {kind}: reward {row['reward']:.2f}, mixed groups {row['mixed_groups']:.2f}, "
                f"distinct right {row['distinct_right']:.1f}, truncated {row['truncated']:.2f}")
            rows.append(row)
    record = {"config": asdict(cfg), **_model_record(model_dir), "rows": rows, "command": _base_command(cfg, out)}
    (out / "base_model.json").write_text(json.dumps(record, indent=1) + "\n")
    (out / "base_model.md").write_text(_base_table_markdown(record))
    return record


def _base_command(cfg: BaseTableConfig, out: str | Path) -> str:
    """The command line that makes ``cfg``'s table in ``out`` (the options that differ from the defaults)."""
    default, parts = BaseTableConfig(), [f"{BASE_COMMAND.prog} --out {out}"]
    if cfg.model_path:
        parts.append(f"--model-path {cfg.model_path}")
    changed = [f"{name}={','.join(map(str, value)) if isinstance(value, tuple) else value}"
               for name in ("per_kind", "n", "kinds", "temperatures")
               if (value := getattr(cfg, name)) != getattr(default, name)]
    return " ".join(parts + (["--set", *changed] if changed else []))


def _model_record(model_dir: Path) -> dict:
    """How a record names the model it was made with, without a machine path: ``model``, the packaged model's
    name ("smollm2-135m-instruct"), else the folder relative to the working directory when inside it (a trained
    run: "results/short_answers/study/train/grpo_s0/final"), else the folder's own name; and ``model_identity``
    (``setpo_lab.studies.sampling.model_identity``: weights, tokenizer, chat template, stop ids), which tells whether
    a record was made by the model now in a folder."""
    from setpo.models import CACHE_DIR, DEFAULT_MODEL
    from setpo_lab.studies.sampling import model_identity

    folder, here = Path(model_dir).resolve(), Path.cwd().resolve()
    name = (DEFAULT_MODEL if folder == (CACHE_DIR / DEFAULT_MODEL).resolve()
            else str(folder.relative_to(here)) if folder.is_relative_to(here) else folder.name)
    return {"model": name, "model_identity": model_identity(folder)}


def _reused_evaluation(record: dict, path: Path, model_dir: Path) -> dict:
    """An evaluation record read back, reused only if the model now in ``model_dir`` made it: its recorded
    ``model_identity`` must match (a model that is not here, e.g. a clone's run without its weights, is not
    compared). A record made before identities were recorded (a machine path in ``model``) gets the model's
    name and identity written in when the model is here; its numbers stay as they are."""
    if not (Path(model_dir) / "config.json").is_file():
        return record
    now = _model_record(model_dir)
    if "model_identity" in record:
        if now["model_identity"] is not None and record["model_identity"] != now["model_identity"]:
            raise refusal(f"was made by another model than the one now in {now['model']}", path,
                          "delete it and rerun to evaluate this model")
    elif Path(str(record.get("model", ""))).is_absolute():
        record.update(now)
        write_json(path, record)
    return record


def _base_table_markdown(record: dict) -> str:
    cfg = record["config"]
    lines = [f"Base model on the short-answer tasks: {cfg['per_kind']} {cfg['split']} prompts per kind × "
             f"{cfg['n']} samples, at most {cfg['max_new_tokens']} new tokens, mixed groups at G = "
             f"{cfg['group_size']}. Made by `{record['command']}`.", "",
             f"| kind | T | reward | pass@{cfg['n']} | mixed groups | distinct right / prompt | answer line | truncated |",
             "|---|---|---|---|---|---|---|---|"]
    for r in record["rows"]:
        passed = f"{r['pass_at_n']:.2f}" if "pass_at_n" in r else "–"  # records made before pass@n was measured
        lines.append(f"| {r['kind']} | {r['temperature']} | {r['reward']:.2f} | {passed} | {r['mixed_groups']:.2f} | "
                     f"{r['distinct_right']:.1f} | {r['answer_line']:.2f} | {r['truncated']:.2f} |")
    return "\n".join(lines) + "\n"


STAGES = ("train", "evaluate", "report")


def _probe_tasks(cfg: ShortAnswerStudyConfig) -> list[TaskSpec]:
    """Validation prompts with many right answers, sampled during training (distinct answers, trajectories)."""
    kinds = [k for k in cfg.kinds if k in MANY_ANSWER_KINDS] or list(cfg.kinds)
    return sample_tasks(kinds, "val", cfg.probe_per_kind, seed=0)


def base_model_folder(model_path: str | None) -> Path:
    """The base model: ``model_path`` (it must exist) or the packaged SmolLM2 (prepared once). A missing folder is
    a ValueError, so that a study command refuses it in one line (exit status 1), not with a traceback."""
    try:
        return model_folder(model_path, remedy="give a local model folder, or leave model_path None for the packaged "
                                               "SmolLM2-135M-Instruct (`python -m setpo.models prepare "
                                               "smollm2-135m-instruct DIR` makes one)")
    except FileNotFoundError as e:
        raise ValueError(str(e)) from None


#: what to do with a model folder that does not load
MODEL_REMEDY = "give an intact model folder (a trained run's: delete the run and rerun)"


def _sampling_settings(cfg: ShortAnswerStudyConfig) -> dict:
    """How the study samples a prompt's completions, in training's probes and in every evaluation
    (``setpo_lab.studies.sampling.sample_completions``): at the training temperature, each prompt run once and its
    samples continued from copies of its cache."""
    return dict(temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens, batch_sequences=256,
                add_special_tokens=False, share_prompt=True)


def trainer_args(cfg: ShortAnswerStudyConfig, settings: dict, seed: int, output_dir: Path):
    """The ``SetPOConfig`` of one run: the study's GRPO settings and the method's ``settings``
    (``cfg.trainer_settings``: λ, and for the cure study's arms what the kernel reads, the gate, the estimator)."""
    return rl_trainer_args(
        "grpo", output_dir, seed=seed, save_steps=cfg.save_steps, bf16=cfg.bf16,
        **{"setpo_lambda_units": cfg.lam_units, "embedder": cfg.embedder, **settings},
        num_generations=cfg.group_size, temperature=cfg.temperature, max_completion_length=cfg.max_new_tokens,
        beta=0.0, learning_rate=cfg.lr, max_steps=cfg.steps,
        per_device_train_batch_size=cfg.prompts_per_step * cfg.group_size, gradient_accumulation_steps=1,
        setpo_share_prompt_pass=True, gradient_checkpointing=False)


def _require_bf16_units(cfg: ShortAnswerStudyConfig, what: str) -> None:
    """Refuse bf16 work (``cfg.bf16``, as every committed short-answer record was made) on a CPU without bf16 matrix
    units: there it runs hundreds of times slower (409 s a training step where the records took about 10), and a
    model trained again there need not round as the recorded one did. A ValueError that says what to do."""
    from setpo_lab.repro.arithmetic import bf16_matrix_units

    if cfg.bf16 and not bf16_matrix_units():
        raise ValueError(
            f"{what} runs in bf16 (the config's bf16=True, as the committed short-answer records were made), and this "
            "CPU has no bf16 matrix units (AVX512-BF16 or AMX), so bf16 matrix products run hundreds of times slower "
            "here and a model trained here need not round as a recorded one did. Run it on a CPU that has them "
            "(`grep -ow 'avx512_bf16\\|amx_bf16' /proc/cpuinfo` prints their names), or, for a new run that is not "
            "a committed record's, use the config with bf16=False (dataclasses.replace(cfg, bf16=False)).")


def train_run(cfg: ShortAnswerStudyConfig, label: str, embedder=None, log=print_flushed,
              need_model: bool = True) -> Path:
    """Train one run of ``cfg.run_labels()`` (resumable; ``engine.train_stage``); returns its ``final/`` folder.

    A run recorded as done whose model is not here (git keeps a study's records, not its models) is trained
    again only when ``need_model`` (its evaluation is still to do), and must then give the recorded weights bit
    for bit (``stages.restore_model`` / ``check_restored``), or it is refused and nothing is made from it."""
    method, seed = cfg.run_labels()[label]
    settings = cfg.trainer_settings(method)
    out = cfg.run_folder(label)

    def fit(final: Path) -> None:
        import torch

        tokenizer, model = load_model(base_model_folder(cfg.model_path), torch.float32, remedy=MODEL_REMEDY)
        probes = _probe_tasks(cfg)

        def record(j: int, task: TaskSpec, text: str) -> dict:
            return {"probe": j, "question": task.question, "task_id": task.task_id, "text": text,
                    "answer": parse_answer(text), "reward": float(task.is_right(parse_answer(text)))}

        args = trainer_args(cfg, settings, seed, out)
        train_setpo(out, final, model=model, tokenizer=tokenizer, args=args, reward=short_answer_reward,
                    rows=to_trl_records(cfg.train_tasks()),
                    embedder=embedder if args.embedder == cfg.embedder else None,
                    probes=probe_sampler(tokenizer, probes, chat_prompts(tokenizer, probes, task_messages),
                                         cfg.probe_samples, record, seed=cfg.eval_seed, **_sampling_settings(cfg)),
                    probe_every=cfg.probe_every, probes_at_end=True,
                    record={"label": label, "method": method, "seed": seed, "lam": settings["setpo_lambda"]}, log=log,
                    describe=f"[{label}] {method}, seed {seed}, {cfg.steps} steps of {cfg.prompts_per_step} "
                             f"prompts × G={cfg.group_size}", heartbeat_label=f"[{label}]")

    return train_stage(out, f"[{label}]", f"run {label}", fit, log, need_model=need_model,
                       can_train=lambda: _require_bf16_units(cfg, f"training run {label}"))


def evaluate_answers(cfg: ShortAnswerStudyConfig, label: str, model_dir: Path, embedder, log=print_flushed, *,
                     tasks: Sequence[TaskSpec] | None = None, n: int | None = None, folder: str = "eval") -> dict:
    """``n`` (default ``eval_n``) samples of every prompt of ``tasks`` (default: the study's test prompts) from
    one model: answers, texts and within-prompt similarity, cached in ``<folder>/<label>.json`` (of the folder
    the run is reused from, for a reused run's study evaluation) and reused only if that model made it."""
    import torch

    from setpo.metrics import mean_pairwise_similarity

    path = cfg.eval_path(label, folder)

    def evaluate() -> dict:
        chosen = cfg.eval_tasks() if tasks is None else list(tasks)
        _require_bf16_units(cfg, f"evaluating {label}")
        # bf16 weights: sampling is 2x the float32 rate on a CPU with bf16 matrix units; every model alike
        tokenizer, model = load_model(model_dir, torch.bfloat16 if cfg.bf16 else torch.float32, remedy=MODEL_REMEDY)
        started = time.perf_counter()
        texts = sample_evaluation(model, tokenizer, chat_prompts(tokenizer, chosen, task_messages),
                                  cfg.eval_n if n is None else n, seed=cfg.eval_seed, log=log, label=f"eval {label}",
                                  **_sampling_settings(cfg))
        return {"label": label, **_model_record(model_dir), "task_ids": [t.task_id for t in chosen],
                "answers": [[parse_answer(x) for x in xs] for xs in texts], "texts": texts,
                "similarity": [mean_pairwise_similarity(embedder(xs)) if len(xs) > 1 else None for xs in texts],
                "seconds": time.perf_counter() - started}

    return cached_evaluation(path, evaluate, reuse=lambda kept: _reused_evaluation(kept, path, model_dir),
                             remedy=f"delete {path} and rerun to evaluate {label} again")


def _rerun_check(cfg: ShortAnswerStudyConfig, label: str, scratch: str | Path, log=print_flushed) -> dict:
    """Train run ``label`` again in ``scratch`` (same config, a fresh folder) and compare it with the recorded
    run: its weights (SHA-256 in ``done.json``) and every logged step. Returns {"label", "same_weights",
    "steps_compared", "differing_steps" (step -> keys whose values differ)}; on one machine and thread count a
    run is expected to come back bit for bit."""
    if label not in cfg.run_labels():
        raise ValueError(f"unknown run {label!r}; runs: {', '.join(cfg.run_labels())}")
    recorded_dir = cfg.run_folder(label)  # a reused run's record is in the folder it is reused from
    if not stage_done(recorded_dir / "final"):
        raise ValueError(f"run {label} has no record to compare with: {recorded_dir / 'final'}; train it first")
    # trained here, never into a reused folder
    again = replace(cfg, run_dir=str(scratch), **({"reuse_from": None} if hasattr(cfg, "reuse_from") else {}))
    final = train_run(again, label, log=log)
    recorded = read_json(recorded_dir / "final" / "done.json")
    fresh = read_json(final / "done.json")
    old_log = read_json(recorded_dir / "log_history.json")
    new_log = read_json(Path(scratch) / "train" / label / "log_history.json")
    timing = ("step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second")
    # every value the record logged must come back; a metric logged only by newer code (the exploit monitor's, say)
    # is not a difference in the run
    differing = {a.get("step"): keys for a, b in zip(old_log, new_log, strict=True)
                 if (keys := sorted(k for k in a if k not in timing and a.get(k) != b.get(k)))}
    result = {"label": label, "same_weights": recorded["weights_sha256"] == fresh["weights_sha256"],
              "steps_compared": len(old_log), "differing_steps": differing}
    log(f"[{label}] trained again: weights {'identical' if result['same_weights'] else 'DIFFERENT'} "
        f"(SHA-256), {len(old_log) - len(differing)}/{len(old_log)} logged steps identical")
    return result


def rerun_status(cfg: ShortAnswerStudyConfig, label: str) -> int:
    """``--rerun LABEL`` of a short-answer command: ``_rerun_check`` in a temporary folder; the exit status, 0 when
    the run came back bit for bit, else 1."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="setpo_rerun_") as scratch:
        again = _rerun_check(cfg, label, scratch)
    return 0 if again["same_weights"] and not again["differing_steps"] else 1


def run_study(cfg: ShortAnswerStudyConfig, stages: Sequence[str] | str | None = None, *,
              log=print_flushed) -> StudyResult:
    """The study's stages (None: all); each finished piece is reused. With both train and evaluate, each run is
    evaluated as soon as it is trained (the base model first). The extended study (``CureStudyConfig``) first checks
    the runs it reuses, and evaluates the base model and ``hard_labels`` on its pass@k prompts too
    (``extra_evaluations``: the confirmatory study adds its held-out kinds). Returns (``StudyResult``) each run's
    final model folder by label and, when "report" ran, the results record (``results.json``)."""
    from setpo.embed import load_embedder

    t0 = time.time()
    chosen = chosen_stages(stages, STAGES)
    if cfg is None:
        raise ValueError("run_study needs a ShortAnswerStudyConfig, got None")
    if cfg.model_path is not None:  # a missing one is refused before the folder is claimed
        base_model_folder(cfg.model_path)
    claim_folder(cfg.run_dir, asdict(cfg), REUSE_NEUTRAL_FIELDS, record="config.json", results=cfg.RESULTS,
                 remedy="use another --out, or delete that folder and rerun")
    cfg.check_reusable()
    embedder = load_embedder(cfg.embedder)
    extra = cfg.extra_evaluations()
    finals = {label: cfg.run_folder(label) / "final" for label in cfg.run_labels()}

    def evaluated(label: str) -> bool:
        return cfg.eval_path(label).exists() and all(cfg.eval_path(label, folder).exists()
                                                     for folder, _, _, labels in extra if label in labels)

    def evaluate(label: str, model: Path) -> None:
        if label != "base" and not stage_done(model):
            raise ValueError(f"run {label} is not trained: {model}; run the train stage first")
        evaluate_answers(cfg, label, model, embedder, log)
        for folder, tasks, n, labels in extra:
            if label in labels:
                evaluate_answers(cfg, label, model, embedder, log, tasks=tasks, n=n, folder=folder)

    # the base model first, then each run evaluated as soon as it is trained: a sitting that stops part way leaves
    # every finished run with its evaluations (git keeps those, not the models, which another sitting would retrain)
    if "evaluate" in chosen:
        evaluate("base", base_model_folder(cfg.model_path))
    for label in cfg.run_labels():
        if "train" in chosen:
            finals[label] = train_run(cfg, label, embedder=embedder, log=log,
                                      need_model="evaluate" in chosen and not evaluated(label))
        if "evaluate" in chosen:
            evaluate(label, finals[label])
    summary = _results_module(cfg).report(cfg, log=log) if "report" in chosen else {}
    name = "short_answers_cure" if isinstance(cfg, CureStudyConfig) else "short_answers"
    return StudyResult(name, Path(cfg.run_dir), finals, summary, time.time() - t0)


def _results_module(cfg: ShortAnswerStudyConfig):
    """The module that reports ``cfg``'s study: ``short_answers_cure_results`` for the extended study (a
    ``CureStudyConfig``, the confirmatory one's too), else ``short_answers_results``."""
    from setpo_lab.studies import short_answers_cure_results, short_answers_results

    return short_answers_cure_results if isinstance(cfg, CureStudyConfig) else short_answers_results


def _base_config(**values) -> BaseTableConfig:
    """``--set`` fields of the base table; kinds and temperatures also as comma-separated text or one number."""
    for name, kind in (("kinds", str), ("temperatures", float)):
        value = values.get(name)
        if isinstance(value, (str, int, float)):
            try:
                values[name] = tuple(kind(v) for v in str(value).split(","))
            except ValueError:
                raise ValueError(f"{name}: expected comma-separated {kind.__name__} values, got {value!r}") from None
        elif isinstance(value, list):
            values[name] = tuple(value)
    return BaseTableConfig(**values)


def _run_base(cfg: BaseTableConfig, stages: Sequence[str], args) -> int:
    _base_table(cfg, args.out)
    return 0


def run_extended(cfg: ShortAnswerStudyConfig, stages: Sequence[str], args) -> int:
    """A short-answer study from its command line: ``--rerun LABEL`` (``rerun_status``), or the stages, then the
    report's table (and, with ``--figures DIR``, its figures)."""
    if args.rerun:
        return rerun_status(cfg, args.rerun)
    result = run_study(cfg, stages)
    if result.summary:
        results = _results_module(cfg)
        print(results.results_markdown(result.summary), flush=True)
        if getattr(args, "figures", None):  # the committed study's figures (only its command has --figures)
            results.write_figures(cfg, result.summary, Path(args.figures), command=" ".join([PROG, *args.argv]))
    return 0


#: ``python -m setpo_lab run short_answers --preset committed --out DIR``: GRPO vs SetPO+GRPO over paired seeds
COMMAND = StudyCommand("short_answers", ShortAnswerStudyConfig.presets(), STAGES, run_extended,
                       default_preset="committed", fields=frozenset(f.name for f in fields(ShortAnswerStudyConfig)),
                       options=("model_path", "rerun", "figures"), doc=__doc__)
BASE_FLAGS = ("--per-kind", "--n", "--kinds", "--temperatures")
#: ``python -m setpo_lab run short_answers_base --out DIR --set n=64 kinds=add_3x2,times_2x1``: the base model on
#: every task kind (base_model.json / .md)
BASE_COMMAND = StudyCommand("short_answers_base", {"default": _base_config}, ("evaluate",), _run_base,
                            default_preset="default", folder=None,
                            fields=frozenset(f.name for f in fields(BaseTableConfig)) - {"model_path"},
                            options=("model_path",), doc="Measure the base model on every task kind.")

if __name__ == "__main__":  # also the recorded forms `... short_answers study ARGS` and `... base --n 64 ...`
    sub, rest = (sys.argv[1:2] or [""])[0], sys.argv[2:]
    if sub == "base":  # the base table's --per-kind, --n, --kinds, --temperatures are --set fields now
        rest = flags_as_set(rest, BASE_FLAGS)
    sys.exit(run_command(BASE_COMMAND if sub == "base" else COMMAND, rest if sub in ("base", "study") else None))
