"""setpo.judge: the versioned rubric, the parser of untrusted replies (hypothesis), the per-method
summary, the cache, and both backends end to end against real HTTP servers on 127.0.0.1: a scripted
OpenAI-compatible server (tests/judge_server.py: hostile replies, errors, slowness, a death mid-run) and
transformers' own ``transformers serve`` with the tiny random Qwen2 (the protocol, not the judgement)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from setpo.judge import (PROMPT_VERSION, SCALE, JudgeCache, JudgeUnavailable, OpenAIJudge, Verdict, build_messages,
                         cache_key, judge_items, judge_sets, parse_reply, summarize_verdicts)
from setpo.judge import rubric
from setpo.judge.__main__ import main as cli_main
from setpo.judge.backends import TransformersJudge, open_judge
from judge_server import ScriptedServer  # noqa: E402  (tests/ is on sys.path, as for helpers)
from setpo.records import read_records

ROOT = Path(__file__).resolve().parent.parent
SECRET = "sk-test-7f3a9c1e5b2d4f60SECRET"
FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
QUICK = {"timeout": 5.0, "retries": 1, "retry_wait": 0.01}  # judge options for a server on this machine


# ---------------------------------------------------------------------------------------------- servers


@pytest.fixture
def scripted(tmp_path):
    """Start scripted servers with ``scripted(rules, ...)``; every one is stopped when the test ends, pass or fail."""
    started: list[ScriptedServer] = []

    def start(rules=(), **kw) -> ScriptedServer:
        started.append(ScriptedServer(tmp_path / f"server{len(started)}", rules, **kw))
        return started[-1]

    try:
        yield start
    finally:
        for s in started:
            s.stop()


def items_for(problems, method="m", n=3):
    return [{"problem": p, "method": method, "responses": [f"{p}: answer {j}" for j in range(n)]} for p in problems]


def asked(server) -> list[str]:
    """Which problems (P0, P1, ...) the server was asked about, in order."""
    out = []
    for r in server.requests():
        problem = r["content"].split("<problem>\n", 1)[1].split("\n</problem>", 1)[0]
        out.append(problem)
    return out


# ----------------------------------------------------------------------------------------------- rubric

# Each prompt version pins the exact rubric: changing the template, the scale or the parsing without a new
# PROMPT_VERSION fails here (and would silently mix scores judged under different rubrics).
PINNED = {"diversity-v1": "5a1058d70429bdb8d2d9fbc02af2ff541fedb6bc1e8c3c4eb05415d50ab025f4"}


def rubric_fingerprint() -> str:
    """The hash of the messages for a fixed example (template, table, layout, truncation) and of the parsing."""
    example = build_messages("PROBLEM", ["A", "B " * 3000, ""])
    parts = [json.dumps(example), repr(SCALE), rubric.SCORE_LINE.pattern, rubric.SCORE_VALUE.pattern,
             str(rubric.MAX_RESPONSE_CHARS)]
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()


def test_prompt_version_pins_the_rubric():
    assert PROMPT_VERSION in PINNED, f"new prompt version {PROMPT_VERSION}: pin its fingerprint in PINNED"
    assert rubric_fingerprint() == PINNED[PROMPT_VERSION], (
        "the rubric (prompt, scale or parsing) changed: give it a new PROMPT_VERSION and pin that")


def test_messages_show_problem_every_response_and_the_table():
    responses = [f"approach number {i}" for i in range(7)] + [""]
    [user] = build_messages("Find x.", responses)
    assert user["role"] == "user" and user["content"].startswith(rubric.ROLE)
    assert "<problem>\nFind x.\n</problem>" in user["content"]
    for i, r in enumerate(responses[:-1], 1):
        assert f"<response {i}>\n{r}\n</response {i}>" in user["content"]
    assert "<response 8>\n(empty response)\n</response 8>" in user["content"]
    assert "- 1 distinct approach: score 1\n" in user["content"]
    assert "- 8 distinct approaches: score 10\n" in user["content"]
    assert user["content"].endswith("SCORE: <whole number from 1 to 10>")
    cut = build_messages("p", ["x" * 50, "y"], max_chars=10)[0]["content"]
    assert "x" * 10 + "\n[... cut: 40 more characters]" in cut and "x" * 11 not in cut


def test_score_table_spans_the_scale():
    for n in range(2, 40):
        scores = [rubric.score_for_count(k, n) for k in range(1, n + 1)]
        assert scores[0] == SCALE[0] and scores[-1] == SCALE[1]
        assert scores == sorted(scores)
    assert [rubric.score_for_count(k, 8) for k in range(1, 9)] == [1, 2, 4, 5, 6, 7, 9, 10]


@pytest.mark.parametrize("problem, responses, match", [
    ("p", ["only one"], "at least 2 responses"),
    ("p", "two responses as one string", "list of texts"),
    ("p", ["a", 3], "response 1"),
    ("", ["a", "b"], "non-empty text"),
])
def test_bad_sets_are_one_clear_error(problem, responses, match):
    with pytest.raises(ValueError, match=match):
        build_messages(problem, responses)


# ---------------------------------------------------------------------------------------------- parsing

@pytest.mark.parametrize("reply, score", [
    ("Responses 1 and 3 share one method; 2 is different.\nSCORE: 4", 4),
    ("SCORE: 7", 7), ("score: 7", 7), ("**SCORE:** 7", 7), ("SCORE: **7**", 7), ("### Score: 7", 7),
    ("Final score: 7.", 7), ("SCORE = 7", 7), ("SCORE: 7/10", 7), ("SCORE: 7 out of 10", 7), ("7", 7),
    ("  10\n", 10), ("SCORE: 1", 1), ("SCORE: 4\r\n", 4), ("SCORE: 6\nSCORE: 6", 6),
    ("<think>maybe SCORE: 2</think>\nSCORE: 5", 5), ("...reasoning</think>SCORE: 3", 3),
])
def test_parser_reads_scores(reply, score):
    assert parse_reply(reply) == Verdict(score)


@pytest.mark.parametrize("reply, reason", [
    (None, "empty reply"), ("", "empty reply"), ("   \n", "empty reply"), (42, "empty reply"),
    ("I'm sorry, but I can't help with that.", "no score line"),
    ("The responses are quite diverse, I would say around seven.", "no score line"),
    ("The score is 7", "no score line"),
    ("SCORE: 0", "out of range"), ("SCORE: 11", "out of range"), ("SCORE: 100", "out of range"), ("12", "out of range"),
    ("SCORE: 7.5", "not one whole number"), ("SCORE: 6 or 7", "not one whole number"),
    ("SCORE: 6-7", "not one whole number"), ("SCORE: seven", "not one whole number"),
    ("SCORE: 7/5", "not one whole number"), ("SCORE: -3", "not one whole number"), ("SCORE:", "not one whole number"),
    ("SCORE: \u0667", "not one whole number"), ("SCORE: " + "9" * 5000, "not one whole number"),
    ("SCORE: 3\nSCORE: 8", "several different scores"), ("3 8", "no score line"),
    ("<think>SCORE: 3", "unfinished reasoning"), ("<think>x</think>", "empty reply"),
])
def test_parser_gives_missing_scores_with_reasons(reply, reason):
    assert parse_reply(reply) == Verdict(None, reason)


prose = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=300).filter(
    lambda t: "score" not in t.lower() and "think>" not in t)
in_range = st.integers(SCALE[0], SCALE[1])


@FAST
@given(prose, in_range, st.sampled_from(["SCORE: {}", "**Score:** {}", "Final score = {}.", "SCORE: {}/10"]))
def test_a_score_line_after_any_prose_is_read(text, score, form):
    assert parse_reply(f"{text}\n{form.format(score)}\n") == Verdict(score)


@FAST
@given(prose, st.one_of(st.integers(-10**6, SCALE[0] - 1), st.integers(SCALE[1] + 1, 10**12)))
def test_out_of_range_is_missing(text, score):
    assert parse_reply(f"{text}\nSCORE: {score}").score is None


@FAST
@given(prose, in_range, in_range)
def test_two_different_scores_are_missing(text, a, b):
    v = parse_reply(f"SCORE: {a}\n{text}\nSCORE: {b}")
    assert v == (Verdict(a) if a == b else Verdict(None, "several different scores"))


@FAST
@given(st.text(max_size=400))
def test_any_reply_parses_without_crash_and_never_invents_a_number(text):
    v = parse_reply(text)
    assert (v.score is None) != (v.missing is None)
    if v.score is not None:
        assert SCALE[0] <= v.score <= SCALE[1] and str(v.score) in text


@FAST
@given(st.text(st.characters(exclude_categories=["Nd", "Cs"]), max_size=300))
def test_a_reply_without_digits_is_missing(text):
    assert parse_reply(text).score is None


# ------------------------------------------------------------------------------------------ aggregation

@pytest.mark.parametrize("df, t", [(1, 12.7062), (2, 4.3027), (4, 2.7764), (10, 2.2281), (30, 2.0423),
                                   (120, 1.9799), (10**5, 1.9600)])
def test_t_quantile(df, t):
    assert rubric.t_quantile_975(df) == pytest.approx(t, abs=1e-4)


def test_summary_mean_interval_and_missing():
    vs = [Verdict(4), Verdict(6), Verdict(None, "no score line"), Verdict(8), Verdict(None, "out of range"),
          Verdict(None, "no score line")]
    s = summarize_verdicts(vs)
    half = 4.302653 * 2.0 / 3 ** 0.5  # t(0.975, 2) * sd / sqrt(n)
    assert s["mean"] == 6 and s["lo"] == pytest.approx(6 - half, abs=1e-4) and s["hi"] == pytest.approx(6 + half)
    assert (s["n"], s["scored"], s["missing"]) == (6, 3, 3)
    assert s["missing_reasons"] == {"no score line": 2, "out of range": 1}
    assert s["prompt_version"] == PROMPT_VERSION and s["scale"] == [1, 10]
    one = summarize_verdicts([Verdict(5), Verdict(None, "empty reply")])
    assert one["mean"] == 5 and one["lo"] is None and one["missing"] == 1
    none = summarize_verdicts([Verdict(None, "empty reply")] * 3)
    assert none["mean"] is None and none["missing"] == 3 and none["scored"] == 0


# ------------------------------------------------------------------------------------------------ cache

def test_cache_key_depends_on_everything_a_verdict_depends_on():
    base = cache_key("j", "p", ["a", "b"])
    assert base == cache_key("j", "p", ("a", "b"))
    others = {cache_key("k", "p", ["a", "b"]), cache_key("j", "q", ["a", "b"]), cache_key("j", "p", ["a", "c"]),
              cache_key("j", "p", ["b", "a"]), cache_key("j", "p", ["a", "b"], max_chars=10)}
    assert base not in others and len(others) == 5


def test_cache_drops_a_cut_last_line_and_appends_after_it(tmp_path):
    path = tmp_path / "c.jsonl"
    JudgeCache(path).put({"key": "a", "score": 3, "missing": None})
    with open(path, "a") as f:
        f.write('{"key": "b", "sco')  # a kill mid-write
    cache = JudgeCache(path)
    assert "a" in cache and "b" not in cache
    cache.put({"key": "c", "score": None, "missing": "no score line"})
    assert [r["key"] for r in read_records(path)] == ["a", "c"]
    (tmp_path / "bad.jsonl").write_text('{"no key": 1}\n')
    with pytest.raises(ValueError, match="not a judge verdict"):
        JudgeCache(tmp_path / "bad.jsonl")


# ------------------------------------------------------------------------- end to end, scripted server

HOSTILE = [
    {"when": "P0\n", "reply": "Responses 1 and 2 share a method, 3 differs.\nSCORE: 6"},
    {"when": "P1\n", "reply": "SCORE: 12"},
    {"when": "P2\n", "reply": "I'm sorry, but I can't help with grading this."},
    {"when": "P3\n", "reply": "SCORE: 3\nOn reflection:\nSCORE: 8"},
    {"when": "P4\n", "reply": ""},
    {"when": "P5\n", "null": True},
    {"when": "P6\n", "reply": "Seven out of ten."},
    {"when": "P7\n", "garbage": True},
    {"when": "P8\n", "status": 400, "message": "prompt too long"},
    {"when": "P9\n", "reply": "**SCORE:** 9"},
]


def test_scores_parsed_and_hostile_answers_counted_as_missing(scripted, tmp_path):
    server = scripted(HOSTILE)
    judge = OpenAIJudge(model="judge-m", base_url=server.url, api_key=SECRET, **QUICK)
    problems = [f"P{i}" for i in range(10)]
    sets = [[f"{p} way {j}" for j in range(3)] for p in problems]
    out = judge_sets(problems, {"A": sets}, judge, tmp_path / "cache.jsonl", progress=False)
    s = out["A"]
    assert (s["n"], s["scored"], s["missing"], s["mean"]) == (10, 2, 8, 7.5)
    assert s["missing_reasons"] == {"empty reply": 2, "no score line": 2, "out of range": 1,
                                    "several different scores": 1,
                                    "malformed answer from the judge server (no choices[0].message)": 1,
                                    "rejected by the judge server (HTTP 400): prompt too long": 1}
    assert s["prompt_version"] == PROMPT_VERSION and s["judge"] == judge.name
    reqs = server.requests()
    assert len(reqs) == 10  # the 400 and the malformed answer are per-item, not retried
    assert {r["auth"] for r in reqs} == {f"Bearer {SECRET}"} and {r["model"] for r in reqs} == {"judge-m"}
    records = read_records(tmp_path / "cache.jsonl")
    assert len(records) == 8  # replies are cached, rejected requests are not
    assert {r["prompt_version"] for r in records} == {PROMPT_VERSION}
    assert all(SECRET not in json.dumps(r) for r in records)


def test_cache_hit_on_rerun_asks_nothing_and_survives_a_new_port(scripted, tmp_path):
    server = scripted([{"when": "P1\n", "reply": "SCORE: 2"}, {"when": "", "reply": "SCORE: 8"}])
    judge = OpenAIJudge(model="m", base_url=server.url, **QUICK)
    cache = tmp_path / "cache.jsonl"
    items = items_for(["P0", "P1", "P2"]) + items_for(["P0"], method="dup")  # the same set twice: asked once
    first = judge_items(items, judge, cache, progress=False)
    assert [r["score"] for r in first] == [8, 2, 8, 8] and not any(r["cached"] for r in first)
    assert sorted(asked(server)) == ["P0", "P1", "P2"]
    again = judge_items(items, judge, cache, progress=False)
    assert len(server.requests()) == 3  # no second request
    assert [r["score"] for r in again] == [8, 2, 8, 8] and all(r["cached"] for r in again)
    moved = scripted()  # the same judge served elsewhere: the cache still holds
    judge2 = OpenAIJudge(model="m", base_url=moved.url, **QUICK)
    changed = items_for(["P0", "P1", "P2"])
    changed[2]["responses"] = ["something else", "entirely", "new"]
    assert [r["score"] for r in judge_items(changed, judge2, cache, progress=False)] == [8, 2, 5]
    assert asked(moved) == ["P2"]
    other = OpenAIJudge(model="another-model", base_url=moved.url, **QUICK)  # another judge: asked again
    judge_items(items_for(["P0"]), other, cache, progress=False)
    assert asked(moved) == ["P2", "P0"]


@pytest.mark.parametrize("concurrency", [1, 4])
def test_server_killed_mid_run_is_one_clear_error_and_the_cache_resumes(scripted, tmp_path, concurrency):
    server = scripted(die_after=3)
    judge = OpenAIJudge(model="m", base_url=server.url, concurrency=concurrency, **QUICK)
    cache = tmp_path / "cache.jsonl"
    problems = [f"P{i}" for i in range(8)]
    items = items_for(problems)
    with pytest.raises(JudgeUnavailable) as err:
        judge_items(items, judge, cache, progress=False)
    assert server.proc.wait(timeout=5) == 3  # the server really died
    saved = {r["problem"] for r in read_records(cache)}
    # one at a time, the 3 answered requests are saved; 4 at once, the death may cut some of their answers off
    assert saved <= set(asked(server)[:3]) and (len(saved) == 3 if concurrency == 1 else len(saved) <= 3)
    msg = str(err.value)
    assert "\n" not in msg and "is down or too slow" in msg and server.url in msg
    assert f"{len(saved)} of 8 sets judged, saved in {cache}; run again to resume" in msg
    restarted = scripted()
    judge2 = OpenAIJudge(model="m", base_url=restarted.url, concurrency=concurrency, **QUICK)
    out = judge_items(items, judge2, cache, progress=False)
    assert [r["score"] for r in out] == [5] * 8 and [r["cached"] for r in out] == [p in saved for p in problems]
    assert sorted(asked(restarted)) == sorted(set(problems) - saved)  # only what the first run had not saved


def test_slow_server_gives_up_after_bounded_retries(scripted, tmp_path):
    server = scripted([{"when": "", "sleep": 30}])
    judge = OpenAIJudge(model="m", base_url=server.url, timeout=0.3, retries=1, retry_wait=0.01)
    import openai  # noqa: F401  (imported before the clock starts: a loaded machine is slow at it)

    t0 = time.perf_counter()
    with pytest.raises(JudgeUnavailable, match=r"no answer within 0.3 s \(tried 2 times, 0.3 s each\)") as err:
        judge_items(items_for(["P0"]), judge, tmp_path / "c.jsonl", progress=False)
    assert time.perf_counter() - t0 < 10 and "\n" not in str(err.value)  # not the 30 s the server takes
    assert len(server.requests()) == 2


def test_server_errors_are_retried(scripted, tmp_path):
    server = scripted([{"when": "", "status": 503, "times": 2}, {"when": "", "reply": "SCORE: 4"}])
    judge = OpenAIJudge(model="m", base_url=server.url, timeout=5, retries=2, retry_wait=0.01)
    assert judge_items(items_for(["P0"]), judge, None, progress=False)[0]["score"] == 4
    assert len(server.requests()) == 3


def test_nothing_listening_is_one_clear_error(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    judge = OpenAIJudge(model="m", base_url=f"http://127.0.0.1:{port}/v1", timeout=2, retries=1, retry_wait=0.01)
    with pytest.raises(JudgeUnavailable, match=r"is down or too slow: cannot connect .*0 of 1 sets judged") as err:
        judge_items(items_for(["P0"]), judge, tmp_path / "c.jsonl", progress=False)
    assert "\n" not in str(err.value)


def test_concurrency_is_bounded(scripted):
    server = scripted(delay=0.15)
    judge = OpenAIJudge(model="m", base_url=server.url, concurrency=3, **QUICK)
    judge_items(items_for([f"P{i}" for i in range(12)]), judge, None, progress=False)
    peak = max(r["in_flight"] for r in server.requests())
    assert len(server.requests()) == 12 and 2 <= peak <= 3


def test_api_key_never_in_a_record_log_or_error(scripted, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)  # every logger, the openai client's and httpx's included
    server = scripted([{"when": "P0\n", "echo_auth": True}, {"when": "P1\n", "status": 422, "echo_auth": True},
                       {"when": "P2\n", "status": 500, "echo_auth": True}, {"when": "P3\n", "status": 401,
                                                                             "echo_auth": True}])
    judge = OpenAIJudge(model="m", base_url=server.url, api_key=SECRET, **QUICK)
    assert SECRET not in repr(judge) + json.dumps(judge.describe()) + judge.name
    with_password = OpenAIJudge(model="m", base_url="http://user:pw@127.0.0.1:8000/v1")
    assert "pw" not in repr(with_password) + json.dumps(with_password.describe())
    assert with_password.describe()["base_url"] == "http://127.0.0.1:8000/v1"
    cache = tmp_path / "cache.jsonl"
    out = judge_items(items_for(["P0", "P1"]), judge, cache, progress=False)  # echoed in a reply, in a 422
    errors = []
    for p in ("P2", "P3"):  # echoed in a 500 (retried, then down) and in a 401
        with pytest.raises(JudgeUnavailable) as err:
            judge_items(items_for([p]), judge, cache, progress=False)
        errors.append(str(err.value))
    assert "refused the API key (HTTP 401)" in errors[1] and "HTTP 500" in errors[0]
    assert all(f"Bearer {SECRET}" == r["auth"] for r in server.requests())  # the server did get the key
    seen = json.dumps(out) + cache.read_text() + " ".join(errors) + caplog.text
    assert "Bearer ***" in seen  # the echoes came back, redacted
    assert SECRET not in seen


# ------------------------------------------------------------------------------------------------- CLI

def test_cli_judges_a_finished_run_and_resumes(scripted, tmp_path, capsys, monkeypatch):
    server = scripted([{"when": "P1\n", "reply": "refused"}, {"when": "", "reply": "SCORE: 7"}])
    run = tmp_path / "responses.jsonl"
    run.write_text("".join(json.dumps(it) + "\n" for it in items_for(["P0", "P1"], "GRPO") +
                           items_for(["P0", "P1"], "SetPO+GRPO", n=4)))
    cmd = [sys.executable, "-m", "setpo.judge", str(run), "--url", server.url, "--model", "m", "--no-progress",
           "--retries", "0"]
    env = {**os.environ, "OPENAI_API_KEY": SECRET, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "| GRPO | 7.00 | - | 1 | 1 | no score line: 1 |" in done.stdout
    assert len(server.requests()) == 4
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    assert cli_main(cmd[3:]) == 0  # again, in this process: everything from the cache
    again = capsys.readouterr()
    assert len(server.requests()) == 4 and "| GRPO | 7.00 | - | 1 | 1 | no score line: 1 |" in again.out
    summary = json.loads((tmp_path / "responses.jsonl.judged.json").read_text())
    assert summary["prompt_version"] == PROMPT_VERSION and summary["judge"]["model"] == "m"
    assert summary["methods"]["SetPO+GRPO"]["scored"] == 1 and len(summary["items"]) == 4
    cache = tmp_path / "responses.jsonl.judge-cache.jsonl"
    assert len(read_records(cache)) == 4
    assert SECRET not in done.stdout + done.stderr + again.out + again.err + json.dumps(summary) + cache.read_text()


def _cli_error(argv, capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_:
        cli_main(argv)
    return exit_.value.code, capsys.readouterr().err


@pytest.mark.parametrize("args, match", [
    ([], "required: file"),
    (["{run}", "--url", "ftp://x/v1", "--model", "m"], "http://HOST:PORT/v1"),
    (["{run}", "--url", "http://127.0.0.1:1/v1"], "--model is required"),
    (["{run}", "--local", "{tmp}", "--url", "http://127.0.0.1:1/v1"], "not both"),
    (["{run}", "--local", "{tmp}"], "no model there"),
    (["{tmp}/absent.jsonl", "--url", "http://127.0.0.1:1/v1", "--model", "m"], "no such file"),
    (["{bad}", "--url", "http://127.0.0.1:1/v1", "--model", "m"], "bad.jsonl: line 1 cannot be loaded; give a JSON list"),
    (["{obj}", "--url", "http://127.0.0.1:1/v1", "--model", "m"], "item 0 is str"),
    (["{one}", "--url", "http://127.0.0.1:1/v1", "--model", "m"], "item 0: judging diversity needs at least 2"),
    (["{run}", "--url", "http://127.0.0.1:1/v1", "--model", "m", "--concurrency", "0"], "--concurrency"),
    (["{run}", "--url", "http://127.0.0.1:1/v1", "--model", "m", "--timeout", "0"], "--timeout must be > 0"),
    (["{run}", "--url", "http://127.0.0.1:1/v1", "--model", "m", "--out", "{tmp}"], "is a folder"),
])
def test_cli_bad_arguments_are_one_line_and_exit_2(args, match, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    (tmp_path / "run.jsonl").write_text(json.dumps(items_for(["P0"])[0]) + "\n")
    (tmp_path / "bad.jsonl").write_text("{not json\n{}\n")
    (tmp_path / "obj.json").write_text(json.dumps(["just text"]))
    (tmp_path / "one.json").write_text(json.dumps([{"problem": "p", "method": "m", "responses": ["a"]}]))
    names = {"run": tmp_path / "run.jsonl", "bad": tmp_path / "bad.jsonl", "one": tmp_path / "one.json",
             "obj": tmp_path / "obj.json", "tmp": tmp_path}
    code, err = _cli_error([a.format(**names) for a in args], capsys)
    assert code == 2 and err.count("\n") == 1 and match in err, err


def test_cli_server_down_is_one_line_and_exit_1(tmp_path, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "run.jsonl").write_text(json.dumps(items_for(["P0"])[0]) + "\n")
    code = cli_main([str(tmp_path / "run.jsonl"), "--url", f"http://127.0.0.1:{port}/v1", "--model", "m",
                     "--retries", "0", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and "is down or too slow" in err and "run again to resume" in err


# ------------------------------------------- external input never shows a traceback: replies, files, env

def _judge_cli(args, env_extra=None, timeout=120) -> subprocess.CompletedProcess:
    """``python -m setpo.judge ARGS`` as a user runs it, in its own process."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "setpo.judge", *args, "--no-progress"], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=timeout)


