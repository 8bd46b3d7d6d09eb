"""Re-stamping a Countdown record after a change that moves code without changing what it makes.

A record is resumed only at the code it names (its identities' code fingerprints, ``setpo_lab.repro.provenance``);
``make countdown`` refuses one made at other code, naming the files. When the code changed in form only (a
refactor, modules folded together) the record is re-stamped instead of remade (hours of training). ``main``
is the command, run once on a clean checkout of the new code, on the pinned floating-point path, with the
study's own arguments:

    python -m setpo_lab.repro.arithmetic .venv/bin/python -m setpo_lab.studies.countdown_record \
        --full --set 'headline_seeds=[5,6,7,8,9,10,11]' --out results/countdown

``restamp`` says what it checks before it rewrites anything: the record at the code it names
(``_check_at_commit``: that commit's study, in a temporary git worktree, reads a copy back with its evaluating stage
(``_read_back_stage``), nothing trained, and remakes the committed summary), the two codes' smoke studies bit for bit
(``_same_study_at``), and the re-stamped copy at the new code. Only the ``code`` of each identity changes.

No module of the study imports this one, so it is not part of the study's code identity.
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

from setpo_lab.repro.at_commit import changed_since, commit_line, environment_at, has_commit, temporary_worktree
from setpo_lab.repro.provenance import ROOT, code_changes, identity_differences, module_file
from setpo.records import read_json, write_json
from setpo_lab.studies import countdown
from setpo_lab.studies.arguments import parse_study_args
from setpo_lab.studies.countdown_config import CountdownLMConfig
from setpo_lab.studies.stages import IDENTITY_FILE

# The study's command in a tree: setpo_lab.studies.countdown since the lab left the wheel (issue 48), and
# setpo.studies.countdown at the commits before it (the records made then name one of those).
STUDY_MODULES = ("setpo_lab.studies.countdown", "setpo.studies.countdown")
CHECK_TIMEOUT_S = 1800  # reading a finished record back takes seconds; a stuck check must not hold a session
# Parts of the summary that are not results: wall-clock seconds, and the folder the study was run in
NOT_COMPARED = ("seconds", "timings", "out")


def _record_at_other_code(cfg: CountdownLMConfig, root: Path = ROOT) -> tuple[dict, list[str]] | None:
    """(the record's identity, the files of the study's code that differ) when ``cfg.out`` holds a record made at
    other code and at the same threads, versions and arithmetic as now; None otherwise."""
    path = Path(cfg.out) / IDENTITY_FILE
    if not path.exists():
        return None
    saved = read_json(path, f"restore it from git, or delete {cfg.out} to start over")
    now = countdown.study_identity(cfg)
    if set(identity_differences(saved, now)) != {"code"}:
        return None
    return saved, code_changes(saved.get("code", {}), now["code"])


def _commit_arguments(argv: Sequence[str], out: Path, stage: str) -> list[str]:
    """The study's arguments for the commit's own code: the same size (``--full``/``--smoke``) and ``--set``
    fields, the copy ``out``, and only the ``stage`` that evaluates (``_read_back_stage``: read back and summarise;
    never train, never judge)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--full", action="store_true")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--set", nargs="*", default=[])
    known = p.parse_known_args(list(argv))[0]
    return (["--full"] if known.full else ["--smoke"]) + (["--set", *known.set] if known.set else []) + [
        "--out", str(out), "--stages", stage]


def _read_back_stage(tree: Path) -> str:
    """The name of the stage that reads a record back in the study of ``tree`` (a checkout or a worktree of any
    commit with a record): "evaluate" since every study names its stages alike, "eval" before (its stages were
    sft, rl, eval, judge)."""
    stages = [line for line in module_file(_study_module(tree), tree).read_text().splitlines()
              if line.startswith("STAGES =")]
    return "evaluate" if stages and '"evaluate"' in stages[0] else "eval"


def _leaves(value, prefix: str = "") -> dict[str, object]:
    if isinstance(value, Mapping):
        return {k: v for key, item in value.items() if key not in NOT_COMPARED
                for k, v in _leaves(item, f"{prefix}{key}.").items()}
    if isinstance(value, list):
        return {k: v for i, item in enumerate(value) for k, v in _leaves(item, f"{prefix}{i}.").items()}
    return {prefix.rstrip("."): value}


