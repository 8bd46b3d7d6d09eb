"""`make countdown` meets its record: the Countdown study resumed at the current code, or, when the record was
made at other code, checked by the commit that made it.

A record made at other code cannot be resumed here (its runs were made by the old code), and it is not thrown
away either (results/countdown holds 5.2 h of 2-core training). ``main`` is what ``python -m setpo.cli countdown``
runs (on the pinned floating-point path):

- no record yet, a record at the current code (by meaning, ``setpo.repro.provenance``: comments, docstrings and
  formatting do not count), one that differs in anything besides the code (threads, package versions,
  arithmetic), or ``--redo``: the study itself (``countdown.run_command``, on the arguments parsed here), which resumes, refuses naming what differs,
  or remakes;
- otherwise ``check_at_commit``: the commit named in the record's ``identity.json`` runs its own study
  (``setpo.repro.at_commit``: a temporary git worktree) over a copy of the record with ``--stages eval``, which
  reads every run and evaluation back, checks each against that code's identity and remakes the summary; nothing
  is trained. Then the report: whether the record checks (that code accepts it and its summary agrees with the
  committed one), the files of the study's code that differ since that commit, and the command that remakes the
  record at the current code with the time the record's own stage timings measured. The record is not touched.

This module makes no run, and no module of the study imports it, so it is not part of the study's code identity:
how a record is checked can improve without making the record "other code".
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from setpo.repro.at_commit import changed_since, commit_line, environment_at, has_commit, temporary_worktree
from setpo.repro.provenance import ROOT, code_changes, identity_differences
from setpo.repro.records import read_json
from setpo.studies import countdown
from setpo.studies.countdown_config import CountdownLMConfig
from setpo.studies.stages import IDENTITY_FILE

STUDY_MODULE = "setpo.studies.countdown"  # the study's command, at any commit that made a record
CHECK_TIMEOUT_S = 1800  # reading a finished record back takes seconds; a stuck check must not hold a session
# Parts of the summary that are not results: wall-clock seconds, and the folder the study was run in
NOT_COMPARED = ("seconds", "timings", "out")


def record_at_other_code(cfg: CountdownLMConfig, root: Path = ROOT) -> tuple[dict, list[str]] | None:
    """(the record's identity, the files of the study's code that differ) when ``cfg.out`` holds a record made at
    other code and at the same threads, versions and arithmetic as now; None otherwise."""
    path = Path(cfg.out) / IDENTITY_FILE
    if not path.exists():
        return None
    saved = read_json(path, f"restore it from git, or delete {cfg.out} to start over")
    now = countdown.study_identity(cfg)
    if set(identity_differences(saved, now, root)) != {"code"}:
        return None
    return saved, code_changes(saved.get("code", {}), now["code"], root)


def commit_arguments(argv: Sequence[str], out: Path) -> list[str]:
    """The study's arguments for the commit's own code: the same size (``--full``/``--smoke``) and ``--set``
    fields, the copy ``out``, and only stage "eval" (read back and summarise; never train, never judge)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--full", action="store_true")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--set", nargs="*", default=[])
    known = p.parse_known_args(list(argv))[0]
    return (["--full"] if known.full else ["--smoke"]) + (["--set", *known.set] if known.set else []) + [
        "--out", str(out), "--stages", "eval"]


def _leaves(value, prefix: str = "") -> dict[str, object]:
    if isinstance(value, Mapping):
        return {k: v for key, item in value.items() if key not in NOT_COMPARED
                for k, v in _leaves(item, f"{prefix}{key}.").items()}
    if isinstance(value, list):
        return {k: v for i, item in enumerate(value) for k, v in _leaves(item, f"{prefix}{i}.").items()}
    return {prefix.rstrip("."): value}


def summary_agreement(made: Mapping, committed: Mapping) -> tuple[int, list[str]]:
    """(how many values both summaries carry, the paths of those that differ), wall-clock seconds and the folder
    left out; a summary format that gained fields since is compared on what both have."""
    a, b = _leaves(made), _leaves(committed)
    shared = a.keys() & b.keys()
    return len(shared), sorted(k for k in shared if a[k] != b[k])


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 360 else f"{seconds:.0f} s"


def recorded_time(summary: Mapping) -> str:
    """The work the record's stage timings measured (``countdown.stage_timings``: the warm start, RL, evaluation;
    its replication's too), e.g. "5.2 h of recorded work (2.5 h at 2 threads, the replication 2.8 h at 1 thread;
    ...)"."""
    parts = [(summary, "")] + ([(summary["replication"], "the replication ")] if "replication" in summary else [])
    spent = [(sum(v or 0.0 for v in (s.get("timings") or {}).get("totals", {}).values()),
              name, (s.get("config") or {}).get("threads")) for s, name in parts]
    detail = ", ".join(f"{name}{_duration(t)} at {n} thread{'s' if n != 1 else ''}" for t, name, n in spent)
    return f"{_duration(sum(t for t, _, _ in spent))} of recorded work ({detail}; data, the solver and model " \
           "loading not counted)"


