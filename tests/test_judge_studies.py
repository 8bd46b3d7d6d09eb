"""The math and Countdown studies take an optional judge (``--judge-url/--judge-model`` or
``--judge-path``). The math study at smoke size, judged by the scripted OpenAI-compatible server of
tests/judge_server.py on 127.0.0.1 (and by a local model in-process): the record and the table hold the judged
score per method with the prompt version, a rerun asks the judge nothing again, a judge that is down is one
refusal line; the Countdown study the same way from the responses its evaluation kept; without a judge the
record has no judge key at all and the training folders' claims do not change. Bad judge flags are refused
before any work (one line, exit status 2)."""

from __future__ import annotations

import difflib
import json
from dataclasses import asdict
from pathlib import Path

import pytest

import setpo_lab.studies.countdown as countdown
from judge_server import ScriptedServer  # noqa: E402  (tests/ is on sys.path, as for helpers)
from setpo.judge import PROMPT_VERSION
from setpo_lab.studies import judging
from setpo_lab.studies import math as ml
from setpo_lab.studies.countdown_config import CountdownLMConfig
from setpo_lab.studies.countdown_results import results_markdown
from setpo_lab.studies.arguments import parse_study_args, run_command

SECRET = "sk-test-study-0c4e9a2fSECRET"


@pytest.fixture
def server(tmp_path):
    started: list[ScriptedServer] = []

    def start(rules=()) -> ScriptedServer:
        started.append(ScriptedServer(tmp_path / f"server{len(started)}", rules))
        return started[-1]

    try:
        yield start
    finally:  # stopped when the test ends, pass or fail
        for s in started:
            s.stop()


