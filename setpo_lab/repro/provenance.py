"""What made a result: the thread count, the project's code and the packages' versions, as one identity.

A study's run is the same run again only when all four are the same: one and two threads gave SFT weights
differing by up to 0.06 in the Countdown study (another floating-point summation order acts like another
seed), and so does any change in the code it runs, and so do torch's AVX2 and AVX-512 kernels (the
``arithmetic``: torch's CPU capability and the pinned settings of ``setpo_lab.repro.arithmetic``). ``run_identity``
records them; ``identity_differences`` names what differs between two.

"The code" is every project module the study can import (``import_closure``: followed statically through
``setpo`` and ``setpo_lab``, imports inside functions included), each file by a hash of what it does, not of its
bytes (``code_fingerprint``: the SHA-256 of its syntax tree, docstrings and every other bare string statement
removed). A comment, a docstring or a reformatting leaves it unchanged; a change to what the code does changes
it. That, not the git commit, decides: a commit that changes only the README, a comment or an unrelated module
(verl's launcher, another study) leaves a 5-hour study resumable, and an uncommitted edit to a module it runs
does not slip through as the same commit. The commit and whether the tree was dirty are recorded beside it,
for the record (``code.commit``, ``code.dirty``), and are not compared.

The reproducibility machinery (``setpo_lab.repro``: this module, the pinned arithmetic; and the library's run records,
``setpo.records`` and ``setpo.refusals``) is not part
of any study's code (``MACHINERY``). It computes nothing a result is made of: it records what was made at what,
and its one effect on the arithmetic, the pin, is measured and compared on its own (``arithmetic``). Were it
part of the code, improving how records are kept or checked would make every record unusable.

A recorded ``code`` is compared only when it was hashed this way (``code.hash`` is ``CODE_HASH``); one hashed
any other way counts as differing in every file. A record whose code was re-stamped (``restamped_at``: the
commit whose code its fingerprints are, beside ``commit``, the one that made it) is compared like any other;
docs/reproducibility/index.md says when a record may be re-stamped and how.
"""

from __future__ import annotations

import ast
import hashlib
import platform
import subprocess
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROJECT_PACKAGES = ("setpo", "setpo_lab")
RESULT_PACKAGES = ("torch", "numpy", "transformers", "trl", "accelerate", "datasets", "tokenizers",
                   "sentence-transformers")
CODE_HASH = "syntax"      # code.hash of an identity: files hashed by code_fingerprint (absent: by their bytes)
MACHINERY = ("setpo_lab.repro", "setpo.records", "setpo.refusals")  # never part of a study's code (above)
# Fields of the syntax tree that say nothing about what the code does, or that only newer Pythons write
IGNORED_FIELDS = frozenset({"ctx", "kind", "type_comment", "type_ignores"})


