"""The verl launcher and the scripts as a user meets them: one-line errors, converted data with plain names,
a quiet dry run, and help text for every option."""

import argparse
import dataclasses
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from setpo_lab.studies.figures import ROOT

pytest.importorskip("verl")

from setpo.verl import launch  # noqa: E402


def test_converted_data_keeps_one_split_name(tmp_path):
    from setpo.envs import math as math_data

    assert launch.converted_name("/d/train.parquet", "train") == "train.parquet"
    assert launch.converted_name("/d/train-00000-of-00001.parquet", "train") == "train-00000-of-00001.parquet"
    assert launch.converted_name("/d/gsm8k.jsonl", "test") == "gsm8k.test.parquet"
    train, val = math_data.write_smoke_files(tmp_path / "data", n_train=6, n_val=3)
    out = launch.prepare_data(str(train), None, "train")
    assert out.endswith("setpo_verl/train.parquet") and math_data.is_verl_parquet(out)
    same_dir = launch.prepare_data(str(train), str(train.parent), "train")  # never overwrites the raw input
    assert same_dir != str(train.resolve()) and math_data.is_verl_parquet(same_dir)


def test_dry_run_config_has_no_critic_and_no_critic_warning():
    cfg = launch.VerlLaunchConfig(model_path="/m", train_files=["/t.parquet"], val_files=["/v.parquet"])
    config = launch.compose_config(launch.build_overrides(cfg))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        launch.validate(config)
    assert config.critic.enable is False
    assert not [w for w in seen if "critic" in str(w.message)]


def _options(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _options(sub)
        elif not isinstance(action, argparse._HelpAction):
            yield action


def test_every_launcher_option_has_help_text():
    missing = [a.dest for a in _options(launch.build_parser()) if not a.help]
    assert not missing, f"options without help text: {missing}"


def _run(cmd, env=None, **kw):
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})}, **kw)


@pytest.mark.slow
def test_missing_paths_are_one_line_not_a_traceback(tmp_path):
    r = _run([sys.executable, "-m", "setpo.verl", "print-config", "--model-path", str(tmp_path / "none"),
              "--train-file", str(tmp_path / "t.parquet"), "--val-file", str(tmp_path / "v.parquet")])
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "MODEL_PATH" in r.stderr, r.stderr
    env = {"MODEL_PATH": str(tmp_path), "TRAIN_FILE": str(tmp_path / "t.parquet"), "VAL_FILE": str(tmp_path / "v"),
           "EMBEDDING_MODEL_PATH": "default", "PYTHON_BIN": sys.executable, "DRY_RUN": "1", "N_GPUS_PER_NODE": "1"}
    r = _run(["bash", "scripts/run_setpo.sh"], env=env)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "no data file" in r.stderr, r.stderr
    r = _run(["bash", "scripts/run_setpo.sh"], env={k: "" for k in ("MODEL_PATH",)})
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and "MODEL_PATH" in r.stderr, r.stderr


def test_the_launchers_options_are_the_config_fields(monkeypatch):
    """Options not given take the config's own defaults: the command line restates none of them."""
    monkeypatch.setattr(launch, "prepare_data", lambda path, *a: path)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    args = launch.build_parser().parse_args(["train", "--model-path", "m", "--train-file", "t.parquet,u.parquet",
                                             "--val-file", "v.parquet"])
    expected = launch.VerlLaunchConfig(model_path="m", train_files=["t.parquet", "u.parquet"], val_files=["v.parquet"])
    got = launch.launch_config_from_args(args)
    assert got == dataclasses.replace(expected, output_dir=str(Path(expected.output_dir).resolve()))
    options = {a.dest for a in _options(launch.build_parser())}
    with_help = {f.name for f in dataclasses.fields(launch.VerlLaunchConfig) if "help" in f.metadata}
    assert with_help <= options and len(with_help) >= 25
    flags = launch.build_parser().parse_args(["train", "--model-path", "m", "--train-file", "t", "--val-file", "v",
                                              "--no-setpo", "--total-steps", "3", "--device", "cpu"])
    cfg = launch.launch_config_from_args(flags)
    assert (cfg.setpo, cfg.total_training_steps, cfg.n_gpus_per_node) == (False, 3, launch.CPU_WORKERS_PER_NODE)
