"""What every study shares about its stages and its folder: whether a stage is done, which stages to run,
claiming a run folder for one configuration, refusals in one shape, and progress lines.

- ``stage_done(final)``: a training stage is done when its final folder holds the trainer's marker
  (``setpo.trl.training.is_done``: ``train_resumable`` writes it there last); the one place a study asks.
- ``claim_folder(folder, config, ...)``: write the configuration a folder's results come from, or check that
  the folder's is the same one; a folder made with another configuration is refused, naming the fields
  (the toy's checkpoint uses ``check_same_config``, the same comparison, on the configuration it carries).
- ``refusal`` / ``unreadable``: every refusal is one line naming the file and what to do. A file that cannot be
  loaded (``unreadable``) *leads* with them, then a short cause in the package's own words that is the same
  whatever bytes are damaged (``setpo.refusals``: never a library's text, never torch's advice to turn
  off safe loading); any other refusal ends with them, after the package's own short problem.
- ``chosen_stages``: the stages a command line names, checked against the study's, the valid ones named.
- ``StudyResult``: what every study's ``run_study`` returns, one shape whichever study ran.
- ``claim_identity(folder, identity)`` / ``reusable_record(path, identity)``: a folder or record made at another
  identity (thread count, code, package versions: ``setpo_lab.repro.provenance``) is refused with the differing fields
  named, or, where the user asks (``redo``), deleted so that it is made again.
- ``restore_model`` / ``check_restored``: a stage recorded as done whose model is not here (a study folder
  kept in git keeps its records, not its models) is trained again and must give the recorded weights bit for
  bit, or is refused (``RestoreMismatch``), its recorded records put back as they were.
- ``write_report(folder, record, markdown)``: the report frame every study's stage "report" ends in:
  ``results.json`` (the record) and ``results.md`` (its tables), each written atomically.
- ``Progress``: a line at most every ``every_s`` seconds from a loop, so long data building shows it is alive.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from setpo_lab.repro.provenance import identity_differences
from setpo.records import config_differences, read_json, write_json, write_text
from setpo.refusals import cannot_load
from setpo.trl.training import DONE_FILE, WEIGHT_FILES, is_done

RECORDED_FILE = "done.recorded.json"  # a done stage's record, set aside while its missing model is trained again

IDENTITY_FILE = "identity.json"
REDO = "rerun with --redo to make it again at this identity, or go back to the threads and code that made it"

#: the stages every study names alike, in the order they run; a study has those it needs (``StudyCommand.stages``):
#: train (every model it trains: a warm start, the RL runs), evaluate (sample and score every model, the base model
#: too, cached), judge (an LLM judge over the evaluations' texts, only with a judge configured), report (tables and
#: figures from what is recorded)
STAGE_NAMES = ("train", "evaluate", "judge", "report")


def stage_done(final: str | Path) -> bool:
    """Whether a training stage whose final folder is ``final`` finished: the trainer answers
    (``setpo.trl.training.is_done``, its own marker), so no study guesses the file."""
    return is_done(final)


def has_model(final: str | Path) -> bool:
    """Whether a final folder holds a model's weights (any of ``setpo.trl.training.WEIGHT_FILES``)."""
    return any((Path(final) / name).is_file() for name in WEIGHT_FILES)


def restore_model(final: str | Path) -> dict | None:
    """Get ready to train again a stage recorded as done whose model is not here: its record (``done.json``)
    is set aside as ``done.recorded.json`` and returned, so the stage trains and ``check_restored`` can compare
    the new weights with the recorded ones. None when there is nothing to restore. A record already set aside
    (a restore that was killed) is returned again."""
    final = Path(final)
    aside = final / RECORDED_FILE
    if stage_done(final) and not has_model(final):
        (final / DONE_FILE).replace(aside)
    return read_json(aside, f"delete {final.parent} and rerun to train it again") if aside.exists() else None


class RestoreMismatch(ValueError):
    """A model trained again to restore a recorded one gave other weights: another machine's arithmetic."""


def run_records(run_dir: str | Path) -> dict[Path, bytes]:
    """A run folder's records (log history, probes, timings), kept while its missing model is trained again and
    put back afterwards (``check_restored``), so a restore leaves the first training's records in place."""
    return {p: p.read_bytes() for p in Path(run_dir).glob("*.json*") if p.is_file()}


