"""Countdown datasets: parquet for TRL and verl, and a local copy of the public Countdown-Tasks-3to4."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence

from setpo.envs._checks import whole_number
from setpo.envs.countdown.solver import CountdownInstance
from setpo.envs.countdown.verifier import check_instance, make_prompt

COUNTDOWN_TASKS_HELP = (
    "Countdown-Tasks-3to4 is the public dataset 'Jiayi-Pan/Countdown-Tasks-3to4' on the Hugging Face Hub; "
    "nothing here downloads it. Get a copy yourself, e.g. `huggingface-cli download --repo-type dataset "
    "Jiayi-Pan/Countdown-Tasks-3to4 --local-dir data/countdown`, and pass the parquet file or its folder. "
    "Or make instances locally with setpo.envs.countdown.generate_instances / make_splits."
)


def export_parquet(
    instances: Sequence[CountdownInstance],
    path,
    style: str = "trl",
    *,
    chat: bool | None = None,
    split: str = "train",
    data_source: str = "countdown",
):
    """Write instances to a parquet file for a trainer; returns the path.

    style="trl" (``GRPOTrainer``'s dataset; extra columns reach reward functions as keyword arguments):
        prompt   text (chat=False, the default: the base-model prompt of ``make_prompt``), or a list of
                 {"role", "content"} messages (chat=True, a conversational dataset)
        numbers  list of int
        target   int
    style="verl" (verl's RL dataset convention):
        data_source   ``data_source`` ("countdown")
        prompt        list of chat messages: ``make_prompt(chat=True)`` by default; chat=False wraps the
                      base-model prompt text in one user message (TinyZero's base-model layout)
        ability       "math"
        reward_model  {"style": "rule", "ground_truth": {"numbers": [...], "target": t}}
        extra_info    {"split": split, "index": i, "numbers": [...], "target": t}
    ``verl_compute_score`` scores this layout.
    """
    import pandas as pd

    if style not in ("trl", "verl"):
        raise ValueError(f"style must be 'trl' or 'verl', got {style!r}")
    if chat is not None and not isinstance(chat, bool):
        raise ValueError(f"chat must be None, True or False, got {chat!r}")
    for name, value in (("split", split), ("data_source", data_source)):
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    if isinstance(instances, (str, bytes)) or not isinstance(instances, Iterable):
        raise ValueError(f"instances must be a sequence of CountdownInstance, got {type(instances).__name__}")
    if Path(path).is_dir():
        raise ValueError(f"path {str(path)!r} is a folder; give the parquet file's path")
    rows = []
    for i, inst in enumerate(instances):
        if not isinstance(inst, CountdownInstance):
            raise ValueError(f"instances must be CountdownInstance, got {type(inst).__name__} at {i}")
        numbers, target = [int(v) for v in inst.numbers], int(inst.target)
        if style == "trl":
            prompt = make_prompt(numbers, target, chat=bool(chat))
            rows.append({"prompt": prompt, "numbers": numbers, "target": target})
        else:
            prompt = make_prompt(numbers, target, chat=True if chat is None else chat)
            if isinstance(prompt, str):
                prompt = [{"role": "user", "content": prompt}]
            truth = {"numbers": numbers, "target": target}
            rows.append(
                {
                    "data_source": data_source,
                    "prompt": prompt,
                    "ability": "math",
                    "reward_model": {"style": "rule", "ground_truth": truth},
                    "extra_info": {"split": split, "index": i, **truth},
                }
            )
    if not rows:
        raise ValueError("no instances to export")
    pd.DataFrame(rows).to_parquet(path, index=False)
    return path


def load_countdown_tasks(path, limit: int | None = None) -> list[CountdownInstance]:
    """Instances from a local copy of the public Countdown-Tasks-3to4 parquet (columns ``nums``, ``target``).

    path: a parquet file, or a folder whose ``*.parquet`` files (searched recursively, in sorted order)
    are read one after another. limit: keep the first ``limit`` rows. Nothing is downloaded: a missing
    path raises FileNotFoundError saying where to get the data. Rows are not checked for solvability
    (``solve`` does that, ~10 ms a row).
    """
    import pandas as pd

    p = Path(path).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"no Countdown-Tasks-3to4 parquet at {str(p)!r}. {COUNTDOWN_TASKS_HELP}")
    files = sorted(p.rglob("*.parquet")) if p.is_dir() else [p]
    if not files:
        raise FileNotFoundError(f"no *.parquet files under {str(p)!r}. {COUNTDOWN_TASKS_HELP}")
    if limit is not None:
        limit = whole_number(limit, "limit", 0)
    out: list[CountdownInstance] = []
    for f in files:
        df = pd.read_parquet(f, columns=None)
        missing = {"nums", "target"} - set(df.columns)
        if missing:
            raise ValueError(
                f"{f} lacks the column(s) {sorted(missing)} of Countdown-Tasks-3to4 (nums, target)"
            )
        for nums, target in zip(df["nums"], df["target"]):
            if limit is not None and len(out) >= limit:
                return out
            numbers, t = check_instance(list(nums), target)
            if not isinstance(t, int):
                raise ValueError(f"{f}: target must be an integer, got {target!r}")
            out.append(CountdownInstance(numbers, t))
    return out
