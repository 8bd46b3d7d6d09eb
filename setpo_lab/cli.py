"""`python -m setpo_lab run STUDY ... | demo | sweep | figures | bench | countdown | link` (also `python -m
setpo_lab.cli ...`): the lab's commands, behind `make demo`, `make figures`, `make bench` and `make countdown`.

`run STUDY` is every study's one command line (``setpo_lab.studies.arguments.study_parser``: --preset, --out,
--stages, --set and the study's options); STUDIES names them.

Every argument is checked before any work starts; a bad one exits with status 2 and one line on stderr.
Only `figures` writes the committed figures/ folder; `demo` writes to runs/demo/ unless told otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import subprocess
import sys
import time
from pathlib import Path

from setpo_lab.repro.arithmetic import pinned_children, pinned_environment
from setpo_lab import ROOT
from setpo.envs.arguments import Parser, nonnegative_float, positive_int

# Notebooks whose full run regenerates committed figures. 04 runs its own study (the cure study's notebook
# preset: resumable in runs/real_llm_notebook; later runs only draw) and draws the committed short-answer
# records (`python -m setpo_lab run short_answers`, `python -m setpo_lab run short_answers_cure`). 06 needs a
# model path (a GPU): without one its cells say so and draw nothing.
FIGURE_NOTEBOOKS = [
    "01_toy_mode_collapse",
    "02_estimator_explained",
    "03_countdown_pass_at_k",
    "04_real_llm_cpu",
    "05_setgrpo_noisy_graders",
    "06_qwen_math_gpu",
]
# Notebooks that run (or resume) a study made across sittings on other machines: run on the pinned floating-point
# path (setpo_lab.repro.arithmetic), the one their study was made on.
PINNED_NOTEBOOKS = {"03_countdown_pass_at_k"}
# Modules in benchmarks/ that the benchmarks import, not benchmarks themselves.
BENCH_HELPERS = {"harness"}
#: the studies of `python -m setpo_lab run STUDY`: name -> the module declaring its ``COMMAND`` (or "module:NAME")
STUDIES = {"toy": "setpo_lab.studies.toy", "countdown": "setpo_lab.studies.countdown", "math": "setpo_lab.studies.math",
           "short_answers": "setpo_lab.studies.short_answers",
           "short_answers_base": "setpo_lab.studies.short_answers:BASE_COMMAND",
           "short_answers_cure": "setpo_lab.studies.short_answers_cure",
           "short_answers_confirm": "setpo_lab.studies.short_answers_confirm", "rubric": "setpo_lab.studies.rubric",
           "math_responses": "setpo_lab.studies.math_responses", "example": "setpo_lab.studies.example"}
MAX_SEEDS = 1000                      # seeds per method or λ: more is a typo, not a study
DEMO_DIR = ROOT / "runs" / "demo"     # scratch: smoke and interactive runs never touch figures/
FIGURES_DIR = ROOT / "figures"        # committed: written only by `make figures`


# ---- argument types (each refusal is one line, exit status 2, before any work) ------------------------------

def lam(text: str) -> float:
    """A λ: finite and >= 0 (0 is the base algorithm); -0 is 0."""
    return nonnegative_float(text) + 0.0


def seed_count(text: str) -> int:
    value = positive_int(text)
    if value > MAX_SEEDS:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_SEEDS} seeds, got {value}")
    return value


def out_dir(text: str) -> str:
    """A folder to write into: not empty (that would be the current folder), not a file, not under a file, and
    writable where it exists or would be created."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a folder path, got {text!r} (an empty path is the current folder)")
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a file, not a folder")
    existing = next((p for p in (path, *path.parents) if p.exists()), Path("."))
    if not existing.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} cannot be created: {str(existing)!r} is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text!r}: no permission to write in {str(existing)!r}")
    return text


def _twice(values: list) -> list:
    """The values given more than once, each once, in the order of their second time."""
    return list(dict.fromkeys(v for i, v in enumerate(values) if v in values[:i]))


# ---- commands -----------------------------------------------------------------------------------------

def run_notebook(name: str, out_dir: Path, smoke: bool = False, **params) -> Path:
    """Execute notebooks/<name>.ipynb headless (``setpo_lab.studies.notebook_runs``); figures go to out_dir (passed
    as the notebook's OUT_DIR, always explicitly), the executed notebook to runs/notebooks/."""
    from setpo_lab.studies.notebook_runs import execute_notebook

    return execute_notebook(name, Path(out_dir), smoke=smoke, **params)


def cmd_demo(args) -> None:
    from setpo_lab.studies.toy import run_study
    from setpo_lab.studies.toy_config import ToyStudyConfig

    print(f"demo: GRPO vs SetPO+GRPO on the toy bandit, {args.seeds} seeds"
          f"{' (smoke)' if args.smoke else ''}; writing to {args.out_dir}", flush=True)
    run_study(ToyStudyConfig(out=args.out_dir, seeds=args.seeds, smoke=args.smoke))


