"""Every benchmark runs and writes its rows: `python -m setpo_lab.cli bench --smoke` (what `make bench` runs, at tiny sizes), each
benchmark's report and rows parsed and checked, and nothing written to the full runs' folder (runs/bench/).

About 1 min on 2 cores without verl, a few more with it (the smoke run of verl_cpu_step is one Ray cluster; 422 s
in a fresh clone's `make test` on 2026-12-07, when verl_real_memory's smoke run was a second one).
verl_ray_nodes is run by tests/test_verl_ray_nodes.py (its full size is already its smoke size), verl_real_memory
by tests/test_real_model.py (its light setting at full size is that test's verl run).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import harness  # noqa: E402 - benchmarks/, after the path entry above
import real_lm  # noqa: E402

HAS_VERL = all(importlib.util.find_spec(m) for m in ("verl", "ray", "transfer_queue"))
#: benchmarks whose smoke run another test file makes (so that make test runs it once)
RUN_ELSEWHERE = {"verl_ray_nodes": "tests/test_verl_ray_nodes.py", "verl_real_memory": "tests/test_real_model.py"}
NEEDS_VERL = {"verl_cpu_step"}


def benchmark_names() -> list[str]:
    from setpo_lab.cli import parse_args

    return [s.stem for s in parse_args(["bench"]).scripts]


def positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def _files(folder: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime_ns for p in folder.glob("*") if p.is_file()} if folder.is_dir() else {}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """`python -m setpo_lab.cli bench --smoke --out TMP` over every benchmark not run elsewhere: its output, exit
    status, and each benchmark's parsed JSON rows and markdown report."""
    out = tmp_path_factory.mktemp("bench_smoke")
    names = [n for n in benchmark_names() if n not in RUN_ELSEWHERE and (HAS_VERL or n not in NEEDS_VERL)]
    before = _files(harness.FULL_OUT)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("RAY_ADDRESS", None)
    run = subprocess.run([sys.executable, "-m", "setpo_lab.cli", "bench", "--smoke", "--out", str(out), *names],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=900)
    reports = {n: ((out / f"{n}.md").read_text() if (out / f"{n}.md").is_file() else None,
                   json.loads((out / f"{n}.json").read_text()) if (out / f"{n}.json").is_file() else None)
               for n in names}
    return {"run": run, "reports": reports, "full_before": before, "full_after": _files(harness.FULL_OUT)}


def _report(smoke, name):
    if name not in smoke["reports"]:
        pytest.skip(f"{name} needs verl, Ray and TransferQueue (pip install -e '.[verl]')")
    md, record = smoke["reports"][name]
    assert record is not None and md is not None, (f"{name} wrote no report:\n"
                                                   + smoke["run"].stdout[-4000:] + smoke["run"].stderr[-4000:])
    assert record["smoke"] is True and md.startswith("SMOKE RUN")
    return md, record


def test_every_benchmark_has_a_smoke_check():
    checked = {name.removeprefix("test_smoke_") for name in globals() if name.startswith("test_smoke_")}
    assert set(benchmark_names()) == checked | set(RUN_ELSEWHERE)
    assert "harness" not in benchmark_names()  # the shared helper is not a benchmark
    for test_file in RUN_ELSEWHERE.values():
        assert (ROOT / test_file).is_file()


def test_the_smoke_runs_end_and_leave_the_full_reports_alone(smoke):
    run = smoke["run"]
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-6000:]
    assert "failed" not in run.stdout.splitlines()[-1]
    assert smoke["full_after"] == smoke["full_before"]  # runs/bench/ is what a full `make bench` wrote


def test_smoke_estimator(smoke):
    md, record = _report(smoke, "estimator")
    rows = record["rows"]
    assert [(r["B"], r["G"], r["d"]) for r in rows] == [(4, 8, 16), (4, 16, 32)]
    for r in rows:
        for column in ("setpo_advantages (ms)", "shuffled uids (ms)", "matmul floor (ms)", "definition (ms)",
                       "setpo / floor", "tensor ops per call"):
            assert positive(r[column]), (column, r[column])
    assert len(record["targets"]) == 5 and {t["met"] for t in record["targets"]} <= {"PASS", "FAIL"}
    assert "| target | measured | met |" in md


def test_smoke_countdown_eval(smoke):
    md, record = _report(smoke, "countdown_eval")
    assert record["problems"] == 2 and record["samples"] == 4
    for key in ("sampling_s", "scoring_s", "nucleus_us", "layers_us"):
        assert positive(record[key]), (key, record[key])
    assert "aten::sort" in record["operators_us"] or "aten::mm" in record["operators_us"]
    assert "sampling (generate), wall clock" in md


def test_smoke_setgrpo(smoke):
    md, record = _report(smoke, "setgrpo")
    rows = record["rows"]
    assert [r["setting"].split(" ")[0] for r in rows] == ["toy", "coefficients"]
    for r in rows:
        assert positive(r["GRPO (ms)"]) and positive(r["SetGRPO (ms)"]) and positive(r["ratio"])
    assert rows[0]["met"] == "–" and rows[1]["met"] in {"PASS", "FAIL"}


