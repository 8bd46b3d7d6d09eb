"""Where each row of a Countdown record came from, and whether two studies made the same thing: the processor
that trained and the one that evaluated it (``made_on``, counted by ``machines_used``), digests of its weights
and its evaluation's counts (``fingerprints``), and how many of those a study and its replication share bit for
bit (``bitwise_agreement``). Read by ``countdown_results.summarize``; nothing here runs anything."""

from __future__ import annotations

import collections
import hashlib
import json
from pathlib import Path
from typing import Mapping, Sequence

from setpo.records import read_json


def machine_label(machine: Mapping | None) -> str:
    """A short name of the processor an identity records (``setpo.provenance.machine``): its model, its widest
    vector extension and its flags digest, e.g. "AMD EPYC avx512f 6a93d771"; "unrecorded" if none."""
    if not machine:
        return "unrecorded"
    widest = next((v for v in ("amx_tile", "avx512f", "avx2") if v in (machine.get("vector") or [])), None)
    parts = [machine.get("cpu"), widest, (machine.get("flags_sha256") or "")[:8] or None]
    return " ".join(str(x) for x in parts if x) or "unrecorded"


def made_on(out: Path, name: str, evaluation: Mapping) -> dict:
    """Which processor trained run ``name`` (its folder's identity.json; "sft": the warm start) and which
    evaluated it (the evaluation's identity): a study of several sittings may have had several."""
    folder = out / ("sft" if name == "sft" else f"rl/{name}") / "identity.json"
    trained = read_json(folder, "delete the run's folder and rerun").get("machine") if folder.exists() else None
    return {"trained_on": machine_label(trained),
            "evaluated_on": machine_label((evaluation.get("identity") or {}).get("machine"))}


def fingerprints(out: Path, name: str, evaluation: Mapping) -> dict:
    """What the run and its evaluation came to, as digests to compare two studies bit for bit:
    ``weights_sha256`` (its final weights, from ``final/done.json``; None if unrecorded) and ``counts_sha256``
    (the evaluation's per-problem correct and distinct counts)."""
    done = out / ("sft" if name == "sft" else f"rl/{name}") / "final" / "done.json"
    weights = read_json(done, "delete the run's folder and rerun").get("weights_sha256") if done.exists() else None
    counts = json.dumps([list(evaluation["correct"]), list(evaluation.get("distinct") or [])])
    return {"weights_sha256": weights, "counts_sha256": hashlib.sha256(counts.encode()).hexdigest()}


def machines_used(rows: Sequence[Mapping]) -> dict[str, dict[str, int]]:
    """How many of the record's rows each processor trained and evaluated: {"trained": {label: rows},
    "evaluated": {...}}. More than one label: the study's sittings had different machines (see the README)."""
    count = lambda key: dict(sorted(collections.Counter(r[key] for r in rows).items()))  # noqa: E731
    return {"trained": count("trained_on"), "evaluated": count("evaluated_on")}


def bitwise_agreement(rows: Sequence[Mapping], other: Sequence[Mapping]) -> dict:
    """Of the models both studies trained (the warm start and each RL run, by name) and the evaluations both
    made (by run and temperature): how many are shared, and how many are identical (the same final-weights
    SHA-256; the same per-problem counts). Rows without a digest (a record from before they were kept) count
    as shared, not identical."""
    def count(key, field) -> tuple[int, int]:
        mine, theirs = ({key(r): r.get(field) for r in rs} for rs in (rows, other))
        shared = set(mine) & set(theirs)
        return len(shared), sum(mine[k] is not None and mine[k] == theirs[k] for k in shared)
    models, same_models = count(lambda r: r["name"], "weights_sha256")
    evaluations, same_evaluations = count(lambda r: (r["name"], r["T"]), "counts_sha256")
    return {"models": models, "models_identical": same_models,
            "evaluations": evaluations, "evaluations_identical": same_evaluations}
