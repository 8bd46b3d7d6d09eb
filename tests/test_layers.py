"""The package's layers, checked from the code's own imports: each layer depends only on the ones below.

    envs/                 environments and checkers: never import setpo
    setpo/ (top level)    the estimator core: no engine (trl, transformers, verl, accelerate, ...) and no envs
    setpo/trl, setpo/verl engine adapters: may use the core and envs, never the studies or the CLI
    setpo/studies         whole studies: anything below, never the CLI
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENGINES = {"trl", "transformers", "verl", "accelerate", "datasets", "vllm", "ray", "tokenizers", "peft"}
MAX_LINES = 600  # a module you can read in one sitting; a longer one needs a reason (none does today)


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at top level or inside functions (absolute names)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def files(*patterns: str) -> list[Path]:
    return sorted({p for pat in patterns for p in ROOT.glob(pat)})


CORE = [p for p in files("setpo/*.py", "setpo/setgrpo/*.py") if p.name != "cli.py"]
ENGINE_ADAPTERS = files("setpo/trl/*.py", "setpo/verl/*.py")
STUDIES = files("setpo/studies/*.py")
ENVS = files("envs/**/*.py")


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


@pytest.mark.parametrize("path", ENVS, ids=_rel)
def test_envs_know_nothing_of_setpo(path):
    bad = {m for m in imported_modules(path) if m.split(".")[0] == "setpo"}
    assert not bad, f"{_rel(path)} imports {sorted(bad)}: environments must not depend on the library"


@pytest.mark.parametrize("path", CORE, ids=_rel)
def test_core_imports_no_engine_no_envs_no_upper_layer(path):
    mods = imported_modules(path)
    bad = {m for m in mods if m.split(".")[0] in ENGINES | {"envs"}}
    bad |= {m for m in mods if m.startswith(("setpo.trl", "setpo.verl", "setpo.studies", "setpo.cli"))}
    assert not bad, f"{_rel(path)} (estimator core) imports {sorted(bad)}"


@pytest.mark.parametrize("path", ENGINE_ADAPTERS, ids=_rel)
def test_engine_adapters_do_not_reach_up(path):
    bad = {m for m in imported_modules(path) if m.startswith(("setpo.studies", "setpo.cli"))}
    assert not bad, f"{_rel(path)} (engine adapter) imports {sorted(bad)}"


@pytest.mark.parametrize("path", STUDIES, ids=_rel)
def test_studies_do_not_import_the_cli(path):
    assert not {m for m in imported_modules(path) if m.startswith("setpo.cli")}


@pytest.mark.parametrize("path", CORE + ENGINE_ADAPTERS + STUDIES + ENVS, ids=_rel)
def test_modules_are_readable_in_one_sitting(path):
    n = len(path.read_text().splitlines())
    assert n <= MAX_LINES, f"{_rel(path)} has {n} lines; split it by job"


def test_every_layer_is_found():
    # the checks above pass trivially on an empty list: make sure the globs still see the tree
    assert len(CORE) >= 8 and len(ENGINE_ADAPTERS) >= 6 and len(STUDIES) >= 6 and len(ENVS) >= 6


def test_importing_the_core_loads_no_engine():
    import subprocess
    import sys

    code = ("import sys, setpo, setpo.setgrpo, setpo.embed, setpo.records; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in %r or m.startswith('envs')))" % (ENGINES,))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stdout
