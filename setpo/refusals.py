"""Refusing a file the package cannot load: one shape, the file and what to do first.

    "<file>: cannot be loaded; <what to do> (cause: <short cause>; at <full path>)"

- the file comes first, relative to the folder it belongs to (a run folder) when the caller names one, so the
  start of the line says which file whatever the folder's path is, and a log that cuts long lines keeps it;
- what to do comes next, before anything a library said;
- then the cause, short (``cause``), and the full path when the file was shown relative to its folder.

The cause is the package's own words, never a library's text passed through. torch's text for a file it refuses
depends on which bytes are damaged (a 300-character paragraph for most garbage, "invalid load key" for some,
an ``IndexError`` for others, a zip reader's error for a cut archive) and its paragraph advises loading again
with safe loading turned off: for a checkpoint of unknown origin that runs whatever code it carries, the one
thing a user must not do. So a loader that knows what it expected says so (``expected="torch checkpoint"``: "not a
readable torch checkpoint"), and the same fault reads the same whatever the bytes; an empty file says it is
empty; an error of the operating system (permissions, a folder where a file should be) keeps its type and
reason (``PermissionError: Permission denied``), which do not depend on the bytes. Only where a loader names no
format does the cause carry the error's type and the first line of its text, at most ``MAX_CLAUSE`` characters,
and never a line that mentions turning off safe loading (``_ADVICE``).

``file_refusal`` is the same shape for a file that loads but is refused for another reason (a record that is not
a verdict): "<file>: <problem>; <what to do> (<detail>; at <full path>)".
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator
from pathlib import Path

#: the most characters of one error's text a cause carries
MAX_CLAUSE = 80
#: what in a library's text marks advice to turn off safe loading: such a text is never relayed
_ADVICE = ("weights_only", "weights only", "weights-only", "arbitrary code")


def _one_line(text) -> str:
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    return " ".join(lines[0].split()) if lines else ""


def shown_path(path: str | Path, root: str | Path | None = None) -> str:
    """``path`` relative to ``root`` when it lies inside it (``root`` itself: its name), else as given."""
    path = Path(path)
    if root is not None:
        try:
            rel = path.relative_to(root).as_posix()
        except ValueError:
            return str(path)
        return path.name if rel in ("", ".") else rel
    return str(path)


def _of_the_system(error: BaseException) -> bool:
    """An error of the operating system (permissions, a missing file, a folder where a file should be, a failing
    disk), not of the bytes: an OSError subclass, or a plain OSError of EIO. Libraries raise plain OSErrors for
    what they fail to parse (torch's zip reader: "Invalid argument" for a cut archive; transformers: a damaged
    config), so those count as the file's fault."""
    if not isinstance(error, OSError) or not error.strerror:
        return False
    return type(error) is not OSError or error.errno == errno.EIO


def cause(error: BaseException, expected: str | None = None, path: str | Path | None = None) -> str:
    """The short cause of a failed load, the same for the same fault whatever the bytes: "an empty file" (``path``
    is an empty file); "<OSError type>: <reason>" for an error of the operating system (``_of_the_system``);
    "not a readable <expected>" when the loader names what it expected; otherwise the error's type and the first
    line of its text (at most ``MAX_CLAUSE`` characters; the type alone where the text is empty or mentions
    turning off safe loading)."""
    with contextlib.suppress(OSError):
        if path is not None and Path(path).is_file() and Path(path).stat().st_size == 0:
            return "an empty file"
    name = type(error).__name__
    if _of_the_system(error):
        return f"{name}: {error.strerror}"
    if expected:
        return f"not a readable {expected}"
    text = _one_line(error)
    if not text or any(a in text.lower() for a in _ADVICE):
        return name
    if len(text) > MAX_CLAUSE:
        text = text[:MAX_CLAUSE - 1].rstrip() + "…"
    return f"{name}: {text}"


def file_refusal(path: str | Path, problem: str, remedy: str, *, detail: str | None = None,
                 root: str | Path | None = None) -> ValueError:
    """"<file>: <problem>; <remedy> (<detail>; at <full path>)", one line: the file (``shown_path``) and what to do
    first; the full path closes the line when the file was shown relative to ``root``."""
    shown = shown_path(path, root)
    tail = [_one_line(detail)] if detail else []
    if shown != str(path):
        tail.append(f"at {path}")
    return ValueError(f"{shown}: {_one_line(problem)}; {_one_line(remedy)}" + (f" ({'; '.join(tail)})" if tail else ""))


def cannot_load(path: str | Path, error: BaseException, remedy: str, *, expected: str | None = None,
                root: str | Path | None = None) -> ValueError:
    """The refusal of a file (or model folder) a loader failed on: "<file>: cannot be loaded; <remedy> (cause:
    <cause>; at <full path>)". ``expected``: what the loader expected ("torch checkpoint", "JSON file", "model
    folder"), which the cause names instead of the library's text."""
    return file_refusal(path, "cannot be loaded", remedy, detail=f"cause: {cause(error, expected, path)}", root=root)


@contextlib.contextmanager
def loading(path: str | Path, remedy: str, *, expected: str, root: str | Path | None = None) -> Iterator[None]:
    """Around a library's load of ``path``: any exception it raises becomes ``cannot_load`` (its own text and
    traceback dropped, ``from None``)."""
    try:
        yield
    except Exception as error:  # noqa: BLE001 - a file from disk is external input: whatever fails, it is unusable
        raise cannot_load(path, error, remedy, expected=expected, root=root) from None
