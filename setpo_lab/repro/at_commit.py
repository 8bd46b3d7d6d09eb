"""The code of another commit, run without touching this checkout: a record kept in git checked by the code it
names before it is re-stamped (``setpo_lab.studies.countdown_record``).

``temporary_worktree`` checks a commit out in a temporary folder (``git worktree add --detach``) and removes it
again when done, on an error or an interrupt too; ``environment_at`` is the environment that runs it (the
worktree's project packages first on the path, all else as in this process, the pinned arithmetic of
``setpo_lab.repro.arithmetic`` included). ``changed_since`` names the files that differ from that commit.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from setpo_lab.repro.provenance import ROOT


def git(root: Path, *args: str, timeout: float = 120) -> str:
    """``git ARGS`` in ``root``, its output; a failure is a ValueError with git's own first line."""
    try:
        run = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as e:
        raise ValueError(f"git {' '.join(args[:2])} could not run in {root}: {e}") from None
    if run.returncode:
        first = next((line for line in run.stderr.splitlines() if line.strip()), "failed")
        raise ValueError(f"git {' '.join(args[:2])} in {root}: {first}")
    return run.stdout.strip()


def has_commit(commit: str | None, root: Path = ROOT) -> bool:
    """Whether the repository at ``root`` holds ``commit``."""
    if not commit:
        return False
    try:
        git(root, "cat-file", "-e", f"{commit}^{{commit}}")
    except ValueError:
        return False
    return True


def commit_line(commit: str, root: Path = ROOT) -> str:
    """``commit`` as a person reads it: short hash and date, e.g. "720491b3 (2026-12-02)"."""
    return git(root, "show", "-s", "--format=%h (%cs)", commit)


@contextlib.contextmanager
def temporary_worktree(commit: str, root: Path = ROOT) -> Iterator[Path]:
    """A detached worktree of ``commit`` in a new temporary folder, for the block; afterwards the folder and git's
    record of the worktree are removed, whatever happened inside. A commit this repository does not hold (a
    shallow clone) is a ValueError saying how to get it."""
    if not has_commit(commit, root):
        raise ValueError(f"commit {commit} is not in the repository at {root} (a shallow clone?); "
                         "`git fetch --unshallow` brings the history")
    holder = Path(tempfile.mkdtemp(prefix="setpo-at-commit-"))
    tree = holder / "tree"
    try:
        git(root, "worktree", "add", "--detach", "--quiet", str(tree), commit, timeout=600)
        yield tree
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=root, capture_output=True, timeout=120)
        shutil.rmtree(holder, ignore_errors=True)
        subprocess.run(["git", "worktree", "prune"], cwd=root, capture_output=True, timeout=120)


def environment_at(tree: Path, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment that runs the code of worktree ``tree``: ``env`` (default this process's) with ``PYTHONPATH``
    the worktree alone (its ``setpo`` and ``setpo_lab``, or ``setpo`` and ``envs`` at a commit before issue 48; not this
    checkout's or an installed one). Everything else is
    kept: the same interpreter and packages, and the same floating-point path (``setpo_lab.repro.arithmetic``'s pin,
    when this process runs under it, as ``make countdown`` does), so that the commit's code computes as it did."""
    return {**(os.environ if env is None else env), "PYTHONPATH": str(tree)}


def changed_since(commit: str, paths: Iterable[str] = (), root: Path = ROOT) -> list[str]:
    """The files (of ``paths``; none given: all) whose bytes in this checkout differ from ``commit``'s, sorted."""
    return sorted(git(root, "diff", "--name-only", commit, "--", *paths).splitlines())
