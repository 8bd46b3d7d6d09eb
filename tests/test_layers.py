"""The package's layers, checked from the code's own imports: each layer depends only on the ones below.

The library (``setpo/``, what the wheel installs):
    setpo/envs/           environments and checkers: nothing of setpo outside setpo.envs
    setpo/ (top level)    the estimator core: pure functions over tensors. It imports only the standard library's
                          computing modules, torch, numpy and itself (``CORE_MAY_IMPORT``): no engine, no
                          environment, no upper layer, and nothing that touches a process, git or the file system (no
                          os, sys, subprocess, pathlib, shutil, ...; no open(), print(), eval(); no
                          Path.read_text / write_*, torch.save / load and the like: ``CORE_MAY_NOT_CALL``)
    setpo/records.py, setpo/refusals.py   what runs write and how a bad file is refused: the core only
    setpo/trl, setpo/verl engine adapters (with setpo/verl_plugin.py, setpo/embed.py, setpo/judge and setpo/models):
                          may use the core, the records and setpo.envs
    setpo/cli.py          the installed ``setpo`` command: the adapters' command lines
and no file under setpo/ imports the lab (imports inside functions included): the wheel does not hold it.

The lab (``setpo_lab/``, in a clone only):
    setpo_lab/repro       the reproducibility machinery (provenance, the pinned arithmetic, two study folders
                          compared bit for bit, a commit's code in a temporary worktree): may use the core and the
                          records; never an adapter, setpo.envs, a study or a command line
    setpo_lab/studies     whole studies: anything above, never the lab's command line
    setpo_lab/cli.py      the lab's command line: anything

A package's ``__main__`` (``python -m setpo.judge``, ``python -m setpo.verl``) sits in its package's layer: the
judge's command line is an adapter's (the argument helpers every command shares are ``setpo.envs.arguments``, the
lowest layer, which everything may import).

Which top-level modules are not core, and why (the rule: a top-level module is core unless it is named here):
- setpo/cli.py is the installed command line (it dispatches to the adapters').
- setpo/records.py and setpo/refusals.py read and write files (run records, refusals of a bad file).
- setpo/verl_plugin.py is verl's entry point (``verl.plugins``): at the top so that verl can load it while
  ``import verl`` runs, but an engine adapter.
- setpo/embed.py turns text into embeddings with sentence-transformers models it loads from folders: an adapter
  at the top because ``setpo.embed.load_embedder`` is a public import path.
- setpo/judge talks to a judge server or an in-process model and keeps a file cache: an adapter package
  (its __main__ included).

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
LONGER_FOR_A_REASON: dict[str, tuple[int, str]] = {
}


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


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


def files(*patterns: str) -> list[Path]:
    return sorted({p for pat in patterns for p in ROOT.glob(pat)})


# The layers (module docstring). Top-level modules that are not core are named; every other one is core.
COMMAND_LINES = files("setpo/cli.py", "setpo_lab/cli.py")
NOT_CORE_AT_TOP = {"setpo/cli.py": "command line", "setpo/records.py": "run records (files)",
                   "setpo/refusals.py": "refusals of bad files", "setpo/verl_plugin.py": "verl's entry point (adapter)",
                   "setpo/embed.py": "loads sentence-transformers models from folders (adapter)"}
ENGINE_ADAPTERS = [p for p in files("setpo/trl/*.py", "setpo/verl/*.py", "setpo/verl_plugin.py", "setpo/embed.py",
                                    "setpo/judge/*.py", "setpo/models/*.py") if p not in COMMAND_LINES]
CORE = [p for p in files("setpo/*.py", "setpo/setgrpo/*.py") if _rel(p) not in NOT_CORE_AT_TOP]
MACHINERY = files("setpo_lab/repro/*.py")
RECORDS = files("setpo/records.py", "setpo/refusals.py")
LIBRARY = files("setpo/**/*.py")
STUDIES = files("setpo_lab/studies/*.py")
ENVS = files("setpo/envs/**/*.py")


@pytest.mark.parametrize("path", ENVS, ids=_rel)
def test_envs_know_nothing_of_setpo(path):
    bad = {m for m in imported_modules(path) if m.split(".")[0] in ("setpo", "setpo_lab")
           and not (m == "setpo.envs" or m.startswith("setpo.envs."))}
    assert not bad, f"{_rel(path)} imports {sorted(bad)}: environments must not depend on the rest of the library"


@pytest.mark.parametrize("path", LIBRARY, ids=_rel)
def test_the_library_never_imports_the_lab(path):
    bad = {m for m in imported_modules(path) if m.split(".")[0] == "setpo_lab"}
    assert not bad, f"{_rel(path)} imports {sorted(bad)}: the wheel holds no setpo_lab (the lab lives in a clone)"


# What the core may import: computing, nothing that reaches a process, git or the file system. A module added
# here needs a reason (written beside it) that it cannot touch any of those.
CORE_MAY_IMPORT = {"__future__", "abc", "collections", "collections.abc", "dataclasses", "enum", "functools",
                   "itertools", "math", "numbers", "operator", "re", "statistics", "typing", "warnings",
                   "numpy", "torch"}
# Calls that touch the file system or the process, by name (builtins) or by attribute (methods, torch's and numpy's
# file functions); the core computes on what it is given and returns it.
NOT_CORE_PACKAGES = {"envs", "records", "refusals", "trl", "verl", "verl_plugin", "cli", "judge", "embed",
                     "models"}  # setpo.<these>
CORE_MAY_NOT_CALL = {"open", "print", "input", "eval", "exec", "compile", "__import__", "breakpoint", "exit", "quit"}
CORE_MAY_NOT_CALL_ATTRIBUTE = {"read_text", "write_text", "read_bytes", "write_bytes", "open", "mkdir", "makedirs",
                               "unlink", "rmdir", "iterdir", "glob", "rglob", "touch", "is_file", "is_dir", "exists",
                               "save", "load", "savez", "savetxt", "loadtxt", "genfromtxt", "fromfile", "tofile",
                               "from_file", "system", "popen", "spawn", "fork", "kill", "hub"}


def core_violations(tree: ast.AST, name: str = "setpo") -> list[str]:
    """What in a core module's syntax tree reaches beyond computing: imports outside ``CORE_MAY_IMPORT`` (the core's
    own modules aside) and calls in ``CORE_MAY_NOT_CALL`` / ``CORE_MAY_NOT_CALL_ATTRIBUTE``, each with its line."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if not node.level else [])
            for mod in mods:
                parts = mod.split(".")
                core_own = parts[0] == "setpo" and (len(parts) == 1 or parts[1] not in NOT_CORE_PACKAGES)
                if mod not in CORE_MAY_IMPORT and not core_own:
                    out.append(f"line {node.lineno}: imports {mod}")
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id in CORE_MAY_NOT_CALL:
                out.append(f"line {node.lineno}: calls {f.id}()")
            elif isinstance(f, ast.Attribute) and f.attr in CORE_MAY_NOT_CALL_ATTRIBUTE:
                out.append(f"line {node.lineno}: calls .{f.attr}()")
        elif isinstance(node, ast.Attribute) and node.attr in ("hub",):
            out.append(f"line {node.lineno}: uses .{node.attr}")
    return out


