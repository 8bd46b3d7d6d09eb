"""What made a result: the thread count, the project's code and the packages' versions, as one identity.

A study's run is the same run again only when all four are the same: one and two threads gave SFT weights
differing by up to 0.06 in the Countdown study (another floating-point summation order acts like another
seed), and so does any change in the code it runs, and so do torch's AVX2 and AVX-512 kernels (the
``arithmetic``: torch's CPU capability and the pinned settings of ``setpo.arithmetic``). ``run_identity``
records them; ``identity_differences`` names what differs between two.

"The code" is the source of every project module the study can import (``import_closure``: followed
statically through ``setpo`` and ``envs``, imports inside functions included), each file by its SHA-256.
That, not the git commit, decides: a commit that changes only the README or an unrelated module (verl's
launcher, another study) leaves a 5-hour study resumable, and an uncommitted edit to a module it runs does
not slip through as the same commit. The commit and whether the tree was dirty are recorded beside it, for
the record (``code.commit``, ``code.dirty``), and are not compared.
"""

from __future__ import annotations

import ast
import hashlib
import platform
import subprocess
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROJECT_PACKAGES = ("setpo", "envs")
RESULT_PACKAGES = ("torch", "numpy", "transformers", "trl", "accelerate", "datasets", "tokenizers",
                   "sentence-transformers")


def module_file(name: str, root: Path = ROOT) -> Path | None:
    """The source file of project module ``name`` (a package's ``__init__.py``), or None if there is none."""
    base = root.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


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
    figures from finished results."""
    todo, seen, skip = list(modules), {}, tuple(exclude)
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
    """{"files": {relative path: SHA-256 (16 hex digits)} of ``import_closure(modules, root, exclude)``,
    "commit", "dirty"}."""
    files = {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()[:16]
             for p in import_closure(modules, root, exclude).values()}
    return {"files": dict(sorted(files.items())), **git_state(root)}


def result_versions() -> dict:
    """Versions of the packages whose arithmetic makes a result (missing ones left out)."""
    out = {}
    for name in RESULT_PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


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
    """The floating-point path this process computes on (``setpo.arithmetic.active_arithmetic``): torch's CPU
    capability and the pinned settings. Compared: the same run on AVX2 and on AVX-512 kernels differs."""
    from setpo.arithmetic import active_arithmetic

    return active_arithmetic()


def run_identity(threads: int, modules: Iterable[str], exclude: Iterable[str] = (), root: Path = ROOT) -> dict:
    """The identity of a run made now: {"threads", "arithmetic": ``arithmetic``, "code": ``code_identity``,
    "versions": ``result_versions``, "machine": ``machine`` (recorded, not compared)}."""
    return {"threads": threads, "arithmetic": arithmetic(), "code": code_identity(modules, root, exclude),
            "versions": result_versions(), "machine": machine()}


def identity_differences(saved: Mapping, now: Mapping) -> dict[str, str]:
    """What differs between two identities, by field: "threads", "arithmetic.<setting>", "code" (the files that
    changed, were added or are gone, and both commits), "versions.<package>". Commit, dirtiness and machine alone
    are not a difference."""
    out: dict[str, str] = {}
    if saved.get("threads") != now.get("threads"):
        out["threads"] = f"{saved.get('threads')} then, {now.get('threads')} now"
    for name in sorted(saved.get("arithmetic", {}).keys() | now.get("arithmetic", {}).keys()):
        a, b = saved.get("arithmetic", {}).get(name), now.get("arithmetic", {}).get(name)
        if a != b:
            out[f"arithmetic.{name}"] = f"{a} then, {b} now"
    old, new = saved.get("code", {}).get("files", {}), now.get("code", {}).get("files", {})
    changed = sorted(f for f in old.keys() | new.keys() if old.get(f) != new.get(f))
    if changed:
        shown = ", ".join(changed[:4]) + (f" and {len(changed) - 4} more" if len(changed) > 4 else "")
        commits = [str(c)[:10] if c else "?" for c in (saved.get("code", {}).get("commit"),
                                                      now.get("code", {}).get("commit"))]
        out["code"] = f"{shown} differ (commit {commits[0]} then, {commits[1]} now)"
    for name in sorted(saved.get("versions", {}).keys() | now.get("versions", {}).keys()):
        a, b = saved.get("versions", {}).get(name), now.get("versions", {}).get(name)
        if a != b:
            out[f"versions.{name}"] = f"{a} then, {b} now"
    return out