def _summary_agreement(made: Mapping, committed: Mapping) -> tuple[int, list[str]]:
    """(how many values both summaries carry, the paths of those that differ), wall-clock seconds and the folder
    left out; a summary format that gained fields since is compared on what both have."""
    a, b = _leaves(made), _leaves(committed)
    shared = a.keys() & b.keys()
    return len(shared), sorted(k for k in shared if a[k] != b[k])


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 360 else f"{seconds:.0f} s"


def _recorded_time(summary: Mapping) -> str:
    """The work the record's stage timings measured (``countdown._stage_timings``: the warm start, RL, evaluation;
    its replication's too), as "<total> of recorded work (<main> at <n> threads, the replication <time> at <m>
    thread; ...)"."""
    parts = [(summary, "")] + ([(summary["replication"], "the replication ")] if "replication" in summary else [])
    spent = [(sum(v or 0.0 for v in (s.get("timings") or {}).get("totals", {}).values()),
              name, (s.get("config") or {}).get("threads")) for s, name in parts]
    detail = ", ".join(f"{name}{_duration(t)} at {n} thread{'s' if n != 1 else ''}" for t, name, n in spent)
    return f"{_duration(sum(t for t, _, _ in spent))} of recorded work ({detail}; data, the solver and model " \
           "loading not counted)"


def _check_at_commit(cfg: CountdownLMConfig, argv: Sequence[str], saved: Mapping, changed: Sequence[str],
                     log: Callable[[str], object] = print, root: Path = ROOT, timeout: float = CHECK_TIMEOUT_S) -> bool:
    """Check the record in ``cfg.out``, made at other code (``saved``: its identity, whose ``code.commit`` is the
    commit to check it with; ``changed``: the study's files that differ), with the code of that commit, and
    report: whether that code accepts every run and evaluation and remakes the committed summary, and the
    command that remakes the record at the current code instead. True when it checks. The record is only read."""
    out, commit = Path(cfg.out), saved.get("code", {}).get("commit")
    remake = "python -m setpo_lab.cli countdown " + " ".join(_quoted(a) for a in argv if a != "--redo") + " --redo"
    summary_path = out / "results.json"
    committed = read_json(summary_path, "restore it from git") if summary_path.exists() else {}
    when = commit_line(commit, root) if has_commit(commit, root) else str(commit)
    log(f"{out} was made at other code: commit {when} made it, and since then the study's code differs in "
        f"{len(changed)} file(s): {', '.join(changed)}")
    kept = [p for p in saved.get("code", {}).get("files", {}) if (root / p).exists()]  # not moved or removed since
    text_only = sorted(set(changed_since(commit, kept, root)) - set(changed)) if has_commit(commit, root) else []
    if text_only:
        log(f"  (in their bytes only, not in what the code does: comments, docstrings or formatting, which the "
            f"identity ignores: {', '.join(text_only)})")
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
            failed = _run_study_at(tree, _commit_arguments(argv, copy, _read_back_stage(tree)), timeout)
            made = read_json(copy / "results.json", "that commit's study wrote it; rerun the check") \
                if not failed else {}
        seconds = time.time() - t0
        if failed:
            log(f"the record does NOT check at {when} ({seconds:.0f} s): its code refused it: {failed}")
        else:
            shared, differ = _summary_agreement(made, committed)
            ok = not differ and shared > 0
            log(f"the record {'checks' if ok else 'does NOT check'} at {when} ({seconds:.0f} s): its code accepted "
                f"every run and evaluation and remade the summary, which agrees with the committed results.json on "
                f"{shared - len(differ)} of {shared} values they both carry"
                + (f"; differing: {', '.join(differ[:6])}" + (" ..." if len(differ) > 6 else "") if differ else ""))
    log(f"to finish or resume it at the code that made it: `git checkout {str(commit)[:10]}` and rerun this command")
    log("to remake it at the current code"
        + (f" ({_recorded_time(committed)})" if committed else "") + f": {remake}")
    return ok


def _study_module(tree: Path) -> str:
    """The module that runs the Countdown study in ``tree`` (a checkout or a worktree of any commit with a record)."""
    found = [m for m in STUDY_MODULES if module_file(m, tree) is not None]
    if not found:
        raise ValueError(f"{tree} holds no Countdown study ({' or '.join(STUDY_MODULES)})")
    return found[0]