def _is_bare_string(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def _canonical(node) -> str:
    """The tree as text: node types and their fields, without positions; fields that are None or empty are
    left out, so that a field a newer Python adds (``type_params=[]``) changes nothing."""
    if isinstance(node, ast.AST):
        fields = [f"{name}={_canonical(value)}" for name, value in ast.iter_fields(node)
                  if name not in IGNORED_FIELDS and value is not None and not (isinstance(value, list) and not value)]
        return f"{type(node).__name__}({','.join(fields)})"
    if isinstance(node, list):
        return "[" + ",".join(_canonical(v) for v in node) + "]"
    return repr(node)


def code_fingerprint(source: str | bytes) -> str:
    """What a module's code does, as 16 hex digits: the SHA-256 of its syntax tree without docstrings, comments,
    formatting or positions (every bare string statement is dropped: it does nothing). Not Python: a ValueError."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise ValueError(f"not Python source ({e.msg}, line {e.lineno}): cannot hash its code") from None
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            stmts = getattr(node, field, None)
            if isinstance(stmts, list):
                setattr(node, field, [s for s in stmts if not _is_bare_string(s)])
    return hashlib.sha256(_canonical(tree).encode()).hexdigest()[:16]


def module_file(name: str, root: Path = ROOT) -> Path | None:
    """The source file of project module ``name`` (a package's ``__init__.py``), or None if there is none."""
    base = root.joinpath(*name.split("."))
    return next((path for path in (base.with_suffix(".py"), base / "__init__.py") if path.is_file()), None)


def _defines(path: Path) -> set[str]:
    """The names a module defines at its top level (functions, classes, assignments)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def _imports(name: str, path: Path, root: Path) -> set[str]:
    """Project modules ``path`` (module ``name``) imports anywhere in it, and the packages above each. A name
    taken from a package that only exports it lazily (``setpo.trl``'s ``__getattr__``) counts as an import of
    the submodule defining it."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = ".".join(package[: len(package) - node.level + 1] + [node.module or ""]).strip(".") \
                if node.level else (node.module or "")
            found.add(module)
            found.update(f"{module}.{a.name}" for a in node.names)  # the names may be submodules
            init = module_file(module, root) if module.split(".")[0] in PROJECT_PACKAGES else None
            if init is not None and init.name == "__init__.py":
                wanted = {a.name for a in node.names} - _defines(init)
                found.update(f"{module}.{sub.stem}" for sub in init.parent.glob("*.py")
                             if sub.name != "__init__.py" and wanted & _defines(sub))
    parents = {".".join(m.split(".")[:i]) for m in found for i in range(1, m.count(".") + 1)}
    return {m for m in found | parents if m.split(".")[0] in PROJECT_PACKAGES}


def import_closure(modules: Iterable[str], root: Path = ROOT, exclude: Iterable[str] = ()) -> dict[str, Path]:
    """Every project module the given ones can import, directly or not: {module name: source file}.
    exclude: modules (and everything under them) left out and not followed, e.g. those that only draw
    figures from finished results; the machinery (``MACHINERY``) always is."""
    todo, seen, skip = list(modules), {}, (*exclude, *MACHINERY)
    while todo:
        name = todo.pop()
        if name in seen or any(name == e or name.startswith(e + ".") for e in skip):
            continue
        path = module_file(name, root)
        if path is None:
            continue  # a name imported from a module, not a module
        seen[name] = path
        todo.extend(_imports(name, path, root) - set(seen))
    return dict(sorted(seen.items()))


def git_state(root: Path = ROOT) -> dict:
    """{"commit", "dirty"} of the checkout ({"commit": None, "dirty": None} outside git)."""
    try:
        run = lambda *a: subprocess.run(["git", *a], cwd=root, capture_output=True, text=True,  # noqa: E731
                                        check=True, timeout=10).stdout.strip()
        return {"commit": run("rev-parse", "HEAD"), "dirty": run("status", "--porcelain", "--untracked-files=no") != ""}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def code_identity(modules: Iterable[str], root: Path = ROOT, exclude: Iterable[str] = ()) -> dict:
    """{"hash": ``CODE_HASH``, "files": {relative path: ``code_fingerprint``} of ``import_closure(modules, root,
    exclude)``, "commit", "dirty"}."""
    files = {str(p.relative_to(root)): code_fingerprint(p.read_bytes())
             for p in import_closure(modules, root, exclude).values()}
    return {"hash": CODE_HASH, "files": dict(sorted(files.items())), **git_state(root)}


def recorded_code(code: Mapping) -> tuple[dict[str, str], list[str]]:
    """A recorded ``code`` identity as ({path: ``code_fingerprint``}, [paths whose code cannot be compared]): its
    files as they are when hashed by ``CODE_HASH``; otherwise none, every file counted as not comparable."""
    files = dict(code.get("files", {}))
    return (files, []) if code.get("hash") == CODE_HASH else ({}, sorted(files))


def code_changes(saved: Mapping, now: Mapping) -> list[str]:
    """The files whose code differs between two ``code`` identities (by meaning, ``recorded_code``): changed,
    added or gone, sorted."""
    old, lost = recorded_code(saved)
    new = recorded_code(now)[0]
    return sorted(set(lost) | {f for f in old.keys() | new.keys() if old.get(f) != new.get(f)})


def installed_versions(names: Iterable[str]) -> dict[str, str]:
    """{name: installed version} of the packages ``names``, in their order; those not installed are left out."""
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def result_versions() -> dict:
    """Versions of the packages whose arithmetic makes a result (missing ones left out)."""
    return installed_versions(RESULT_PACKAGES)


def machine() -> dict:
    """The processor that made a result, recorded (not compared): when a model trained again elsewhere gives other
    weights, this says whose arithmetic made the first. Virtual machines often name only the vendor ("AMD EPYC"),
    so the vector extensions, a digest of every CPU flag and the cache size are recorded too."""
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    flags = sorted(info.get("flags", "").split())
    return {"cpu": info.get("model name") or platform.processor() or None, "arch": platform.machine(),
            "vector": [f for f in ("avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "amx_tile") if f in flags],
            "flags_sha256": hashlib.sha256(" ".join(flags).encode()).hexdigest()[:16] if flags else None,
            "cache": info.get("cache size")}


def arithmetic() -> dict:
    """The floating-point path this process computes on (``setpo_lab.repro.arithmetic.active_arithmetic``): torch's CPU
    capability and the pinned settings. Compared: the same run on AVX2 and on AVX-512 kernels differs."""
    from setpo_lab.repro.arithmetic import active_arithmetic

    return active_arithmetic()


def run_identity(threads: int, modules: Iterable[str], exclude: Iterable[str] = (), root: Path = ROOT) -> dict:
    """The identity of a run made now: {"threads", "arithmetic": ``arithmetic``, "code": ``code_identity``,
    "versions": ``result_versions``, "machine": ``machine`` (recorded, not compared)}."""
    return {"threads": threads, "arithmetic": arithmetic(), "code": code_identity(modules, root, exclude),
            "versions": result_versions(), "machine": machine()}


def identity_differences(saved: Mapping, now: Mapping) -> dict[str, str]:
    """What differs between two identities, by field: "threads", "arithmetic.<setting>", "code" (the files whose
    code changed, was added or is gone: ``code_changes``, and both commits), "versions.<package>". Commit,
    dirtiness, machine, and edits to comments, docstrings or formatting alone are not a difference."""
    out: dict[str, str] = {}
    if saved.get("threads") != now.get("threads"):
        out["threads"] = f"{saved.get('threads')} then, {now.get('threads')} now"
    out.update(_field_differences("arithmetic", saved, now))
    changed = code_changes(saved.get("code", {}), now.get("code", {}))
    if changed:
        shown = ", ".join(changed[:4]) + (f" and {len(changed) - 4} more" if len(changed) > 4 else "")
        commits = [str(c)[:10] if c else "?" for c in (saved.get("code", {}).get("commit"),
                                                       now.get("code", {}).get("commit"))]
        out["code"] = f"{shown} differ (commit {commits[0]} then, {commits[1]} now)"
    out.update(_field_differences("versions", saved, now))
    return out


def _field_differences(field: str, saved: Mapping, now: Mapping) -> dict[str, str]:
    """The settings of ``field`` (a dict in each identity) that differ: {"<field>.<name>": "<a> then, <b> now"},
    by name."""
    then, current = saved.get(field, {}), now.get(field, {})
    return {f"{field}.{name}": f"{then.get(name)} then, {current.get(name)} now"
            for name in sorted(then.keys() | current.keys()) if then.get(name) != current.get(name)}
