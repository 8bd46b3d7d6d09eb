"""A run's code identity follows what the code does, not its bytes (a docstring, a comment or a reformatting
keeps it; a code edit changes it); a record hashed any other way differs in every file; the committed Countdown
record is at the study's current code; and re-stamping a record (``setpo_lab.studies.countdown_record``) checks it
with the code it names, in a temporary worktree that is always removed, and changes only its code stamps."""

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from setpo_lab.repro.at_commit import changed_since, environment_at, has_commit, temporary_worktree
from setpo_lab.repro.provenance import (ROOT, CODE_HASH, code_changes, code_fingerprint, code_identity, identity_differences,
                                        import_closure, recorded_code)
from setpo_lab.studies import countdown, countdown_record

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


def test_a_module_that_is_not_python_has_no_fingerprint():
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
    assert identity_differences(made, {"threads": 1, "code": code_identity(["setpo.study"], tmp_path)}) == {}
    (tmp_path / "setpo/diversity.py").write_text(MODULE.replace("r ** 2", "r ** 3"))
    differ = identity_differences(made, {"threads": 1, "code": code_identity(["setpo.study"], tmp_path)})
    assert list(differ) == ["code"] and differ["code"].startswith("setpo/diversity.py differ")


def test_a_record_hashed_any_other_way_differs_in_every_file(tmp_path):
    _repo(tmp_path, {"setpo/__init__.py": "", "setpo/study.py": "X = 1\n"})
    now = code_identity(["setpo.study"], tmp_path)
    by_bytes = {"files": {p: hashlib.sha256((tmp_path / p).read_bytes()).hexdigest()[:16] for p in now["files"]},
                "commit": now["commit"], "dirty": False}  # no "hash": the scheme records had before fingerprints
    assert recorded_code(by_bytes) == ({}, ["setpo/study.py"]) and recorded_code(now) == (now["files"], [])
    assert code_changes(by_bytes, now) == ["setpo/study.py"]
    assert code_changes({**now, "hash": "other"}, now) == ["setpo/study.py"]
    assert code_changes({**now, "commit": "f" * 40, "dirty": True, "restamped_at": "e" * 40}, now) == []


def test_a_restamp_changes_only_the_code_fingerprints_and_names_the_commit_they_are_of():
    recorded = {"files": {"setpo/old.py": "ab" * 8}, "commit": "c" * 40, "dirty": True}
    now = {"hash": CODE_HASH, "files": {"setpo/new.py": "cd" * 8}, "commit": "d" * 40, "dirty": False}
    assert countdown_record._restamped_code(recorded, now) == {
        "hash": CODE_HASH, "files": {"setpo/new.py": "cd" * 8}, "commit": "c" * 40, "dirty": True,
        "restamped_at": "d" * 40}
    assert code_changes(countdown_record._restamped_code(recorded, now), now) == []


def test_every_identity_of_a_record_is_found_and_the_judges_texts_are_not(tmp_path):
    (tmp_path / "rl" / "a").mkdir(parents=True)
    (tmp_path / "eval").mkdir()
    for path, record in {"identity.json": {"code": {}}, "rl/a/identity.json": {"code": {}},
                         "eval/a_T1.json": {"correct": [1], "identity": {"code": {}}},
                         "eval/a_T1.texts.json": [["x"]], "selection.json": {"chosen": "a"}}.items():
        (tmp_path / path).write_text(json.dumps(record))
    assert sorted(str(p.relative_to(tmp_path)) for p in countdown_record._record_identities(tmp_path)) == [
        "eval/a_T1.json", "identity.json", "rl/a/identity.json"]


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
    assert countdown_record._commit_arguments(argv, tmp_path, "evaluate") == [
        "--full", "--set", "headline_seeds=[5,6]", "threads=2", "--out", str(tmp_path), "--stages", "evaluate"]
    assert countdown_record._commit_arguments(["--smoke"], tmp_path, "eval")[:2] == ["--smoke", "--out"]


def test_a_commits_study_is_asked_for_its_own_name_of_the_evaluating_stage(tmp_path):
    """Since every study names its stages alike the Countdown study evaluates with "evaluate"; a commit from before
    (whose record the re-stamp reads back with that commit's code) knew it as "eval"."""
    assert countdown_record._read_back_stage(ROOT) == "evaluate" and "evaluate" in countdown.STAGES
    module = tmp_path / "setpo_lab" / "studies" / "countdown.py"
    module.parent.mkdir(parents=True)
    module.write_text('STAGES = ("sft", "rl", "eval", "judge")\n')
    assert countdown_record._read_back_stage(tmp_path) == "eval"


def test_summaries_agree_on_what_both_carry_except_seconds_and_folder():
    committed = {"runs": [{"name": "a", "accuracy": 0.5, "seconds": 3}], "config": {"out": "x", "lr": 1},
                 "identical": {"models": 9}}
    made = {"runs": [{"name": "a", "accuracy": 0.5, "seconds": 4}], "config": {"out": "/tmp/y", "lr": 1}}
    assert countdown_record._summary_agreement(made, committed) == (3, [])
    made["runs"][0]["accuracy"] = 0.25
    assert countdown_record._summary_agreement(made, committed) == (3, ["runs.0.accuracy"])


def test_the_remake_time_comes_from_the_records_own_stage_timings():
    summary = {"config": {"threads": 2}, "timings": {"totals": {"sft": 1800.0, "evaluation": 1800.0, "rl": None}},
               "replication": {"config": {"threads": 1}, "timings": {"totals": {"sft": 7200.0}}}}
    assert countdown_record._recorded_time(summary).startswith(
        "3.0 h of recorded work (1.0 h at 2 threads, the replication 2.0 h at 1 thread;")


COMMITTED_RECORD = Path(__file__).resolve().parent.parent / "results" / "countdown"


@pytest.mark.skipif(not (COMMITTED_RECORD / "identity.json").exists(), reason="no committed Countdown record here")
def test_the_committed_countdown_record_is_at_the_studys_current_code():
    """Every identity of the committed record names the code this checkout's study runs (``make countdown``
    resumes it; a change that moves code must re-stamp it: docs/reproducibility/index.md)."""
    import setpo_lab.studies.countdown as countdown

    now = code_identity(countdown.IDENTITY_MODULES, exclude=countdown.NOT_IN_IDENTITY)
    identities = countdown_record._record_identities(COMMITTED_RECORD)
    assert len(identities) > 400
    differ = {str(p.relative_to(COMMITTED_RECORD)): code_changes(i["code"], now) for p, i in identities.items()}
    assert {p: d for p, d in differ.items() if d} == {}


def test_the_record_checker_is_not_part_of_the_studys_code():
    import setpo_lab.studies.countdown as countdown

    closure = import_closure(countdown.IDENTITY_MODULES, exclude=countdown.NOT_IN_IDENTITY)
    assert "setpo_lab.studies.countdown_record" not in closure
    assert not any(m.startswith(("setpo_lab.repro", "setpo.records", "setpo.refusals")) for m in closure)