def cmd_sweep(args) -> None:
    from setpo.records import markdown_table
    from setpo_lab.studies.toy import ToyConfig, lambda_sweep

    print(markdown_table(lambda_sweep(ToyConfig(algo=args.algo), args.lams, range(args.seeds))))


def cmd_figures(args) -> None:
    out_dir = Path(args.out_dir)
    t_all = time.time()
    for i, name in enumerate(args.names, 1):
        print(f"== [{i}/{len(args.names)}] notebooks/{name}.ipynb -> {out_dir} ...", flush=True)
        t0 = time.time()
        # writing the committed figures also saves the notebook back with its (static-image) outputs
        with pinned_children() if name in PINNED_NOTEBOOKS else contextlib.nullcontext():
            executed = run_notebook(name, out_dir, save_to_notebook=out_dir.resolve() == FIGURES_DIR.resolve(),
                                    log_output=True)
        print(f"   done in {time.time() - t0:.0f} s (executed copy: {executed})", flush=True)
    print(f"== {len(args.names)} notebooks in {time.time() - t_all:.0f} s", flush=True)


def run_benchmark(script: Path, flags: list[str]) -> int:
    """``python benchmarks/<script> FLAGS`` in its own process (one benchmark's thread settings or imports cannot
    change the next one's timings), with this checkout first on the path; its exit status."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, str(script), *flags], cwd=ROOT, env=env).returncode


def cmd_bench(args) -> None:
    """Each benchmark with this command's --smoke / --out; a failed one is named and the others still run; exit
    status 1 if any failed."""
    flags = (["--smoke"] if args.smoke else []) + (["--out", args.out] if args.out else [])
    failed, t_all = [], time.time()
    for script in args.scripts:
        print(f"== benchmarks/{script.name}{' --smoke' if args.smoke else ''}", flush=True)
        t0 = time.time()
        status = run_benchmark(script, flags)
        print(f"   {'done' if status == 0 else f'FAILED (exit status {status})'} in {time.time() - t0:.0f} s",
              flush=True)
        if status:
            failed.append(script.stem)
    print(f"== {len(args.scripts)} benchmarks in {time.time() - t_all:.0f} s"
          + (f"; failed: {', '.join(failed)}" if failed else ""), flush=True)
    if failed:
        raise SystemExit(1)


def cmd_countdown(args) -> None:
    """The Countdown study on the pinned floating-point path: this process becomes ``python -m setpo_lab run
    countdown ARGS`` with the pin in its environment, and the study parses its own arguments."""
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, "-m", "setpo_lab", "run", "countdown", *args.study_args],
              pinned_environment())


def study_command(study: str):
    """The ``StudyCommand`` of a study named in STUDIES."""
    import importlib

    module, _, name = STUDIES[study].partition(":")
    return getattr(importlib.import_module(module), name or "COMMAND")


def cmd_run(args) -> int:
    """``run STUDY ARGS``: the study's ``COMMAND`` (``arguments.run_command``); a preset the study runs on the pinned
    floating-point path (``StudyCommand.pinned``) puts this process under the pin first."""
    from setpo_lab.repro.arithmetic import pinned
    from setpo_lab.studies.arguments import run_command, study_parser

    command = study_command(args.study)
    chosen = study_parser(command).parse_known_args(args.study_args)[0].preset or command.default_preset
    if chosen in command.pinned and not pinned():
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable, "-m", "setpo_lab", "run", args.study, *args.study_args],
                  pinned_environment())
    return run_command(command, args.study_args)


LAB_PTH = "setpo_lab.pth"  # in the interpreter's site-packages: puts this clone on its path


def cmd_link(args) -> None:
    """Put this clone on the running interpreter's path for good (a .pth file in its site-packages), so that the lab
    imports from any folder: notebooks (their kernels run in notebooks/), scripts run as files. ``make`` runs this
    for its venvs; the wheel never holds the lab."""
    import sysconfig

    pth = Path(sysconfig.get_paths()["purelib"]) / LAB_PTH
    pth.write_text(f"{ROOT}\n")
    print(f"{pth}: setpo_lab imports from {ROOT}")


def build_parser() -> Parser:
    p = Parser(prog="python -m setpo_lab.cli", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="toy mode-collapse demo: GRPO vs SetPO on the multi-modal bandit")
    d.add_argument("--out-dir", type=out_dir, default=str(DEMO_DIR),
                   help=f"where Figure 1 and its record go (default {DEMO_DIR.relative_to(ROOT)}/, not committed; "
                        "`make figures` writes figures/)")
    d.add_argument("--seeds", type=seed_count, default=5, help=f"seeds per method (default 5, at most {MAX_SEEDS})")
    d.add_argument("--smoke", action="store_true", help="a few steps only, to check that it runs")
    d.set_defaults(fn=cmd_demo)
    s = sub.add_parser("sweep", help="toy: correct modes kept by SetPO for each λ (λ = 0 is plain GRPO)")
    s.add_argument("--lams", type=lam, nargs="+", default=[0.0, 0.05, 0.1, 0.2, 0.5, 1.0],
                   help="values of λ (finite, >= 0, each once; 0 is the base algorithm)")
    s.add_argument("--seeds", type=seed_count, default=5, help=f"seeds per λ (default 5, at most {MAX_SEEDS})")
    s.add_argument("--algo", default="grpo", choices=["grpo", "gspo", "dapo"], help="base algorithm")
    s.set_defaults(fn=cmd_sweep)
    f = sub.add_parser("figures", help="regenerate the committed figures by running the notebooks headless")
    f.add_argument("names", nargs="*", help=f"notebooks to run (default: {' '.join(FIGURE_NOTEBOOKS)})")
    f.add_argument("--out-dir", type=out_dir, default=str(FIGURES_DIR), help="where the figures go (default figures/)")
    f.set_defaults(fn=cmd_figures)
    b = sub.add_parser("bench", help="run benchmarks/*.py; each prints a table and writes it to runs/bench/")
    b.add_argument("names", nargs="*", help="benchmark script stems to run (default: all)")
    b.add_argument("--smoke", action="store_true",
                   help="tiny sizes (seconds each): check that every benchmark runs; reports go to runs/bench/smoke/")
    b.add_argument("--out", type=out_dir, default=None, help="folder for the reports (default runs/bench/)")
    b.set_defaults(fn=cmd_bench)
    r = sub.add_parser("run", help="a study: python -m setpo_lab run STUDY --preset NAME --out DIR --stages ... --set ...")
    r.add_argument("study", choices=list(STUDIES))
    r.add_argument("study_args", nargs="*", help="the study's arguments (python -m setpo_lab run STUDY --help)")
    r.set_defaults(fn=cmd_run)
    c = sub.add_parser("countdown", help="the Countdown study (python -m setpo_lab run countdown ARGS) on the pinned "
                                         "floating-point path, so that a study of several sittings is one experiment")
    c.add_argument("study_args", nargs="*", help="the study's own arguments, e.g. --full --out results/countdown "
                                                 "(passed on as they are: the study checks them)")
    c.set_defaults(fn=cmd_countdown)
    ln = sub.add_parser("link", help=f"put this clone on this Python's path ({LAB_PTH} in its site-packages), so that "
                                     "notebooks and scripts find the lab from any folder")
    ln.set_defaults(fn=cmd_link)
    return p


def _negative_lams(argv: list[str]) -> list[str]:
    """Values after --lams that argparse would take for options ("-inf", "-1e3": not negative numbers to it),
    so that the refusal names --lams instead of saying "unrecognized arguments"."""
    out, inside = [], False
    for tok in argv:
        if tok == "--lams":
            inside = True
        elif tok.startswith("--"):
            inside = False
        elif inside and tok.startswith("-"):
            try:
                value = float(tok)
            except ValueError:
                continue
            if not (math.isfinite(value) and value >= 0):  # "-0" is 0, a λ
                out.append(tok)
    return out


def parse_args(argv=None) -> argparse.Namespace:
    """Parse and check everything a command needs before it starts (names that must exist included)."""
    p = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["countdown"]:  # everything after it is the study's, options included
        return argparse.Namespace(cmd="countdown", study_args=argv[1:], fn=cmd_countdown)
    if argv[:1] == ["run"] and len(argv) > 1 and argv[1] in STUDIES:  # likewise after the study's name
        return argparse.Namespace(cmd="run", study=argv[1], study_args=argv[2:], fn=cmd_run)
    if _negative_lams(argv):
        p.error(f"argument --lams: expected a finite number >= 0, got {_negative_lams(argv)[0]}")
    args = p.parse_args(argv)
    if args.cmd == "demo":
        target = Path(args.out_dir).expanduser().resolve()
        if target == FIGURES_DIR.resolve() or FIGURES_DIR.resolve() in target.parents:
            p.error(f"demo: --out-dir {args.out_dir} is inside the committed figures/ folder, which only "
                    f"`make figures` writes; use another folder (default {DEMO_DIR.relative_to(ROOT)}/)")
    if args.cmd == "sweep" and _twice(args.lams):
        p.error(f"argument --lams: {', '.join(map(str, _twice(args.lams)))} given more than once (each λ is one row)")
    if args.cmd in ("figures", "bench") and _twice(args.names):
        p.error(f"{args.cmd}: {', '.join(_twice(args.names))} named more than once")
    if args.cmd == "figures":
        known = sorted(n.stem for n in (ROOT / "notebooks").glob("*.ipynb"))
        unknown = [n for n in args.names if n not in known]
        if unknown:
            p.error(f"figures: no notebook {', '.join(unknown)}; known: {', '.join(known)}")
        args.names = args.names or FIGURE_NOTEBOOKS
    if args.cmd == "bench":
        scripts = sorted(s for s in (ROOT / "benchmarks").glob("*.py") if s.stem not in BENCH_HELPERS)
        unknown = [n for n in args.names if n not in {s.stem for s in scripts}]
        if unknown:
            p.error(f"bench: no benchmark {', '.join(unknown)}; known: {', '.join(s.stem for s in scripts)}")
        args.scripts = [s for s in scripts if not args.names or s.stem in args.names]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    return args.fn(args) or 0


if __name__ == "__main__":
    sys.exit(main())
