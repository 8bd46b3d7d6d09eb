"""Small shared helpers for what runs print and write: markdown tables, side-by-side timings, result files."""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Collection

from setpo.refusals import cannot_load, file_refusal


def progress_bar(total: int, desc: str = "", unit: str = "step"):
    """A tqdm bar that shows in a terminal, a notebook, and a log file: to a file (stderr not a terminal) it
    writes a line at most every 10 s instead of a redraw every 0.1 s."""
    from tqdm.auto import tqdm

    live = sys.stderr.isatty() or "ipykernel" in sys.modules
    return tqdm(total=total, desc=desc, unit=unit, mininterval=0.1 if live else 10.0, miniters=1, dynamic_ncols=True)


def markdown_table(rows: list[dict], fmt: Callable[[object], str] = str) -> str:
    """A markdown table with one column per key of the first row."""
    if not rows:
        raise ValueError("markdown_table needs at least one row")
    header = list(rows[0])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(fmt(r[h]) for h in header) + " |" for r in rows])


def time_side_by_side(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median wall-clock seconds of each function, run interleaved (A, B, A, B, ...) so that a noisy, shared
    machine slows every candidate alike; ratios of these medians are what a benchmark should report."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t0)
    return {name: statistics.median(v) for name, v in samples.items()}


def write_text(path: Path, text: str) -> None:
    """Write ``text`` atomically (a temp file beside it, then rename): a run killed at any moment leaves the old
    file or the new one, never half of one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_json(path: Path, obj) -> None:
    """Write ``obj`` as JSON atomically (see ``write_text``)."""
    write_text(path, json.dumps(obj, indent=1))


def append_record(path: Path, record: dict) -> None:
    """Append one JSON record as a line of a JSONL file, flushed to disk (``read_records`` reads it back; a line
    cut short by a kill is dropped there)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_records(path: Path, remedy: str = "delete the file to record it again (or the run folder to start over)",
                 root: Path | None = None) -> list[dict]:
    """The records of a JSONL file. A last line cut short (a kill mid-write) is dropped; a damaged line
    elsewhere, or a file that is not text, is a ValueError that leads with the file (relative to ``root``, by
    default its folder; ``setpo.refusals``) and ``remedy``."""
    path = Path(path)
    if not path.exists():
        return []
    root = path.parent if root is None else root
    try:
        lines = path.read_text().split("\n")
    except UnicodeDecodeError as e:
        raise cannot_load(path, e, remedy, expected="JSON lines file", root=root) from None
    out = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except (json.JSONDecodeError, RecursionError):
            if i == len(lines) - 1:  # no newline after it: the write was interrupted
                break
            raise file_refusal(path, f"line {i + 1} cannot be loaded", remedy, detail="cause: not valid JSON",
                               root=root) from None
    return out


def config_differences(old: dict, new: dict, ignore: Collection[str] = ()) -> dict[str, str]:
    """What differs between a saved config and the current one (both as JSON dicts; a field missing from one
    counts as None), fields in ``ignore`` left out: field -> "<old> there, <new> now" (reprs), sorted by field;
    for the message refusing to reuse a folder or checkpoint made with another config."""
    return {k: f"{old.get(k)!r} there, {new.get(k)!r} now"
            for k in sorted(set(old) | set(new)) if k not in ignore and old.get(k) != new.get(k)}


def read_json(path: Path, remedy: str = "delete it to start over", root: Path | None = None):
    """Read a JSON file; a damaged one (empty, cut short, not JSON, not text) is a ValueError that leads with
    the file (relative to ``root``, by default its folder) and ``remedy``, then a short cause that is the same
    whatever the damaged bytes are (``setpo.refusals.cannot_load``)."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise cannot_load(path, e, remedy, expected="JSON file", root=path.parent if root is None else root) from None
