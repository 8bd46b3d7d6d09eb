"""The one command line of every study (``python -m setpo_lab run STUDY``, ``setpo_lab.studies.arguments``): one
parser, one preset mechanism, every value checked before any work, and the old module commands forwarding to it."""

import re
import subprocess
import sys

import pytest

import setpo_lab.cli as cli
from setpo_lab import ROOT
from setpo_lab.repro.arithmetic import pinned
from setpo_lab.studies.arguments import StudyCommand, parse_study_args, run_command, study_parser


def _command(study: str):
    return cli.study_command(study)


@pytest.mark.parametrize("study", list(cli.STUDIES))
def test_every_study_declares_its_command_and_answers_help(study, capsys):
    command = _command(study)
    assert command.name == study and command.stages and command.presets
    assert command.default_preset is None or command.default_preset in command.presets
    assert set(command.pinned) <= set(command.presets) and set(command.default_out) <= set(command.presets)
    with pytest.raises(SystemExit) as e:
        study_parser(command).parse_args(["--help"])
    assert e.value.code == 0 and f"python -m setpo_lab run {study}" in capsys.readouterr().out


def test_a_preset_flag_is_the_preset_and_set_accumulates():
    from setpo_lab.studies.countdown import COMMAND

    by_flag, stages, args = parse_study_args(COMMAND, ["--smoke", "--set", "rl_steps=4", "--set", "n_val=3"])
    by_name, _, _ = parse_study_args(COMMAND, ["--preset", "smoke", "--set", "rl_steps=4", "n_val=3"])
    assert by_flag == by_name and by_flag.rl_steps == 4 and by_flag.n_val == 3
    assert stages == list(COMMAND.stages) and args.out == by_flag.out == "runs/countdown_smoke"