BROKEN_REPLIES = [
    {"when": "P0\n", "raw": '{"id": "c1", "choices": [{"message": {"content": "SCORE: 5"'},  # broken JSON
    {"when": "P1\n", "raw": "<html><body>502 Bad Gateway</body></html>", "content_type": "text/html"},
    {"when": "P2\n", "raw": "Internal error, try later"},  # not JSON, sent as application/json
    {"when": "P3\n", "raw": "[" * 100_000},  # nested deeper than any parser's stack
    {"when": "P4\n", "raw": ""},
    {"when": "P5\n", "raw": '{"choices": [{"message": {"content": {"score": 9}}}]}'},  # wrong shape
    {"when": "P6\n", "reply": "SCORE: 7"},
]


def test_cli_broken_replies_are_counted_missing_scores(scripted, tmp_path):
    server = scripted(BROKEN_REPLIES)
    run = tmp_path / "responses.jsonl"
    run.write_text("".join(json.dumps(it) + "\n" for it in items_for([f"P{i}" for i in range(7)], "GRPO")))
    done = _judge_cli([str(run), "--url", server.url, "--model", "m", "--retries", "0", "--timeout", "10"])
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    summary = json.loads((tmp_path / "responses.jsonl.judged.json").read_text())["methods"]["GRPO"]
    assert (summary["scored"], summary["missing"], summary["mean"]) == (1, 6, 7.0)
    assert summary["missing_reasons"] == {"malformed answer from the judge server (not JSON)": 4,
                                          "malformed answer from the judge server (no choices[0].message)": 1,
                                          "malformed answer from the judge server (content is dict)": 1}
    assert "| GRPO | 7.00 | - | 1 | 6 |" in done.stdout
    assert len(server.requests()) == 7  # one request each: a malformed answer is not retried