def _keys(obj) -> set[str]:
    """Every key of a JSON value, at any depth."""
    if isinstance(obj, dict):
        return set(obj) | {k for v in obj.values() for k in _keys(v)}
    if isinstance(obj, list):
        return {k for v in obj for k in _keys(v)}
    return set()


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_math_study_judged_per_method_with_the_prompt_version(tmp_path, server, monkeypatch, capsys):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    run = tmp_path / "run"
    # 1. no judge: the study as before; its record and table know nothing of a judge
    assert run_command(ml.COMMAND, ["--smoke", "--run-dir", str(run)]) == 0
    record = json.loads((run / "results.json").read_text())
    assert not {k for k in _keys(record) if "judge" in k}, "a record without a judge has judge keys"
    assert "judge" not in (run / "results.md").read_text().lower()
    assert not list(run.glob("*.texts.json")) and not (run / judging.JUDGE_CACHE).exists()
    claims = {p: p.read_bytes() for p in run.glob("*/run_config.json")}
    assert len(claims) == 2 and not {k for b in claims.values() for k in _keys(json.loads(b)) if "judge" in k}
    evals = {p: p.read_bytes() for p in run.glob("eval_*.json")}
    assert len(evals) == 2

    # 2. judge the finished runs: training and evaluation are reused (the judge is result-neutral for the claims)
    cfg = ml.MathRunConfig.cpu_demo(smoke=True, run_dir=str(run))
    first = ml._evaluated_problems(cfg, ml.load_study_problems(cfg)[1])[0].question
    judge = server([{"when": first, "reply": "I would rather not grade this."}])  # SCORE: 5 for every other set
    argv = ["--smoke", "--run-dir", str(run), "--stages", "judge", "--judge-url", judge.url, "--judge-model", "judge-m"]
    capsys.readouterr()
    assert run_command(ml.COMMAND, argv) == 0
    shown = capsys.readouterr().out
    asked = judge.requests()
    assert asked and {r["model"] for r in asked} == {"judge-m"} and all(SECRET in r["auth"] for r in asked)
    record = json.loads((run / "results.json").read_text())
    judged = record["judged"]
    assert judged["prompt_version"] == PROMPT_VERSION and judged["judge"]["model"] == "judge-m"
    assert judged["problems"] == cfg.eval_limit and judged["responses_per_set"] == cfg.eval_k
    assert set(judged["methods"]) == {"GRPO", "SetPO+GRPO"}
    for s in judged["methods"].values():
        assert s["prompt_version"] == PROMPT_VERSION and s["n"] == cfg.eval_limit
        assert (s["mean"], s["scored"], s["missing"]) == (5.0, cfg.eval_limit - 1, 1)
        assert s["missing_reasons"] == {"no score line": 1}
    # the evaluations kept no texts: they were sampled again with the same seeds, and matched
    assert set(judged["responses"].values()) == {"sampled again"}
    table = (run / "results.md").read_text()
    assert judging.JUDGED_COLUMN in table and table.count("5.00 [5.00, 5.00], 1 missing") == 2
    assert PROMPT_VERSION in table and judging.JUDGED_COLUMN in shown
    assert {p: p.read_bytes() for p in run.glob("*/run_config.json")} == claims
    assert {p: p.read_bytes() for p in run.glob("eval_*.json") if ".texts." not in p.name} == evals
    assert len(list(run.glob("eval_*.texts.json"))) == 2  # kept for the next judge
    assert all(SECRET.encode() not in b for b in _files(run).values()), "the API key reached the run folder"

    # 3. a rerun asks the judge nothing: every verdict is in the cache beside the runs
    n = len(asked)
    assert run_command(ml.COMMAND, argv) == 0 and len(judge.requests()) == n
    assert json.loads((run / "results.json").read_text())["judged"]["methods"] == judged["methods"]

    # 4. a judge that is down: one line that ends with what to do, exit status 1, nothing else changed
    judge.stop()
    capsys.readouterr()
    assert run_command(ml.COMMAND, [*argv[:-1], "another-judge"]) == 1
    err = capsys.readouterr().err.strip()
    errors = [line for line in err.splitlines() if "error:" in line]  # the rest: the judging progress bar
    assert len(errors) == 1 and errors[0] == err.splitlines()[-1]
    assert "down or too slow" in errors[0] and errors[0].endswith("rerun --stages judge") and SECRET not in err

    # 5. a local judge model, in-process (the tiny model: its context cannot hold the prompt, so every score is
    # missing, counted with its reason, and none is made up)
    assert run_command(ml.COMMAND, ["--smoke", "--run-dir", str(run), "--stages", "judge", "--judge-path", str(run / "tiny_model")]) == 0
    judged = json.loads((run / "results.json").read_text())["judged"]
    assert judged["judge"]["backend"] == "transformers" and judged["prompt_version"] == PROMPT_VERSION
    for s in judged["methods"].values():
        assert (s["mean"], s["scored"], s["missing"]) == (None, 0, cfg.eval_limit)
        assert all("exceeds the judge's context" in why for why in s["missing_reasons"])
    assert (run / "results.md").read_text().count(f"| -, {cfg.eval_limit} missing |") == 2


