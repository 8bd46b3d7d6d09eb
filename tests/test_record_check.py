"""Issue 33 item 3, end to end on a smoke study in a throwaway git repository (the committed 48 MB record is
checked by hand, docs/reproducibility/index.md): `make countdown`'s command
(``python -m setpo.studies.countdown_record``) accepts a record after a docstring edit in setpo/diversity.py; after a
code edit it checks the record with the code of the
commit that made it, names the file and the command that remakes it, exits 0, and leaves the record and the
repository as they were; a record that does not check is reported and exits 1."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The smallest study that has every stage, its replication excluded (the check reads the replication the same way)
SMOKE = ["--smoke", "--set", "other_cells=[]", "rl_seeds=[0]", 'dra_embedders=["hash"]', "eval_temperatures=[1.0]",
         "threads=1"]


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout.strip()


def _study(root: Path, out: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(root)}
    return subprocess.run([sys.executable, "-m", "setpo.studies.countdown_record", *SMOKE, "--out", str(out)],
                          cwd=root, env=env, capture_output=True, text=True, timeout=900)


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A git repository holding this checkout's setpo/ and envs/ at one commit, and a smoke study made there
    (outside the repository, so the tree stays clean)."""
    base = tmp_path_factory.mktemp("record_check")
    root = base / "project"
    for package in ("setpo", "envs"):
        shutil.copytree(ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "the code that made the record")
    made = _study(root, base / "study")
    assert made.returncode == 0, made.stderr[-2000:]
    return root, base / "study"


@pytest.fixture
def diversity(project):
    """setpo/diversity.py of the project, restored after the test."""
    path = project[0] / "setpo" / "diversity.py"
    text = path.read_text()
    yield path, text
    path.write_text(text)


@pytest.mark.slow
def test_a_docstring_edit_leaves_the_record_accepted_at_the_current_code(project, diversity):
    root, study = project
    path, text = diversity
    before = _digest(study)
    path.write_text(text.replace('"""', '"""Edited by a test. ', 1))
    run = _study(root, study)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "other code" not in run.stdout and "[study]" in run.stdout  # resumed: the study itself ran
    assert _digest(study) == before


@pytest.mark.slow
def test_a_code_edit_checks_the_record_at_its_commit_and_says_how_to_remake_it(project, diversity, tmp_path):
    root, study = project
    path, text = diversity
    before = _digest(study)
    path.write_text(text + "\nEDITED_BY_A_TEST = True\n")
    run = _study(root, study)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    out = run.stdout
    assert "was made at other code" in out and "setpo/diversity.py" in out
    assert "the record checks at" in out and "every run and evaluation" in out
    assert f"--out {study} --redo" in out and " of recorded work (" in out
    assert _digest(study) == before  # only a copy was read back and summarised
    assert len(_git(root, "worktree", "list").splitlines()) == 1  # the temporary worktree is gone
    assert _git(root, "status", "--porcelain") == "M setpo/diversity.py"

    # a record whose summary no longer agrees with what its own code makes: reported, exit 1, left as it is
    tampered = tmp_path / "tampered"
    shutil.copytree(study, tampered)
    summary = json.loads((tampered / "results.json").read_text())
    summary["runs"][0]["width"] += 1000
    (tampered / "results.json").write_text(json.dumps(summary))
    run = _study(root, tampered)
    assert run.returncode == 1 and "does NOT check" in run.stdout and "runs.0.width" in run.stdout, run.stdout
    assert json.loads((tampered / "results.json").read_text()) == summary
