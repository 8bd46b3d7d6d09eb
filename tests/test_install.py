"""Each documented install resolves to the tested versions: pip asks the package index, installs nothing.

The installs are the documented ones (README, docs/reproducibility/versions.md): pip CPU (`.[lab]` after torch's CPU
build; `.[notebooks]` alone), pip GPU (`.[lab,gpu]`), the pip sections of environment.yml (CPU) and environment-gpu.yml
(GPU), and verl across nodes (`.[verl-gpu]`). Each is resolved with ``pip install --dry-run --ignore-installed
--report``, all at once in parallel, against the public index (or PIP_INDEX_URL), ignoring this machine's pip
configuration, find-links and constraints so that what is checked is what a newcomer's pip would pick. Skipped, with the
reason, when no index is reachable. What the index resolves changes with each release, so these run in
`make test-newest` (marker ``newest``), not in `make test`; `make test` checks the committed constraints instead.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
INDEX = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"

# The tested sets (docs/reproducibility/versions.md): what each install must resolve to.
SINGLE_NODE = {"torch": "2.13.0"}
GPU_NODE = {"torch": "2.13.0", "vllm": "0.31.0", "transformers": "5.10.4", "trl": "1.16.0"}
VERL_NODES = {"verl": "0.9.1", "torch": "2.11.0", "vllm": "0.24.0", "transformers": "5.9.0", "trl": "1.16.0"}
# What `make test` installs (extra `test`: TRL's trainers and verl's plug-in side by side, on the CPU).
TEST_ENV = {"verl": "0.9.1", "torch": "2.13.0", "transformers": "5.10.4", "trl": "1.16.0"}


def conda_pip_section(name: str) -> list[str]:
    """The lines of an environment file's ``pip:`` list (what conda hands to pip as a requirements file)."""
    lines, inside = [], False
    for line in (ROOT / name).read_text().splitlines():
        if re.match(r"\s*- pip:\s*$", line):
            inside = True
        elif inside and re.match(r"\s{4,}- ", line):
            lines.append(line.split("- ", 1)[1].strip().strip('"'))
        elif inside and line.strip() and not line.strip().startswith("#"):
            inside = False
    return lines


def requirement_args(lines: list[str]) -> list[str]:
    args = []
    for line in lines:
        if line.startswith("-"):
            args += line.replace('"', "").split(None, 1)
        else:
            args.append(line)
    return args


INSTALLS = {
    "pip CPU (.[lab])": (["-e", ".[lab]"], SINGLE_NODE),
    "pip notebooks only (.[notebooks])": (["-e", ".[notebooks]"], SINGLE_NODE),
    "pip GPU (.[lab,gpu])": (["-e", ".[lab,gpu]"], GPU_NODE),
    "conda CPU (environment.yml)": (requirement_args(conda_pip_section("environment.yml")), {"torch": "2.13.0+cpu"}),
    "conda GPU (environment-gpu.yml)": (requirement_args(conda_pip_section("environment-gpu.yml")), GPU_NODE),
    "verl across nodes (.[verl-gpu])": (["-e", ".[verl-gpu]"], VERL_NODES),
    "make test (.[test])": (["-e", ".[test]"], TEST_ENV),
}


