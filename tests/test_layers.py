"""The package's layers, checked from the code's own imports: each layer depends only on the ones below.

    envs/                 environments and checkers: never import setpo
    setpo/ (top level)    the estimator core: no engine (trl, transformers, verl, accelerate, ...) and no envs
    setpo/trl, setpo/verl engine adapters: may use the core and envs, never the studies or the CLI
    setpo/studies         whole studies: anything below, never the CLI

and, across all of them: no import circle (imports inside functions count: they only delay one), no relative
import that names a module which does not exist, and no module importing another module's underscore names
(what other modules need is public, with its shapes documented).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENGINES = {"trl", "transformers", "verl", "accelerate", "datasets", "vllm", "ray", "tokenizers", "peft", "openai"}
MAX_LINES = 600  # a module you can read in one sitting; a longer one needs a reason, written here
# {module: (its current length at most, the reason)}. A longer module fails again the moment it grows.
LONGER_FOR_A_REASON: dict[str, tuple[int, str]] = {}


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


# setpo/verl_plugin.py is verl's entry point (``verl.plugins``): it sits at the top so that verl can load it while
# ``import verl`` runs (setpo/verl/__init__ imports verl's trainer), but it is an engine adapter. The judge's
# client and in-process backend talk to openai / transformers: adapters inside the core's setpo.judge package.
# The command lines (setpo.cli, python -m setpo.judge) are the top layer: they may import anything.
COMMAND_LINES = files("setpo/cli.py", "setpo/judge/__main__.py")
JUDGE_ADAPTERS = files("setpo/judge/client.py", "setpo/judge/backends.py")
# setpo.models turns a packaged model file into a transformers model folder: an adapter over transformers.
ENGINE_ADAPTERS = (files("setpo/trl/*.py", "setpo/verl/*.py", "setpo/verl_plugin.py", "setpo/models/*.py")
                   + JUDGE_ADAPTERS)
CORE = [p for p in files("setpo/*.py", "setpo/setgrpo/*.py", "setpo/judge/*.py")
        if p not in ENGINE_ADAPTERS and p not in COMMAND_LINES]
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
    limit = LONGER_FOR_A_REASON.get(_rel(path), (MAX_LINES,))[0]
    assert n <= limit, f"{_rel(path)} has {n} lines; split it by job"


def test_every_layer_is_found():
    # the checks above pass trivially on an empty list: make sure the globs still see the tree
    assert len(CORE) >= 8 and len(ENGINE_ADAPTERS) >= 6 and len(STUDIES) >= 6 and len(ENVS) >= 6


def test_importing_the_core_loads_no_engine():
    import subprocess
    import sys

    code = ("import sys, setpo, setpo.setgrpo, setpo.embed, setpo.records, setpo.judge; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in %r or m.startswith('envs')))" % (ENGINES,))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stdout


# ------------------------------------------------------------------------------------------- the import graph

PACKAGE_FILES = files("setpo/**/*.py", "envs/**/*.py")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE_FILES}


def imports_of(path: Path) -> tuple[set[str], list[str], list[tuple[str, str]]]:
    """(project modules this file imports, at any depth; relative imports that name no module; (module,
    name) pairs of underscore names it imports from other project modules)."""
    name = module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    targets: set[str] = set()
    unresolved: list[str] = []
    private: list[tuple[str, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets.update(a.name for a in node.names if a.name in MODULES)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
                if module not in MODULES:
                    unresolved.append(f"line {node.lineno}: from {'.' * node.level}{node.module or ''} import ...")
                    continue
            else:
                module = node.module or ""
            for alias in node.names:
                if f"{module}.{alias.name}" in MODULES:      # a submodule: the edge goes to it
                    targets.add(f"{module}.{alias.name}")
                elif module in MODULES:
                    targets.add(module)
                    if alias.name.startswith("_") and module != name:
                        private.append((module, alias.name))
    return targets, unresolved, private


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (or a module importing itself)."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm; the graph has a few hundred nodes
        order[v] = low[v] = len(order)
        stack.append(v)
        for w in graph[v]:
            if w not in order:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph[v]:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in order:
            visit(v)
    return circles


def test_no_import_circle():
    graph = {m: imports_of(p)[0] for m, p in MODULES.items()}
    assert not import_circles(graph), f"import circles (function-level imports count): {import_circles(graph)}"


def test_the_circle_check_sees_a_circle():
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_circles({"a": {"a"}}) == [["a"]]
    assert import_circles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("path", PACKAGE_FILES, ids=_rel)
def test_relative_imports_resolve(path):
    unresolved = imports_of(path)[1]
    assert not unresolved, f"{_rel(path)}: relative imports of no module: {unresolved}"


@pytest.mark.parametrize("path", PACKAGE_FILES + files("benchmarks/*.py", "scripts/*.py", "tests/*.py"), ids=_rel)
def test_no_module_imports_another_modules_private_names(path):
    private = imports_of(path)[2]
    assert not private, f"{_rel(path)} imports underscore names {private}: make them public (documented) instead"