def _run_study_at(tree: Path, args: Sequence[str], timeout: float) -> str | None:
    """Run the study (``python -m <_study_module(tree)> ARGS``) with the code of ``tree`` (a worktree or this
    checkout); None when it finished, else why not (its last line)."""
    try:
        run = subprocess.run([sys.executable, "-m", _study_module(tree), *args], cwd=tree, env=environment_at(tree),
                             capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"still running after {timeout:.0f} s"
    if run.returncode:
        return (run.stderr.strip() or run.stdout.strip() or f"exit {run.returncode}").splitlines()[-1][:600]
    return None


def _same_study_at(commit: str, threads: int, log: Callable[[str], object] = print, root: Path = ROOT,
                   timeout: float = CHECK_TIMEOUT_S) -> bool:
    """Whether the code of ``commit`` and the code of this checkout make the same study: each makes the smoke
    study (``--smoke``: every stage, every kind of run, at toy size) at ``threads`` threads in a folder of its
    own, and every model (final-weights SHA-256) and every evaluation (per-problem counts) they both make is
    identical bit for bit (``setpo_lab.repro.agreement.bitwise_agreement``), at the same configuration and with
    the same summary."""
    from setpo_lab.repro.agreement import bitwise_agreement  # what a study and its replication share

    args = ["--smoke", "--set", f"threads={threads}"]
    with tempfile.TemporaryDirectory(prefix="setpo-same-study-") as tmp, temporary_worktree(commit, root) as tree:
        made = {}
        for name, code in (("then", tree), ("now", root)):
            t0 = time.time()
            failed = _run_study_at(code, [*args, "--out", str(Path(tmp) / name)], timeout)
            if failed:
                log(f"the smoke study did not finish with the code of {'commit ' + commit[:10] if name == 'then' else 'this checkout'}: {failed}")
                return False
            log(f"the smoke study with the code of {'commit ' + commit[:10] if name == 'then' else 'this checkout'}: "
                f"{time.time() - t0:.0f} s")
            made[name] = Path(tmp) / name
        agreement = bitwise_agreement(made["now"], made["then"])
        configs = [read_json(made[n] / "config.json") for n in ("then", "now")]
        _, config_differ = _summary_agreement(*configs)
        shared, summary_differ = _summary_agreement(read_json(made["now"] / "results.json"),
                                                    read_json(made["then"] / "results.json"))
    same = (agreement["models"] > 0 and agreement["models_identical"] == agreement["models"]
            and agreement["evaluations"] > 0 and agreement["evaluations_identical"] == agreement["evaluations"]
            and not config_differ and not summary_differ and shared > 0)
    log(f"the two smoke studies: {agreement['models_identical']} of {agreement['models']} models and "
        f"{agreement['evaluations_identical']} of {agreement['evaluations']} evaluations identical bit for bit; "
        f"configurations {'equal' if not config_differ else 'differing in ' + ', '.join(config_differ)}; summaries "
        f"agree on {shared - len(summary_differ)} of {shared} values: "
        + ("the same study" if same else "NOT the same study"))
    return same


def _record_identities(out: Path) -> dict[Path, dict]:
    """Every identity a study folder records, by file: its ``identity.json`` files (the study's, each run's, the
    replication's) and the ``identity`` of each cached evaluation."""
    found = {}
    for path in sorted(Path(out).rglob("*.json")):
        if path.name.endswith(".texts.json"):
            continue
        record = read_json(path, "restore it from git")
        if path.name == IDENTITY_FILE:
            found[path] = record
        elif isinstance(record, dict) and isinstance(record.get("identity"), dict):
            found[path] = record["identity"]
    return found


def _restamped_code(recorded: Mapping, now: Mapping) -> dict:
    """A recorded ``code`` identity re-stamped as the code identity ``now`` (``setpo_lab.repro.provenance.
    code_identity`` of this checkout): the files' fingerprints become ``now``'s; the commit that made the
    record and whether its tree was dirty stay, and ``restamped_at`` names the commit whose code the
    fingerprints are."""
    return {"hash": now["hash"], "files": dict(now["files"]), "commit": recorded.get("commit"),
            "dirty": recorded.get("dirty"), "restamped_at": now["commit"]}


def restamp(cfg: CountdownLMConfig, argv: Sequence[str], log: Callable[[str], object] = print,
            root: Path = ROOT) -> bool:
    """Re-stamp the record in ``cfg.out``, made at other code, with this checkout's code identity, once three
    checks pass: (1) the code the record is stamped with accepts it and remakes its summary
    (``_check_at_commit``); (2) that code and this checkout's make the same smoke study bit for bit
    (``_same_study_at``); (3) every identity the record holds names the same code; (4) re-stamped in a copy (the
    ``code`` of each identity, ``_record_identities``, becomes ``_restamped_code``; nothing else changes), the
    record is accepted by this checkout's study, which reads it back (``--stages evaluate``) and remakes the same
    summary. Only then is the record itself re-stamped. True when it was."""
    out = Path(cfg.out)
    now = countdown.study_identity(cfg)["code"]
    if now["dirty"] or not now["commit"]:
        log("cannot re-stamp from a tree with uncommitted changes (the stamp names the commit whose code it is): "
            "commit first")
        return False
    found = _record_at_other_code(cfg, root)
    if found is None:
        log(f"nothing to re-stamp: {out} holds no record, or one at this code, or one that differs in more than "
            "the code (`python -m setpo_lab.cli countdown ...` names what)")
        return False
    saved, changed = found
    stamped_at = saved["code"].get("restamped_at") or saved["code"].get("commit")
    if not _check_at_commit(cfg, argv, {**saved, "code": {**saved["code"], "commit": stamped_at}}, changed, log, root):
        return False
    if not _same_study_at(stamped_at, cfg.threads, log, root):
        return False
    identities = _record_identities(out)
    others = sorted(str(p.relative_to(out)) for p, ident in identities.items()
                    if ident.get("code", {}).get("files") != saved["code"]["files"]
                    or ident.get("code", {}).get("hash") != saved["code"].get("hash"))
    if others:
        log(f"cannot re-stamp: {len(others)} identities of the record name other code than its identity.json: "
            + ", ".join(others[:6]))
        return False
    with tempfile.TemporaryDirectory(prefix="setpo-restamped-") as tmp:
        copy = Path(tmp) / out.name
        shutil.copytree(out, copy)
        _write_stamps(copy, [copy / p.relative_to(out) for p in identities], now)
        failed = _run_study_at(root, _commit_arguments(argv, copy, _read_back_stage(root)), CHECK_TIMEOUT_S)
        made = read_json(copy / "results.json") if not failed else {}
    shared, differ = _summary_agreement(made, read_json(out / "results.json", "restore it from git")) \
        if not failed else (0, [])
    ok = not failed and not differ and shared > 0
    log(f"this checkout's study {'accepts' if ok else 'does NOT accept'} a re-stamped copy of the record"
        + (f": {failed}" if failed else f" and remakes its summary, agreeing on {shared - len(differ)} of {shared} "
           "values" + (f"; differing: {', '.join(differ[:6])}" if differ else "")))
    if ok:
        _write_stamps(out, list(identities), now)
        log(f"re-stamped {len(identities)} identities in {out} as the code of commit {now['commit'][:10]}")
    return ok


def _write_stamps(out: Path, paths: Sequence[Path], now: Mapping) -> None:
    """Each identity of ``paths`` (``_record_identities``'s files) with its ``code`` re-stamped as ``now``."""
    for path in paths:
        record = read_json(path, "restore it from git")
        target = record if path.name == IDENTITY_FILE else record["identity"]
        target["code"] = _restamped_code(target["code"], now)
        write_json(path, record)


def _quoted(arg: str) -> str:
    return arg if all(c.isalnum() or c in "-_=./,:" for c in arg) else "'" + arg.replace("'", "'\\''") + "'"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m setpo_lab.studies.countdown_record ARGS`` (the study's own arguments, parsed once): ``restamp``
    the record in ``--out``; exit 0 when it was re-stamped, 1 when not (the reason printed)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    cfg, _, _ = parse_study_args(countdown.COMMAND, argv)
    try:
        return 0 if restamp(cfg, argv, log=lambda line: print(line, flush=True)) else 1
    except ValueError as err:
        print(f"python -m setpo_lab.studies.countdown_record: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
