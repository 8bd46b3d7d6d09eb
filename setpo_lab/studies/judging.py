"""The studies' optional LLM judge: the judged diversity (``setpo.judge``, 1-10, the paper's
LLM-based score) of the responses each method sampled at evaluation, one step shared by the math study and
the Countdown study (their stage "judge").

- Config: every study config has ``JUDGE_FIELDS`` (all None by default: no judge, the study runs exactly as
  before and writes the same records). ``judge_url`` + ``judge_model``: an OpenAI-compatible server (``vllm
  serve``; the API key, if it needs one, from ``$OPENAI_API_KEY``, never from a config or a record);
  ``judge_path``: a local chat model run in-process. ``judge_limit``: judge the first N evaluated problems
  only (None: all); ``judge_samples``: the first N of each problem's evaluation responses make its set
  (None: ``DEFAULT_JUDGE_SAMPLES`` or all of them if fewer; a judge's context must hold the whole set).
  ``check_judge_fields`` is the config's check; ``without_judge`` drops the fields from what a folder claim
  or a record holds: judging changes no training and no evaluation, and a judge's URL may carry a password.
- Command line: ``add_judge_arguments`` (``--judge-url/--judge-model/--judge-path/--judge-limit/
  --judge-samples``) and ``judge_overrides`` (the fields, checked before any work: one line, exit 2).
- Responses: ``texts_path(eval_file)`` is where an evaluation keeps the texts it sampled when a judge is
  configured; ``eval_responses`` reads them back, or samples them again (same seeds) for an evaluation made
  without a judge, checked against that evaluation's correct counts.
- ``judge_methods``: the judged summary per method, cached in the run folder (``JUDGE_CACHE``), so an
  interrupted judging resumes without asking twice. A judge that cannot be reached is one refusal line that
  ends with what to do. ``judged_cell``: the table cell, "mean [95% CI], k missing"; ``judged_note``: the line
  under a table naming the judge and the prompt version.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from setpo.envs.arguments import positive_int
from setpo.judge import PROMPT_VERSION, SCALE, JudgeUnavailable, judge_items, summarize
from setpo.judge.client import check_url, redact_url
from setpo.records import read_json, write_json
from setpo_lab.studies.stages import refusal

@dataclass
class JudgeSettings:
    """The optional LLM judge of a study's stage "judge", shared by the math and Countdown configs (which
    subclass it). All None: no judge, and the study runs and records exactly as without these fields.

    judge_url, judge_model: an OpenAI-compatible server and its model name; judge_path: a local chat model
    instead; judge_limit: judge the first N problems; judge_samples: responses per judged set
    (None: ``DEFAULT_JUDGE_SAMPLES``)."""

    judge_url: str | None = None
    judge_model: str | None = None
    judge_path: str | None = None
    judge_limit: int | None = None
    judge_samples: int | None = None


JUDGE_FIELDS = tuple(f.name for f in fields(JudgeSettings))
DEFAULT_JUDGE_SAMPLES = 8  # responses per judged set when judge_samples is None (fewer if fewer were sampled)
JUDGE_CACHE = "judge_cache.jsonl"
JUDGED_COLUMN = f"judged diversity ({SCALE[0]}-{SCALE[1]})"


# ---- configuration -----------------------------------------------------------------------------------------

def judge_configured(cfg) -> bool:
    """Whether the study config names a judge (a server, or a local model)."""
    return cfg.judge_model is not None or cfg.judge_url is not None or cfg.judge_path is not None


def check_judge_fields(cfg, samples_per_problem: int) -> None:
    """A ValueError naming the first bad judge field; samples_per_problem: how many responses the study's
    evaluation samples per problem (the most a judged set can hold)."""
    url, model, path = cfg.judge_url, cfg.judge_model, cfg.judge_path
    for name in ("judge_url", "judge_model", "judge_path"):
        value = getattr(cfg, name)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ValueError(f"{name} must be non-empty text or None, got {value!r}")
    if path is not None and (url is not None or model is not None):
        raise ValueError("give either a local judge model (judge_path) or a judge server (judge_url and "
                         "judge_model), not both")
    if model is not None and url is None and not os.environ.get("OPENAI_BASE_URL"):
        raise ValueError("judge_model needs judge_url, the judge server (e.g. http://127.0.0.1:8000/v1 for "
                         "`vllm serve`), or OPENAI_BASE_URL set")
    if url is not None:
        if model is None:
            raise ValueError("judge_url needs judge_model, the model name the server serves (`vllm serve MODEL` "
                             "serves it as MODEL)")
        check_url(url)
    if path is not None and not (Path(path).expanduser() / "config.json").is_file():
        raise ValueError(f"judge_path {path}: no model there (a folder with config.json); download the judge "
                         "model first, e.g. `hf download Qwen/Qwen2.5-7B-Instruct --local-dir PATH`")
    for name in ("judge_limit", "judge_samples"):
        value = getattr(cfg, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a whole number >= 1 or None, got {value!r}")
    if cfg.judge_samples is not None and not 2 <= cfg.judge_samples <= samples_per_problem:
        raise ValueError(f"judge_samples must be between 2 and the {samples_per_problem} responses sampled per "
                         f"problem, got {cfg.judge_samples}")
    if judge_configured(cfg) and samples_per_problem < 2:
        raise ValueError(f"judging diversity needs at least 2 responses per problem; the evaluation samples "
                         f"{samples_per_problem}")


def without_judge(config: Mapping) -> dict:
    """``config`` (a config as a dict) without the judge fields: what a folder claim and a record hold."""
    return {k: v for k, v in config.items() if k not in JUDGE_FIELDS}


def samples_per_set(cfg, samples_per_problem: int) -> int:
    return cfg.judge_samples or min(DEFAULT_JUDGE_SAMPLES, samples_per_problem)


def open_study_judge(cfg):
    """The judge the config names (``setpo.judge.backends.open_judge``); the key comes from $OPENAI_API_KEY."""
    from setpo.judge.backends import open_judge  # the in-process backend is an engine adapter

    if cfg.judge_path is not None:
        return open_judge(path=cfg.judge_path)
    return open_judge(url=cfg.judge_url, model=cfg.judge_model)


# ---- command line ------------------------------------------------------------------------------------------

def add_judge_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("judge (optional; stage 'judge': the LLM-judged diversity of each method's responses)")
    g.add_argument("--judge-url", help="OpenAI-compatible judge server, e.g. http://127.0.0.1:8000/v1 (`vllm serve`); "
                                       "its API key, if any, from $OPENAI_API_KEY")
    g.add_argument("--judge-model", help="the model name the judge server serves")
    g.add_argument("--judge-path", help="a local chat model folder, run in-process as the judge")
    g.add_argument("--judge-limit", type=positive_int, help="judge the first N evaluated problems (default all)")
    g.add_argument("--judge-samples", type=positive_int,
                   help=f"responses per judged set (default {DEFAULT_JUDGE_SAMPLES}, or all sampled if fewer)")


def judge_overrides(args: argparse.Namespace, p: argparse.ArgumentParser, stages: Sequence[str]) -> dict:
    """The judge fields the command line sets; contradictions are refused here (one line, exit 2), the rest by
    the config's own check."""
    fields = {name: getattr(args, name) for name in JUDGE_FIELDS if getattr(args, name) is not None}
    if args.judge_path is not None and (args.judge_url is not None or args.judge_model is not None):
        p.error("give either --judge-path PATH or --judge-url URL --judge-model NAME, not both")
    if args.judge_url is not None and args.judge_model is None:
        p.error("--judge-url needs --judge-model, the model name the server serves")
    if args.judge_model is not None and args.judge_url is None and not os.environ.get("OPENAI_BASE_URL"):
        p.error("--judge-model needs --judge-url, the judge server (e.g. http://127.0.0.1:8000/v1), or "
                "OPENAI_BASE_URL set")
    if args.judge_url is not None:
        try:
            check_url(args.judge_url)
        except ValueError as err:
            p.error(f"--judge-url: {err}")
    named = judge_configured(args)  # the parsed options have the config's field names
    if not named and (args.judge_limit is not None or args.judge_samples is not None):
        p.error("--judge-limit and --judge-samples need a judge: --judge-url URL --judge-model NAME, or --judge-path")
    if list(stages) == ["judge"] and not named:
        p.error("--stages judge needs a judge: give --judge-url URL --judge-model NAME, or --judge-path PATH")
    return fields


