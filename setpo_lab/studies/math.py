"""Training and evaluation on math word problems with TRL: the math study behind notebook 06.

GRPO vs SetPO+GRPO (GSPO / DAPO one switch away, ``setpo.presets``) on one machine with TRL's
``GRPOTrainer`` (``setpo.trl.SetPOTrainer``), vLLM for generation when there is a GPU, and a tiny randomly
initialised Qwen2 model with a character-level ChatML tokenizer on a CPU, where the numbers mean nothing
but every code path runs. Data, template and reward come from ``setpo.envs.math``.

Laid out like the other studies: the config in ``math_config`` (``MathRunConfig``, the paper's run settings
as defaults), the stages here (data: ``load_study_problems``; "train": ``_train_rl`` per run, ``train_runs`` for
both; "evaluate": ``evaluate_avg_at_k``, avg@k, and ``evaluate_pass_at_k``; "judge", only with a judge configured:
``judge_runs``, the LLM-judged diversity of each run's evaluation responses; ``run_study`` runs them, ``COMMAND``
is ``python -m setpo_lab run math``), the figures and tables in ``math_results``.
Each run folder is claimed for one configuration (``run_config.json``, ``setpo_lab.studies.stages.claim_folder``):
a rerun with another one is refused, naming the fields. transformers, TRL, datasets and vLLM are imported
inside the functions that use them: importing this module (for its config or its figures) must stay light.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, fields, replace
from pathlib import Path

import torch

from setpo.envs.math import (MathProblem, gsm8k_file, load_math_problems, math_reward, qwen_math_messages,
                             smoke_problems, to_trl_records)
from setpo.metrics import pass_at_k
from setpo.records import read_json, write_json
from setpo_lab.studies import judging
from setpo_lab.studies.arguments import StudyCommand, run_command
from setpo_lab.studies.engine import probe_sampler, sample_evaluation, train_setpo, train_stage
from setpo_lab.studies.math_config import REUSE_NEUTRAL_FIELDS, MathRunConfig
from setpo_lab.studies.figures import save_table
from setpo_lab.studies.math_results import config_record, results_record, results_table
from setpo_lab.studies.sampling import batch_prompts, model_identity
from setpo_lab.studies import toolkit
from setpo_lab.studies.toolkit import chat_prompts, model_folder
from setpo_lab.studies.trainer_arguments import rl_trainer_args
from setpo_lab.studies.stages import (StudyResult, cached_evaluation, chosen_stages, claim_folder,
                                      print_flushed, sittings_seconds)
from setpo.trl.tiny_models import make_tiny_model
from setpo.trl.rewards import math_reward_func

STAGES = ("train", "evaluate", "judge")
#: a run folder's record of the seconds each training sitting took (``stages.heartbeat``)
CLOCK_FILE = "sittings.json"
#: sequences per generation batch when an evaluation samples with ``generate`` (one prompt's n when n is larger)
EVAL_BATCH_SEQUENCES = 64


#: what to do with a model folder that cannot be loaded (``load_tokenizer``, ``load_model``)
MODEL_REMEDY = "give an intact model folder (MODEL_PATH; a trained one: delete its run folder and rerun)"


def load_tokenizer(model_path: str | Path, tiny: bool = False):
    """The model's tokenizer (``toolkit.load_tokenizer``; ``tiny``: the tiny random model's, read as saved),
    left-padded for generation; it must have a chat template."""
    tok = toolkit.load_tokenizer(model_path, remedy=MODEL_REMEDY, tiny=tiny)
    if tok.chat_template is None:
        raise ValueError(f"the tokenizer at {model_path} has no chat template; the Qwen-Math prompt needs one")
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(model_path: str | Path, dtype):
    """The causal LM in the folder ``model_path`` (``toolkit.load_causal_lm``), refused like ``load_tokenizer``."""
    return toolkit.load_causal_lm(model_path, dtype, remedy=MODEL_REMEDY)


def _in_fresh_process(fn, *args, **kwargs):
    """Run ``fn(*args, **kwargs)`` in a newly spawned Python process and return its result.

    Used for everything that starts a vLLM engine: an engine keeps its GPU memory and distributed state until
    its process exits, so each training run and each evaluation gets its own process and the next one
    starts clean.
    """
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args, **kwargs).result()


def _folder_name(label: str) -> str:
    """The folder (and file-name part) of a run label: ``SetPO+GRPO λ=0.15σ`` -> ``SetPO_GRPO_lam0.15sd``."""
    name = label.replace("+", "_").replace(" λ=", "_lam").replace("σ", "sd")
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)


def resolve_model_path(cfg: MathRunConfig) -> Path:
    """MODEL_PATH if given (it must exist), else the packaged model (``setpo.models.prepared_folder``: prepared the
    first time, a one-line install instruction when its package is missing), else the tiny model under ``run_dir``."""
    return model_folder(cfg.model_path, packaged=cfg.packaged_model,
                        otherwise=lambda: make_tiny_model(Path(cfg.run_dir) / "tiny_model", seed=cfg.seed),
                        remedy="set MODEL_PATH to a local copy, e.g. `huggingface-cli download Qwen/Qwen2.5-Math-1.5B "
                               "--local-dir <dir>`, or on a CPU `python -m setpo.models prepare smollm2-135m-instruct "
                               "<dir>` (a real 135M instruct model from a package), or leave it None for the tiny "
                               "random model")


def _problems(name: str | None, limit: int | None, generated: int, seed: int) -> list[MathProblem]:
    """The first ``limit`` problems (all without one) of a data file setting (``"gsm8k:train"`` / ``"gsm8k:test"``
    name the repository's GSM8K; anything else is a path), or, without one, ``limit`` (else ``generated``)
    generated problems seeded ``seed``."""
    if not name:
        return smoke_problems(limit or generated, seed=seed)
    return load_math_problems(gsm8k_file(name.split(":", 1)[1]) if name.startswith("gsm8k:") else name, limit=limit)


def load_study_problems(cfg: MathRunConfig) -> tuple[list[MathProblem], list[MathProblem]]:
    """(train, validation) problems from TRAIN_FILE / VAL_FILE, or generated ones."""
    return (_problems(cfg.train_file, cfg.train_limit, 256, cfg.seed),
            _problems(cfg.val_file, cfg.val_limit, 64, cfg.seed + 1))


def _trl_args(cfg: MathRunConfig, lam: float, output_dir: str | Path, units: str = "absolute"):
    """The ``setpo.trl`` config of one run: the preset's loss settings, the paper's sampling, our batch shape."""
    on_gpu = torch.cuda.is_available()
    extra = {} if cfg.lr is None else {"learning_rate": cfg.lr}
    if cfg.uses_vllm():
        extra.update(use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=cfg.vllm_gpu_memory_utilization)
    return rl_trainer_args(
        cfg.algo, output_dir, seed=cfg.seed, save_steps=cfg.save_steps, on_cpu=not on_gpu, bf16=on_gpu,
        setpo_lambda=lam, setpo_lambda_units=units, embedder=cfg.embedder, num_generations=cfg.num_generations,
        temperature=cfg.temperature, max_completion_length=cfg.max_completion_length, beta=cfg.beta,
        per_device_train_batch_size=cfg.micro_batch,
        gradient_accumulation_steps=cfg.prompts_per_step * cfg.num_generations // cfg.micro_batch,
        num_train_epochs=cfg.num_train_epochs, max_steps=cfg.max_steps,
        gradient_checkpointing=on_gpu and not cfg.tiny, **extra)


def _math_probes(cfg: MathRunConfig, probes: Sequence[MathProblem], tokenizer):
    """What a run samples at its probes (``engine.probe_sampler``): responses to fixed probe questions, as
    {"probe", "question", "answer", "text", "reward"} records."""
    def record(j: int, prob: MathProblem, text: str) -> dict:
        return {"probe": j, "question": prob.question, "answer": prob.answer, "text": text,
                "reward": math_reward(text, prob.answer)}

    return probe_sampler(tokenizer, probes, chat_prompts(tokenizer, [p.question for p in probes], qwen_math_messages),
                         cfg.probe_samples, record, seed=cfg.seed, temperature=cfg.temperature, top_p=1.0,
                         max_new_tokens=cfg.max_completion_length, batch_sequences=64, add_special_tokens=False)


def _train_rl(cfg: MathRunConfig, label: str, lam: float, train: Sequence[MathProblem],
              probes: Sequence[MathProblem], embedder=None, callbacks: Sequence = (), log=print,
              units: str = "absolute") -> Path:
    """Train one run (λ = 0: the baseline; λ in ``units``) from the base model; resumes from its last checkpoint.
    A heartbeat line every 10 s (``log``) shows a long step is alive.

    Writes under ``run_dir/<_folder_name(label)>/``: ``run_config.json (the folder's claim: a rerun with another config
    is refused, naming the fields; ``REUSE_NEUTRAL_FIELDS`` may differ), checkpoints, ``final/`` (model +
    tokenizer + done.json), ``log_history.json`` and ``probes.jsonl``. A finished run is not retrained.
    Returns ``final/``.
    """
    out = Path(cfg.run_dir) / _folder_name(label)
    # λ's units are named only when they are not the paper's, so folders made before units existed stay valid
    claim_folder(out, {"label": label, "lambda": lam, **({"units": units} if units != "absolute" else {}),
                       "config": judging.without_judge(asdict(cfg))},
                 [f"config.{name}" for name in REUSE_NEUTRAL_FIELDS], record="run_config.json",
                 results=("final", "checkpoint-*", "log_history.json", "probes.jsonl"),
                 remedy="use another run_dir, or delete that folder and rerun")

    def fit(final: Path) -> None:
        model_path = resolve_model_path(cfg)
        tokenizer = load_tokenizer(model_path, tiny=cfg.tiny)
        # float32 master weights (bf16 autocast on a GPU): at lr 1e-6 an update is far below bf16's resolution
        model = load_model(model_path, torch.float32)
        args = _trl_args(cfg, lam, out, units)
        train_setpo(out, final, model=model, tokenizer=tokenizer, args=args, reward=math_reward_func,
                    rows=to_trl_records(train), embedder=embedder, probes=_math_probes(cfg, probes, tokenizer),
                    probe_every=cfg.probe_every, probes_at_end=True, callbacks=callbacks,
                    record={"label": label, "lam": lam, "units": units}, log=log,
                    describe=f"[{label}] λ={cfg.lam_text(lam, units)}, G={cfg.num_generations}, {cfg.prompts_per_step} "
                             f"prompts/step, vLLM={args.use_vllm}", heartbeat_label=f"[{label}]",
                    clock=out / CLOCK_FILE)
        del model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # the next run in this process starts with the memory free

    return train_stage(out, f"[{label}]", f"run {label}", fit, log)


def _generate_vllm(model_dir: str, prompts: list[str], k: int, temperature: float, top_p: float,
                   max_new_tokens: int, seed: int, gpu_memory_utilization: float) -> list[list[str]]:
    """k samples per (already templated) prompt with vLLM; run it through ``_in_fresh_process``."""
    from vllm import LLM, SamplingParams  # only in the spawned process that generates: vLLM is heavy and GPU-only

    llm = LLM(model=model_dir, seed=seed, gpu_memory_utilization=gpu_memory_utilization)
    params = SamplingParams(n=k, temperature=temperature, top_p=top_p, max_tokens=max_new_tokens, seed=seed,
                            skip_special_tokens=True)
    return [[o.text for o in out.outputs] for out in llm.generate(prompts, params)]


def train_runs(cfg: MathRunConfig, train: Sequence[MathProblem], probes: Sequence[MathProblem], embedder=None,
               log=print) -> dict[str, Path]:
    """Every run of ``cfg.runs()`` (baseline, then SetPO), each with ``_train_rl``; label -> final model dir.

    With vLLM each run trains in its own spawned process (``_in_fresh_process``; the embedder is then loaded
    there from ``cfg.embedder``), otherwise in this one with the given embedder.
    """
    finals = {}
    for label, (lam, units) in cfg.runs().items():
        if cfg.uses_vllm():
            log(f"[{label}] training in a fresh process (vLLM)")
            finals[label] = _in_fresh_process(_train_rl, cfg, label, lam, list(train), list(probes), units=units)
        else:
            finals[label] = _train_rl(cfg, label, lam, train, probes, embedder=embedder, log=log, units=units)
    return finals


def _evaluated_problems(cfg: MathRunConfig, problems: Sequence[MathProblem]) -> list[MathProblem]:
    """The problems an evaluation samples: the first ``eval_limit`` (all without one)."""
    return list(problems[:cfg.eval_limit] if cfg.eval_limit else problems)


def _eval_file(cfg: MathRunConfig, label: str) -> Path:
    """Where stage "evaluate" caches a run's avg@k evaluation: its pass@k file when the two are the same samples
    (``MathRunConfig.shares_samples``), so they are sampled once."""
    return _passk_file(cfg, label) if cfg.shares_samples() else Path(cfg.run_dir) / f"eval_{_folder_name(label)}.json"


def _passk_file(cfg: MathRunConfig, label: str) -> Path:
    """Where stage "evaluate" caches a model's pass@k evaluation (label: a run's, or "base model")."""
    return Path(cfg.run_dir) / f"passk_{_folder_name(label)}.json"


def _sample_eval_texts(cfg: MathRunConfig, model_dir: str | Path, problems: Sequence[MathProblem], log=None,
                       label: str = "eval", partial: str | Path | None = None) -> list[list[str]]:
    """The ``eval_k`` responses per problem an evaluation scores (seeded: sampling again gives them again): by vLLM
    when ``use_vllm`` resolves true (in a fresh process), else ``generate``, batch by batch. partial: a JSONL file
    that keeps each finished batch, so that an evaluation stopped part-way resumes at its next batch with the
    same samples (seeds follow the problem's position; ``setpo_lab.studies.sampling``). Each prompt is run through the
    model once for all its samples (``share_prompt``) and top-p takes no sort of the vocabulary (``fast_nucleus``).
    With ``log``, a line at most every 10 s (``engine.sample_evaluation``: prompts sampled so far, and a heartbeat
    inside a long batch)."""
    tokenizer = load_tokenizer(model_dir, tiny=cfg.tiny)
    prompts = chat_prompts(tokenizer, [p.question for p in problems], qwen_math_messages)
    if cfg.uses_vllm():
        # The evaluation process holds the GPU alone (training has exited), so vLLM may take most of it.
        return _in_fresh_process(_generate_vllm, str(model_dir), prompts, cfg.eval_k, cfg.eval_temperature,
                                 cfg.eval_top_p, cfg.max_completion_length, cfg.seed + 1, 0.85)
    on_gpu = torch.cuda.is_available()
    model = load_model(model_dir, torch.bfloat16 if on_gpu else torch.float32)
    model.to("cuda" if on_gpu else "cpu")
    return sample_evaluation(model, tokenizer, prompts, cfg.eval_k, seed=cfg.seed + 1, log=log, label=label,
                             partial=partial,
                             chunk_prompts=batch_prompts(cfg.eval_k, EVAL_BATCH_SEQUENCES),
                             temperature=cfg.eval_temperature, top_p=cfg.eval_top_p,
                             max_new_tokens=cfg.max_completion_length, batch_sequences=EVAL_BATCH_SEQUENCES,
                             add_special_tokens=False, share_prompt=True, fast_nucleus=True)


def _sampling_record(cfg: MathRunConfig, model_dir: str | Path, problems: Sequence[MathProblem]) -> dict:
    """Everything an evaluation's samples depend on (``_sample_eval_texts``): the model (``model_identity``;
    None for a folder without weight files), the questions, and the settings, batch size and seed included."""
    questions = json.dumps([p.question for p in problems]).encode()
    return {"model": model_identity(model_dir), "questions_sha256": hashlib.sha256(questions).hexdigest(),
            "k": cfg.eval_k, "temperature": cfg.eval_temperature, "top_p": cfg.eval_top_p,
            "max_new_tokens": cfg.max_completion_length, "seed": cfg.seed + 1,
            "engine": "vllm" if cfg.uses_vllm() else "generate", "batch_sequences": EVAL_BATCH_SEQUENCES}


def _evaluation_of_same_model(cache: Path, sampled: Mapping) -> dict | None:
    """A finished evaluation kept beside ``cache`` that sampled what ``sampled`` (``_sampling_record``) says this
    one would: the same model, questions and settings, so the same responses (seeds follow each problem's
    position). A run that never changed its model (with rewards all 0, GRPO's advantages are all 0 and so is
    its update) is then not sampled again. None when there is none, or the model has no identity."""
    if sampled.get("model") is None:
        return None
    for path in sorted(cache.parent.glob("*.json")):
        if path == cache or path.name.endswith(".clock.json"):
            continue
        record = read_json(path, "delete it and rerun to evaluate again")
        if isinstance(record, dict) and record.get("sampled") == sampled and "label" in record:
            return record
    return None


def evaluate_avg_at_k(cfg: MathRunConfig, model_dir: str | Path, problems: Sequence[MathProblem],
                      cache: str | Path | None = None, texts_file: str | Path | None = None, log=None,
                      label: str = "eval") -> dict:
    """Pass@1 as avg@k: k samples per problem at T = eval_temperature, top-p eval_top_p, mean fraction correct.

    Also the unbiased pass@j curve for j = 1..k (``setpo.pass_at_k``) and avg@k per data source
    (``_sample_eval_texts`` samples; ``log``/``label``: its progress lines). Cached as JSON in ``cache`` when given;
    texts_file: a JSON file that keeps the sampled responses (for the judge, ``judging.texts_path``; None keeps none).
    A model that an evaluation kept beside ``cache`` already sampled alike (``_evaluation_of_same_model``) gets that
    evaluation, marked ``same_model_as`` its label, with 0 s of sampling.
    Returns {"avg_at_k", "k", "per_source", "pass_at_k", "correct", "n_problems", "examples", "seconds", "label",
    "sampled"} (``_sampling_record``).
    """
    problems = _evaluated_problems(cfg, problems)
    partial = None if cache is None else Path(cache).with_suffix(".partial.jsonl")

    def evaluate() -> dict:
        sampled = _sampling_record(cfg, model_dir, problems)
        same = None if cache is None or texts_file is not None else _evaluation_of_same_model(Path(cache), sampled)
        if same is not None:
            if log:
                log(f"[{label}] the same model as {same['label']!r} (weights, tokenizer and stop ids), sampled "
                    "alike: its evaluation is that one's")
            return {**same, "label": label, "same_model_as": same["label"], "seconds": 0.0}
        t0 = time.time()
        texts = _sample_eval_texts(cfg, model_dir, problems, log=log, label=label, partial=partial)
        if texts_file is not None:
            write_json(Path(texts_file), texts)
        seconds = time.time() - t0 if partial is None else sittings_seconds(partial.with_suffix(".clock.json"))
        correct = [sum(math_reward(t, p.answer) for t in ts) for p, ts in zip(problems, texts, strict=False)]
        k = cfg.eval_k
        per_source: dict[str, list[float]] = {}
        for p, c in zip(problems, correct, strict=False):
            per_source.setdefault(p.source, []).append(c / k)
        return {
            "avg_at_k": sum(c / k for c in correct) / len(correct), "k": k,
            "per_source": {s: sum(v) / len(v) for s, v in per_source.items()},
            "pass_at_k": [sum(pass_at_k(k, int(c), j) for c in correct) / len(correct) for j in range(1, k + 1)],
            "correct": correct, "n_problems": len(problems), "temperature": cfg.eval_temperature,
            "top_p": cfg.eval_top_p, "examples": [ts[:2] for ts in texts[:3]], "seconds": seconds,
            "label": label, "sampled": sampled,
        }

    result = cached_evaluation(cache, evaluate, remedy="delete it and rerun to evaluate again")
    for leftover in ((partial, partial.with_suffix(".clock.json")) if partial is not None else ()):
        leftover.unlink(missing_ok=True)  # the sittings' samples and clock, once the evaluation is kept
    return result


def load_passk_problems(cfg: MathRunConfig) -> list[MathProblem]:
    """The pass@k problems: PASSK_FILE (an AIME-style file), or generated ones (seeded apart from train/val)."""
    return _problems(cfg.passk_file, cfg.passk_limit, 30, cfg.seed + 2)


def evaluate_pass_at_k(cfg: MathRunConfig, models: Mapping[str, str | Path], problems: Sequence[MathProblem],
                       cache_dir: str | Path | None = None, log=print) -> dict[str, dict]:
    """pass@k for k = 1..passk_max of each model (label -> model folder; e.g. the base model, GRPO, SetPO).

    n = passk_max samples per problem (``evaluate_avg_at_k`` with eval_k = passk_max, every problem), so each
    curve is the unbiased estimator at every k from one set of samples. Cached per model in ``cache_dir``.
    Returns label -> ``evaluate_avg_at_k``'s result (``pass_at_k[k-1]`` is pass@k).
    """
    pcfg = replace(cfg, eval_k=cfg.passk_max, eval_limit=None, **dict.fromkeys(judging.JUDGE_FIELDS))  # no judge
    return {label: evaluate_avg_at_k(pcfg, model_dir, problems, log=log, label=label,
                                     cache=None if cache_dir is None
                                     else Path(cache_dir) / _passk_file(cfg, label).name)
            for label, model_dir in models.items()}


def evaluate_runs(cfg: MathRunConfig, finals: Mapping[str, str | Path], problems: Sequence[MathProblem],
                  keep_texts: bool | None = None, log=print) -> dict[str, dict]:
    """Stage "evaluate"'s avg@k of every run (label -> final model folder), each cached in ``_eval_file``.
    keep_texts: keep the sampled responses beside each evaluation for the judge (None: when a judge is set)."""
    keep = judging.judge_configured(cfg) if keep_texts is None else keep_texts
    return {label: evaluate_avg_at_k(cfg, final, problems, cache=_eval_file(cfg, label),
                                     texts_file=judging.texts_path(_eval_file(cfg, label)) if keep else None,
                                     log=log, label=label)
            for label, final in finals.items()}


def judge_runs(cfg: MathRunConfig, finals: Mapping[str, str | Path], problems: Sequence[MathProblem], log=print,
               judge=None) -> dict:
    """Stage "judge": the LLM-judged diversity (``setpo_lab.studies.judging.judge_methods``) of the responses each
    run sampled in its avg@k evaluation (``_eval_file``; kept beside it when the evaluation ran with a judge,
    else sampled again with its seeds), on the evaluated validation problems; verdicts cached in
    ``run_dir/judge_cache.jsonl``. Returns the judged record ({"judge", "prompt_version", "methods", ...})."""
    problems = _evaluated_problems(cfg, problems)
    members = [(label, _eval_file(cfg, label), Path(final)) for label, final in finals.items()]
    return judging.judge_evaluations(
        cfg, [p.question for p in problems], members, lambda d: _sample_eval_texts(cfg, d, problems),
        lambda texts: [sum(math_reward(t, p.answer) for t in ts) for p, ts in zip(problems, texts, strict=True)],
        cfg.eval_k,
        cfg.run_dir, log, judge)


def run_study(cfg: MathRunConfig, stages: Sequence[str] | None = None, *, log=print_flushed) -> StudyResult:
    """The whole study, resumable, as notebook 06 runs it: data; the base model's large-budget pass@k (stage
    "evaluate", first, before any training, so that the "base model at large budgets" reading exists before a
    run is trained); the RL runs (stage "train"); avg@k on the validation problems and pass@k of the trained runs
    (stage "evaluate"; everything
    cached beside the runs in ``run_dir``); then, only with a judge configured, the judged diversity of the avg@k
    responses (stage "judge", ``judge_runs``). Returns (``StudyResult``) each run's final folder by label as
    ``runs``, and as ``summary`` {"results", "pass_at_k", "judged"}, those of the stages run ("pass_at_k" holds
    the base model and the runs from stage "evaluate"; "judge" reads the cached evaluations into
    "results")."""
    t0 = time.time()
    stages = chosen_stages(stages, STAGES)
    judge = judging.judge_configured(cfg)
    if stages == ["judge"] and not judge:
        raise ValueError("stage 'judge' needs a judge: set judge_url and judge_model (a server), or judge_path")
    train, val = load_study_problems(cfg)
    log(f"[data] {len(train)} training and {len(val)} validation problems")
    finals = {label: Path(cfg.run_dir) / _folder_name(label) / "final" for label in cfg.runs()}
    summary: dict = {}
    if "evaluate" in stages:
        passk_problems = load_passk_problems(cfg)
        summary["pass_at_k"] = evaluate_pass_at_k(cfg, {"base model": resolve_model_path(cfg)}, passk_problems,
                                                  cache_dir=cfg.run_dir, log=log)
    if "train" in stages:
        finals = train_runs(cfg, train, val[:cfg.n_probe], log=log)
    if "evaluate" in stages:
        summary["pass_at_k"].update(evaluate_pass_at_k(cfg, finals, passk_problems, cache_dir=cfg.run_dir, log=log))
        summary["results"] = evaluate_runs(cfg, finals, val, keep_texts=judge and "judge" in stages, log=log)
    if "judge" in stages and judge:
        summary["judged"] = judge_runs(cfg, finals, val, log)
        if "results" not in summary:
            summary["results"] = {label: read_json(_eval_file(cfg, label), "delete it and rerun --stages evaluate")
                                  for label in finals}
    return StudyResult("math", Path(cfg.run_dir), finals, summary, time.time() - t0)


def _saved_config(path: Path) -> dict:
    """``--config RUN_CONFIG``: a finished run's config fields (its run_dir: the folder above the run's)."""
    saved = read_json(path, "give a run's run_config.json")
    saved = saved.get("config", saved) if isinstance(saved, dict) else None
    if not isinstance(saved, dict):
        raise ValueError("not a run_config.json (no config in it)")
    known = {f.name for f in fields(MathRunConfig)}
    return {**{k: v for k, v in saved.items() if k in known}, "run_dir": str(path.resolve().parent.parent)}


def _write_results(cfg: MathRunConfig, out: Mapping, command: str) -> tuple[str, Path]:
    """``run_dir/results.md`` (``results_table``) and ``run_dir/results.json`` (its record, ``results_record``,
    with the pass@k curves when stage "evaluate" ran) from ``run_study``'s summary. Returns (table, path)."""
    table = results_table(out["results"], cfg.eval_k, judged=out.get("judged"),
                          note="Tiny random model: these numbers mean nothing." if cfg.tiny else "")
    extra = {"pass_at_k": {k: r["pass_at_k"] for k, r in out["pass_at_k"].items()}} if "pass_at_k" in out else {}
    record = results_record(config_record(cfg, command), out["results"], out.get("judged"), **extra)
    return table, save_table(table, Path(cfg.run_dir) / "results", record)