def check_restored(final: str | Path, recorded: Mapping | None, what: str,
                   kept: Mapping[Path, bytes] | None = None) -> None:
    """After training again what ``restore_model`` set aside: the same weights (SHA-256) as recorded put the
    recorded ``done.json`` back (its times are the first training's); other weights are deleted and refused
    (``RestoreMismatch``), so that nothing made from them passes for the recorded run. Either way the records
    ``kept`` (``run_records``, taken before training again) are put back: the folder holds the recorded run's
    records, which the next try compares with again."""
    if recorded is None:
        return
    final = Path(final)
    now = read_json(final / DONE_FILE, "delete it and rerun").get("weights_sha256")
    then = recorded.get("weights_sha256")
    for path, data in (kept or {}).items():
        path.write_bytes(data)
    if now is None or now != then:
        for name in [*WEIGHT_FILES, DONE_FILE]:
            (final / name).unlink(missing_ok=True)
        raise RestoreMismatch(refusal(
            f"{what}, trained again because its model was not here, gave other weights than the recorded ones "
            f"(SHA-256 {str(now)[:12]} now, {str(then)[:12]} recorded): this machine's arithmetic is not the one "
            "that made the record (see identity.json's machine)", final,
            "rerun where the record was made, or with --redo to make that run and its evaluations again here"))
    write_json(final / DONE_FILE, dict(recorded))
    (final / RECORDED_FILE).unlink()


def chosen_stages(stages: Sequence[str] | str | None, valid: Sequence[str]) -> list[str]:
    """``stages`` (a list, or comma-separated text; None: every stage) as a list in the study's order, every name
    checked: an empty choice or an unknown name is a ValueError naming the valid stages."""
    if stages is None:
        return list(valid)
    names = [s.strip() for s in stages.split(",")] if isinstance(stages, str) else list(stages)
    names = [s for s in names if s]
    unknown = [s for s in names if s not in valid]
    if not names or unknown:
        raise ValueError(f"unknown stage(s) {unknown} in {stages!r}; valid stages: {', '.join(valid)}" if unknown
                         else f"no stage named in {stages!r}; valid stages: {', '.join(valid)}")
    return [s for s in valid if s in names]


@dataclass(frozen=True)
class StudyResult:
    """What every study's ``run_study`` returns: one shape whichever study ran, each field what that study has.

    - ``study``: the study's module name ("toy", "countdown", "math", "rubric").
    - ``out``: the folder its stages write to; None for a study that writes nothing (rubric).
    - ``runs``: every run the call made or read, by name, as the study keeps it. toy: each variant's ``ToyRun``
      of every seed ({"GRPO": [...], "SetPO+GRPO": [...]}); Countdown: the record's rows of each run ("sft",
      ``RLRun.name``; a row per evaluation temperature); math: each run's final model folder by label;
      rubric: each seed's row ("seed 0": the three methods' final true-quality rewards and grader calls).
    - ``summary``: the report the stages made, empty when none did. toy: Figure 1's tables ("coverage",
      "summary" rows); Countdown: ``results.json`` (the replication's inside); math: the evaluations of the
      stages run ("pass_at_k", "results", "judged", as ``math._write_results`` reads them); rubric: the
      markdown table ("table").
    - ``seconds``: the call's wall-clock time.
    """

    study: str
    out: Path | None
    runs: Mapping[str, Any]
    summary: Mapping[str, Any]
    seconds: float


def refusal(problem: str, path: str | Path, remedy: str) -> ValueError:
    """The one shape of a refusal: ``"<problem>: <path>; <remedy>"``, one line, the file and what to do last."""
    return ValueError(f"{_one_line(problem)}: {path}; {remedy}")


def unreadable(path: str | Path, error: BaseException, remedy: str, *, expected: str,
               root: str | Path | None = None) -> ValueError:
    """A file (or model folder) a library failed to load: ``"<file>: cannot be loaded; <remedy> (cause: not a
    readable <expected>; at <full path>)"``, the file relative to ``root`` (its run folder) when given; the
    library's own text is dropped (``setpo.refusals.cannot_load``)."""
    return cannot_load(path, error, remedy, expected=expected, root=root)


def _one_line(text: str) -> str:
    return next((line.strip() for line in str(text).strip().splitlines() if line.strip()), "")