def test_smoke_paper_shapes(smoke):
    md, record = _report(smoke, "paper_shapes")
    params = {r["model"]: r["parameters"] for r in record["rows"]}
    assert 1.5e9 < params["Qwen2.5-Math-1.5B-shaped"] < 1.6e9  # what the model's name says
    assert 7.5e9 < params["Qwen2.5-Math-7B-shaped"] < 7.7e9
    assert 0.55e9 < params["Qwen3-Embedding-0.6B-shaped"] < 0.65e9
    assert "1.544B" in md


def test_smoke_trl_step(smoke):
    md, record = _report(smoke, "trl_step")
    rows = record["rows"]
    names = [r["configuration"] for r in rows]
    assert len(rows) == 6 and sum(n.startswith("Countdown policy") for n in names) == 4
    assert sum(n.startswith("paper ratio") for n in names) == 2
    for r in rows:
        for key in ("grpo_s", "setpo_s", "ratio", "policy_params"):
            assert positive(r[key]), (r["configuration"], key, r[key])
        assert r["met"] in {"PASS", "FAIL"}
    assert all(positive(r["embed_s_alone"]) for r in rows if r["configuration"].startswith("paper"))
    assert "| configuration | policy params |" in md


def test_smoke_verl_cpu_step(smoke):
    md, record = _report(smoke, "verl_cpu_step")
    (row,) = record["rows"]
    assert row["configuration"] == "SetPO+GRPO (hash)" and row["steps_measured"] == 1
    for key in ("step_s", "adv_s", "embed_s", "gen_s", "update_actor_s", "wall_s"):
        assert positive(row[key]), (key, row[key])
    assert row["step_ratio"] == 1.0 and row["setpo_share"] == 0.0  # its own baseline in a smoke run
    assert "SetPO+GRPO (hash)" in md


def test_options_default_folders_keep_smoke_apart_from_full_runs(tmp_path):
    assert harness.options("", []).out == harness.FULL_OUT
    assert harness.options("", ["--smoke"]).out == harness.SMOKE_OUT != harness.FULL_OUT
    assert harness.options("", ["--smoke", "--out", str(tmp_path)]).out == tmp_path
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit):
        harness.options("", ["--out", str(tmp_path / "file")])


def test_an_out_that_is_a_file_is_refused_before_any_work(tmp_path):
    """By the lab's `bench` (exit status 2, one line) and by each benchmark's own command line."""
    from setpo_lab.cli import parse_args

    blocker = tmp_path / "not_a_folder"
    blocker.write_text("")
    with pytest.raises(SystemExit):  # the CLI checks --out itself, first
        parse_args(["bench", "--out", str(blocker)])
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "paper_shapes.py"), "--out", str(blocker)],
                         capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 2 and "is a file, not a folder" in run.stderr and "Traceback" not in run.stderr


def test_smoke_real_lm(smoke):
    md, record = _report(smoke, "real_lm")
    roof = record["roofline"]
    for key in ("bandwidth_GBps", "fp32_GFLOPs", "bf16_GFLOPs"):
        assert positive(roof[key]), (key, roof[key])
    assert [f["shape"] for f in record["floors"]] == ["short answers", "GSM8K"]
    for f in record["floors"]:
        assert all(positive(f[k]) for k in ("decode_step_floor_ms", "rollout_floor_s")), f
    paths = [(r["shape"], r["path"]) for r in record["rollouts"]]
    assert ("short answers", "(a) TRL default (generate)") in paths
    assert ("GSM8K", "(b) shared prompt + preallocated KV + grouped attention [trainer default]") in paths
    for r in record["rollouts"]:
        assert positive(r["tokens_per_s"]) and positive(r["floor_s"]) and positive(r["speedup"]), r
        if r["exact"] and "rows_equal_to_trl_default" in r:  # the exact paths sample what TRL's default samples,
            same, rows = r["rows_equal_to_trl_default"].split("/")  # from the same distributions
            assert same == rows and r["measured_exact"] and r["logprob_gap"] <= 1e-3, r
    compared = [r for r in record["rollouts"] if "logprob_gap" in r]
    assert len(compared) >= 2 * 4 and all(r["path"] != "(a) TRL default (generate)" for r in compared)
    assert [s["trainer"] for s in record["steps"]] == list(real_lm.STEP_SETUPS)
    for s in record["steps"]:
        assert all(positive(s[k]) for k in ("step_s", "generated_tokens", "generation_tokens_per_s", "update_floor_s"))
        assert s["generated_tokens"] <= 2 * 3 * 6  # the smoke preset: 2 prompts x G = 3, at most 6 new tokens
    assert len(record["targets"]) == 3 and {t["met"] for t in record["targets"]} <= {"PASS", "FAIL"}
    assert "Roofline (measured)" in md and "| shape | path |" in md
