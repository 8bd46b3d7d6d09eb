"""What tests/test_docs.py checks the docs against: the Python code blocks of README.md and docs/, and the public
names the API reference must cover.

A code block is a fenced ```python block. One that cannot run in a test (it needs a GPU, a server or a model
download) is marked by an HTML comment on the line right before its fence, ``<!-- no-run: needs a GPU -->``; the
reason is reported when the test skips it. Bash blocks are never run.

"Public" is Python's own rule: ``__all__`` where a module defines it, else the names a module defines at its top
level (functions, classes, assignments) that do not start with an underscore. ``setpo.trl`` exports its names
lazily (``setpo.trl._SOURCES``: name -> submodule), so its ``__all__`` is read by importing it.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The packages and modules the API reference covers, each with the API page that documents it.
API_MODULES = {
    "setpo": "api/setpo",
    "setpo.reads": "api/setpo",
    "setpo.losses": "api/setpo",
    "setpo.diagnostics": "api/setpo",
    "setpo.trl": "api/trl",
    "setpo.verl": "api/verl",
    "setpo.setgrpo": "api/setgrpo",
    "setpo.judge": "api/judge",
    "setpo.embed": "api/embed",
    "setpo.envs": "api/envs",
    "setpo.envs.bandit": "api/envs",
    "setpo.envs.countdown": "api/envs",
    "setpo.envs.math": "api/envs",
    "setpo.envs.math_answers": "api/envs",
    "setpo.envs.rubric": "api/envs",
    "setpo.envs.short_answers": "api/envs",
}

_FENCE = re.compile(r"^```(\w*)\s*$")
_NO_RUN = re.compile(r"<!--\s*no-run:\s*(.+?)\s*-->")


@dataclass(frozen=True)
class CodeBlock:
    path: Path     # the markdown file
    line: int      # 1-based line of the opening fence
    code: str
    no_run: str | None  # the reason it is not run, from its marker; None: it runs

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def python_blocks(path: Path) -> list[CodeBlock]:
    """The ```python blocks of one markdown file, in order, each with its no-run reason if marked."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m or not m.group(1):
            i += 1
            continue
        start, lang = i, m.group(1)
        i += 1
        body = []
        while i < len(lines) and lines[i].rstrip() != "```":
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise ValueError(f"{path}:{start + 1}: a ```{lang} block is never closed")
        i += 1
        if lang == "python":
            prev = lines[start - 1] if start > 0 else ""
            marker = _NO_RUN.search(prev)
            blocks.append(CodeBlock(path, start + 1, "\n".join(body) + "\n", marker.group(1) if marker else None))
    return blocks


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def module_file(module: str) -> Path:
    base = ROOT.joinpath(*module.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def _literal_all(tree: ast.Module) -> list[str] | None:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            try:
                return list(ast.literal_eval(node.value))
            except ValueError:
                return None  # computed: read it at run time
    return None


def public_names(module: str) -> list[str]:
    """The public names of ``module`` (see the module docstring), in their order of definition."""
    tree = ast.parse(module_file(module).read_text(encoding="utf-8"))
    names = _literal_all(tree)
    if names is not None:
        return names
    if any(isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)
           for n in tree.body):
        import importlib

        return list(importlib.import_module(module).__all__)
    out = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.append(node.name)
        elif isinstance(node, ast.Assign):
            out += [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.append(node.target.id)
    return [n for n in dict.fromkeys(out) if not n.startswith("_")]
