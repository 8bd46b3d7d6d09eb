"""The judge's on-disk cache: one JSONL record per judged set, so an interrupted evaluation resumes without asking
(or paying) twice.

A record is keyed by ``cache_key(judge, problem, responses, max_chars)``: the judge's name (model and decoding
settings, never its address or key), ``PROMPT_VERSION``, the problem and the responses, so a new rubric, another
judge or other responses never reuse an old verdict. Each record is one ``write`` of one line to a file opened
for appending, flushed and fsynced before the verdict counts as done: a kill leaves at most a last line cut
short, which opening the cache drops (``setpo.records.read_records`` reads the rest). Only the judge's replies
are cached (a reply that gives no score included: asking again at temperature 0 would pay for the same
answer); a request that failed, or that the server rejected, is not, so a rerun asks again.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Sequence

from setpo.judge.rubric import MAX_RESPONSE_CHARS, PROMPT_VERSION, SCALE
from setpo.records import read_records
from setpo.refusals import cannot_load, file_refusal


def cache_key(judge_name: str, problem: str, responses: Sequence[str], max_chars: int = MAX_RESPONSE_CHARS) -> str:
    """The sha256 of everything a verdict depends on: judge, prompt version, problem, responses, truncation."""
    blob = json.dumps([judge_name, PROMPT_VERSION, problem, list(responses), max_chars], ensure_ascii=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def verdict_problem(rec) -> str | None:
    """What makes ``rec`` not a verdict this cache can serve (a record made by hand or by another program), or
    None: it needs a text "key", a "score" that is None or a whole number on the scale, a "missing" that is None
    or text."""
    if not isinstance(rec, dict) or not isinstance(rec.get("key"), str):
        return "no 'key'"
    score, missing = rec.get("score"), rec.get("missing")
    if "score" not in rec or not (score is None or type(score) is int and SCALE[0] <= score <= SCALE[1]):
        return f"'score' must be null or a whole number from {SCALE[0]} to {SCALE[1]}, got {score!r:.40}"
    if "missing" not in rec or not (missing is None or isinstance(missing, str)):
        return f"'missing' must be null or text, got {missing!r:.40}"
    return None


class JudgeCache:
    """Verdicts by key, read from ``path`` (JSONL) and appended to it; thread-safe. ``path=None``: in memory."""

    def __init__(self, path: str | os.PathLike | None):
        self.path = None if path is None else Path(path)
        self._lock = threading.Lock()
        self._records: dict[str, dict] = {}
        if self.path is not None:
            if self.path.is_dir():
                raise ValueError(f"judge cache {self.path} is a folder; give a file path (e.g. judge_cache.jsonl)")
            # a refusal leads with the file and what to do, then a short cause (setpo.refusals)
            remedy = "give another cache file, or delete this one to judge again"
            try:
                records = read_records(self.path, remedy)
                for i, rec in enumerate(records):
                    problem = verdict_problem(rec)
                    if problem:
                        raise file_refusal(self.path, f"record {i + 1} is not a judge verdict", remedy,
                                           detail=f"cause: {problem}", root=self.path.parent)
                    self._records[rec["key"]] = rec
                self._drop_cut_last_line()  # once the file is known to be a cache: a refused one is left as it was
            except OSError as err:
                raise cannot_load(self.path, err, remedy, root=self.path.parent) from None

    def _drop_cut_last_line(self) -> None:
        # A kill mid-write leaves a last line without its newline; appending after it would glue the next record
        # onto it and damage both, so cut the file back to its last complete line first.
        if not self.path.exists():
            return
        with open(self.path, "rb+") as f:
            data = f.read()
            if data and not data.endswith(b"\n"):
                f.truncate(data.rfind(b"\n") + 1)

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, key: str) -> bool:
        return key in self._records

    def get(self, key: str) -> dict | None:
        return self._records.get(key)

    def put(self, record: dict) -> None:
        """Store ``record`` (it must have a "key"); on disk before this returns."""
        line = json.dumps(record, ensure_ascii=True) + "\n"
        with self._lock:
            if self.path is not None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with open(self.path, "a", encoding="ascii") as f:
                    f.write(line)
                    f.flush()
                    os.fsync(f.fileno())
            self._records[record["key"]] = record
