"""The inputs, the commands and the process hygiene of a verl run on the CPU (``setpo.verl.cpu``): the tiny
Countdown model and data that ``python -m setpo.verl cpu-demo`` writes and the command that trains on them
(``cpu_demo_command``), the smallest run of a real model folder (``smoke_train_command``), and
``run_in_session``, which runs a training command as the leader of its own process session, measures its peak
memory and leaves none of its Ray processes behind, pass or fail (the end-to-end and real-model tests and the
CPU benchmarks use it)."""

from __future__ import annotations

import os
from typing import NamedTuple


def _prompt_text(inst) -> str:
    """The Countdown study's compact prompt (``setpo_lab.studies.countdown_data.prompt_text``, without its newline)."""
    return " ".join(str(v) for v in inst.numbers) + f" = {inst.target}"


def write_countdown_demo(out_dir, n_train: int = 64, n_val: int = 16, seed: int = 0) -> dict[str, str]:
    """A CPU run's inputs, written once to ``out_dir`` (reused when present): a tiny random Qwen2 with the
    character-level ChatML tokenizer (``setpo.trl.tiny_models.build_chat_tokenizer``: verl's Qwen token
    handling needs ``<|im_end|>`` and a one-token newline) and verl parquet files of Countdown problems in the
    Countdown study's compact prompt (``3 7 25 = 82``), scored by ``setpo.envs.countdown.verl_compute_score``.

    The tokenizer goes to its own folder (``tokenizer``, passed as ``--tokenizer-path``): next to a qwen2
    ``config.json``, transformers' AutoTokenizer would swap it for its byte-level Qwen2 tokenizer, which has no
    token for a newline in this vocabulary.

    Returns {"model": dir, "tokenizer": dir, "train": parquet, "val": parquet}.
    """
    from pathlib import Path

    import pandas as pd

    from setpo.envs.countdown import make_splits
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


def cpu_demo_command(paths: dict[str, str], output_dir: str = "runs/verl") -> list[str]:
    """``python -m setpo.verl train`` on the CPU for the inputs ``setpo.verl.cpu_demo.write_countdown_demo`` wrote:
    SetPO+GRPO on Countdown, 2 FSDP2 workers, 4 prompts x 4 rollouts a step, 3 steps, hashed n-gram embedder."""
    return ["python", "-m", "setpo.verl", "train", "--device", "cpu", "--task", "countdown",
            "--model-path", paths["model"], "--tokenizer-path", paths["tokenizer"], "--train-file", paths["train"],
            "--val-file", paths["val"], "--embedding-model", "hash", "--rollout-n", "4", "--train-batch-size", "4",
            "--max-prompt-length", "48", "--max-response-length", "24", "--micro-batch-per-gpu", "4",
            "--val-n", "2", "--test-freq", "3", "--save-freq", "3", "--total-steps", "3",
            "--output-dir", output_dir]


def smoke_train_command(model_path, train_file, val_file, out_dir, *, workers: int = 1, kl_coef: float = 0.0,
                        steps: int = 2, response_length: int = 48, tokenizer_path=None, task: str = "math",
                        extra: tuple[str, ...] = ()) -> list[str]:
    """The smallest verl training run of a real model folder on the CPU: SetPO+GRPO (hashed n-grams), 2 prompts x
    G = 4 a step, ``steps`` steps, ``workers`` FSDP2 workers, metrics in ``<out_dir>/real/metrics.jsonl``.
    ``task``: whose verifier scores the data ("math" for GSM8K, "countdown" for ``write_countdown_demo``'s).

    Its defaults are the light ones: one worker, and β = 0, so that verl builds no reference model (SmolLM2-135M:
    see docs/guides/verl.md for the memory each setting takes, ``benchmarks/verl_real_memory.py``)."""
    import sys

    return [sys.executable, "-m", "setpo.verl", "train", "--device", "cpu", "--task", task, "--model-path", str(model_path),
            "--train-file", str(train_file), "--val-file", str(val_file), "--embedding-model", "hash",
            "--rollout-n", "4", "--train-batch-size", "2", "--max-prompt-length", "256",
            "--max-response-length", str(response_length), "--micro-batch-per-gpu", "2", "--val-n", "1",
            "--test-freq", "-1", "--save-freq", "-1", "--total-steps", str(steps), "--n-gpus-per-node", str(workers),
            "--kl-coef", repr(float(kl_coef)), "--output-dir", str(out_dir), "--experiment-name", "real",
            "--logger", "console,file", "trainer.val_before_train=false", "data.train_max_samples=8",
            "data.val_max_samples=2", *(["--tokenizer-path", str(tokenizer_path)] if tokenizer_path else []), *extra]


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


class SessionRun(NamedTuple):
    """What ``run_in_session`` saw: the exit status (None on timeout), the output, the pids still alive
    ``grace_s`` after the run ended (then killed), and the peak memory of the whole session (bytes; the sum of
    its processes' proportional set sizes, shared pages split between the processes that share them, sampled
    every ``SAMPLE_S`` seconds: what a Ray job's processes together take from the machine)."""

    status: int | None
    output: str
    left: list
    peak_bytes: int


SAMPLE_S = 0.5


def session_pss(sid: int) -> int:
    """The summed proportional set size (bytes) of session ``sid``'s live processes (``/proc/<pid>/smaps_rollup``)."""
    from pathlib import Path

    total = 0
    for pid in session_pids(sid):
        try:
            rollup = (Path("/proc") / str(pid) / "smaps_rollup").read_text()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        total += next((int(line.split()[1]) * 1024 for line in rollup.splitlines() if line.startswith("Pss:")), 0)
    return total


def run_in_session(cmd: list[str], timeout: float, grace_s: float = 30.0, **popen) -> SessionRun:
    """Run ``cmd`` as the leader of a new session and leave nothing of it behind, pass or fail.

    Returns a ``SessionRun`` (it unpacks as status, output, leftover pids, peak bytes). A CPU training run starts
    a Ray cluster that its driver shuts down; the leftover pids are the check that it did, and they are killed
    when it could not.
    """
    import signal
    import subprocess
    import time

    import tempfile

    with tempfile.TemporaryFile("w+") as log:  # a file, not a pipe: a leftover child may hold the output open
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True, **popen)
        status, peak, deadline = None, 0, time.time() + timeout
        while status is None and time.time() < deadline:
            peak = max(peak, session_pss(proc.pid))
            try:
                status = proc.wait(timeout=SAMPLE_S)
            except subprocess.TimeoutExpired:
                pass
        if status is None:
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
    return SessionRun(status, out, left, peak)
