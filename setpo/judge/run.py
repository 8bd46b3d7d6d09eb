"""Judging many sets: ``judge_items`` (one verdict per {problem, method, responses} item, cached, concurrent),
``summarize`` (per method: mean score, 95% interval over problems, missing counted) and ``judge_sets``, the
one call a study makes.

How a study calls it (after its evaluation has sampled n responses per problem for each method)::

    from setpo.judge import OpenAIJudge, judge_sets
    judge = OpenAIJudge(model="Qwen/Qwen2.5-7B-Instruct", base_url="http://127.0.0.1:8000/v1")
    judged = judge_sets(problems, {"GRPO": grpo_sets, "SetPO+GRPO": setpo_sets}, judge,
                        out_dir / "judge_cache.jsonl")
    judged["SetPO+GRPO"]["mean"], judged["SetPO+GRPO"]["lo"], judged["SetPO+GRPO"]["missing"]

``grpo_sets[i]`` is the list of responses sampled for ``problems[i]``. Rerunning after an interruption asks
only for the sets not yet in the cache.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from setpo.judge.cache import JudgeCache, cache_key
from setpo.judge.client import Judge, JudgeRejected, JudgeUnavailable
from setpo.judge.rubric import MAX_RESPONSE_CHARS, PROMPT_VERSION, Verdict, build_messages, check_set, \
    parse_reply, summarize_verdicts
from setpo.records import progress_bar
from setpo.refusals import cannot_load, file_refusal


@dataclass(frozen=True)
class Item:
    """One set to judge: the responses one method sampled for one problem."""

    problem: str
    method: str
    responses: tuple[str, ...]


def as_items(items: Sequence) -> list[Item]:
    """``items`` (Item or dicts with problem, method, responses) checked: a ValueError names the first bad one."""
    out = []
    for i, it in enumerate(items):
        if isinstance(it, Mapping):
            missing = [k for k in ("problem", "method", "responses") if k not in it]
            if missing:
                raise ValueError(f"item {i} has no {', '.join(missing)} (each item needs problem, method, responses)")
            it = Item(it["problem"], it["method"], it["responses"])
        if not isinstance(it, Item):
            raise ValueError(f"item {i} is {type(it).__name__}, not an object with problem, method, responses")
        if not isinstance(it.method, str) or not it.method.strip():
            raise ValueError(f"item {i}: method must be non-empty text, got {it.method!r:.80}")
        try:
            check_set(it.problem, it.responses)
        except ValueError as err:
            raise ValueError(f"item {i}: {err}") from None
        out.append(Item(it.problem, it.method, tuple(it.responses)))
    if not out:
        raise ValueError("nothing to judge: no items")
    return out


def load_items(path: str | Path) -> list[Item]:
    """Items from a JSONL file (one {problem, method, responses} per line) or a JSON file holding a list of
    them; any problem with the file is a ValueError that names it."""
    path = Path(path)
    if not path.is_file():
        what = "is a folder, not a file" if path.is_dir() else "no such file"
        raise ValueError(f"{path}: {what} (a JSONL or JSON of {{problem, method, responses}} items)")
    # a file that cannot be read leads with itself and what to do, then a short cause (setpo.refusals)
    remedy = "give a JSON list of {problem, method, responses} objects, or one per line (JSONL)"
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as err:
        raise cannot_load(path, err, remedy, root=path.parent) from None
    if text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as err:  # RecursionError: nested deeper than Python's stack
            cause = "nested too deeply" if isinstance(err, RecursionError) else "not valid JSON"
            raise file_refusal(path, "cannot be loaded", remedy, detail=f"cause: {cause}", root=path.parent) from None
    else:
        data = []
        for i, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    data.append(json.loads(line))
                except (json.JSONDecodeError, RecursionError):
                    raise file_refusal(path, f"line {i} cannot be loaded", remedy, detail="cause: not valid JSON",
                                       root=path.parent) from None
    try:
        return as_items(data)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None


def _verdict_record(judge: Judge, key: str, item: Item, reply, seconds: float) -> dict:
    v = parse_reply(reply)
    return {"key": key, "judge": judge.name, "prompt_version": PROMPT_VERSION, "score": v.score,
            "missing": v.missing, "reply": reply, "n_responses": len(item.responses),
            "problem": item.problem[:200], "seconds": round(seconds, 3), "time": time.strftime("%Y-%m-%dT%H:%M:%S")}


def judge_items(items: Sequence, judge: Judge, cache_path: str | Path | None = None, *,
                max_chars: int = MAX_RESPONSE_CHARS, progress: bool = True) -> list[dict]:
    """One result per item, in order: {"method", "problem", "score", "missing", "cached"}. Sets already in the
    cache (same judge, prompt version, problem and responses) are not asked again; identical sets are asked
    once. At most ``judge.concurrency`` requests are in flight; each verdict is on disk as soon as it arrives.
    A judge that cannot be reached raises ``JudgeUnavailable`` (one line, saying how many verdicts are saved
    and that rerunning resumes); a request the judge rejects gives a missing score ("rejected ...")."""
    items = as_items(items)
    cache = JudgeCache(cache_path)
    keys = [cache_key(judge.name, it.problem, it.responses, max_chars) for it in items]
    todo = {k: it for k, it in zip(keys, items) if k not in cache}
    cached_before = {k for k in keys if k in cache}
    rejected: dict[str, str] = {}

    def ask(key: str, item: Item) -> None:
        t0 = time.perf_counter()
        try:
            reply = judge.reply(build_messages(item.problem, item.responses, max_chars))
        except JudgeRejected as err:
            rejected[key] = str(err)
            return
        cache.put(_verdict_record(judge, key, item, reply, time.perf_counter() - t0))

    if todo:
        bar = progress_bar(len(todo), desc="judging", unit="set") if progress else None
        pool = ThreadPoolExecutor(max_workers=judge.concurrency, thread_name_prefix="setpo-judge")
        try:
            pending = {pool.submit(ask, k, it) for k, it in todo.items()}
            while pending:
                done, pending = wait(pending, return_when=FIRST_EXCEPTION)
                if bar is not None:
                    bar.update(len(done))
                failed = [f for f in done if f.exception() is not None]
                if failed:
                    for f in pending:
                        f.cancel()
                    wait(pending)
                    err = failed[0].exception()
                    if isinstance(err, JudgeUnavailable):
                        saved = sum(k in cache for k in keys)
                        where = f"saved in {cache.path}; run again to resume" if cache.path else "not saved (no cache)"
                        raise JudgeUnavailable(f"{err}. {saved} of {len(keys)} sets judged, {where}") from None
                    raise err
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            if bar is not None:
                bar.close()

    out = []
    for key, it in zip(keys, items):
        rec = cache.get(key)
        if rec is None:
            rec = {"score": None, "missing": rejected.get(key, "rejected by the judge")[:200]}
        out.append({"method": it.method, "problem": it.problem, "score": rec["score"], "missing": rec["missing"],
                    "cached": key in cached_before})
    return out


def summarize(results: Sequence[dict], judge: Judge | None = None) -> dict[str, dict]:
    """Per method (in order of first appearance): ``summarize_verdicts`` of its results, plus the judge's name."""
    by_method: dict[str, list[Verdict]] = {}
    for r in results:
        by_method.setdefault(r["method"], []).append(Verdict(r["score"], r["missing"]))
    out = {}
    for method, verdicts in by_method.items():
        out[method] = summarize_verdicts(verdicts)
        if judge is not None:
            out[method]["judge"] = judge.name
    return out