def _flat(record: Mapping, prefix: str = "") -> dict:
    """Nested dicts as dotted keys, so a differing field is named exactly (``config.lr``, ``model.hidden_size``)."""
    out = {}
    for key, value in record.items():
        if isinstance(value, Mapping) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def check_same_config(saved: Mapping, now: Mapping, ignore: Collection[str], path: str | Path, remedy: str) -> None:
    """Refuse (``refusal``) when two configurations (as JSON dicts) differ outside ``ignore``, naming the fields
    with both values."""
    differ = config_differences(_flat(saved), _flat(now), ignore)
    if differ:
        raise refusal(f"made with a different configuration (fields {list(differ)}: "
                      + ", ".join(f"{k}: {d}" for k, d in differ.items()) + ")", path, remedy)


def claim_folder(folder: str | Path, config: Mapping, ignore: Collection[str] = (), *,
                 record: str = "config.json", results: Sequence[str] = (),
                 remedy: str = "use another folder, or delete that one and rerun") -> Path:
    """Claim ``folder`` for the results of ``config`` (JSON-able), recorded in ``folder/record``.

    A new folder gets the record. A folder with a record is checked against it (``check_same_config``; fields
    in ``ignore`` may differ). A folder holding any of ``results`` but no record is refused: nothing says which
    configuration made them. Returns the record's path.

    ``ignore`` is the study's ``REUSE_NEUTRAL_FIELDS`` (one name, one meaning in every ``<study>_config``): the
    fields in which the config asking may differ from the one a folder or checkpoint was made with while what
    it holds is reused, because nothing written there depends on them (where it lives, how often it saves,
    evaluation and judge settings kept apart; for the toy's checkpoints, how far the run goes on).
    """
    folder = Path(folder)
    path = folder / record
    new = json.loads(json.dumps(config, default=str))
    if path.exists():
        check_same_config(read_json(path, f"delete {folder} and rerun to start over"), new, ignore, path, remedy)
        return path
    made = [name for name in results if (folder / name).exists()]
    if made:
        raise refusal(f"holds results ({', '.join(made)}) but no {record}, so nothing says which configuration "
                      "made them", folder, remedy)
    folder.mkdir(parents=True, exist_ok=True)
    write_json(path, new)
    return path


def _differences_text(differ: Mapping[str, str]) -> str:
    return "; ".join(f"{k}: {v}" for k, v in differ.items())


def claim_identity(folder: str | Path, identity: Mapping | None, redo: bool = False,
                   outputs: Sequence[str] | None = None) -> None:
    """Claim ``folder`` for results made at ``identity`` (``setpo_lab.repro.provenance.run_identity``; None: no check),
    recorded in ``folder/identity.json``.

    A new folder gets the record. A folder recorded at another identity, or holding results but no record, is
    refused with the differing fields named (threads, the code files that changed, package versions); with
    ``redo`` its results are deleted instead, to be made again: ``outputs`` (names inside the folder), or the
    whole folder when None.
    """
    if identity is None:
        return
    folder = Path(folder)
    path = folder / IDENTITY_FILE
    made = [folder / name for name in outputs] if outputs is not None else (
        list(folder.iterdir()) if folder.is_dir() else [])
    made = [p for p in made if p.exists()]
    if path.exists():
        differ = identity_differences(read_json(path, f"delete {folder} and rerun to start over"), identity)
        if not differ:
            return
        problem = f"made at another identity ({_differences_text(differ)})"
    elif made:
        problem = "holds results but no identity.json, so nothing says which threads and code made them"
    else:
        problem = None
    if problem is not None:
        if not redo:
            raise refusal(problem, path if path.exists() else folder, REDO)
        for p in made + [path]:
            shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
    folder.mkdir(parents=True, exist_ok=True)
    write_json(path, identity)


def reusable_record(path: str | Path, identity: Mapping | None, redo: bool = False,
                    remedy: str = "delete it and rerun") -> dict | None:
    """A cached JSON record (an evaluation) if it was made at ``identity`` (its "identity" field), else None when
    there is none; one made at another identity (or recording none) is refused naming the fields, or with
    ``redo`` deleted (None: make it again). identity None: any record is reused."""
    path = Path(path)
    if not path.exists():
        return None
    record = read_json(path, remedy)
    if identity is None:
        return record
    differ = identity_differences(record["identity"], identity) if "identity" in record else {"identity": "none recorded"}
    if not differ:
        return record
    if not redo:
        raise refusal(f"made at another identity ({_differences_text(differ)})", path, REDO)
    path.unlink()
    return None


