"""The inputs and the process hygiene of a verl run on the CPU (``setpo.verl.cpu``): the tiny Countdown model
and data that ``python -m setpo.verl cpu-demo`` writes, and ``run_in_session``, which runs a training command
as the leader of its own process session and leaves none of its Ray processes behind, pass or fail (the
end-to-end test and the CPU step benchmark use it)."""

from __future__ import annotations

import os


def _prompt_text(inst) -> str:
    """The Countdown study's compact prompt (``setpo.studies.countdown.prompt_text``, without its newline)."""
    return " ".join(str(v) for v in inst.numbers) + f" = {inst.target}"


def write_countdown_demo(out_dir, n_train: int = 64, n_val: int = 16, seed: int = 0) -> dict[str, str]:
    """A CPU run's inputs, written once to ``out_dir`` (reused when present): a tiny random Qwen2 with the
    character-level ChatML tokenizer (``setpo.trl.tiny_models.build_chat_tokenizer``: verl's Qwen token
    handling needs ``<|im_end|>`` and a one-token newline) and verl parquet files of Countdown problems in the
    Countdown study's compact prompt (``3 7 25 = 82``), scored by ``envs.countdown.verl_compute_score``.

    The tokenizer goes to its own folder (``tokenizer``, passed as ``--tokenizer-path``): next to a qwen2
    ``config.json``, transformers' AutoTokenizer would swap it for its byte-level Qwen2 tokenizer, which has no
    token for a newline in this vocabulary.

    Returns {"model": dir, "tokenizer": dir, "train": parquet, "val": parquet}.
    """
    from pathlib import Path

    import pandas as pd

    from envs.countdown import make_splits
    from setpo.trl.tiny_models import ModelSize, build_chat_tokenizer, build_model

    out = Path(out_dir)
    paths = {"model": out / "model", "tokenizer": out / "tokenizer", "train": out / "train.parquet",
             "val": out / "val.parquet"}
    if not (paths["model"] / "config.json").is_file() or not (paths["tokenizer"] / "tokenizer.json").is_file():
        tokenizer = build_chat_tokenizer()
        size = ModelSize(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         intermediate_size=128, max_position_embeddings=128)
        model = build_model(tokenizer, size, seed=seed)
        paths["model"].mkdir(parents=True, exist_ok=True)
        model.save_pretrained(str(paths["model"]))
        tokenizer.save_pretrained(str(paths["tokenizer"]))
    if not (paths["train"].is_file() and paths["val"].is_file()):
        train, val = make_splits(n_train, n_val, seed=seed, num_numbers=(3,), number_range=(1, 20),
                                 target_range=(1, 60))
        for split, items in (("train", train), ("val", val)):
            rows = []
            for i, inst in enumerate(items):
                truth = {"numbers": [int(v) for v in inst.numbers], "target": int(inst.target)}
                rows.append({"data_source": "countdown", "prompt": [{"role": "user", "content": _prompt_text(inst)}],
                             "ability": "math", "reward_model": {"style": "rule", "ground_truth": truth},
                             "extra_info": {"split": split, "index": i, **truth}})
            pd.DataFrame(rows).to_parquet(paths[split], index=False)
    return {k: str(v) for k, v in paths.items()}


# --------------------------------------------------------------------------------------------------- runs


def session_pids(sid: int) -> list[int]:
    """Live processes of session ``sid`` (Linux ``/proc``): a run started as a session leader, with every Ray
    process it starts (GCS, raylet, workers) inheriting its session."""
    from pathlib import Path

    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[3]) == sid and fields[0] != "Z":  # fields[3]: the session id; "Z": a zombie, already gone
            out.append(int(entry.name))
    return out


def run_in_session(cmd: list[str], timeout: float, grace_s: float = 30.0, **popen) -> tuple[int | None, str, list]:
    """Run ``cmd`` as the leader of a new session and leave nothing of it behind, pass or fail.

    Returns (exit status or None on timeout, its output, the pids still alive ``grace_s`` after it ended, which
    are then killed). A CPU training run starts a Ray cluster that its driver shuts down; this is the check that
    it did, and the clean-up when it could not.
    """
    import signal
    import subprocess
    import time

    import tempfile

    with tempfile.TemporaryFile("w+") as log:  # a file, not a pipe: a leftover child may hold the output open
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True, **popen)
        status = None
        try:
            status = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            for pid in session_pids(proc.pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait()
        log.seek(0)
        out = log.read()
    deadline = time.time() + grace_s
    while session_pids(proc.pid) and time.time() < deadline:
        time.sleep(1)
    left = session_pids(proc.pid)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return status, out, left