def redact_command(argv: Sequence[str]) -> list[str]:
    """A command line fit for a record: every URL in it without user name or password."""
    out = []
    for arg in argv:
        flag, eq, value = arg.partition("=") if arg.startswith("--") else ("", "", arg)
        value = redact_url(value) if "://" in value else value
        out.append(f"{flag}{eq}{value}")
    return out


# ---- responses ---------------------------------------------------------------------------------------------

def texts_path(eval_file: str | Path) -> Path:
    """Where the evaluation cached in ``eval_file`` keeps the responses it sampled (when a judge is set)."""
    eval_file = Path(eval_file)
    return eval_file.with_name(f"{eval_file.stem}.texts.json")


def eval_responses(eval_file: Path, n_problems: int, n_samples: int, sample: Callable[[], list[list[str]]],
                   correct: Callable[[list[list[str]]], list], log=print) -> tuple[list[list[str]], str]:
    """The responses of the evaluation cached in ``eval_file``: its texts file, or (an evaluation made without a
    judge, or a texts file that is not this evaluation's) ``sample()`` again with the evaluation's seeds, saved
    to the texts file. ``correct(texts)`` gives the per-problem correct counts, checked against the
    evaluation's either way. Returns (texts, how they were had)."""
    path = texts_path(eval_file)
    result = read_json(eval_file, "delete it and rerun --stages evaluate to evaluate again")
    if path.is_file():
        texts = read_json(path, "delete it and rerun the judge stage to sample them again")
        if _shaped(texts, n_problems, n_samples) and list(correct(texts)) == list(result["correct"]):
            return texts, "kept by the evaluation"
        log(f"[judge] {path} does not hold this evaluation's {n_problems} x {n_samples} responses; sampling again")
    log(f"[judge] {eval_file.name}: sampling the evaluation's responses again (same seeds; it kept no texts)")
    texts = sample()
    if not _shaped(texts, n_problems, n_samples):
        raise ValueError(f"the sampler gave {len(texts)} sets for {n_problems} problems x {n_samples} responses")
    write_json(path, texts)
    same = list(correct(texts)) == list(result["correct"])
    if not same:
        log(f"[judge] {eval_file.name}: the responses sampled again differ from the evaluation's (other correct "
            "counts; e.g. another GPU or library version); judging the new ones")
    return texts, "sampled again" + ("" if same else " (correct counts differ from the evaluation's)")


