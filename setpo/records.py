"""Small shared helpers for what runs print and write: markdown tables, side-by-side timings, result files."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent


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


def write_bench_report(name: str, text: str) -> Path:
    """Print a benchmark's report and write it to runs/bench/<name>.md (runs/ is not committed)."""
    print(text)
    out = ROOT / "runs" / "bench" / f"{name}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")
    return out


def write_json(path: Path, obj) -> None:
    """Write ``obj`` as JSON atomically (a temp file, then rename): an interrupted run never leaves half a file."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    tmp.replace(path)