def judge_sets(problems: Sequence[str], responses_by_method: Mapping[str, Sequence[Sequence[str]]], judge: Judge,
               cache_path: str | Path | None, *, max_chars: int = MAX_RESPONSE_CHARS, progress: bool = True) -> dict:
    """The judged diversity of each method: ``responses_by_method[m][i]`` are the responses method m sampled
    for ``problems[i]``. Returns {method: {"mean", "lo", "hi", "n", "scored", "missing", "missing_reasons",
    "prompt_version", "scale", "judge"}}; see ``judge_items`` for caching and failures."""
    if isinstance(problems, str) or not isinstance(problems, Sequence):
        raise ValueError(f"problems must be a list of texts, got {type(problems).__name__}")
    if not isinstance(responses_by_method, Mapping) or not responses_by_method:
        raise ValueError("responses_by_method must map each method's name to its list of response sets")
    items = []
    for method, sets in responses_by_method.items():
        if isinstance(sets, str) or not isinstance(sets, Sequence) or len(sets) != len(problems):
            n = len(sets) if isinstance(sets, Sequence) else type(sets).__name__
            raise ValueError(f"method {method!r} has {n} response sets for {len(problems)} problems; give one "
                             "list of responses per problem, in the problems' order")
        items += [Item(p, method, s) for p, s in zip(problems, sets)]
    results = judge_items(items, judge, cache_path, max_chars=max_chars, progress=progress)
    return summarize(results, judge)
