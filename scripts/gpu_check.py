"""GPU check: the estimator, verl's hook and TRL training on CUDA, and SetPO's cost at the paper's sizes.

For a bare CUDA machine: torch, transformers, sentence-transformers, accelerate, pandas and pyarrow installed,
no internet. Everything else the check needs (TRL, datasets, verl's core without Ray, gymnasium, math-verify,
...) is gathered beforehand into a wheel folder: about 7 MB (prepare refuses more than 60 MB).

  1. On a machine with internet, once (wheels for Python 3.11 and 3.12, the versions TRL and verl support):
         python scripts/gpu_check.py prepare --wheels runs/gpu_wheels
  2. Copy the repository (with runs/gpu_wheels) to the GPU machine and run, in under 8 minutes (plus a few
     for verl_e2e where verl's full stack is installed):
         python scripts/gpu_check.py all --wheels runs/gpu_wheels --out runs/gpu_check
     ("all" installs the folder with pip --no-index --no-deps, then runs the checks in a fresh process.)
  Dry run on a CPU, the same commands with tiny shapes (what tests/test_gpu_check.py runs):
         python scripts/gpu_check.py all --wheels runs/gpu_wheels --out runs/gpu_check --allow-cpu

What "run" (the checks alone, also the default when no command is given) does:
  estimator   setpo_advantages / diversity_marginals on CUDA equal the CPU: ragged shuffled groups in float32
              and float64, and bf16 embeddings with float32 advantages
  verl        verl's registered "setpo" estimator (core_algos registry) with CUDA tensors; Ray is replaced by
              an import-time stub when it is not installed (the estimator path never calls it)
  embedders   an embedder on CUDA agrees with the CPU (all-MiniLM-L6-v2 if its package is installed, else a
              random Qwen3-shaped encoder built from a config); verl's embedding_device "auto" picks the GPU
  training    notebook 06's path: GRPO and SetPO+GRPO steps with a small Qwen2 built from a config, avg@k,
              the embedding projection of the probes
  floor       the estimator's time against its floor (one torch.bmm forming the Gram matrices) at
              (B, G, d) = (512, 16, 1024) and (1024, 64, 4096), contiguous and shuffled groups, its host reads
              per call, and the contiguous path compiled whole (torch.compile(fullgraph=True))
  overhead    SetPO's step time over GRPO's (TRL, interleaved) with random models shaped like the paper's:
              a Qwen2.5-Math-1.5B-shaped policy and a Qwen3-Embedding-0.6B-shaped embedder, 756-token responses
  verl_e2e    verl's own trainer end to end with vLLM rollouts: tests/test_verl_e2e.py's run (`python -m
              setpo.verl train`, the tiny Countdown Qwen2, SetPO+GRPO, 3 steps, verl's checkpoint and file
              logger) with only the platform (CUDA, 1 GPU) and the rollout (vLLM) changed; it finishes, writes
              verl's checkpoint and logs setpo/* metrics at every step. Needs verl's full stack (Ray, vLLM,
              TransferQueue: `pip install -e '.[verl-gpu]'`), which the wheel folder does not carry: skipped,
              with the reason, on a machine without it or without CUDA (a few minutes when it runs)
Writes gpu_check.json and gpu_check.md to --out (default $OUT or runs/gpu_check); exits 1 if a check fails
(a skipped check is not a failure; the report says why it was skipped).
--allow-cpu runs it all on the CPU as a dry run with tiny shapes (the CUDA comparisons then compare the CPU
with itself); verl_e2e is skipped there unless named with --only, which runs its CPU twin (--device cpu,
transformers rollouts: the CI test's run) through the same checks.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

# the checks (scripts/gpu_checks/, found beside this file) import setpo and benchmarks/paper_shapes
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from gpu_checks import ROOT, elapsed  # noqa: E402  (after the paths above)
from gpu_checks.numerics import check_embedders, check_estimator, check_verl  # noqa: E402
from gpu_checks.timing import check_floor, check_overhead  # noqa: E402
from gpu_checks.training import check_training, check_verl_e2e  # noqa: E402
from gpu_checks.wheels import PYTHON_VERSIONS, install, prepare  # noqa: E402

#: every check, in the order "run" runs them
CHECKS = ("estimator", "verl", "embedders", "training", "floor", "overhead", "verl_e2e")


# ------------------------------------------------------------------------------------------------ report


def markdown(report: dict) -> str:
    lines = [f"# GPU check: {report['device']}", "",
             f"torch {report['torch']}, transformers {report.get('transformers')}, Python {report['python']}; "
             f"{'tiny shapes (dry run)' if report['tiny'] else 'full shapes'}; total {report['total_s']} s.", "",
             "| check | result | seconds |", "|---|---|---|"]
    for name, c in report["checks"].items():
        result = ("FAILED: " + c.get("error", "")[:120] if not c["ok"]
                  else "skipped: " + c["skipped"] if c.get("skipped") else "ok")
        lines.append(f"| {name} | {result} | {c['seconds']} |")
    floor = report["checks"].get("floor", {})
    if floor.get("ok"):
        lines += ["", "## Estimator against its floor (one torch.bmm forming the Gram matrices)", "",
                  "| B | G | d | setpo (ms) | shuffled (ms) | bmm floor (ms) | setpo / floor | shuffled / contiguous "
                  "| host reads | compiled / floor |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in floor["rows"]:
            lines.append(f"| {r['B']} | {r['G']} | {r['d']} | {r['setpo_advantages (ms)']} | {r['shuffled uids (ms)']} "
                         f"| {r['bmm floor (ms)']} | {r['setpo / floor']} | {r['shuffled / contiguous']} "
                         f"| {r.get('host reads per call')} | {r.get('compiled / floor', r.get('compile error'))} |")
    ov = report["checks"].get("overhead", {})
    if ov.get("ok") and "ratio" in ov:
        lines += ["", "## SetPO's step-time overhead (TRL, random paper-shaped models)", "",
                  f"policy {ov['policy_params'] / 1e6:,.1f}M params, embedder {ov['embedder_params'] / 1e6:,.1f}M; "
                  f"{ov['setting']['prompts_per_step']} prompts x G={ov['setting']['num_generations']}, responses up "
                  f"to {ov['setting']['max_completion_length']} tokens", "",
                  "| GRPO step (s) | SetPO+GRPO step (s) | ratio | embedding alone (s) |", "|---|---|---|---|",
                  f"| {ov['grpo_s']} | {ov['setpo_s']} | {ov['ratio']} | {ov['embed_s_alone']} |"]
    elif ov.get("skipped"):
        lines += ["", f"Overhead: {ov['skipped']}"]
    return "\n".join(lines) + "\n"


def run_checks(out_dir: Path, allow_cpu: bool, tiny: bool | None, only: list[str] | None) -> int:
    import torch

    if torch.cuda.is_available():
        device = "cuda"
    elif allow_cpu:
        device = "cpu"
    else:
        print("no CUDA device; pass --allow-cpu for a dry run", file=sys.stderr)
        return 2
    tiny = device == "cpu" if tiny is None else tiny
    if device == "cpu":
        torch.set_num_threads(1)  # a dry run; one thread keeps its timings sane on a shared machine
    out_dir.mkdir(parents=True, exist_ok=True)
    import transformers

    report: dict = {"device": torch.cuda.get_device_name(0) if device == "cuda" else f"cpu ({platform.processor()})",
                    "torch": torch.__version__, "transformers": transformers.__version__,
                    "python": platform.python_version(), "tiny": tiny, "checks": {}}
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        checks = {"estimator": lambda: check_estimator(device), "verl": lambda: check_verl(device),
                  "embedders": lambda: check_embedders(device), "training": lambda: check_training(device, Path(tmp)),
                  "floor": lambda: check_floor(device, tiny), "overhead": lambda: check_overhead(device, tiny),
                  "verl_e2e": lambda: check_verl_e2e(device, Path(tmp), requested=bool(only) and "verl_e2e" in only)}
        assert tuple(checks) == CHECKS
        for name, fn in checks.items():
            if only and name not in only:
                continue
            t0 = time.time()
            try:
                result = fn()
                report["checks"][name] = {"ok": True, "seconds": round(time.time() - t0, 1), **result}
            except Exception as err:  # noqa: BLE001 - report every check, then fail
                failed.append(name)
                report["checks"][name] = {"ok": False, "seconds": round(time.time() - t0, 1), "error": repr(err),
                                          "traceback": traceback.format_exc()[-4000:]}
            skipped = report["checks"][name].get("skipped")
            shown = "FAILED" if name in failed else f"skipped ({skipped})" if skipped else "ok"
            print(f"[{elapsed():6.1f} s] {name}: {shown}", flush=True)
    report["total_s"] = round(elapsed(), 1)
    report["passed"] = not failed
    (out_dir / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    (out_dir / "gpu_check.md").write_text(markdown(report))
    print(markdown(report))
    print(f"report: {out_dir / 'gpu_check.json'} and gpu_check.md")
    return 1 if failed else 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = ("prepare", "install", "all", "run")
    command = argv.pop(0) if argv and argv[0] in commands else "run"
    ap = argparse.ArgumentParser(prog="gpu_check.py [prepare|install|all|run]", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheels", default=str(ROOT / "runs" / "gpu_wheels"),
                    help="the wheel folder prepare fills and install / all install from (default runs/gpu_wheels)")
    ap.add_argument("--python-versions", nargs="+", default=list(PYTHON_VERSIONS),
                    help="prepare: the Python versions to fetch compiled wheels for (default: 3.11 3.12)")
    ap.add_argument("--platform", help="prepare: pip's --platform tag (e.g. manylinux_2_28_x86_64)")
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "runs" / "gpu_check"),
                    help="folder for gpu_check.json and gpu_check.md (default: $OUT or runs/gpu_check)")
    ap.add_argument("--allow-cpu", action="store_true",
                    help="run every check on the CPU: a dry run of the script with tiny shapes (CUDA comparisons "
                         "compare the CPU with itself)")
    ap.add_argument("--tiny", action=argparse.BooleanOptionalAction, default=None,
                    help="tiny shapes for the floor and overhead measurements (default: on the CPU only)")
    ap.add_argument("--only", nargs="+", choices=list(CHECKS),
                    help="run only these checks")
    args = ap.parse_args(argv)
    wheels = Path(args.wheels)
    if command == "prepare":
        return prepare(wheels, args.python_versions, args.platform)
    if command == "install":
        return install(wheels)
    if command == "all":
        rc = install(wheels)
        if rc:
            return rc
        # a fresh process, so that the check imports what was just installed
        rest = ["--out", args.out, *(["--allow-cpu"] if args.allow_cpu else []),
                *([] if args.tiny is None else ["--tiny" if args.tiny else "--no-tiny"]),
                *(["--only", *args.only] if args.only else [])]
        return subprocess.run([sys.executable, str(Path(__file__).resolve()), "run", *rest]).returncode
    return run_checks(Path(args.out), args.allow_cpu, args.tiny, args.only)


if __name__ == "__main__":
    sys.exit(main())
