"""Re-stamping a record, end to end on a smoke study in a throwaway git repository (the committed record was
re-stamped by the same command, docs/reproducibility/index.md): after a code change that moves code without
changing what it makes, the study refuses the record naming the file; ``python -m setpo_lab.studies.countdown_record``
checks it with the code it names, proves the two codes make the same smoke study bit for bit, and re-stamps
only its code fingerprints, after which the study resumes it. A record that does not check is left as it was."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The smallest study that has every stage, its replication excluded (a re-stamp reads the replication the same way)
SMOKE = ["--smoke", "--set", "other_cells=[]", "rl_seeds=[0]", 'dra_embedders=["hash"]', "eval_temperatures=[1.0]",
         "threads=1"]


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout.strip()


def _run(root: Path, module: str, out: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(root)}
    return subprocess.run([sys.executable, "-m", module, *SMOKE, "--out", str(out)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=900)


def _without_code(record):
    """A record with every identity's ``code`` left out: what a re-stamp must leave as it was."""
    if isinstance(record, dict):
        return {k: _without_code(v) for k, v in record.items() if k != "code"}
    return [_without_code(v) for v in record] if isinstance(record, list) else record


def _digest(folder: Path, without_code: bool = False) -> dict[str, str]:
    def read(p: Path) -> bytes:
        if without_code and p.suffix == ".json":
            return json.dumps(_without_code(json.loads(p.read_text()))).encode()
        return p.read_bytes()
    return {str(p.relative_to(folder)): hashlib.sha256(read(p)).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A git repository holding this checkout's setpo/ and setpo_lab/, a smoke study made at its first commit (outside
    the repository, so the tree stays clean), and a second commit that adds a constant nothing reads to
    setpo/diversity.py: other code by its fingerprints, the same study."""
    base = tmp_path_factory.mktemp("record_check")
    root = base / "project"
    for package in ("setpo", "setpo_lab"):
        shutil.copytree(ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "the code that made the record")
    made = _run(root, "setpo_lab.studies.countdown", base / "study")
    assert made.returncode == 0, made.stderr[-2000:]
    path = root / "setpo" / "diversity.py"
    path.write_text(path.read_text() + "\nUNUSED_BY_THE_STUDY = True\n")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "a constant nothing reads")
    return root, base / "study"


@pytest.mark.slow
def test_a_record_that_does_not_check_is_not_restamped(project, tmp_path):
    root, study = project
    tampered = tmp_path / "tampered"
    shutil.copytree(study, tampered)
    summary = json.loads((tampered / "results.json").read_text())
    summary["runs"][0]["width"] += 1000
    (tampered / "results.json").write_text(json.dumps(summary))
    before = _digest(tampered)
    run = _run(root, "setpo_lab.studies.countdown_record", tampered)
    assert run.returncode == 1 and "does NOT check" in run.stdout and "runs.0.width" in run.stdout, run.stdout
    assert _digest(tampered) == before
    assert len(_git(root, "worktree", "list").splitlines()) == 1  # the temporary worktree is gone


@pytest.mark.slow
def test_moved_code_is_refused_then_restamped_after_proof_and_resumed(project):
    root, study = project
    refused = _run(root, "setpo_lab.studies.countdown", study)
    assert refused.returncode == 1 and "made at another identity" in refused.stderr
    assert "setpo/diversity.py" in refused.stderr
    before, before_numbers = _digest(study), _digest(study, without_code=True)
    run = _run(root, "setpo_lab.studies.countdown_record", study)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "the record checks at" in run.stdout and "the same study" in run.stdout
    assert "re-stamped" in run.stdout
    assert _digest(study, without_code=True) == before_numbers  # no number, no run changed
    changed = {p for p, d in _digest(study).items() if before[p] != d}
    assert "identity.json" in changed and all(p.endswith(".json") for p in changed)
    head = _git(root, "rev-parse", "HEAD")
    stamp = json.loads((study / "identity.json").read_text())["code"]
    assert stamp["restamped_at"] == head and stamp["commit"] != head  # the commit that made it stays
    assert len(_git(root, "worktree", "list").splitlines()) == 1 and _git(root, "status", "--porcelain") == ""
    resumed = _run(root, "setpo_lab.studies.countdown", study)
    assert resumed.returncode == 0 and "[study]" in resumed.stdout, resumed.stderr[-2000:]