def _run(cfg: MathRunConfig, stages: Sequence[str], args) -> int:
    """The study's stages, then ``run_dir/results.md`` and its record ``results.json`` (``_write_results``) when
    there are evaluations."""
    from setpo.trl import quiet_libraries  # imports TRL: only once the arguments are known to be good

    quiet_libraries()
    summary = run_study(cfg, stages=stages).summary
    if "results" in summary:
        command = " ".join([COMMAND.prog, *judging.redact_command(args.argv)])
        table, path = _write_results(cfg, summary, command)
        print(table)
        print(f"results: {path} (record: {path.with_suffix('.json')})")
    return 0


#: the study's command line (``arguments.study_parser``): ``python -m setpo_lab run math --cpu-real``; --full is
#: the paper's settings (give --set model_path=DIR ...), --cpu-real notebook 06's CPU setting (the packaged
#: SmolLM2-135M-Instruct on GSM8K, hours on 2 cores, resumable), --cpu-demo a tiny random model on generated
#: problems, --smoke the demo at toy size; --config a finished run's run_config.json (e.g. to judge it)
COMMAND = StudyCommand(
    "math", {"full": MathRunConfig, "cpu-real": MathRunConfig.cpu_real, "cpu-demo": MathRunConfig.cpu_demo,
             "smoke": lambda **kw: MathRunConfig.cpu_demo(smoke=True, **kw)}, STAGES, _run,
    default_out={"full": "runs/qwen_math", "cpu-real": "runs/qwen_math_cpu", "cpu-demo": "runs/qwen_math",
                 "smoke": "runs/qwen_math_smoke"},
    fields=frozenset(f.name for f in fields(MathRunConfig)), options=("judge", "config"), saved=_saved_config,
    doc="GRPO vs SetPO+GRPO on math word problems with TRL (notebook 06).")

if __name__ == "__main__":
    sys.exit(run_command(COMMAND))
