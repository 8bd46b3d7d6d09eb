"""SetPO's share of a verl training step, on verl's own v1 trainer on the CPU.

The run of ``python -m setpo.verl cpu-demo``: a tiny random Qwen2 (~80K parameters) on Countdown, 2 FSDP2
workers over gloo, transformers rollouts, 4 prompts x G = 4 per step, 24-token responses, reference model and
KL 1e-4 (``setpo.verl.cpu``). Three runs of ``STEPS`` steps with the same data and seeds: plain GRPO
(``--no-setpo``), SetPO+GRPO with the hashed n-gram embedder, SetPO+GRPO with all-MiniLM-L6-v2. verl's own
``timing_s/*`` metrics are read from its file logger, the first step (warm-up) dropped, the median taken:
``timing_s/step`` (the whole step) and ``timing_s/adv`` (the advantage phase, where SetPO embeds the responses
and adds λ·s; ``setpo/embed_time_s`` is the embedding alone). The SetPO share is SetPO's advantage phase minus
GRPO's, over SetPO's step (0 when it is within noise below GRPO's); the embedding share is
``setpo/embed_time_s`` over the step.

Rows go to ``runs/bench/verl_cpu_step.json`` (``configuration``, ``step_s``, ``adv_s``, ``embed_s``,
``setpo_share``, ``embed_share``, ``step_ratio``, ``wall_s``); the table to ``runs/bench/verl_cpu_step.md``. Each run is a fresh Ray cluster
(about 2-3 min on 2 cores, most of it Ray's processes importing verl) started in its own process session and
gone when the run ends. ``--smoke``: only SetPO+GRPO (hash), 2 steps (one Ray cluster, about 2 min: Ray's start-up
is the least a verl run costs), so its share columns compare it with itself; ``--out DIR``.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness import options, report  # noqa: E402
from setpo.records import markdown_table  # noqa: E402

STEPS, SMOKE_STEPS = 4, 2  # the first step of each run is dropped (warm-up)
CONFIGURATIONS = {  # name -> extra launcher arguments; the first is the baseline of the share columns
    "GRPO": ["--no-setpo"],
    "SetPO+GRPO (hash)": ["--embedding-model", "hash"],
    "SetPO+GRPO (MiniLM)": ["--embedding-model", "default"],
}
SMOKE_CONFIGURATIONS = ["SetPO+GRPO (hash)"]


def _run(name: str, extra: list[str], demo: dict, out: Path, steps: int = STEPS) -> dict:
    from setpo.verl.cpu_demo import cpu_demo_command, run_in_session
    from setpo.verl.launch import METRICS_FILE

    cmd = cpu_demo_command(demo, str(out))
    cmd[0] = sys.executable  # the demo's command, with this bench's steps, run name and logger
    cmd[cmd.index("--total-steps") + 1] = str(steps)
    cmd[cmd.index("--test-freq") + 1] = "-1"
    cmd[cmd.index("--save-freq") + 1] = "-1"
    if "--embedding-model" in extra and "--embedding-model" in cmd:
        i = cmd.index("--embedding-model")
        del cmd[i:i + 2]
    run_name = "".join(c if c.isalnum() else "_" for c in name)
    cmd += [*extra, "--experiment-name", run_name, "--logger", "console,file", "trainer.val_before_train=false"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.perf_counter()
    status, output, left, _ = run_in_session(cmd, timeout=600, cwd=ROOT, env=env)
    wall = time.perf_counter() - t0
    if status != 0 or left:
        raise RuntimeError(f"{name}: exit {status}, leftover processes {left}\n{output[-3000:]}")
    rows = [json.loads(line) for line in (out / run_name / METRICS_FILE).read_text().splitlines() if line.strip()]
    steps = [r["data"] for r in sorted(rows, key=lambda r: r["step"])][1:]  # drop the warm-up step
    med = lambda key: statistics.median(s.get(key, 0.0) for s in steps)  # noqa: E731
    return {"configuration": name, "step_s": med("timing_s/step"), "adv_s": med("timing_s/adv"),
            "embed_s": med("setpo/embed_time_s"), "gen_s": med("timing_s/gen"),
            "update_actor_s": med("timing_s/update_actor"), "steps_measured": len(steps), "wall_s": wall}


def main(argv=None) -> str:
    from setpo.verl.cpu_demo import write_countdown_demo

    args = options(__doc__, argv)
    steps = SMOKE_STEPS if args.smoke else STEPS
    names = SMOKE_CONFIGURATIONS if args.smoke else list(CONFIGURATIONS)
    with tempfile.TemporaryDirectory(prefix="verl_cpu_bench_") as tmp:
        demo = write_countdown_demo(Path(tmp) / "demo")
        rows = [_run(name, CONFIGURATIONS[name], demo, Path(tmp) / "runs", steps) for name in names]
    base = rows[0]
    for r in rows:
        r["setpo_share"] = 0.0 if r is base else max(0.0, r["adv_s"] - base["adv_s"]) / r["step_s"]
        r["step_ratio"] = r["step_s"] / base["step_s"]
        r["embed_share"] = r["embed_s"] / r["step_s"]
    shown = [{"configuration": r["configuration"], "step (s)": f"{r['step_s']:.2f}", "adv (s)": f"{r['adv_s']:.3f}",
              "embed (s)": f"{r['embed_s']:.3f}", "SetPO share of step": f"{100 * r['setpo_share']:.1f}%",
              "embedding share": f"{100 * r['embed_share']:.1f}%",
              "step / GRPO": f"{r['step_ratio']:.2f}", "run wall (s)": f"{r['wall_s']:.0f}"} for r in rows]
    table = "\n".join([
        f"verl v1 trainer on the CPU (setpo.verl.cpu): tiny Qwen2, Countdown, 2 FSDP2 workers, 4 prompts x G=4, "
        f"24 tokens, ref + KL; median of steps 2-{steps} (verl's timing_s/*).", "", markdown_table(shown)])
    report(args, "verl_cpu_step", table, {"rows": rows})
    return table


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"({time.time() - t0:.0f}s)")
