"""Whether a Countdown study made the same thing as another, and on which processors: the provenance columns of its
record (``made_on``, ``fingerprints``, ``machines_used``) and the bit-for-bit comparison of a study with its
replication (``bitwise_agreement``, ``identical_text``).

They record what was made where and compare digests of what was made; they compute none of the record's
numbers, so, like the rest of ``setpo_lab.repro``, they are not part of the study's code identity
(``provenance.MACHINERY``). A study folder keeps the warm start in ``sft/``, RL runs in ``rl/<name>/`` and
evaluations in ``val/`` and ``eval/`` (``setpo_lab.studies.countdown``).
"""

from __future__ import annotations

import collections
import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from setpo.records import read_json


def _machine_label(machine: Mapping | None) -> str:
    """A short name of the processor an identity records (``setpo_lab.repro.provenance.machine``): its model, its widest
    vector extension and its flags digest, e.g. "AMD EPYC avx512f 6a93d771"; "unrecorded" if none."""
    if not machine:
        return "unrecorded"
    widest = next((v for v in ("amx_tile", "avx512f", "avx2") if v in (machine.get("vector") or [])), None)
    parts = [machine.get("cpu"), widest, (machine.get("flags_sha256") or "")[:8] or None]
    return " ".join(str(x) for x in parts if x) or "unrecorded"


def made_on(out: Path, name: str, evaluation: Mapping) -> dict:
    """Which processor trained run ``name`` (its folder's identity.json; "sft": the warm start) and which
    evaluated it (the evaluation's identity): a study of several sittings may have had several."""
    folder = _run_folder(out, name) / "identity.json"
    trained = read_json(folder, "delete the run's folder and rerun").get("machine") if folder.exists() else None
    return {"trained_on": _machine_label(trained),
            "evaluated_on": _machine_label((evaluation.get("identity") or {}).get("machine"))}


def fingerprints(out: Path, name: str, evaluation: Mapping) -> dict:
    """What the run and its evaluation came to, as digests to compare two studies bit for bit:
    ``weights_sha256`` (its final weights, from ``final/done.json``; None if unrecorded) and ``counts_sha256``
    (``_counts_digest`` of the evaluation)."""
    return {"weights_sha256": _weights_digest(_run_folder(out, name)),
            "counts_sha256": _counts_digest(evaluation)}


def _counts_digest(evaluation: Mapping) -> str:
    """SHA-256 of an evaluation's per-problem correct and distinct counts: what it measured, not when or how fast."""
    counts = json.dumps([list(evaluation["correct"]), list(evaluation.get("distinct") or [])])
    return hashlib.sha256(counts.encode()).hexdigest()


def _run_folder(out: Path, name: str) -> Path:
    """Where a study keeps run ``name``: "sft" is the warm start, anything else an RL run."""
    return out / "sft" if name == "sft" else out / "rl" / name


def _weights_digest(run_folder: Path) -> str | None:
    done = run_folder / "final" / "done.json"
    return read_json(done, "delete the run's folder and rerun").get("weights_sha256") if done.exists() else None


def machines_used(rows: Sequence[Mapping]) -> dict[str, dict[str, int]]:
    """How many of the record's rows each processor trained and evaluated: {"trained": {label: rows}, "evaluated":
    {...}}. More than one label: the study's sittings had different machines (see
    docs/reproducibility/countdown-history.md)."""
    count = lambda key: dict(sorted(collections.Counter(r[key] for r in rows).items()))  # noqa: E731
    return {"trained": count("trained_on"), "evaluated": count("evaluated_on")}


def bitwise_agreement(out: str | Path, other: str | Path) -> dict:
    """Of everything two study folders both made: the models (the warm start, every search and final run, by
    name) and the evaluations (validation and test, by name): how many are shared, and how many identical (the
    same final-weights SHA-256; the same ``_counts_digest``). A model without a recorded digest counts as shared,
    not identical."""
    def models(root: Path) -> dict[str, str | None]:
        return {p.name: _weights_digest(p) for p in [root / "sft", *sorted((root / "rl").glob("*"))]
                if (p / "final" / "done.json").exists()}

    def evaluations(root: Path) -> dict[str, str]:
        return {f"{split}/{p.stem}": _counts_digest(read_json(p, "delete it and rerun to evaluate again"))
                for split in ("val", "eval") for p in sorted((root / split).glob("*.json"))
                if not p.name.endswith(".texts.json")}  # the judge's responses, not an evaluation

    def count(made) -> tuple[int, int]:
        mine, theirs = made(Path(out)), made(Path(other))
        shared = set(mine) & set(theirs)
        return len(shared), sum(mine[k] is not None and mine[k] == theirs[k] for k in shared)
    n_models, same_models = count(models)
    n_evaluations, same_evaluations = count(evaluations)
    return {"models": n_models, "models_identical": same_models,
            "evaluations": n_evaluations, "evaluations_identical": same_evaluations}


def identical_text(identical: Mapping | None) -> str:
    """"; identical bit for bit: 58 of 58 models, 67 of 67 evaluations" from ``bitwise_agreement``'s counts;
    "" when the record has none."""
    if not identical:
        return ""
    return (f"; identical bit for bit: {identical['models_identical']} of {identical['models']} models, "
            f"{identical['evaluations_identical']} of {identical['evaluations']} evaluations")