def test_cli_truncated_reply_is_one_line_and_exit_1(scripted, tmp_path):
    """A server that closes the connection mid-body is retried like one that is down, then one line, exit 1."""
    server = scripted([{"when": "", "cut": 40}])
    run = tmp_path / "responses.jsonl"
    run.write_text(json.dumps(items_for(["P0"])[0]) + "\n")
    done = _judge_cli([str(run), "--url", server.url, "--model", "m", "--retries", "1", "--timeout", "10"])
    assert done.returncode == 1 and "Traceback" not in done.stderr
    *retries, error = done.stderr.splitlines()  # a warning line per retry, then the error
    assert len(retries) == 1 and "try 2 of 2" in retries[0]
    assert error.startswith("python -m setpo.judge: error:") and "answer cut off" in error
    assert "run again to resume" in error and len(server.requests()) == 2


def test_cli_environment_errors_are_one_line(scripted, tmp_path):
    server = scripted()
    run = tmp_path / "responses.jsonl"
    run.write_text(json.dumps(items_for(["P0"])[0]) + "\n")
    args = [str(run), "--url", server.url, "--model", "m", "--retries", "0"]
    for key in ("sk-two\nlines", "sk-ключ", "sk with spaces"):
        done = _judge_cli([*args, "--api-key-env", "JUDGE_KEY"], {"JUDGE_KEY": key})
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert "$JUDGE_KEY holds characters an HTTP header cannot carry" in done.stderr and key not in done.stderr
    for proxy in ("http://proxy:notaport", "ftp://proxy:1"):
        done = _judge_cli(args, {"HTTP_PROXY": proxy, "http_proxy": proxy, "NO_PROXY": "", "no_proxy": ""})
        assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
        assert "cannot set up the HTTP client" in done.stderr and "HTTP_PROXY" in done.stderr
    assert server.requests() == []


