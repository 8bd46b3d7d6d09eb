"""`setpo demo | figures | bench`: the commands behind `make demo`, `make figures` and `make bench`."""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

from setpo.records import ROOT

# Notebooks whose full run regenerates committed figures (04 needs a GPU and is run by hand).
FIGURE_NOTEBOOKS = [
    "01_toy_mode_collapse",
    "02_estimator_explained",
    "03_countdown_pass_at_k",
    "05_setgrpo_noisy_graders",
]


def run_notebook(name: str, out_dir: Path, smoke: bool = False, **params) -> Path:
    """Execute notebooks/<name>.ipynb headless with papermill; figures go to out_dir, the run to runs/."""
    import papermill

    src = ROOT / "notebooks" / f"{name}.ipynb"
    if not src.exists():
        raise FileNotFoundError(f"no notebook {src}")
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    executed = ROOT / "runs" / "notebooks" / f"{name}{'.smoke' if smoke else ''}.ipynb"
    executed.parent.mkdir(parents=True, exist_ok=True)
    papermill.execute_notebook(str(src), str(executed), cwd=str(src.parent), progress_bar=False,
                               parameters={"SMOKE": smoke, "OUT_DIR": str(out_dir), **params})
    return executed


def cmd_demo(args) -> None:
    from setpo.studies.toy import run_demo

    run_demo(out_dir=Path(args.out_dir), seeds=args.seeds, smoke=args.smoke)


def cmd_sweep(args) -> None:
    import torch

    from setpo.records import markdown_table
    from setpo.studies.toy import ToyConfig, lambda_sweep

    torch.set_num_threads(1)
    rows = lambda_sweep(ToyConfig(algo=args.algo), args.lams, range(args.seeds))
    print(markdown_table(rows))


def cmd_figures(args) -> None:
    names = args.names or FIGURE_NOTEBOOKS
    for name in names:
        print(f"== {name}", flush=True)
        run_notebook(name, Path(args.out_dir))


def cmd_bench(args) -> None:
    scripts = sorted((ROOT / "benchmarks").glob("*.py"))
    if args.names:
        scripts = [s for s in scripts if s.stem in args.names]
    for script in scripts:
        print(f"== benchmarks/{script.name}", flush=True)
        runpy.run_path(str(script), run_name="__main__")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="setpo", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="toy mode-collapse demo: GRPO vs SetPO on the multi-modal bandit")
    d.add_argument("--out-dir", default=str(ROOT / "figures"))
    d.add_argument("--seeds", type=int, default=5)
    d.add_argument("--smoke", action="store_true", help="a few steps only, to check that it runs")
    d.set_defaults(fn=cmd_demo)
    s = sub.add_parser("sweep", help="toy: correct modes kept by SetPO for each λ (λ = 0 is plain GRPO)")
    s.add_argument("--lams", type=float, nargs="+", default=[0.0, 0.05, 0.1, 0.2, 0.5, 1.0])
    s.add_argument("--seeds", type=int, default=5)
    s.add_argument("--algo", default="grpo", choices=["grpo", "gspo", "dapo"])
    s.set_defaults(fn=cmd_sweep)
    f = sub.add_parser("figures", help="regenerate figures by running the notebooks headless")
    f.add_argument("names", nargs="*", help=f"notebooks to run (default: {' '.join(FIGURE_NOTEBOOKS)})")
    f.add_argument("--out-dir", default=str(ROOT / "figures"))
    f.set_defaults(fn=cmd_figures)
    b = sub.add_parser("bench", help="run benchmarks/*.py; each prints a table and writes it to runs/bench/")
    b.add_argument("names", nargs="*", help="benchmark script stems to run (default: all)")
    b.set_defaults(fn=cmd_bench)
    args = p.parse_args(argv)
    args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