def test_countdown_study_judged_per_method_from_the_responses_its_evaluation_kept(tmp_path, server, monkeypatch):
    """The Countdown study at smoke size with a judge from the start: the evaluation keeps its T = 1 responses,
    stage "judge" reads them back (no second sampling), and results.json / results.md hold the judged score
    per main-cell method (seeds pooled) with the prompt version; config.json never holds the judge."""
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    judge = server([{"when": "<response 1>", "reply": "Two approaches here.\nSCORE: 4"}])
    out = tmp_path / "study"
    argv = ["--smoke", "--out", str(out), "--set", "threads=1", "--judge-url", judge.url, "--judge-model", "judge-m",
            "--judge-samples", "4", "--judge-limit", "3"]
    assert run_command(countdown.COMMAND, argv) == 0
    summary = json.loads((out / "results.json").read_text())
    judged = summary["judged"]
    cfg = CountdownLMConfig.smoke()
    methods = {r["variant"] for r in summary["runs"] if r["T"] == 1.0}
    # the warm start, GRPO, SetPO, the pairwise penalty, DRA-GRPO, Pass@k training, the perfect-kernel ceiling
    assert set(judged["methods"]) == methods and len(methods) == 7
    assert judged["prompt_version"] == PROMPT_VERSION and (judged["problems"], judged["responses_per_set"]) == (3, 4)
    for method, s in judged["methods"].items():
        seeds = 1 if method.startswith("warm") else len(cfg.rl_seeds)
        assert (s["n"], s["mean"], s["missing"], s["prompt_version"]) == (3 * seeds, 4.0, 0, PROMPT_VERSION)
    assert set(judged["responses"].values()) == {"kept by the evaluation"}
    asked = judge.requests()
    assert all("<response 4>" in r["content"] and "<response 5>" not in r["content"] for r in asked)
    assert "Using the numbers" in asked[0]["content"] and "<think>" not in asked[0]["content"]
    table = (out / "results.md").read_text()
    assert table.count("| 4.00 [4.00, 4.00], 0 missing |") == len(methods) and PROMPT_VERSION in table
    assert not {k for k in json.loads((out / "config.json").read_text()) if k.startswith("judge")}
    assert not {k for k in summary["config"] if k.startswith("judge")}
    assert all(SECRET.encode() not in b for b in _files(out).values())