@pytest.mark.parametrize("content, match", [
    ("[" * 100_000, "run.json: cannot be loaded; give a JSON list of {problem, method, responses} objects, or one "
                    "per line (JSONL) (cause: nested too deeply"),
    ("{\"problem\": " + "[" * 100_000 + "\n", "run.json: line 1 cannot be loaded; give a JSON list"),
])
def test_cli_hostile_items_file_is_one_line(content, match, tmp_path):
    (tmp_path / "run.json").write_text(content)
    done = _judge_cli([str(tmp_path / "run.json"), "--url", "http://127.0.0.1:1/v1", "--model", "m"])
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and match in done.stderr, done.stderr


@pytest.mark.parametrize("cache, match", [
    (b"{not json\n{}\n", "cache.jsonl: line 1 cannot be loaded; give another cache file"),
    (b"\xff\xfe\x00\n", "cache.jsonl: cannot be loaded; give another cache file, or delete this one to judge again "
                         "(cause: not a readable JSON lines file"),
    (b'{"k": 1}\n', "cache.jsonl: record 1 is not a judge verdict; give another cache file, or delete this one to "
                    "judge again (cause: no 'key'"),
    (b'{"key": "x", "score": 11, "missing": null}\n', "'score' must be null or a whole number from 1 to 10"),
    (b'{"key": "x", "score": "7", "missing": null}\n', "'score' must be null or a whole number"),
    (b'{"key": "x", "score": null, "missing": 3}\n', "'missing' must be null or text"),
])
def test_cli_damaged_or_foreign_cache_is_one_line_before_any_request(cache, match, tmp_path, capsys):
    (tmp_path / "run.jsonl").write_text(json.dumps(items_for(["P0"])[0]) + "\n")
    (tmp_path / "cache.jsonl").write_bytes(cache)
    code, err = _cli_error([str(tmp_path / "run.jsonl"), "--url", "http://127.0.0.1:1/v1", "--model", "m",
                            "--cache", str(tmp_path / "cache.jsonl")], capsys)
    assert code == 2 and err.count("\n") == 1 and match in err and "cache.jsonl" in err, err


