"""What every benchmark here shares: its command line (``--smoke``, ``--out``) and where its report goes.

Not a benchmark itself (``make bench`` skips it). Each benchmark script calls ``options(__doc__)`` first and
``report(args, name, text, record)`` last:

- ``--smoke``: tiny sizes that run in seconds. It checks that the benchmark runs and writes its rows (``make test``
  does, tests/test_benchmarks.py); its numbers measure nothing and its PASS / FAIL mean nothing.
- ``--out DIR``: the folder of the report (``<name>.md``, the table) and its rows (``<name>.json``). Default
  ``runs/bench/`` for a full run (what ``make bench`` writes and the docs quote), ``runs/bench/smoke/`` for a
  smoke run, so that a smoke run never overwrites a measurement. runs/ is not committed.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable

from setpo.records import write_json, write_text
from setpo_lab import ROOT

FULL_OUT = ROOT / "runs" / "bench"
SMOKE_OUT = FULL_OUT / "smoke"


def options(doc: str, argv: list[str] | None = None,
            more: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    """Parse a benchmark's command line: ``--smoke``, ``--out`` and what ``more`` adds to the parser.
    doc: the script's docstring (its first paragraph is the description). ``args.out`` is always a Path."""
    ap = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true",
                    help="tiny sizes, seconds: checks that it runs and writes its rows; measures nothing")
    ap.add_argument("--out", type=Path, default=None,
                    help=f"folder for <name>.md and <name>.json (default {FULL_OUT.relative_to(ROOT)}/, "
                         f"{SMOKE_OUT.relative_to(ROOT)}/ with --smoke)")
    if more is not None:
        more(ap)
    args = ap.parse_args(argv)
    if args.out is None:
        args.out = SMOKE_OUT if args.smoke else FULL_OUT
    if args.out.exists() and not args.out.is_dir():
        ap.error(f"--out {args.out} is a file, not a folder")
    return args


def report(args: argparse.Namespace, name: str, text: str, record: dict) -> Path:
    """Print the report ``text`` and write it to ``<out>/<name>.md``, ``record`` (its rows) to ``<out>/<name>.json``;
    a smoke run's table says so in its first line. Returns the .md path."""
    if args.smoke:
        text = "SMOKE RUN (tiny sizes; the numbers measure nothing)\n\n" + text
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"{name}.md"
    write_text(out, text + "\n")
    write_json(out.with_suffix(".json"), {"smoke": args.smoke, **record})
    return out