@pytest.mark.parametrize("study, argv, match", [
    ("countdown", [], "give a preset"),
    ("countdown", ["--smoke", "--full"], "not allowed"),
    ("countdown", ["--smoke", "--set", "out=x"], "it has its own option"),
    ("short_answers", ["--preset", "smoke"], "--out is required"),
    ("short_answers_cure", ["--preset", "huge", "--out", "x"], "invalid choice"),
    ("short_answers_confirm", ["--out", "x", "--stages", "plot"], "--stages"),
    ("math", ["--config", "no/such/run_config.json", "--smoke"], "either --config or a preset"),
    ("math", ["--config", "no/such/run_config.json"], "--config no/such/run_config.json"),
    ("rubric", ["--set", "seeds=two"], "seeds"),
    ("toy", ["--set", "seeds=0"], "seeds must be a whole number from 1 to 1000"),
    ("toy", ["--smoke", "--set", "projection=tsne"], "projection"),
    ("short_answers_base", ["--out", "x", "--set", "kinds=no_such_kind"], "no_such_kind"),
    ("short_answers_base", ["--out", "x", "--set", "n=0"], "n must be a whole number >= 1"),
    ("short_answers_base", ["--out", "x", "--set", "temperatures=hot"], "temperatures: expected comma-separated"),
    ("short_answers_base", ["--out", "x", "--set", "temperatures=0,1"], "temperatures must be positive finite numbers"),
])
def test_bad_arguments_are_one_line_and_exit_2_before_any_work(study, argv, match, capsys):
    command = _command(study)
    with pytest.raises(SystemExit) as e:
        run_command(command, argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and match in err, err


def test_a_pinned_preset_puts_the_run_under_the_pin_and_others_do_not(monkeypatch):
    for name in ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA"):
        monkeypatch.delenv(name, raising=False)
    seen = {}

    def execve(path, argv, env):  # the process is replaced: nothing after it runs
        seen.update(argv=argv, env=env)
        raise SystemExit("replaced")

    monkeypatch.setattr(cli.os, "execve", execve)
    from setpo_lab.studies import countdown

    monkeypatch.setattr(countdown, "run_study", lambda cfg, stages, redo: seen.update(ran=cfg.out))
    with pytest.raises(SystemExit, match="replaced"):
        cli.main(["run", "countdown", "--full", "--out", "runs/never"])
    assert seen["argv"][1:] == ["-m", "setpo_lab", "run", "countdown", "--full", "--out", "runs/never"]
    assert pinned(seen["env"]) and "ran" not in seen
    seen.clear()
    assert cli.main(["run", "countdown", "--smoke", "--out", "runs/never_smoke"]) == 0
    assert seen == {"ran": "runs/never_smoke"}


@pytest.mark.parametrize("argv, match", [
    (["setpo_lab", "run", "rubric", "--set", "seeds=0"], "python -m setpo_lab run rubric: error: seeds"),
    (["setpo_lab.studies.rubric", "--set", "steps=0"], "python -m setpo_lab run rubric: error: steps"),
    # the form the committed base tables record: its options become --set fields
    (["setpo_lab.studies.short_answers", "base", "--out", "x", "--kinds", "no_such_kind"], "no_such_kind"),
])
def test_python_m_forms_reach_the_one_parser(argv, match):
    run = subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and match in run.stderr, run.stderr


def test_every_study_names_its_stages_from_one_vocabulary():
    """train, evaluate, judge, report (``stages.STAGE_NAMES``), in that order, whatever the study; a command that
    names another stage, or puts them out of order, is refused when it is declared."""
    from setpo_lab.studies.stages import STAGE_NAMES

    for name in cli.STUDIES:
        stages = list(cli.study_command(name).stages)
        assert stages and stages == [s for s in STAGE_NAMES if s in stages], name
    for bad in (("sft", "rl"), ("evaluate", "train"), ()):
        with pytest.raises(ValueError, match="must be some of"):
            StudyCommand("x", {"default": dict}, bad, lambda cfg, stages, args: 0)


def test_a_recorded_command_of_an_older_parser_reads_as_set_fields():
    from setpo_lab.studies.arguments import flags_as_set

    assert flags_as_set(["--model-path", "m", "--n", "20", "--max-new-tokens", "256", "--out", "o"],
                        ("--n", "--max-new-tokens")) == ["--model-path", "m", "--set", "n=20", "--set",
                                                         "max_new_tokens=256", "--out", "o"]
    assert flags_as_set(["--n"], ("--n",)) == ["--n"]  # a flag without its value is left for the parser to refuse


def test_the_real_responses_table_refuses_bad_settings_and_a_missing_model_in_one_line(tmp_path, capsys):
    from setpo_lab.studies import math_responses

    for argv, code, words in ((["--set", "n=0"], 2, "n must be a whole number"),
                              (["--set", "seed=-1"], 2, "seed must be a whole number"),
                              (["--set", "resample=3"], 2, "resample must be true or false"),
                              ([], 1, "no model folder given"),
                              (["--model-path", str(tmp_path / "none")], 1, "no model folder at")):
        try:  # a bad argument exits 2 (argparse); a refusal while running returns 1
            status = run_command(math_responses.COMMAND, ["--out", str(tmp_path), *argv])
        except SystemExit as e:
            status = e.code
        err = capsys.readouterr().err
        assert status == code and words in err and len(err.strip().splitlines()) == 1, argv


@pytest.mark.parametrize("study, setting", [
    ("short_answers_cure", "lam_key=nan"), ("short_answers_cure", "lam_key=NaN"), ("short_answers", "lr=-Infinity"),
    ("short_answers", "seeds=[0,Infinity]"), ("countdown", "rl_lr=inf"), ("example", "lam=+nan")])
def test_a_set_value_that_is_not_finite_is_refused_naming_the_field(study, setting, tmp_path, capsys):
    """json reads NaN and Infinity as numbers and "nan" stays text, which a config then compared with a number
    (the cure study's lam_key=nan was "'>' not supported between instances of 'str' and 'int'")."""
    with pytest.raises(SystemExit) as stop:
        parse_study_args(_command(study), ["--smoke", "--out", str(tmp_path / "out"), "--set", setting])
    field = setting.partition("=")[0]
    assert stop.value.code == 2 and f"--set {field}: expected a finite value" in capsys.readouterr().err


def test_a_value_of_the_wrong_type_names_the_set_fields(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        parse_study_args(_command("short_answers_cure"), ["--smoke", "--out", str(tmp_path), "--set", "kinds=5"])
    assert stop.value.code == 2 and "(a value of the wrong type? --set kinds)" in capsys.readouterr().err


@pytest.mark.parametrize("study, setting", [
    ("short_answers", "embedder=no_such_model"), ("countdown", "paper_embedder=no_such_model"),
    ("countdown", 'search_embedders=["centered:no_such_model"]'), ("math", "embedder=no_such_model")])
def test_an_embedder_that_cannot_load_is_refused_before_anything_is_written(study, setting, tmp_path, capsys):
    """It was refused only when the first run loaded it: after the study's folder was claimed (and, for math,
    the base model evaluated), so the rerun with the embedder fixed was refused as another configuration's."""
    out = tmp_path / "out"
    flag = "--run-dir" if study == "math" else "--out"
    with pytest.raises(SystemExit) as stop:
        run_command(_command(study), ["--smoke", flag, str(out), "--set", setting])
    field = setting.partition("=")[0]
    assert stop.value.code == 2 and f"{field}: 'no_such_model" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("setting", ["eval_temperatures=[]", "eval_temperatures=[0.5]"])
def test_countdown_refuses_evaluation_temperatures_without_the_one_its_record_compares_at(setting, tmp_path, capsys):
    """The record's comparisons are at T = 1; without it the smoke study trained and then failed far from the
    setting ("stage 'train' has not finished")."""
    with pytest.raises(SystemExit) as stop:
        parse_study_args(_command("countdown"), ["--smoke", "--out", str(tmp_path / "out"), "--set", setting])
    assert stop.value.code == 2 and "eval_temperatures must" in capsys.readouterr().err


@pytest.mark.parametrize("rule, good, bad", [
    ("count", [1, 10**6], [0, -1, True, 1.0, "1", None]), ("seed", [0, 7], [-1, False, 0.0, "0"]),
    ("group", [3, 8], [2, True, 3.0]), ("limit", [None, 1], [0, "x", True]),
    ("positive", [1e-9, 2, 0.5], [0, -1, float("nan"), float("inf"), True, "0.5", None]),
    ("nonnegative", [0, 0.0, 2.5], [-0.1, float("nan"), float("inf"), False, "0"]),
    ("share", [0, 0.5, 1], [-0.1, 1.1, float("nan"), True, "0.5"]),
    ("probability", [0.1, 1], [0, 1.1, float("nan"), True]),
    ("positives", [(0.5,), [1, 2]], [(), (0,), (float("nan"),), "1", (True,)]),
    ("seeds", [(0,), [3, 1]], [(), (1, 1), (-1,), (True,), ("a",), "01"]), ("flag", [True, False], [1, 0, "true", None]),
])
def test_each_field_rule_refuses_what_it_names_and_keeps_what_it_allows(rule, good, bad):
    """The shared config checks (``arguments.check_fields``): a bool is never a number, NaN and infinity never pass a
    bound, text is never a number, and the error names the field and the value."""
    from types import SimpleNamespace

    from setpo_lab.studies.arguments import check_fields

    for value in good:
        check_fields(SimpleNamespace(x=value), **{rule: ("x",)})
    for value in bad:
        with pytest.raises(ValueError, match=rf"^x must be .*, got {re.escape(repr(value))}$"):
            check_fields(SimpleNamespace(x=value), **{rule: ("x",)})
