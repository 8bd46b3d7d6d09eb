"""The verl launcher: data prepared for verl, the command line (``python -m setpo.verl train | print-config |
cpu-demo``) and the run (see ``setpo.verl``); the launch config and its overrides are
``setpo.verl.overrides``."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from setpo.verl.estimator import PLUGIN_ENV
from setpo.verl.overrides import (  # noqa: F401  (re-exported: the launcher's names as they always were)
    CPU_MODULE,
    CPU_ROLLOUT,
    CPU_WORKERS_PER_NODE,
    DEVICES,
    METRICS_FILE,
    TASK_REWARDS,
    VerlLaunchConfig,
    build_overrides,
    check_batch_split,
    compose_config,
    cpu_overrides,
    plugin_modules,
    validate,
    verl_config_dir,
    verl_preset_overrides,
)
from setpo.verl.trainer import PROGRESS_FILE, setpo_task_runner


def prepare_data(path: str, data_dir: str | None = None, split: str = "train") -> str:
    """A verl parquet for ``path``: the file itself if it already has verl's columns, else a converted copy.

    Raw GSM8K/MATH500/AIME/AMC files (``setpo.envs.math`` layouts) are written with the Qwen-Math template to
    ``data_dir`` (default: a ``setpo_verl`` folder beside the input, so a file on shared storage stays on
    shared storage, which multi-node runs need: verl's task runner may read it on any node).
    """
    from setpo.envs import math as math_data

    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"no data file at {str(p)!r}. {math_data.HOW_TO_GET_DATA}")
    if math_data.is_verl_parquet(p):
        return str(p.resolve())
    out_dir = Path(data_dir).expanduser() if data_dir else p.resolve().parent / "setpo_verl"
    out = out_dir / converted_name(p, split)
    if out.resolve() == p.resolve():  # DATA_DIR is the input's own folder: never overwrite the raw file
        out = out.with_name(f"{p.stem}.verl.parquet")
    problems = math_data.load_math_problems(p)
    try:
        math_data.write_verl_parquet(problems, out, split=split)
    except OSError as err:
        raise ValueError(f"cannot write the converted data to {out} ({err}); pass --data-dir (DATA_DIR) with a "
                         "writable directory that every node can read") from None
    return str(out.resolve())


def converted_name(path: str | Path, split: str) -> str:
    """File name of a converted data file: the input's stem, plus the split unless the stem already names it
    (``train.parquet`` -> ``train.parquet``, ``gsm8k.jsonl`` -> ``gsm8k.train.parquet``)."""
    stem = Path(path).stem
    words = {w.lower() for w in stem.replace("-", ".").replace("_", ".").split(".")}
    return f"{stem}.parquet" if split.lower() in words else f"{stem}.{split}.parquet"


def _split_files(value: str) -> list[str]:
    return [v for v in (s.strip() for s in value.split(",")) if v]


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m setpo.verl`` (subcommands train, print-config, cpu-demo). The options of
    train and print-config are ``VerlLaunchConfig``'s fields that carry ``_option`` metadata, with the field's
    default, type and help; their parsed values become a config through ``launch_config_from_args``."""
    ap = argparse.ArgumentParser(prog="python -m setpo.verl",
                                 description="Train with SetPO on verl (the paper's math settings by default).")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, helptext in (("train", "prepare data, compose and validate the config, run verl"),
                           ("print-config", "prepare data, compose and validate, print the overrides; no run")):
        sp = sub.add_parser(name, help=helptext)
        _add_config_options(sp)
        sp.add_argument("--data-dir", default=None, help="where converted parquet files go")
        sp.add_argument("overrides", nargs="*", help="extra Hydra overrides for verl, applied last")
    demo = sub.add_parser("cpu-demo", help="write a tiny Qwen2 and Countdown data for a CPU run; print its command")
    demo.add_argument("--out", default="runs/verl_cpu_demo", help="folder for the model and data (default: %(default)s)")
    return ap


#: An option's value type, from its field's annotation; lists and tuples are given as comma-separated text.
_OPTION_TYPES = {"int": int, "float": float, "str": str}


def _add_config_options(parser: argparse.ArgumentParser) -> None:
    """One option per ``VerlLaunchConfig`` field with ``_option`` metadata, named and typed as the field: a field
    without a default is required, a bool that defaults to True is switched off by its flag."""
    for f in fields(VerlLaunchConfig):
        meta = f.metadata
        if "help" not in meta:
            continue
        flag = meta["flag"] or "--" + f.name.replace("_", "-")
        kwargs: dict[str, Any] = {"dest": f.name, "help": meta["help"]}
        if f.type == "bool":
            parser.add_argument(flag, action="store_false" if f.default else "store_true", **kwargs)
            continue
        kwargs["type"] = _OPTION_TYPES.get(str(f.type).split(" | ")[0], str)
        if meta["choices"] is None:
            kwargs["metavar"] = flag.lstrip("-").replace("-", "_").upper()  # --train-file TRAIN_FILE
        if f.default is MISSING:
            kwargs["required"] = True
        else:
            kwargs["default"] = f.default if meta["cli_default"] is MISSING else meta["cli_default"]
        if meta["choices"] is not None:
            kwargs["choices"] = meta["choices"]
        parser.add_argument(flag, **kwargs)


def launch_config_from_args(args) -> VerlLaunchConfig:
    """The ``VerlLaunchConfig`` of parsed train / print-config options (``build_parser``), the command line's
    own forms turned into the config's: comma-separated data files, each prepared by ``prepare_data``
    (``--data-dir``); --n-gpus-per-node's default by device; the output folder as an absolute path; the
    comma-separated loggers; the Ray address from $RAY_ADDRESS when not given."""
    values = {f.name: getattr(args, f.name) for f in fields(VerlLaunchConfig) if "help" in f.metadata}
    values.update(
        train_files=[prepare_data(f, args.data_dir, "train") for f in _split_files(args.train_files)],
        val_files=[prepare_data(f, args.data_dir, "test") for f in _split_files(args.val_files)],
        n_gpus_per_node=args.n_gpus_per_node or (CPU_WORKERS_PER_NODE if args.device == "cpu"
                                                 else VerlLaunchConfig.n_gpus_per_node),
        output_dir=str(Path(args.output_dir).expanduser().resolve()),
        logger=tuple(_split_files(args.logger)),
        ray_address=args.ray_address or os.environ.get("RAY_ADDRESS") or None,
    )
    return VerlLaunchConfig(**values)


def main(argv: Sequence[str] | None = None) -> None:
    """The command line. A missing file or a bad setting raises FileNotFoundError / ValueError here;
    ``python -m setpo.verl`` (``cli``) turns them into one line on stderr and exit status 2."""
    args = build_parser().parse_args(argv)
    if args.cmd == "cpu-demo":
        import shlex

        from setpo.verl.cpu_demo import cpu_demo_command, write_countdown_demo

        paths = write_countdown_demo(Path(args.out).expanduser().resolve())
        print(shlex.join(cpu_demo_command(paths)))
        return
    if not Path(args.model_path).expanduser().is_dir():
        raise FileNotFoundError(f"no model directory at {args.model_path!r}; set MODEL_PATH to a local copy, e.g. "
                                "`huggingface-cli download Qwen/Qwen2.5-Math-1.5B --local-dir <dir>`, or on a CPU "
                                "`python -m setpo.models prepare smollm2-135m-instruct <dir>`")
    from setpo.embed import is_named_embedder

    emb = args.embedding_model
    if args.setpo and not is_named_embedder(emb) and not Path(emb).expanduser().is_dir():
        raise FileNotFoundError(f"no embedding model directory at {emb!r}; set EMBEDDING_MODEL_PATH to a local "
                                "copy (`huggingface-cli download Qwen/Qwen3-Embedding-0.6B --local-dir <dir>`) or "
                                "to 'default' for the packaged all-MiniLM-L6-v2")
    cfg = launch_config_from_args(args)
    check_batch_split(cfg)
    overrides = build_overrides(cfg) + list(args.overrides)
    config = compose_config(overrides)
    validate(config)
    # the run folder exists for print-config too: its overrides point verl's file logger into it, so a
    # `python -m verl.trainer.main_ppo` given them can start
    run_dir = Path(cfg.output_dir) / cfg.run_name
    run_dir.mkdir(parents=True, exist_ok=True)
    if args.cmd == "print-config":
        print("\n".join(overrides))
        return
    (run_dir / "overrides.txt").write_text("\n".join(overrides) + "\n")  # the run's record of its config
    run(config, device=cfg.device, progress_file=run_dir / PROGRESS_FILE)


def run(config, device: str = "cuda", progress_file: str | Path | None = None, heartbeat_s: float = 10.0) -> None:
    """verl's ``run_ppo`` with SetPO's task runner; on the CPU with ``setpo.verl.cpu`` in this process too.

    A heartbeat line every ``heartbeat_s`` seconds (elapsed time, and the step the trainer reached, from
    ``progress_file``) keeps a long step visibly alive. Ray is shut down at the end, pass or fail, when this
    call started it.
    """
    import threading
    import time

    import ray

    # The driver imports verl before Ray starts; make sure its own process has the plug-in too.
    os.environ.setdefault(PLUGIN_ENV, plugin_modules(device))
    if device == "cpu":
        os.environ["VERL_PLATFORM"] = "cpu"
        import importlib

        importlib.import_module(CPU_MODULE).install()
    from verl.trainer.main_ppo import run_ppo
    from verl.utils.device import auto_set_device

    auto_set_device(config)
    if progress_file is not None:
        Path(progress_file).unlink(missing_ok=True)
    start, done = time.perf_counter(), threading.Event()

    def beat():
        while not done.wait(heartbeat_s):
            where = ""
            try:
                import json

                p = json.loads(Path(progress_file).read_text()) if progress_file else {}
                where = f", step {p['step']}/{p['total']} ({p['phase']})"
            except (OSError, ValueError, KeyError):
                pass
            print(f"[setpo.verl] {time.perf_counter() - start:.0f} s{where}", flush=True)

    started_ray = not ray.is_initialized()
    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        for attempt in range(3):
            try:
                run_ppo(config, task_runner_class=setpo_task_runner())
                break
            except Exception as err:
                # ray.init waits a fixed 30 s for the raylet; on a loaded machine it can take longer
                if "timed out during startup" not in str(err) or attempt == 2:
                    raise
                print(f"[setpo.verl] Ray did not start in time ({err}); retrying", flush=True)
                ray.shutdown()
    finally:
        done.set()
        if started_ray and ray.is_initialized():
            ray.shutdown()
    print(f"[setpo.verl] done in {time.perf_counter() - start:.0f} s", flush=True)


def cli(argv: Sequence[str] | None = None) -> int:
    """``python -m setpo.verl``: ``main``, with a missing path or a bad setting reported as one line (no
    traceback) and exit status 2; ``scripts/run_setpo.sh`` runs this."""
    try:
        main(argv)
    except (FileNotFoundError, ValueError) as err:
        print(f"python -m setpo.verl: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    return 0