@pytest.mark.parametrize("argv, match", [
    (["--judge-url", "http://127.0.0.1:9/v1"], "--judge-url needs --judge-model"),
    (["--judge-model", "m"], "--judge-model needs --judge-url"),
    (["--judge-url", "ftp://host/v1", "--judge-model", "m"], "http://HOST:PORT/v1"),
    (["--judge-url", "http://127.0.0.1:9/v1", "--judge-model", "m", "--judge-path", "/x"], "not both"),
    (["--judge-path", "/no/such/model"], "no model there"),
    (["--stages", "judge"], "--stages judge needs a judge"),
    (["--judge-samples", "4"], "need a judge"),
    (["--judge-url", "http://127.0.0.1:9/v1", "--judge-model", "m", "--judge-samples", "1"], "judge_samples"),
    (["--judge-url", "http://127.0.0.1:9/v1", "--judge-model", "m", "--judge-limit", "0"], "--judge-limit"),
])
@pytest.mark.parametrize("study", ["math", "countdown"])
def test_bad_judge_flags_are_refused_before_any_work(study, argv, match, capsys, monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    module = ml if study == "math" else countdown
    monkeypatch.setattr(module, "run_study", lambda *a, **k: pytest.fail("the study started"))
    with pytest.raises(SystemExit) as e:
        run_command(module.COMMAND, ["--smoke", *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and match in err, err


def test_good_judge_flags_reach_the_config_and_stay_out_of_the_claims(monkeypatch, tmp_path):
    seen = {}
    monkeypatch.setattr(countdown, "run_study", lambda cfg, stages, redo: seen.update(cfg=cfg, stages=stages))
    argv = ["--smoke", "--out", str(tmp_path / "cd"), "--judge-url", "http://u:pw@127.0.0.1:9/v1/", "--judge-model",
            "m", "--judge-limit", "3", "--judge-samples", "4"]
    assert run_command(countdown.COMMAND, argv) == 0
    cfg = seen["cfg"]
    assert (cfg.judge_url, cfg.judge_model, cfg.judge_limit, cfg.judge_samples) == (
        "http://u:pw@127.0.0.1:9/v1/", "m", 3, 4) and seen["stages"] == list(countdown.STAGES)
    countdown.claim_folder(cfg)  # the folder's config.json never holds the judge (nor its URL's password)
    saved = json.loads((tmp_path / "cd" / "config.json").read_text())
    assert not {k for k in saved if k.startswith("judge")} and "u:pw@" not in json.dumps(saved)
    # a command line kept in a record names the judge's URL without its user name and password
    assert judging.redact_command(["--judge-url", "http://u:pw@h:8/v1", "--judge-url=https://u:pw@h/v1"]) == [
        "--judge-url", "http://h:8/v1", "--judge-url=https://h/v1"]
    countdown.claim_folder(CountdownLMConfig.smoke(out=str(tmp_path / "cd")))  # the same folder without a judge
    model = tmp_path / "judge_model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    cfg, stages, _ = parse_study_args(ml.COMMAND, ["--smoke", "--judge-path", str(model), "--stages", "judge"])
    assert cfg.judge_path == str(model) and stages == ["judge"] and judging.judge_configured(cfg)
    assert parse_study_args(ml.COMMAND, ["--smoke"])[0].judge_path is None
    # a finished run's own config (its run_config.json; run_dir: the folder above it), to judge it later
    run = tmp_path / "runs" / "qwen" / "GRPO"
    run.mkdir(parents=True)
    saved = ml.MathRunConfig.cpu_demo(smoke=True, run_dir="../elsewhere", eval_k=3)
    (run / "run_config.json").write_text(json.dumps({"label": "GRPO", "lambda": 0.0, "config": asdict(saved)}))
    cfg, stages, _ = parse_study_args(ml.COMMAND, ["--config", str(run / "run_config.json"), "--stages", "judge", "--judge-url",
                                                   "http://127.0.0.1:9/v1", "--judge-model", "m"])
    assert cfg.run_dir == str(run.parent) and cfg.eval_k == 3 and cfg.judge_model == "m"
    # judging a run that has no evaluation yet says which stage to run first (the judge is never asked)
    with pytest.raises(ValueError, match=r"no evaluation of 'GRPO' to judge: .*eval_GRPO.json; run stage 'evaluate' first"):
        ml.run_study(cfg, log=lambda *_: None, stages=["judge"])


def test_countdown_table_and_record_gain_the_judged_column_only_with_a_judge():
    """The Countdown results table from a record: the judged column (mean [95% CI], missing) per main-cell
    method with the judge and prompt version named under it; a record without "judged" gives the table as
    before."""
    cfg = CountdownLMConfig.smoke()

    def row(variant, seed):
        return {"name": f"{variant}{seed}", "variant": variant, "method": variant, "seed": seed,
                "G": cfg.main_group_size, "beta": cfg.main_beta, "T": 1.0, "primary": False, "lam": 0,
                "pass_at_k": {"1": 0.5, str(cfg.eval_samples): 0.7}, "avg_modes": 1.5, "width": 2}

    summary = {"config": judging.without_judge(json.loads(json.dumps(asdict(cfg)))), "chosen": "x",
               "runs": [row("GRPO", 0), row("GRPO", 1)], "paired": [],
               "selection": {"rule": "r", "grpo": {"pass1": 0.5, "passn": 0.7}, "candidates": {}}, "diagnostics": {}}
    plain = results_markdown(summary)
    assert "judge" not in plain.lower()
    judged = {"judge": {"backend": "openai", "model": "judge-m"}, "prompt_version": PROMPT_VERSION, "scale": [1, 10],
              "problems": 4, "responses_per_set": 8,
              "methods": {"GRPO": {"mean": 6.5, "lo": 5.25, "hi": 7.75, "missing": 2}}}
    table = results_markdown({**summary, "judged": judged})
    header = next(line for line in table.splitlines() if line.startswith("| method | seeds"))
    assert header.endswith(f"| {judging.JUDGED_COLUMN} |")
    assert "| 6.50 [5.25, 7.75], 2 missing |" in table and PROMPT_VERSION in table and "judge-m" in table
    # only the main table changes (its header and row gain the column, the note follows it); the rest is as it was
    diff = list(difflib.ndiff(plain.splitlines(), table.splitlines()))
    added, removed = [d[2:] for d in diff if d.startswith("+ ")], [d[2:] for d in diff if d.startswith("- ")]
    assert added[-1].startswith("Judged diversity: judge-m") and len(added) == 5  # header, rule, row, blank, note
    assert removed == plain.splitlines()[4:7]  # the header, its rule and the row that gained the column
