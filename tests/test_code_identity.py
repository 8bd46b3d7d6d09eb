"""Issue 33 item 3: a run's code identity follows what the code does, not its bytes (a docstring, a comment or a
reformatting keeps it; a code edit changes it); a record hashed by bytes (issue 23's, such as results/countdown)
is read back from git at its commit and compared by meaning; and a record made at other code is checked by the
code of the commit that made it, in a temporary worktree that is always removed."""

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from setpo.repro.at_commit import changed_since, environment_at, has_commit, temporary_worktree
from setpo.repro.provenance import (CODE_HASH, code_changes, code_fingerprint, code_identity, identity_differences,
                                    import_closure, recorded_code)
from setpo.studies.countdown_record import commit_arguments, recorded_time, summary_agreement

MODULE = '''"""A module."""

import math

# a comment
def area(r: float) -> float:
    """The area."""
    return math.pi * r ** 2
'''


@pytest.mark.parametrize("edit", [
    lambda s: s.replace('"""The area."""', '"""The area of a disc of radius r."""'),
    lambda s: s.replace("# a comment", "# another comment\n# on two lines"),
    lambda s: s.replace('"""A module."""', "'''A module, said otherwise.'''\n\n\n"),
    lambda s: s.replace("math.pi * r ** 2", "math.pi*r**2  # same code"),
    lambda s: s.replace("    return", '    "a bare string does nothing"\n    return'),
    lambda s: s.replace('    """The area."""\n', ""),
])
def test_comments_docstrings_and_formatting_keep_a_modules_identity(edit):
    assert edit(MODULE) != MODULE
    assert code_fingerprint(edit(MODULE)) == code_fingerprint(MODULE)


@pytest.mark.parametrize("edit", [
    lambda s: s.replace("r ** 2", "r ** 3"),
    lambda s: s.replace("math.pi", "3.14159"),
    lambda s: s.replace("r: float", "r: int"),
    lambda s: s.replace("    return", "    r = abs(r)\n    return"),
    lambda s: s + "\nLIMIT = 1\n",
])
def test_a_code_edit_changes_a_modules_identity(edit):
    assert code_fingerprint(edit(MODULE)) != code_fingerprint(MODULE)


def test_a_module_read_under_a_moved_name_is_the_same_code():
    before = "from setpo.records import read_json\nimport setpo.arithmetic\nfrom setpo import provenance\n"
    after = "from setpo.repro.records import read_json\nimport setpo.repro.arithmetic\nfrom setpo.repro import provenance\n"
    moved = {"setpo.records": "setpo.repro.records", "setpo.arithmetic": "setpo.repro.arithmetic",
             "setpo.provenance": "setpo.repro.provenance"}
    assert code_fingerprint(before) != code_fingerprint(after)
    assert code_fingerprint(before, moved) == code_fingerprint(after)
    with pytest.raises(ValueError, match="not Python source"):
        code_fingerprint("def (:\n")


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout.strip()


def _repo(root: Path, files: dict[str, str]) -> str:
    """A git repository at ``root`` holding ``files``, committed; returns the commit."""
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    if not (root / ".git").exists():
        _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    return _git(root, "rev-parse", "HEAD")


def test_a_docstring_edit_keeps_a_studys_identity_and_a_code_edit_names_the_file(tmp_path):
    _repo(tmp_path, {"setpo/__init__.py": "", "setpo/study.py": "from setpo import diversity\n",
                     "setpo/diversity.py": MODULE})
    made = {"threads": 1, "code": code_identity(["setpo.study"], tmp_path)}
    assert made["code"]["hash"] == CODE_HASH and len(made["code"]["files"]) == 3
    (tmp_path / "setpo/diversity.py").write_text(MODULE.replace('"""The area."""', '"""Edited."""'))
    assert identity_differences(made, {"threads": 1, "code": code_identity(["setpo.study"], tmp_path)}, tmp_path) == {}
    (tmp_path / "setpo/diversity.py").write_text(MODULE.replace("r ** 2", "r ** 3"))
    differ = identity_differences(made, {"threads": 1, "code": code_identity(["setpo.study"], tmp_path)}, tmp_path)
    assert list(differ) == ["code"] and differ["code"].startswith("setpo/diversity.py differ")


def _byte_record(root: Path, modules, commit: str) -> dict:
    """A code identity the way records were made before issue 33: each file by its bytes' SHA-256."""
    files = {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()[:16]
             for p in import_closure(modules, root).values()}
    return {"files": files, "commit": commit, "dirty": False}


def test_a_record_hashed_by_bytes_is_read_back_from_its_commit_and_compared_by_meaning(tmp_path):
    old = {"setpo/__init__.py": "", "setpo/records.py": "def read_json(p):\n    return p\n",
           "setpo/study.py": '"""Old words."""\nfrom setpo.records import read_json\n\nX = read_json(1)\n',
           "setpo/diversity.py": MODULE}
    commit = _repo(tmp_path, old)
    saved = _byte_record(tmp_path, ["setpo.study"], commit)
    # before it moved, the machinery (setpo.records) was part of the code; now it is not, and lives elsewhere
    assert set(saved["files"]) == {"setpo/__init__.py", "setpo/records.py", "setpo/study.py"}
    (tmp_path / "setpo/records.py").unlink()
    _repo(tmp_path, {"setpo/repro/__init__.py": "", "setpo/repro/records.py": "def read_json(p):\n    return [p]\n",
                     "setpo/study.py": '"""New words."""\nfrom setpo.repro.records import read_json\n\n\nX = read_json(1)\n'})
    now = code_identity(["setpo.study"], tmp_path)
    assert set(now["files"]) == {"setpo/__init__.py", "setpo/study.py"}  # the machinery is no study's code
    assert recorded_code(saved, tmp_path) == (now["files"], [])
    assert identity_differences({"code": saved}, {"code": now}, tmp_path) == {}
    # a code edit since then is a difference, named by file
    (tmp_path / "setpo/study.py").write_text("from setpo.repro.records import read_json\n\nX = read_json(2)\n")
    assert code_changes(saved, code_identity(["setpo.study"], tmp_path), tmp_path) == ["setpo/study.py"]
    # bytes git cannot give back (an edit never committed, no commit recorded) differ: nothing vouches for them
    dirty = {**saved, "files": {**saved["files"], "setpo/__init__.py": "0" * 16}}
    assert code_changes(dirty, now, tmp_path) == ["setpo/__init__.py"]
    assert code_changes({**saved, "commit": None}, now, tmp_path) == ["setpo/__init__.py", "setpo/study.py"]
    assert code_changes({**saved, "commit": "f" * 40}, now, tmp_path) == ["setpo/__init__.py", "setpo/study.py"]