def reachable(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status < 400
    except Exception:  # noqa: BLE001 - any failure means "not reachable from here"
        return False


def _pip_env() -> dict:
    keep = {"PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_CERT", "PIP_TRUSTED_HOST", "PIP_DEFAULT_TIMEOUT"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k in keep}
    env["PIP_CONFIG_FILE"] = os.devnull  # no config files: no local find-links, mirrors or constraints
    return env


def resolve(args: list[str], tmp: Path) -> dict[str, str]:
    """name -> version pip would install for ``args`` (nothing is installed)."""
    report = tmp / f"report_{abs(hash(tuple(args)))}.json"
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
           "--disable-pip-version-check", "--retries", "1", "--timeout", "60", "--report", str(report), *args]
    try:
        import setuptools  # noqa: F401  (build setpo's metadata with it, instead of a fresh build env per run)

        cmd.insert(4, "--no-build-isolation")
    except ImportError:
        pass
    r = subprocess.run(cmd, cwd=ROOT, env=_pip_env(), capture_output=True, text=True, timeout=300)
    if r.returncode:
        return {"error": (r.stderr or r.stdout).strip()[-2000:]}
    data = json.loads(report.read_text())
    return {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"] for i in data["install"]}


@pytest.fixture(scope="module")
def resolved(tmp_path_factory):
    if not reachable(f"{INDEX}/pip/"):
        pytest.skip(f"no package index reachable ({INDEX}); these checks ask pip to resolve each install")
    cpu_index = reachable(f"{TORCH_CPU_INDEX}/torch/")
    tmp = tmp_path_factory.mktemp("pip")
    todo = {name: args for name, (args, _) in INSTALLS.items() if cpu_index or TORCH_CPU_INDEX not in " ".join(args)}
    with ThreadPoolExecutor(max_workers=len(todo)) as pool:
        futures = {name: pool.submit(resolve, args, tmp) for name, args in todo.items()}
        return {name: f.result() for name, f in futures.items()}


def constraint_pins(path: Path) -> dict[str, str]:
    return dict(re.findall(r"^([a-z0-9][a-z0-9._-]*)==(\S+)$", path.read_text(), re.M))


def test_make_test_installs_the_tested_set_under_committed_constraints():
    """`make test` installs under constraints/ (the versions the suite last passed at): they hold the tested set of
    the test install, the second venv's TRL and transformers floors, and the Makefile uses both files."""
    tested = constraint_pins(ROOT / "constraints" / "tested.txt")
    oldest = constraint_pins(ROOT / "constraints" / "trl-oldest.txt")
    assert {k: tested.get(k) for k in TEST_ENV if k != "torch"} == {k: v for k, v in TEST_ENV.items() if k != "torch"}
    floors = constraint_pins(ROOT / "tests" / "trl-oldest.txt")
    assert floors and {k: oldest.get(k) for k in floors} == floors
    for pins in (tested, oldest):
        assert "torch" not in pins and "setpo" not in pins, "TORCH_SPEC chooses torch; setpo is installed editable"
    makefile = (ROOT / "Makefile").read_text()
    assert "CONSTRAINTS        ?= constraints/tested.txt" in makefile and "-c $(CONSTRAINTS)" in makefile
    assert "OLDEST_CONSTRAINTS ?= constraints/trl-oldest.txt" in makefile and "-c $(OLDEST_CONSTRAINTS)" in makefile


def test_freeze_keeps_index_pins_only():
    import importlib.util

    spec = importlib.util.spec_from_file_location("freeze_constraints", ROOT / "scripts" / "freeze_constraints.py")
    freeze = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(freeze)
    lines = ["Torch==2.13.0", "-e git+https://x/setpo#egg=setpo", "# Editable install", "setpo==0.1.0",
             "Jinja2==3.1.6", "foo @ file:///tmp/foo.whl", "typing_extensions==4.15.0", ""]
    assert freeze.pins(lines) == ["jinja2==3.1.6", "typing-extensions==4.15.0"]


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.newest
@pytest.mark.parametrize("name", list(INSTALLS))
def test_documented_install_resolves_to_the_tested_versions(resolved, name):
    if name not in resolved:
        pytest.skip(f"{TORCH_CPU_INDEX} is not reachable; {name} installs torch's CPU build from it")
    got = resolved[name]
    assert "error" not in got, f"{name} does not resolve:\n{got.get('error')}"
    want = INSTALLS[name][1]
    assert {k: got.get(k) for k in want} == want
    if "vllm" not in want and "verl" not in want:
        assert "vllm" not in got and "verl" not in got and "ray" not in got, f"{name} pulls the GPU stack"
    if "verl" in got:
        from setpo.verl_plugin import verl_trl_clash

        # verl 0.9.1 imports TRL's value-head model, gone since TRL 1.13, on every model build; an install that
        # carries verl must pair it with a TRL that has the class or with the verl that setpo's guard covers
        assert not verl_trl_clash(got["verl"], got.get("trl")), f"{name}: verl {got['verl']} with trl {got.get('trl')}"


def test_verl_trl_clash_is_what_verl_needs():
    from setpo.verl_plugin import GUARDED_VERL_VERSIONS, trl_has_value_head, verl_trl_clash

    # the guard's rule, checked against the TRL releases read: 1.12 still has the class, 1.13 does not
    assert trl_has_value_head("1.12.2") and not trl_has_value_head("1.13.0") and not trl_has_value_head("1.16.0")
    assert not trl_has_value_head(None)
    assert not verl_trl_clash("0.9.1", "1.16.0")  # covered by setpo.verl_plugin's guard
    assert verl_trl_clash("0.9.2", "1.16.0")  # an unread verl with a TRL lacking the class: a clash
    assert not verl_trl_clash("0.9.2", "1.12.0") and not verl_trl_clash(None, "1.16.0")
    assert GUARDED_VERL_VERSIONS == (TEST_ENV["verl"],) == (VERL_NODES["verl"],)


def test_every_install_carrying_verl_loads_the_guard():
    # verl loads the "verl.plugins" entry points at import; setpo's must name the guard module
    pyproject = (ROOT / "pyproject.toml").read_text()
    section = pyproject.split('[project.entry-points."verl.plugins"]', 1)
    assert len(section) == 2, "pyproject.toml lost setpo's verl.plugins entry point (the TRL guard)"
    assert re.match(r"\s*setpo = \"setpo\.verl_plugin\"", section[1])
    for extra in ("verl-gpu", "test"):  # both carry verl, and setpo itself with them
        line = re.search(rf"^{extra} = \[(.*)\]$", pyproject, re.M).group(1)
        assert "setpo[" in line and ("verl" in line or "lm,verl" in line)


def test_install_files_name_real_extras():
    pyproject = (ROOT / "pyproject.toml").read_text()
    extras = set(re.findall(r"^([a-z][a-z-]*) = \[", pyproject.split("[project.optional-dependencies]")[1], re.M))
    assert {"notebooks", "lm", "lab", "gpu", "verl", "verl-gpu", "test"} <= extras
    for name in ("environment.yml", "environment-gpu.yml"):
        for line in conda_pip_section(name):
            for extra in re.findall(r"\[([a-z,-]+)\]", line):
                assert set(extra.split(",")) <= extras, f"{name}: unknown extra in {line!r}"
    assert "test" not in " ".join(conda_pip_section("environment.yml") + conda_pip_section("environment-gpu.yml"))
    makefile = (ROOT / "Makefile").read_text()
    assert "--allow-root" in makefile and re.search(r"^lab: \$\(VENV\)/\.deps-lab", makefile, re.M)
