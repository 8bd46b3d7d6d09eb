"""Command lines: every argument is checked before any work starts, and a bad one exits non-zero with one line
that names it; scratch commands write to runs/, only `make figures` writes figures/."""

import subprocess
import sys
from pathlib import Path

import pytest

import setpo_lab.cli as cli
import setpo_lab.studies.countdown as countdown
import setpo_lab.studies.rubric as rubric
from setpo_lab import ROOT
from setpo_lab.studies.arguments import run_command


def _refused(main, argv, capsys, match: str):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert match in err, err
    return err


@pytest.fixture
def no_work(monkeypatch):
    """Any command that gets past its checks fails the test instead of running."""
    def forbidden(*a, **kw):
        raise AssertionError("work started although an argument was bad")

    for module, name in [(cli, "run_notebook"), (cli, "run_benchmark"), (countdown, "run_study"),
                         (rubric, "compare_methods")]:
        monkeypatch.setattr(module, name, forbidden)
    import setpo_lab.studies.toy as toy
    monkeypatch.setattr(toy, "run_study", forbidden)
    monkeypatch.setattr(toy, "lambda_sweep", forbidden)


@pytest.mark.parametrize("argv, match", [
    (["demo", "--seeds", "0"], "--seeds"),
    (["demo", "--seeds", "two"], "--seeds"),
    (["sweep", "--seeds", "0"], "--seeds"),
    (["sweep", "--lams", "-1", "nan"], "--lams"),
    (["sweep", "--lams", "0.1", "inf"], "--lams"),
    (["sweep", "--algo", "ppo"], "--algo"),
    # a bad value among good ones, and every other option of `setpo` the same way
    (["sweep", "--lams", "-1", "nan", "0.5"], "--lams"),
    (["sweep", "--lams", "0.5", "-inf"], "--lams: expected a finite number >= 0, got -inf"),
    (["sweep", "--lams", "-1e3"], "--lams: expected a finite number >= 0, got -1e3"),
    (["sweep", "--lams", "0.5", "0.5"], "0.5 given more than once"),
    (["sweep", "--lams", "0", "-0"], "given more than once"),
    (["sweep", "--lams"], "--lams"),
    (["sweep", "--seeds", "99999999999999999999"], "at most 1000"),
    (["sweep", "--seeds", "2.5"], "--seeds"),
    (["demo", "--seeds", "-3"], "--seeds"),
    (["demo", "--seeds", "1001"], "at most 1000"),
    (["demo", "--out-dir", ""], "empty path is the current folder"),
    (["demo", "--out-dir", "  "], "--out-dir"),
    (["demo", "--out-dir", "README.md"], "is a file, not a folder"),
    (["demo", "--out-dir", "README.md/sub"], "cannot be created"),
    (["figures", "--out-dir", ""], "empty path is the current folder"),
    (["figures", "--out-dir", "README.md"], "is a file"),
    (["figures", "01_toy_mode_collapse", "01_toy_mode_collapse"], "named more than once"),
    (["bench", "estimator", "estimator"], "named more than once"),
    (["demo", "--smoke", "extra"], "unrecognized arguments"),
    (["demo", "--out-dir", str(ROOT / "figures")], "only `make figures` writes"),
    (["demo", "--out-dir", str(ROOT / "figures" / "demo")], "inside the committed figures/"),
    (["bench", "no_such"], "no benchmark no_such"),
    (["bench", "--smoke", "--out", "README.md"], "is a file, not a folder"),
    (["figures", "no_such_notebook"], "no notebook no_such_notebook"),
    (["frobnicate"], "invalid choice"),
])
def test_setpo_cli_refuses_bad_arguments_up_front(argv, match, capsys, no_work):
    _refused(cli.main, argv, capsys, match)


@pytest.mark.parametrize("argv, match", [
    (["--smoke", "--stages", "bogus"], "--stages"),
    (["--smoke", "--stages", ","], "--stages"),
    (["--smoke", "--set", "rl_steps=abc"], "rl_steps"),
    (["--smoke", "--set", "rl_steps=-1"], "rl_steps"),
    (["--smoke", "--set", "rl_save_steps=3"], "rl_save_steps"),
    (["--smoke", "--set", "no_such_field=1"], "no_such_field"),
    (["--smoke", "--set", "rl_steps"], "FIELD=VALUE"),
    (["--full", "--set", "main_group_size=2"], "group sizes"),
    (["--smoke", "--full"], "not allowed"),
])
def test_countdown_cli_refuses_bad_arguments_before_sft(argv, match, capsys, no_work):
    _refused(lambda a: run_command(countdown.COMMAND, a), argv, capsys, match)


