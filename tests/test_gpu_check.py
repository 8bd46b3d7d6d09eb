"""The GPU check's CPU rehearsal (scripts/gpu_check.py --allow-cpu): every check runs, on tiny shapes, and
writes its JSON and markdown report; the install step names what is missing. (The wheel folder and the
install into a bare environment are rehearsed by hand: `prepare` needs the network.)"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu_check.py"


def _run(*args, timeout=600):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)


@pytest.mark.slow
def test_cpu_rehearsal_runs_every_check(tmp_path):
    r = _run("run", "--allow-cpu", "--out", str(tmp_path))
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    failed = {k: v.get("error") for k, v in report["checks"].items() if not v["ok"]}
    assert r.returncode == 0 and not failed, (failed, r.stdout[-3000:], r.stderr[-3000:])
    assert set(report["checks"]) == {"estimator", "verl", "embedders", "training", "floor", "overhead", "verl_e2e"}
    assert report["checks"]["verl_e2e"]["skipped"].startswith("no CUDA device")
    assert report["tiny"] and report["device"].startswith("cpu")
    assert report["checks"]["estimator"]["torch.bfloat16"]["advantage_dtype"] == "torch.float32"
    assert {"grpo_s", "setpo_s", "ratio", "policy_params", "embedder_params"} <= set(report["checks"]["overhead"])
    md = (tmp_path / "gpu_check.md").read_text()
    assert "| estimator | ok |" in md and "setpo / floor" in md and "SetPO+GRPO step" in md


def test_install_names_an_empty_wheel_folder(tmp_path):
    r = _run("install", "--wheels", str(tmp_path))
    assert r.returncode == 2 and "prepare" in r.stderr


def test_without_cuda_it_asks_for_allow_cpu(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    r = _run("--out", str(tmp_path))
    assert r.returncode == 2 and "--allow-cpu" in r.stderr


def test_help_lists_the_commands():
    r = _run("--help")
    assert r.returncode == 0
    assert "issue" not in r.stdout.lower()  # the help explains itself, it does not point at an issue number
    for word in ("prepare", "all", "--wheels", "gpu_check.json", "dry run", "60"):
        assert word in r.stdout, word