@pytest.mark.parametrize("path", CORE, ids=_rel)
def test_core_imports_no_engine_no_envs_no_upper_layer(path):
    mods = imported_modules(path)
    bad = {m for m in mods if m.split(".")[0] in ENGINES | {"setpo_lab"}}
    bad |= {m for m in mods if m.startswith(("setpo.envs", "setpo.records", "setpo.refusals", "setpo.trl", "setpo.verl",
                                             "setpo.cli", "setpo.judge", "setpo.embed", "setpo.models"))}
    assert not bad, f"{_rel(path)} (estimator core) imports {sorted(bad)}"


@pytest.mark.parametrize("path", CORE, ids=_rel)
def test_core_touches_no_process_git_or_file_system(path):
    bad = core_violations(ast.parse(path.read_text(), filename=str(path)))
    assert not bad, f"{_rel(path)} (estimator core: pure functions) {'; '.join(bad)}: move it to setpo_lab.repro or up"


@pytest.mark.parametrize("source, found", [
    ("import os", "imports os"), ("from pathlib import Path", "imports pathlib"),
    ("import subprocess as sp", "imports subprocess"), ("from setpo.records import write_json", "imports setpo.records"),
    ("def f(p):\n    return p.read_text()", "calls .read_text()"), ("open('x')", "calls open()"),
    ("import torch\ntorch.save({}, 'x')", "calls .save()"), ("print(1)", "calls print()"),
    ("import torch\ntorch.hub", "uses .hub")])
def test_the_purity_check_sees_what_it_forbids(source, found):
    assert any(found in v for v in core_violations(ast.parse(source))), core_violations(ast.parse(source))
    assert not core_violations(ast.parse("import math, torch\nfrom setpo.groups import Groups\nx = torch.ones(3).sum()"))


