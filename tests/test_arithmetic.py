"""The pinned floating-point path (``setpo_lab.repro.arithmetic``): a study made over several sittings, on whatever x86 CPU
each gets, is one experiment only if every part computes on the same kernels (a Countdown run retrained on an
AVX-512 machine gives other weights than its AVX2 record, and the recorded ones under the pin).
These check that every way of running the study gets the pin: `python -m setpo_lab.repro.arithmetic`, `python -m setpo_lab.cli countdown`
(`make countdown`), `make figures` for notebook 03, `make lab`, and that notebook 03 refuses without it."""

import os
import subprocess
import sys

import pytest

import setpo_lab.cli as cli
from setpo_lab.repro.arithmetic import (PINNED_ARITHMETIC, pinned, pinned_children, pinned_environment,
                              require_pinned)
from setpo_lab import ROOT
from setpo_lab.studies.arguments import run_command


@pytest.fixture
def unpinned(monkeypatch):
    for key in PINNED_ARITHMETIC:
        monkeypatch.delenv(key, raising=False)


def test_the_pinned_environment_carries_every_setting_and_keeps_the_rest():
    env = pinned_environment({"PATH": "/bin", "MKL_CBWR": "AUTO"})
    assert env["PATH"] == "/bin"
    assert {k: env[k] for k in PINNED_ARITHMETIC} == PINNED_ARITHMETIC
    assert pinned(env)
    assert not pinned({**env, "MKL_CBWR": "AUTO"})
    assert not pinned({"PATH": "/bin"})


def test_pinned_children_sets_the_pin_for_the_block_and_restores_what_was_there(unpinned, monkeypatch):
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    with pinned_children():
        assert pinned()
    assert os.environ["MKL_CBWR"] == "COMPATIBLE"
    assert "ATEN_CPU_CAPABILITY" not in os.environ and "ONEDNN_MAX_CPU_ISA" not in os.environ


def test_require_pinned_names_what_is_missing_and_how_to_run_pinned(unpinned, monkeypatch):
    monkeypatch.setenv("MKL_CBWR", "AVX2")
    with pytest.raises(ValueError, match=r"the study must run on the pinned floating-point path.*"
                                         r"ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2.*make countdown"):
        require_pinned("the study")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    require_pinned("the study")  # pinned: nothing raised


def test_python_m_setpo_arithmetic_runs_a_command_on_torchs_avx2_kernels(unpinned):
    """The child sees the pin, and torch in it uses at most AVX2 kernels (an AVX-512 machine reports AVX512
    without the pin: the case the pin exists for)."""
    code = ("import os, torch; print(torch.backends.cpu.get_cpu_capability()); "
            f"print(' '.join(os.environ[k] for k in {list(PINNED_ARITHMETIC)!r}))")
    out = subprocess.run([sys.executable, "-m", "setpo_lab.repro.arithmetic", sys.executable, "-c", code], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, check=True).stdout.split("\n")
    assert out[0] != "AVX512"
    assert out[1] == " ".join(PINNED_ARITHMETIC.values())


@pytest.mark.parametrize("argv, message", [([], "usage: python -m setpo_lab.repro.arithmetic COMMAND"),
                                           (["no-such-command-here"], "cannot run 'no-such-command-here'")])