def _shaped(texts, n_problems: int, n_samples: int) -> bool:
    return (isinstance(texts, list) and len(texts) == n_problems
            and all(isinstance(s, list) and len(s) == n_samples and all(isinstance(t, str) for t in s) for s in texts))


def judge_evaluations(cfg, problems: Sequence[str], members: Sequence[tuple[str, Path, Path]],
                      sample: Callable[[Path], list[list[str]]], correct: Callable[[list[list[str]]], list],
                      n_samples: int, folder: str | Path, log=print, judge=None) -> dict:
    """``judge_methods`` over evaluations: members are (method, evaluation file, model folder); each
    evaluation's responses come from ``eval_responses`` (``sample(model folder)`` when it kept none), a
    method's evaluations (e.g. its seeds) are pooled. An evaluation not made yet is refused, saying to run it."""
    sets: dict[str, list] = {}
    sources = {}
    for method, path, model_dir in members:
        if not Path(path).is_file():
            raise refusal(f"no evaluation of {method!r} to judge", path,
                          "run stage 'evaluate' first (--stages evaluate,judge), then rerun")
        texts, sources[Path(path).stem] = eval_responses(Path(path), len(problems), n_samples,
                                                         lambda d=model_dir: sample(d), correct, log)
        sets.setdefault(method, []).append(texts)
    return judge_methods(cfg, problems, sets, folder, sources, log, judge)