@pytest.mark.parametrize("argv, match", [
    (["--set", "steps=-1"], "steps"),
    (["--set", "steps=0"], "steps"),
    (["--set", "seeds=0"], "seeds"),
    (["--set", "reference=oracle"], "reference"),
    (["--out", "x"], "unrecognized arguments: --out"),  # the rubric study writes nothing
])
def test_rubric_cli_refuses_bad_arguments(argv, match, capsys, no_work):
    _refused(lambda a: run_command(rubric.COMMAND, a), argv, capsys, match)


def test_good_arguments_reach_the_work(monkeypatch):
    seen = {}
    monkeypatch.setattr(countdown, "run_study", lambda cfg, stages, redo: seen.update(cfg=cfg, stages=stages, redo=redo))
    assert run_command(countdown.COMMAND, ["--smoke", "--out", "/tmp/x", "--stages", "train,evaluate", "--set", "rl_steps=4",
                           'paper_embedder="hash"']) == 0
    assert seen["cfg"].rl_steps == 4 and seen["cfg"].out == "/tmp/x" and seen["stages"] == ["train", "evaluate"]
    assert seen["redo"] is False
    assert run_command(countdown.COMMAND, ["--smoke", "--redo"]) == 0 and seen["redo"] is True
    args = cli.parse_args(["sweep", "--lams", "0", "0.5", "--seeds", "2"])
    assert args.lams == [0.0, 0.5] and args.seeds == 2


def test_only_figures_writes_the_committed_figures(monkeypatch, tmp_path, capsys):
    assert Path(cli.parse_args(["demo"]).out_dir) == ROOT / "runs" / "demo"
    assert Path(cli.parse_args(["demo", "--smoke"]).out_dir) == ROOT / "runs" / "demo"
    assert Path(cli.parse_args(["figures"]).out_dir) == ROOT / "figures"
    assert "runs/" in (ROOT / ".gitignore").read_text().split()
    calls = []
    from setpo_lab.studies import notebook_runs

    monkeypatch.setattr(notebook_runs, "execute_notebook",
                        lambda name, out_dir, **kw: calls.append((Path(out_dir).resolve(), kw)) or tmp_path / "x")
    monkeypatch.setattr(cli, "ROOT", ROOT)
    cli.main(["figures", "01_toy_mode_collapse", "--out-dir", str(tmp_path)])
    # OUT_DIR always passed explicitly; a scratch folder does not save the notebook back
    assert calls == [(tmp_path.resolve(), {"smoke": False, "save_to_notebook": False, "log_output": True})]
    out = capsys.readouterr().out
    assert "[1/1] notebooks/01_toy_mode_collapse.ipynb" in out and "done in" in out


def test_bad_out_dirs_are_named_relative_to_the_working_folder(tmp_path, monkeypatch, capsys, no_work):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a_file").write_text("x")
    _refused(cli.main, ["demo", "--out-dir", "a_file/figs"], capsys, "'a_file' is a file")
    assert cli.parse_args(["demo", "--out-dir", "new/deeper"]).out_dir == "new/deeper"  # created later, by the work
    assert not (tmp_path / "new").exists()
    assert cli.parse_args(["sweep", "--lams", "-0", "1e3"]).lams == [0.0, 1000.0]
    assert str(cli.parse_args(["sweep", "--lams", "-0"]).lams[0]) == "0.0"  # a row labelled 0.0, not -0.0


def test_exit_status_from_a_real_process():
    for argv in (["-m", "setpo_lab.cli", "sweep", "--lams", "-1", "nan", "0.5"], ["-m", "setpo_lab.cli", "bench", "no_such"]):
        r = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_link_puts_this_clone_on_the_interpreters_path(monkeypatch, tmp_path, capsys):
    import sysconfig

    monkeypatch.setattr(sysconfig, "get_paths", lambda: {"purelib": str(tmp_path)})
    assert cli.main(["link"]) == 0
    assert (tmp_path / cli.LAB_PTH).read_text().strip() == str(ROOT)
    assert cli.main(["link"]) == 0  # again: the same file, not a second line
    assert (tmp_path / cli.LAB_PTH).read_text().splitlines() == [str(ROOT)]


def test_the_installed_command_runs_the_librarys_commands_and_points_at_the_lab(capsys):
    import setpo.cli as library_cli

    assert library_cli.main(["--help"]) == 0 and "math-data" in capsys.readouterr().out
    assert library_cli.main(["models", "list"]) == 0 and "SmolLM2" in capsys.readouterr().out
    for argv, words in ((["figures"], "`make figures` or `python -m setpo_lab.cli figures`"),
                        (["train"], "unknown command 'train'"), ([], "usage: setpo")):
        assert library_cli.main(argv) == 2
        out = capsys.readouterr()
        assert words in out.err + out.out
        assert len(out.err.strip().splitlines()) <= 1