def test_python_m_setpo_arithmetic_refuses_without_a_runnable_command(argv, message):
    run = subprocess.run([sys.executable, "-m", "setpo_lab.repro.arithmetic", *argv], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 2
    assert message in run.stderr


def test_setpo_countdown_becomes_the_study_under_the_pin(unpinned, monkeypatch):
    seen = {}
    monkeypatch.setattr(cli.os, "execve", lambda path, argv, env: seen.update(path=path, argv=argv, env=env))
    cli.main(["countdown", "--full", "--out", "results/countdown"])
    assert seen["argv"][1:] == ["-m", "setpo_lab", "run", "countdown", "--full", "--out", "results/countdown"]
    assert pinned(seen["env"])


def test_setpo_countdown_hands_its_arguments_to_the_study_which_checks_them():
    """For real: the process becomes the study, whose own parser refuses a bad option before any work."""
    run = subprocess.run([sys.executable, "-m", "setpo_lab.cli", "countdown", "--full", "--no-such-option"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert "python -m setpo_lab run countdown" in run.stderr and "--no-such-option" in run.stderr


def test_setpo_figures_runs_notebook_03_pinned_and_the_others_as_they_are(unpinned, monkeypatch, tmp_path):
    seen = {}
    monkeypatch.setattr(cli, "run_notebook", lambda name, out_dir, **kw: seen.setdefault(name, pinned()) and None)
    cli.main(["figures", "01_toy_mode_collapse", "03_countdown_pass_at_k", "--out-dir", str(tmp_path)])
    assert seen == {"01_toy_mode_collapse": False, "03_countdown_pass_at_k": True}
    assert not pinned()  # restored after


def test_make_countdown_and_make_lab_run_pinned():
    dry = subprocess.run(["make", "-n", "-W", "pyproject.toml", "countdown", "lab"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60).stdout
    countdown = next(line for line in dry.splitlines() if "-m setpo_lab.cli countdown --full" in line)
    assert countdown.endswith("--out results/countdown")
    assert "-m setpo_lab.repro.arithmetic" in next(line for line in dry.splitlines() if "jupyter lab" in line)


def test_notebook_03_refuses_the_full_study_off_the_pinned_path(unpinned, tmp_path):
    """Run headless without the pin (as a bare `jupyter lab` would), it stops before the study starts."""
    from papermill.exceptions import PapermillExecutionError

    from setpo_lab.studies.notebook_runs import execute_notebook

    with pytest.raises(PapermillExecutionError, match="must run on the pinned floating-point path"):
        execute_notebook("03_countdown_pass_at_k", tmp_path / "figures", smoke=False,
                         RUN_DIR=str(tmp_path / "study"))
    assert not (tmp_path / "study").exists()  # nothing started


def test_notebook_03_draws_only_a_study_make_countdown_started(tmp_path, monkeypatch):
    """Pinned, with no study in RUN_DIR, it says how to start one instead of starting a study of other settings
    (the documented one has make countdown's headline seeds; the notebook takes the folder's config)."""
    from papermill.exceptions import PapermillExecutionError

    from setpo_lab.studies.notebook_runs import execute_notebook

    for name, value in PINNED_ARITHMETIC.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(PapermillExecutionError, match="holds no Countdown study: start it with `make countdown`"):
        execute_notebook("03_countdown_pass_at_k", tmp_path / "figures", smoke=False,
                         RUN_DIR=str(tmp_path / "study"))
    assert not (tmp_path / "study").exists()


def test_a_run_made_on_other_kernels_is_another_identity():
    """The identity compares the floating-point path: a resume on AVX-512 kernels of a run made on AVX2 ones
    is refused naming it, as another thread count is."""
    from setpo_lab.repro.provenance import identity_differences, run_identity

    ident = run_identity(2, ["setpo_lab.repro.arithmetic"])
    assert set(ident["arithmetic"]) == {"torch_cpu_capability", *PINNED_ARITHMETIC}
    avx2 = {**ident, "arithmetic": {**ident["arithmetic"], "torch_cpu_capability": "AVX2", **PINNED_ARITHMETIC}}
    avx512 = {**ident, "arithmetic": {**avx2["arithmetic"], "torch_cpu_capability": "AVX512",
                                      "ATEN_CPU_CAPABILITY": None}}
    differ = identity_differences(avx2, avx512)
    assert set(differ) == {"arithmetic.torch_cpu_capability", "arithmetic.ATEN_CPU_CAPABILITY"}
    assert differ["arithmetic.ATEN_CPU_CAPABILITY"] == "avx2 then, None now"
    assert identity_differences(ident, {**ident, "machine": {"cpu": "elsewhere"}}) == {}  # the machine: recorded only


def test_the_full_study_refuses_to_start_off_the_pinned_path(unpinned, capsys, monkeypatch):
    import setpo_lab.studies.countdown as countdown

    monkeypatch.setattr(countdown, "run_study", lambda *a, **kw: pytest.fail("the study started unpinned"))
    with pytest.raises(SystemExit) as e:
        run_command(countdown.COMMAND, ["--full", "--out", "runs/never"])
    assert e.value.code == 2
    assert "must run on the pinned floating-point path" in capsys.readouterr().err