# ---- judging -----------------------------------------------------------------------------------------------

def judge_methods(cfg, problems: Sequence[str], sets_by_method: Mapping[str, Sequence[Sequence[Sequence[str]]]],
                  folder: str | Path, sources: Mapping[str, str] | None = None, log=print, judge=None) -> dict:
    """The judged diversity of each method. ``sets_by_method[m]`` is a list of runs (e.g. seeds), each a list of
    response sets in ``problems``' order; a method's sets of every run are pooled. The first ``judge_limit``
    problems and the first ``samples_per_set`` responses of each set are judged. judge: None opens the one
    ``cfg`` names. Returns the record: {"judge" (its description, no key), "prompt_version", "scale",
    "problems", "responses_per_set", "cache", "methods": {method: summary}, "responses": sources}."""
    problems = list(problems[:cfg.judge_limit] if cfg.judge_limit else problems)
    n_samples = min(len(s) for runs in sets_by_method.values() for sets in runs for s in sets)
    m = samples_per_set(cfg, n_samples)
    items = [{"problem": p, "method": method, "responses": list(s[:m])}
             for method, runs in sets_by_method.items() for sets in runs
             for p, s in zip(problems, sets, strict=False)]  # problems: the first judge_limit
    cache = Path(folder) / JUDGE_CACHE
    judge = open_study_judge(cfg) if judge is None else judge
    log(f"[judge] {len(items)} sets ({len(problems)} problems, {len(sets_by_method)} methods, {m} responses each) "
        f"with {judge!r}, prompt {PROMPT_VERSION}; cache {cache}")
    try:
        results = judge_items(items, judge, cache)  # a progress bar; at least a line every 10 s into a log file
    except JudgeUnavailable as err:
        raise refusal(f"the judge cannot be used: {err}", cache,
                      "start the judge (or fix --judge-url/--judge-model) and rerun --stages judge") from None
    summary = summarize(results, judge)
    for method, s in summary.items():
        log(f"[judge] {method}: {judged_cell(s)}")
    return {"judge": judge.describe(), "prompt_version": PROMPT_VERSION, "scale": list(SCALE),
            "problems": len(problems), "responses_per_set": m, "cache": JUDGE_CACHE, "methods": summary,
            "responses": dict(sources or {})}


def judged_cell(s: Mapping | None) -> str:
    """A judged summary as a table cell: "6.20 [5.10, 7.30], 1 missing" ("-" when nothing was judged)."""
    if s is None:
        return "-"
    mean = "-" if s["mean"] is None else f"{s['mean']:.2f}"
    ci = "" if s["lo"] is None else f" [{s['lo']:.2f}, {s['hi']:.2f}]"
    return f"{mean}{ci}, {s['missing']} missing"


def judged_note(judged: Mapping) -> str:
    """What the judged column is: the judge, the prompt version and what was judged."""
    j = judged["judge"]
    who = j.get("model") or j.get("path") or j.get("name")
    return (f"Judged diversity: {who} ({j.get('backend')}), prompt {judged['prompt_version']}, scale "
            f"{judged['scale'][0]}-{judged['scale'][1]}, on {judged['problems']} problems x "
            f"{judged['responses_per_set']} responses each; mean [95% CI over problems], missing scores counted.")