def check_at_commit(cfg: CountdownLMConfig, argv: Sequence[str], saved: Mapping, changed: Sequence[str],
                    log: Callable[[str], object] = print, root: Path = ROOT, timeout: float = CHECK_TIMEOUT_S) -> bool:
    """Check the record in ``cfg.out``, made at other code (``saved``: its identity; ``changed``: the study's
    files that differ), with the code of the commit that made it, and report (module docstring). True when it
    checks. The record itself is only read."""
    out, commit = Path(cfg.out), saved.get("code", {}).get("commit")
    remake = "python -m setpo.cli countdown " + " ".join(_quoted(a) for a in argv if a != "--redo") + " --redo"
    summary_path = out / "results.json"
    committed = read_json(summary_path, "restore it from git") if summary_path.exists() else {}
    when = commit_line(commit, root) if has_commit(commit, root) else str(commit)
    log(f"{out} was made at other code: commit {when} made it, and since then the study's code differs in "
        f"{len(changed)} file(s): {', '.join(changed)}")
    kept = [p for p in saved.get("code", {}).get("files", {}) if (root / p).exists()]  # not moved or removed since
    text_only = sorted(set(changed_since(commit, kept, root)) - set(changed)) if has_commit(commit, root) else []
    if text_only:
        log(f"  (in their bytes only, not in what the code does: comments, docstrings, formatting or the new names of "
            f"moved modules, which the identity ignores: {', '.join(text_only)})")
    ok = False
    if not has_commit(commit, root):
        log(f"cannot check it: commit {commit} is not in this repository (a shallow clone? `git fetch --unshallow` "
            "brings it)")
    else:
        log(f"checking it with the code of {when} (a temporary git worktree; the record is read back and summarised "
            "in a copy, nothing is trained) ...")
        t0 = time.time()
        with tempfile.TemporaryDirectory(prefix="setpo-record-") as tmp, temporary_worktree(commit, root) as tree:
            copy = Path(tmp) / out.name
            shutil.copytree(out, copy)
            try:
                run = subprocess.run([sys.executable, "-m", STUDY_MODULE, *commit_arguments(argv, copy)], cwd=tree,
                                     env=environment_at(tree), capture_output=True, text=True, timeout=timeout)
                failed = run.returncode and (run.stderr.strip() or run.stdout.strip() or f"exit {run.returncode}")
            except subprocess.TimeoutExpired:
                failed = f"still running after {timeout:.0f} s (it should only read the record back)"
            made = read_json(copy / "results.json", "its summary is damaged") if not failed else {}
        seconds = time.time() - t0
        if failed:
            log(f"the record does NOT check at {when} ({seconds:.0f} s): its code refused it: "
                f"{failed.splitlines()[-1][:600]}")
        else:
            shared, differ = summary_agreement(made, committed)
            ok = not differ and shared > 0
            log(f"the record {'checks' if ok else 'does NOT check'} at {when} ({seconds:.0f} s): its code accepted "
                f"every run and evaluation and remade the summary, which agrees with the committed results.json on "
                f"{shared - len(differ)} of {shared} values they both carry"
                + (f"; differing: {', '.join(differ[:6])}" + (" ..." if len(differ) > 6 else "") if differ else ""))
    log(f"to finish or resume it at the code that made it: `git checkout {str(commit)[:10]}` and rerun this command")
    log("to remake it at the current code"
        + (f" ({recorded_time(committed)})" if committed else "") + f": {remake}")
    return ok


def _quoted(arg: str) -> str:
    return arg if all(c.isalnum() or c in "-_=./,:" for c in arg) else "'" + arg.replace("'", "'\\''") + "'"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m setpo.studies.countdown_record ARGS`` (the study's own arguments): see the module docstring."""
    argv = sys.argv[1:] if argv is None else list(argv)
    cfg, stages, redo = countdown.parse_args(argv)  # the one parse of the command line
    try:
        found = None if redo else record_at_other_code(cfg)
    except ValueError as err:
        print(f"python -m setpo.cli countdown: error: {err}", file=sys.stderr)
        return 1
    if found is None:
        return countdown.run_command(cfg, stages, redo)
    return 0 if check_at_commit(cfg, argv, *found, log=lambda line: print(line, flush=True)) else 1


if __name__ == "__main__":
    sys.exit(main())
