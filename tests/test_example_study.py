"""The contributing guide's example study (``setpo_lab.studies.example``): a whole study through the engine in
under 150 lines, run end to end on a tiny random model, resumed, and refused in a folder of another config."""

import json
from pathlib import Path

import pytest

from setpo_lab.studies import example
from setpo_lab.studies.arguments import run_command


def test_the_example_study_stays_under_150_lines():
    assert len(Path(example.__file__).read_text().splitlines()) < 150


def test_the_example_study_runs_every_stage_through_the_engine_and_resumes(tmp_path, capsys):
    out = tmp_path / "example"
    argv = ["--smoke", "--out", str(out), "--set", "seeds=[0]", "steps=1"]
    assert run_command(example.COMMAND, argv) == 0
    assert "| distinct_right |" in capsys.readouterr().out
    for label in ("grpo_s0", "setpo_s0"):
        run = out / "train" / label
        assert (run / "final" / "done.json").is_file() and not list(run.glob("checkpoint-*"))
        assert [json.loads(line)["step"] for line in (run / "probes.jsonl").read_text().splitlines()][0] == 0
        scored = json.loads((out / "eval" / f"{label}.json").read_text())
        assert 0 <= scored["pass_at_1"] <= 1 and 0 <= scored["distinct_right"] <= 2  # at most eval_n distinct
    record = json.loads((out / "results.json").read_text())
    assert record["differences"]["pass_at_1"]["n"] == 1 and record["config"]["seeds"] == [0]
    logs = []
    cfg = example.ExampleConfig.smoke(run_dir=str(out), seeds=(0,), steps=1)
    example.run_study(cfg, log=logs.append)
    assert logs == []  # everything was done: nothing trained or sampled again
    with pytest.raises(ValueError, match="lam"):  # the folder holds another config's results
        example.run_study(example.ExampleConfig.smoke(run_dir=str(out), seeds=(0,), steps=1, lam=0.25))


def test_the_example_study_refuses_bad_settings():
    with pytest.raises(ValueError, match="group must be a whole number >= 3"):
        example.ExampleConfig(group=2)
    with pytest.raises(ValueError, match="steps must be a whole number"):
        example.ExampleConfig(steps=0)
    for seeds in ((-1,), ("a",), (), (1, 1)):  # ("a",) was a TypeError from "a" + 1
        with pytest.raises(ValueError, match="seeds must be distinct whole numbers"):
            example.ExampleConfig(seeds=seeds)
    for lam in (float("nan"), -1, "0.5", True):  # NaN passed `0 <= lam <= 10`'s first half as text: a TypeError
        with pytest.raises(ValueError, match="lam must be a number in"):
            example.ExampleConfig(lam=lam)


@pytest.mark.parametrize("setting, match", [("kind=nope", "kind must be one of"), ("embedder=nope", "embedder: 'nope'"),
                                            ("lam=nan", "--set lam: expected a finite value")])
def test_a_bad_setting_is_refused_before_the_folder_is_claimed(tmp_path, capsys, setting, match):
    """A kind or embedder the study cannot use was refused only once training began, after the folder held
    config.json and a tiny model: the rerun with the setting fixed was then refused as another config's folder."""
    from setpo_lab.studies.arguments import run_command

    out = tmp_path / "out"
    with pytest.raises(SystemExit) as stop:
        run_command(example.COMMAND, ["--smoke", "--out", str(out), "--set", setting])
    assert stop.value.code == 2 and match in capsys.readouterr().err
    assert not out.exists()