@pytest.mark.parametrize("config, refusal", [
    ("{broken", "cannot be loaded; give the folder of a complete chat model"),  # damaged
    (json.dumps({"model_type": "qwen2"}), "has no chat template; give an instruct/chat model"),  # no tokenizer, weights
])
def test_cli_local_model_that_cannot_load_is_one_line(config, refusal, tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(config)
    (tmp_path / "run.jsonl").write_text(json.dumps(items_for(["P0"])[0]) + "\n")
    done = _judge_cli([str(tmp_path / "run.jsonl"), "--local", str(tmp_path / "model")],
                      {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    error = done.stderr.splitlines()[-1]
    # the folder and what to do first, then a short cause in the package's words, never the library's text
    assert error.startswith(f"python -m setpo.judge: error: the judge model model: {refusal}"), done.stderr
    assert "weights_only" not in done.stderr and "JSONDecodeError" not in done.stderr, done.stderr


def test_cli_summary_that_cannot_be_written_is_one_line(scripted, tmp_path):
    server = scripted()
    run = tmp_path / "responses.jsonl"
    run.write_text(json.dumps(items_for(["P0"])[0]) + "\n")
    done = _judge_cli([str(run), "--url", server.url, "--model", "m", "--out", "/proc/setpo-judge-summary.json"])
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert "cannot write the summary /proc/setpo-judge-summary.json" in done.stderr
    assert "run again with another --out" in done.stderr


# ---------------------------------------------------------------- the real thing: transformers serve + in-process

CONTEXT = 4096


@pytest.fixture(scope="module")
def tiny_chat_model(tmp_path_factory):
    from dataclasses import replace

    from setpo.trl.tiny_models import TINY_QWEN2, make_tiny_model

    # A character-level tokenizer makes the judge's prompt ~1300 tokens: give the tiny model room for it.
    size = replace(TINY_QWEN2, max_position_embeddings=CONTEXT)
    return make_tiny_model(tmp_path_factory.mktemp("judge") / "tiny-qwen2", size=size)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_transformers_serve_end_to_end(tiny_chat_model, tmp_path):
    """transformers' own OpenAI-compatible server with the tiny random Qwen2: the real protocol and real replies
    (noise, parsed like any reply, so almost surely missing scores), a cache hit on rerun, and a killed server
    giving one clear error with the cache intact. The server is stopped when the test ends, pass or fail."""
    port = _free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "HF_HUB_DISABLE_TELEMETRY": "1"}
    cmd = [sys.executable, "-m", "transformers.cli.transformers", "serve", str(tiny_chat_model), "--host",
           "127.0.0.1", "--port", str(port), "--device", "cpu", "--log-level", "info"]
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.time() + 120
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                assert proc.poll() is None and time.time() < deadline, (tmp_path / "serve.log").read_text()[-3000:]
                time.sleep(0.25)
        judge = OpenAIJudge(model=str(tiny_chat_model), base_url=f"http://127.0.0.1:{port}/v1", max_tokens=8,
                            concurrency=2, **QUICK)
        cache = tmp_path / "cache.jsonl"
        items = items_for(["P0", "P1", "P2"])

        def served() -> int:
            return (tmp_path / "serve.log").read_text().count("POST /v1/chat/completions")

        out = judge_items(items, judge, cache, progress=False)
        records = {r["key"]: r for r in read_records(cache)}
        assert served() == 3 and len(records) == 3
        for r in records.values():  # a real reply came back, and its verdict is the parser's
            assert isinstance(r["reply"], str) and Verdict(r["score"], r["missing"]) == parse_reply(r["reply"])
        assert summarize_verdicts([Verdict(r["score"], r["missing"]) for r in out])["n"] == 3
        assert all(r["cached"] for r in judge_items(items, judge, cache, progress=False)) and served() == 3
        proc.kill()  # the server dies; the next set cannot be judged
        proc.wait(timeout=10)
        with pytest.raises(JudgeUnavailable, match=r"is down or too slow: cannot connect.* 3 of 4 sets judged") as e:
            judge_items(items + items_for(["P3"]), judge, cache, progress=False)
        assert "\n" not in str(e.value) and len(read_records(cache)) == 3
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        log.close()


@pytest.mark.slow
def test_transformers_judge_in_process(tiny_chat_model, tmp_path):
    judge = open_judge(path=tiny_chat_model, max_tokens=8)
    assert isinstance(judge, TransformersJudge) and judge.describe()["backend"] == "transformers"
    out = judge_items(items_for(["P0", "P1"]), judge, tmp_path / "c.jsonl", progress=False)
    records = read_records(tmp_path / "c.jsonl")
    assert len(out) == len(records) == 2
    for r in records:
        assert isinstance(r["reply"], str) and Verdict(r["score"], r["missing"]) == parse_reply(r["reply"])
    assert all(r["cached"] for r in judge_items(items_for(["P0", "P1"]), judge, tmp_path / "c.jsonl", progress=False))
    too_long = [{"problem": "P9", "method": "m", "responses": ["x" * 3000, "y" * 3000]}]  # > CONTEXT tokens
    [r] = judge_items(too_long, judge, tmp_path / "c.jsonl", progress=False)
    assert r["score"] is None and f"exceeds the judge's context of {CONTEXT}" in r["missing"]
    assert len(read_records(tmp_path / "c.jsonl")) == 2  # a rejected set is not cached: a rerun asks again
    run = tmp_path / "run.json"
    run.write_text(json.dumps(items_for(["P0", "P1"], "GRPO")))
    assert cli_main([str(run), "--local", str(tiny_chat_model), "--max-tokens", "4", "--no-progress"]) == 0
    summary = json.loads((tmp_path / "run.json.judged.json").read_text())
    assert summary["judge"]["backend"] == "transformers" and summary["methods"]["GRPO"]["n"] == 2


def test_open_judge_checks_its_arguments(tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ValueError, match="no model at"):
        open_judge(path=tmp_path)
    with pytest.raises(ValueError, match="not both"):
        open_judge(path=tmp_path, url="http://127.0.0.1:1/v1", model="m")
    with pytest.raises(ValueError, match="no judge server"):
        open_judge(model="m")
    with pytest.raises(ValueError, match="needs a model name"):
        open_judge(url="http://127.0.0.1:1/v1")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    assert open_judge(model="m").base_url == "http://127.0.0.1:9/v1"
    for bad in ({"timeout": 0}, {"retries": -1}, {"concurrency": 1.5}, {"max_tokens": 0}, {"temperature": 3}):
        with pytest.raises(ValueError):
            OpenAIJudge(model="m", **bad)


# --------------------------------------------------------------------------------------------- layering

# setpo.judge's place in the layers (core; client.py and backends.py engine adapters; __main__.py a command
# line) is checked with every other module's by tests/test_layers.py.


def test_importing_the_judge_loads_no_client_or_engine():
    code = ("import sys, setpo.judge; print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('openai', 'transformers', 'httpx', 'httpx2', 'trl', 'vllm')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"
