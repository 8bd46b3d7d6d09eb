"""The memory a verl training run of the real model takes on the CPU, by setting: what the real-model test needs.

The run of tests/test_real_model.py (``setpo.verl.cpu_demo.smoke_train_command``): SmolLM2-135M-Instruct (the
packaged model, float32), GSM8K, SetPO+GRPO with hashed n-grams, 2 prompts x G = 4, 48-token responses, 2 steps,
on verl's own trainer (FSDP2 over gloo, transformers rollouts), in a fresh Ray cluster of its own. Three settings:

- 2 workers with the reference model and KL (β = 1e-4): the test as it ran before;
- 2 workers, β = 0: no KL loss, so verl builds no reference model;
- 1 worker, β = 0: the test now.

Peak memory: the sum of the proportional set sizes of every process of the run's session (driver, Ray's GCS and
raylet, the workers), sampled every 0.5 s (``setpo.verl.cpu_demo.run_in_session``): what the run takes from the
machine, shared pages counted once. Ray's memory monitor kills workers when the machine's used memory passes 95%,
whoever uses it, so this is the room the test needs beside other work; a setting that did not run to the end
(e.g. killed for memory) is a row too, with the peak it reached and its output's tail in the JSON rows. Each run is a fresh cluster (about 2-3 min
on 2 cores). ``--smoke``: the tiny random Countdown model (``python -m setpo.verl cpu-demo``'s), the last setting,
1 step (one Ray cluster, about 2 min); ``--out DIR``; ``--model DIR`` (default: the packaged model, prepared on
first use).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness import options, report  # noqa: E402
from setpo.records import markdown_table  # noqa: E402

LIGHT = "1 worker, β = 0: the test now"  # tests/test_real_model.py's run, at full size
SETTINGS = {  # name -> (workers, β)
    "2 workers, reference model + KL (β = 1e-4): the test before": (2, 1e-4),
    "2 workers, β = 0 (no reference model)": (2, 0.0),
    LIGHT: (1, 0.0),
}
SMOKE_SETTINGS = [LIGHT]


def measure(name: str, model: Path, train: Path, val: Path, out: Path, steps: int, tokenizer=None,
            task: str = "math", extra: tuple[str, ...] = ()) -> dict:
    """One setting's run (``smoke_train_command`` with ``extra`` overrides), metrics in ``out/real/``: its row."""
    from setpo.verl.cpu_demo import run_in_session, smoke_train_command

    workers, beta = SETTINGS[name]
    cmd = smoke_train_command(model, train, val, out, workers=workers, kl_coef=beta, steps=steps,
                              tokenizer_path=tokenizer, task=task, extra=extra)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "RAY_DEDUP_LOGS": "1", "PYTHONUNBUFFERED": "1"}
    print(f"  {name} ...", flush=True)
    t0 = time.perf_counter()
    status, output, left, peak = run_in_session(cmd, timeout=600, cwd=ROOT, env=env)
    wall = time.perf_counter() - t0
    metrics = out / "real" / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] if metrics.exists() else []
    row = {"setting": name, "workers": workers, "beta": beta, "peak_bytes": peak, "wall_s": wall,
           "exit_status": status, "left": left, "steps": len(rows),
           "reference_model": any("timing_s/ref" in r["data"] for r in rows)}
    if status != 0 or left:  # a measurement too (e.g. Ray's memory monitor killed a worker): kept with its cause
        print(output[-3000:], flush=True)
        row["output_tail"] = output[-3000:]
    return row


def table(model_name: str, steps: int, rows: list[dict]) -> str:
    """The report's table: each setting's row beside the first's peak."""
    base = rows[0]["peak_bytes"]
    shown = [{"setting": r["setting"], "ran to the end": "yes" if r["exit_status"] == 0 and not r["left"] else
              f"no (exit {r['exit_status']}{', OOM-killed by Ray' if 'memory' in r.get('output_tail', '') else ''})",
              "steps": r["steps"], "reference model built": "yes" if r["reference_model"] else "no",
              "peak memory (GiB)": f"{r['peak_bytes'] / 2**30:.2f}", "of the first": f"{r['peak_bytes'] / base:.2f}",
              "run wall (s)": f"{r['wall_s']:.0f}"} for r in rows]
    return "\n".join([
        f"verl on the CPU, {model_name}: {steps} steps of 2 prompts x G = 4, one Ray cluster per setting; peak of "
        f"the summed proportional set sizes of the run's processes (sampled every 0.5 s).", "", markdown_table(shown)])


def main(argv=None) -> str:
    def more(ap):
        ap.add_argument("--model", default=None, help="model folder (default: the packaged SmolLM2-135M-Instruct)")

    args = options(__doc__, argv, more)
    names = SMOKE_SETTINGS if args.smoke else list(SETTINGS)
    with tempfile.TemporaryDirectory(prefix="verl_real_memory_") as tmp:
        if args.smoke:
            from setpo.verl.cpu_demo import write_countdown_demo

            demo = write_countdown_demo(Path(tmp) / "demo")
            model, train, val, steps = Path(demo["model"]), Path(demo["train"]), Path(demo["val"]), 1
            tokenizer, task = demo["tokenizer"], "countdown"  # the demo's data is Countdown's: its verifier scores it
        else:
            from setpo.models import prepared_folder

            model = Path(args.model) if args.model else prepared_folder()
            train, val, steps = ROOT / "data/gsm8k/train.parquet", ROOT / "data/gsm8k/test.parquet", 2
            tokenizer, task = None, "math"
        rows = [measure(name, model, train, val, Path(tmp) / f"run{i}", steps, tokenizer, task)
                for i, name in enumerate(names)]
    text = table(model.name, steps, rows)
    report(args, "verl_real_memory", text, {"rows": rows})
    return text


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"({time.time() - t0:.0f}s)")