def test_the_temporary_worktree_holds_the_commits_code_and_is_removed_even_on_error(tmp_path):
    first = _repo(tmp_path, {"setpo/__init__.py": "", "setpo/a.py": "X = 1\n"})
    _repo(tmp_path, {"setpo/a.py": "X = 2\n"})
    assert has_commit(first, tmp_path) and not has_commit("f" * 40, tmp_path) and not has_commit(None, tmp_path)
    assert changed_since(first, root=tmp_path) == ["setpo/a.py"] and changed_since(first, ["setpo/__init__.py"],
                                                                                    root=tmp_path) == []
    with pytest.raises(RuntimeError, match="inside"):
        with temporary_worktree(first, tmp_path) as tree:
            assert (tree / "setpo/a.py").read_text() == "X = 1\n"
            env = environment_at(tree, {"PATH": "/bin", "PYTHONPATH": "/elsewhere", "ATEN_CPU_CAPABILITY": "avx2"})
            assert env == {"PATH": "/bin", "PYTHONPATH": str(tree), "ATEN_CPU_CAPABILITY": "avx2"}
            raise RuntimeError("inside")
    assert not tree.exists() and not tree.parent.exists()
    assert len(_git(tmp_path, "worktree", "list").splitlines()) == 1
    assert (tmp_path / "setpo/a.py").read_text() == "X = 2\n"  # the checkout is untouched
    with pytest.raises(ValueError, match="not in the repository.*unshallow"):
        with temporary_worktree("f" * 40, tmp_path):
            pass


def test_the_commits_study_reads_a_copy_back_at_the_same_size_and_settings_and_trains_nothing(tmp_path):
    argv = ["--full", "--set", "headline_seeds=[5,6]", "threads=2", "--out", "results/countdown", "--stages",
            "rl", "--redo", "--judge-url", "http://x"]
    assert commit_arguments(argv, tmp_path) == ["--full", "--set", "headline_seeds=[5,6]", "threads=2", "--out",
                                                str(tmp_path), "--stages", "eval"]
    assert commit_arguments(["--smoke"], tmp_path)[:2] == ["--smoke", "--out"]


def test_summaries_agree_on_what_both_carry_except_seconds_and_folder():
    committed = {"runs": [{"name": "a", "accuracy": 0.5, "seconds": 3}], "config": {"out": "x", "lr": 1},
                 "identical": {"models": 9}}
    made = {"runs": [{"name": "a", "accuracy": 0.5, "seconds": 4}], "config": {"out": "/tmp/y", "lr": 1}}
    assert summary_agreement(made, committed) == (3, [])
    made["runs"][0]["accuracy"] = 0.25
    assert summary_agreement(made, committed) == (3, ["runs.0.accuracy"])


def test_the_remake_time_comes_from_the_records_own_stage_timings():
    summary = {"config": {"threads": 2}, "timings": {"totals": {"sft": 1800.0, "evaluation": 1800.0, "rl": None}},
               "replication": {"config": {"threads": 1}, "timings": {"totals": {"sft": 7200.0}}}}
    assert recorded_time(summary).startswith("3.0 h of recorded work (1.0 h at 2 threads, the replication 2.0 h at "
                                             "1 thread;")


COMMITTED_RECORD = Path(__file__).resolve().parent.parent / "results" / "countdown" / "identity.json"


@pytest.mark.skipif(not COMMITTED_RECORD.exists(), reason="no committed Countdown record in this checkout")
def test_the_committed_countdown_record_is_at_the_current_code_or_its_commit_is_named():
    """The committed record hashed its code by bytes; read back from its commit (when this clone holds it) it is
    compared by meaning, and the files that differ, if any, are named (make countdown checks those at the commit)."""
    import setpo.studies.countdown as countdown

    saved = json.loads(COMMITTED_RECORD.read_text())["code"]
    now = code_identity(countdown.IDENTITY_MODULES, exclude=countdown.NOT_IN_IDENTITY)
    if not has_commit(saved["commit"]):
        pytest.skip(f"this clone does not hold the record's commit {saved['commit'][:10]} (shallow)")
    old, lost = recorded_code(saved)
    assert not lost and len(old) == len(saved["files"]) - 3  # every file read back; the machinery left out
    assert set(code_changes(saved, now)) <= set(old) | set(now["files"])


def test_the_record_checker_is_not_part_of_the_studys_code():
    import setpo.studies.countdown as countdown

    closure = import_closure(countdown.IDENTITY_MODULES, exclude=countdown.NOT_IN_IDENTITY)
    assert "setpo.studies.countdown_record" not in closure and not any(m.startswith("setpo.repro") for m in closure)