def write_report(folder: str | Path, record: Mapping, markdown: str) -> Path:
    """``folder/results.json`` (``record``) and ``folder/results.md`` (``markdown``, the record's tables), each
    written atomically: where every study's report stage leaves its result. Returns the .md's path."""
    folder = Path(folder)
    write_json(folder / "results.json", record)
    write_text(folder / "results.md", markdown)
    return folder / "results.md"


def cached_evaluation(path: str | Path | None, evaluate: Callable[[], dict], *, remedy: str,
                      reuse: Callable[[dict], dict] | None = None, identity: Mapping | None = None,
                      redo: bool = False) -> dict:
    """The frame of every study's evaluation of a model: the one kept in ``path`` if there is one and it may be
    reused, else ``evaluate()``'s, kept there (with ``identity`` under "identity"). A kept one must have been made at
    ``identity`` (``reusable_record``: another is refused, or with ``redo`` made again) and passes through ``reuse``,
    which refuses one made by another model or brings an older record up to date. path None: nothing is kept."""
    if path is None:
        return evaluate()
    kept = reusable_record(path, identity, redo, remedy)
    if kept is not None:
        return reuse(kept) if reuse else kept
    record = evaluate()
    if identity is not None:
        record["identity"] = identity
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_json(Path(path), record)
    return record


def print_flushed(*args) -> None:
    """Every study's default ``log``: print, flushed, so a long run's progress shows when stdout is a file."""
    print(*args, flush=True)


@contextlib.contextmanager
def heartbeat(log: Callable[[str], object] | None, label: str, status: Callable[[], str] | None = None,
              every_s: float = 10.0, clock: str | Path | None = None):
    """While the block runs, ``log`` a line every ``every_s`` seconds from a daemon thread: the label, the seconds
    since the block began and ``status()`` (e.g. the sequences sampled so far). For the long calls that report
    nothing themselves (a training step, a batch of generation). clock: a JSON file where each beat (and the end)
    records this sitting's seconds so far, so that work done over several sittings, some of them killed, adds up
    (``sittings_seconds``; at most ``every_s`` of a killed sitting is lost). With log None: no lines."""
    start, done = time.monotonic(), threading.Event()
    sitting = time.strftime("%Y-%m-%dT%H:%M:%S")

    def record_clock():
        if clock is not None:
            try:
                seconds = read_json(Path(clock)) if Path(clock).is_file() else {}
                write_json(Path(clock), {**seconds, sitting: time.monotonic() - start})
            except (OSError, ValueError):  # the clock is a courtesy: it must not stop the work it times
                pass

    def beat():
        while not done.wait(every_s):
            record_clock()
            if log is None:
                continue
            try:
                extra = f", {status()}" if status is not None else ""
            except Exception:  # noqa: BLE001 - a status that cannot be read must not stop the work it reports on
                extra = ""
            log(f"{label}: {time.monotonic() - start:.0f} s{extra}")

    thread = threading.Thread(target=beat, daemon=True, name=f"heartbeat {label}")
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        record_clock()


def sittings_seconds(clock: str | Path) -> float:
    """The seconds ``heartbeat`` recorded in ``clock`` over every sitting (0 when there is no such file)."""
    return float(sum(read_json(Path(clock)).values())) if Path(clock).is_file() else 0.0


class Progress:
    """``log`` a line (``"<label> i/total"``) at most every ``every_s`` seconds while a loop runs, and at its
    end; ``Progress(...).over(items)`` yields the items and counts them."""

    def __init__(self, log: Callable[[str], object], label: str, total: int, every_s: float = 10.0,
                 clock: Callable[[], float] | None = None):
        self.log, self.label, self.total, self.every_s = log, label, total, every_s
        self.clock = clock or time.monotonic
        self.done, self.last = 0, self.clock()

    def step(self, n: int = 1) -> None:
        self.done += n
        now = self.clock()
        if now - self.last >= self.every_s or self.done == self.total:
            self.last = now
            self.log(f"{self.label} {self.done}/{self.total}")

    def over(self, items: Iterable):
        for item in items:
            yield item
            self.step()