@pytest.mark.parametrize("path", MACHINERY, ids=_rel)
def test_the_machinery_sits_above_the_core_and_below_adapters_and_studies(path):
    bad = {m for m in imported_modules(path) if m.split(".")[0] in ENGINES
           or m.startswith(("setpo.envs", "setpo.trl", "setpo.verl", "setpo.cli", "setpo.judge", "setpo.embed",
                            "setpo.models", "setpo_lab.studies", "setpo_lab.cli"))}
    assert not bad, f"{_rel(path)} (reproducibility machinery) imports {sorted(bad)}"


@pytest.mark.parametrize("path", RECORDS, ids=_rel)
def test_records_use_only_the_core(path):
    bad = {m for m in imported_modules(path) if m.split(".")[0] in ENGINES | {"setpo_lab"}
           or m.startswith(("setpo.envs", "setpo.trl", "setpo.verl", "setpo.cli", "setpo.judge", "setpo.embed",
                            "setpo.models"))}
    assert not bad, f"{_rel(path)} (run records) imports {sorted(bad)}"


@pytest.mark.parametrize("path", ENGINE_ADAPTERS, ids=_rel)
def test_engine_adapters_do_not_reach_up(path):
    bad = {m for m in imported_modules(path) if m.startswith(("setpo_lab", "setpo.cli"))}
    assert not bad, f"{_rel(path)} (engine adapter) imports {sorted(bad)}"


@pytest.mark.parametrize("path", STUDIES, ids=_rel)
def test_studies_do_not_import_the_cli(path):
    assert not {m for m in imported_modules(path) if m.startswith("setpo_lab.cli")}


@pytest.mark.parametrize("path", CORE + RECORDS + MACHINERY + ENGINE_ADAPTERS + STUDIES + COMMAND_LINES + ENVS + files("scripts/**/*.py"), ids=_rel)
def test_modules_are_readable_in_one_sitting(path):
    n = len(path.read_text().splitlines())
    limit = LONGER_FOR_A_REASON.get(_rel(path), (MAX_LINES,))[0]
    assert n <= limit, f"{_rel(path)} has {n} lines; split it by job"


def test_every_layer_is_found():
    # the checks above pass trivially on an empty list: make sure the globs still see the tree
    assert len(CORE) >= 8 and len(MACHINERY) >= 4 and len(ENGINE_ADAPTERS) >= 6 and len(STUDIES) >= 6 and len(ENVS) >= 6
    assert len(RECORDS) == 2 and len(COMMAND_LINES) == 2
    top = {_rel(p) for p in files("setpo/*.py")}
    assert set(NOT_CORE_AT_TOP) <= top, "a module named as not core is gone: update NOT_CORE_AT_TOP"
    assert {"setpo/diversity.py", "setpo/advantages.py"} <= {_rel(p) for p in CORE}


def test_importing_the_core_loads_no_engine():
    import subprocess
    import sys

    code = ("import sys, setpo, setpo.setgrpo, setpo.embed, setpo.records, setpo.refusals, setpo_lab.repro.provenance, "
            "setpo_lab.repro.arithmetic, setpo_lab.repro.at_commit, setpo.judge, setpo.cli; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in %r or m.startswith('setpo.envs')))" % (ENGINES,))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stdout


# ------------------------------------------------------------------------------------------- the import graph

PACKAGE_FILES = files("setpo/**/*.py", "setpo_lab/**/*.py")


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


@pytest.mark.parametrize("path", PACKAGE_FILES + files("benchmarks/*.py", "scripts/**/*.py", "tests/*.py"), ids=_rel)
def test_no_module_imports_another_modules_private_names(path):
    private = imports_of(path)[2]
    assert not private, f"{_rel(path)} imports underscore names {private}: make them public (documented) instead"


def test_the_one_line_error_parser_is_defined_once():
    """Every command's parser is ``setpo.envs.arguments.Parser``: no module keeps a copy of it."""
    subclasses = sorted({_rel(p) for p in files("setpo/**/*.py", "setpo_lab/**/*.py", "scripts/**/*.py", "benchmarks/*.py")
                         for node in ast.walk(ast.parse(p.read_text(), filename=str(p)))
                         if isinstance(node, ast.ClassDef)
                         and any(ast.unparse(base).endswith("ArgumentParser") for base in node.bases)})
    assert subclasses == ["setpo/envs/arguments.py"]
