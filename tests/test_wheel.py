"""The wheel holds the library alone (``setpo``, its environments included; no lab, tests or results), and the
README's TRL quickstart trains from a venv that holds only that wheel.

The wheel is built offline from a copy of the tracked files (nothing untracked slips in, and the checkout gets no
build folder). The venv borrows this one's dependencies read-only through a .pth file of its site-packages folders;
the .pth files inside them (this checkout's editable install, ``setpo_lab.pth``) are not processed there, so the
only ``setpo`` it can import is the wheel's.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from docs_blocks import python_blocks

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    out = base / "dist"
    run = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                          "-q", "-w", str(out), str(src)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    (whl,) = out.glob("setpo-*.whl")
    return whl


def _names(whl: Path) -> list[str]:
    with zipfile.ZipFile(whl) as z:
        return z.namelist()


def test_the_wheel_holds_the_library_and_nothing_else(wheel):
    names = _names(wheel)
    assert {n.split("/")[0] for n in names} == {"setpo", wheel.name.split("-py3")[0] + ".dist-info"}
    sources = {n for n in names if n.endswith(".py")}
    # every module of setpo/ (a subpackage without __init__.py would be dropped silently)
    assert sources == {str(p.relative_to(ROOT)) for p in (ROOT / "setpo").rglob("*.py")}
    assert {"setpo/envs/__init__.py", "setpo/envs/countdown/verifier.py", "setpo/trl/trainer.py", "setpo/cli.py",
            "setpo/verl_plugin.py", "setpo/records.py", "setpo/refusals.py"} <= sources
    assert not [n for n in names if n.startswith(("setpo/studies/", "setpo/repro/"))]
    with zipfile.ZipFile(wheel) as z:
        entry = z.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
        imports = {m for n in sources for m in _imported(z.read(n).decode(), n)}
    assert "setpo = setpo.cli:main" in entry and "setpo = setpo.verl_plugin" in entry
    assert not {m for m in imports if m.split(".")[0] in ("setpo_lab", "envs")}, "the wheel imports what it lacks"


def _imported(text: str, name: str) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(text, filename=name)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
    return out


@pytest.fixture(scope="module")
def wheel_venv(wheel, tmp_path_factory) -> Path:
    venv = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    run = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index",
                          "-q", str(wheel)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    own = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    borrowed = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    Path(own, "borrowed_dependencies.pth").write_text("\n".join(borrowed) + "\n")
    return py


def _run(py: Path, args: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | OFFLINE
    return subprocess.run([str(py), "-I", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_wheels_venv_has_the_library_its_environments_and_commands_but_no_lab(wheel_venv, tmp_path):
    code = """
import importlib, importlib.util, pkgutil, sys
from importlib import metadata
import gymnasium
import setpo, setpo.envs
assert setpo.__file__.startswith(sys.prefix), setpo.__file__
assert importlib.util.find_spec("setpo_lab") is None and importlib.util.find_spec("envs") is None
for env_id in ("setpo/Countdown-v0", "setpo/MultiModalBandit-v0"):
    env = gymnasium.make(env_id)
    obs, info = env.reset(seed=0)
    env.step(env.action_space.sample())
for m in pkgutil.walk_packages(setpo.__path__, "setpo."):
    if not m.name.endswith("__main__"):
        importlib.import_module(m.name)
print(metadata.version("setpo"))
"""
    run = _run(wheel_venv, ["-c", code], tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    setpo_command = wheel_venv.parent / "setpo"
    helped = subprocess.run([str(setpo_command), "--help"], capture_output=True, text=True, cwd=tmp_path)
    assert helped.returncode == 0 and all(c in helped.stdout for c in ("verl", "judge", "models", "math-data"))
    lab = subprocess.run([str(setpo_command), "demo"], capture_output=True, text=True, cwd=tmp_path)
    assert lab.returncode == 2 and "make demo" in lab.stderr and len(lab.stderr.strip().splitlines()) == 1


def test_the_readme_quickstart_trains_from_the_wheel_alone(wheel_venv, tmp_path):
    block = next(b for b in python_blocks(ROOT / "README.md") if "SetPOTrainer" in b.code and b.no_run is None)
    (tmp_path / "quickstart.py").write_text(block.code)
    run = _run(wheel_venv, ["quickstart.py"], tmp_path, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
