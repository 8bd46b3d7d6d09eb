"""A study command's arguments, checked before any work: ``--stages`` and ``--set FIELD=JSON``, with one-line
errors and exit status 2. The parser and the number types every command shares are ``setpo.envs.arguments``'s."""

from __future__ import annotations

import argparse
import json
from collections.abc import Collection, Sequence

from setpo_lab.studies.stages import chosen_stages


def add_stage_and_set_arguments(p: argparse.ArgumentParser, stages: Sequence[str], set_example: str,
                                stages_note: str = "default: all") -> None:
    """A study command's ``--stages`` (comma-separated, of ``stages``) and ``--set FIELD=JSON ...`` options."""
    p.add_argument("--stages", default=",".join(stages),
                   help=f"comma-separated stages to run, of {','.join(stages)} ({stages_note})")
    p.add_argument("--set", nargs="*", default=[], metavar="FIELD=JSON",
                   help=f"override config fields, e.g. --set {set_example}")


def parsed_stages(p: argparse.ArgumentParser, text: str, stages: Sequence[str]) -> list[str]:
    """``--stages`` checked against the study's (``stages.chosen_stages``), a one-line error otherwise."""
    try:
        return chosen_stages(text, stages)
    except ValueError as e:
        p.error(f"--stages: {e}")


def set_overrides(p: argparse.ArgumentParser, items: Sequence[str], known: Collection[str],
                  reserved: Collection[str] = (), reserved_why: str = "") -> dict:
    """``--set FIELD=VALUE`` items as config overrides: VALUE as JSON, else a bare string. A field that is
    not in ``known``, or is ``reserved`` (it has an option of its own: ``reserved_why`` says so), is a
    one-line error listing the fields that may be set."""
    overrides = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq:
            p.error(f"--set: expected FIELD=VALUE, got {item!r}")
        if key not in known or key in reserved:
            p.error(f"--set: unknown config field {key!r}{reserved_why}; known: "
                    + ", ".join(sorted(set(known) - set(reserved))))
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value  # a bare string
    return overrides
