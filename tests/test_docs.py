"""The docs: README.md fits a screen's worth (12 KB), the site builds with ``mkdocs build --strict`` and opens
offline, its API reference covers every public name, every Python code block of README.md and docs/ runs, and
no docstring cites a file the repository does not hold."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from docs_blocks import API_MODULES, ROOT, doc_files, public_names, python_blocks
from test_browser import chromium  # noqa: F401  (the module-scoped browser fixture: Debian's chromium)

README_LIMIT = 12 * 1024
BLOCKS = [b for f in doc_files() for b in python_blocks(f)]
# A block repeated word for word (the README's TRL quickstart is also the TRL guide's) runs once, under its first
# place: the same code in the same empty folder gives the same result.
UNIQUE: dict[str, object] = {}
for _b in BLOCKS:
    UNIQUE.setdefault(_b.code, _b)
RUN_BLOCKS = list(UNIQUE.values())


def test_docs_hold_no_control_characters():
    """A control character in a page is a string escape gone wrong (LaTeX's backslash-f of frac read as a form
    feed, backslash-n of ne as a new line), which breaks the formula and the table row around it."""
    bad = [f"{path.relative_to(ROOT)}:{n}: {line[:60]!r}" for path in doc_files()
           for n, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1)
           if re.search(r"[\x00-\x08\x0b-\x1f\x7f]", line)]
    assert not bad, "control characters in the docs:\n" + "\n".join(bad)


def test_readme_is_at_most_12_kb():
    size = len((ROOT / "README.md").read_bytes())
    assert size <= README_LIMIT, f"README.md is {size} bytes, over {README_LIMIT}: move detail into docs/"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site built strictly into a temporary folder (``make docs`` builds the same into site/)."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    return out


def test_every_public_name_is_in_the_api_reference(site):
    missing = []
    for module, page in API_MODULES.items():
        html = (site / f"{page}.html").read_text(encoding="utf-8")
        ids = set(re.findall(r'id="([\w.]+)"', html))
        for name in public_names(module):
            if not any(i == name or i.endswith(f".{name}") for i in ids):
                missing.append(f"{module}.{name} (page {page})")
    assert not missing, "public names missing from the API reference (add a `::: path` line):\n" + "\n".join(missing)


def test_site_loads_nothing_from_the_network(site):
    """Scripts, styles and fonts all come from the site itself, so it opens offline (file:// or a local server)."""
    remote = []
    for page in site.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        loads = re.findall(r'<(?:script|link|img)[^>]*(?:src|href)="((?:https?:)?//[^"]+)"', text)
        remote += [f"{page.relative_to(site)}: {m}" for m in loads]
    for css in site.rglob("*.css"):
        urls = re.findall(r'url\(["\']?((?:https?:)?//[^)"\']+)', css.read_text(encoding="utf-8"))
        remote += [f"{css.relative_to(site)}: {m}" for m in urls]
    assert not remote, "the site fetches from the network:\n" + "\n".join(remote[:20])
    html = (site / "guides" / "estimator.html").read_text(encoding="utf-8")
    assert 'class="arithmatex"' in html and (site / "assets" / "katex" / "katex.min.js").is_file()
    fonts = list((site / "assets" / "katex" / "fonts").glob("*.woff2"))
    assert fonts, "KaTeX's fonts were not copied into the site"


def test_site_opens_offline_in_a_browser(site, chromium):  # noqa: F811
    """From file://, with the network off: the formulas render (KaTeX), and nothing fails to load."""
    context = chromium.new_context(viewport={"width": 1280, "height": 800}, offline=True)
    failed, errors = [], []
    try:
        page = context.new_page()
        page.on("requestfailed", lambda r: failed.append(r.url))
        page.on("pageerror", lambda e: errors.append(str(e)))
        for path, katex_min in (("index.html", 1), ("guides/estimator.html", 20), ("api/setpo.html", 0)):
            page.goto((site / path).as_uri())
            page.wait_for_load_state("load")
            rendered = page.locator(".katex").count()
            assert rendered >= katex_min, f"{path}: {rendered} formulas rendered, expected at least {katex_min}"
            assert page.locator(".arithmatex .katex-error").count() == 0, f"{path}: KaTeX could not parse a formula"
    finally:
        context.close()
    assert not failed and not errors, f"requests failed: {failed}; page errors: {errors}"


def test_code_blocks_are_collected():
    """The collector sees the README's quickstarts; a marked block carries its reason."""
    readme = [b for b in BLOCKS if b.path.name == "README.md"]
    assert any("SetPOTrainer" in b.code and b.no_run is None for b in readme), "the README's TRL quickstart"
    assert all(b.no_run is None or b.no_run.strip() for b in BLOCKS)


def test_collector_reads_markers_and_skips_bash(tmp_path):
    md = tmp_path / "page.md"
    md.write_text("text\n\n```bash\nmake test\n```\n\n```python\nprint(1)\n```\n\n"
                  "<!-- no-run: needs a GPU -->\n```python\nimport torch; torch.cuda.current_device()\n```\n")
    first, second = python_blocks(md)
    assert (first.line, first.code, first.no_run) == (7, "print(1)\n", None)
    assert (second.line, second.no_run) == (12, "needs a GPU")
    md.write_text("```python\nprint(1)\n")
    with pytest.raises(ValueError, match="never closed"):
        python_blocks(md)


@pytest.mark.parametrize("block", RUN_BLOCKS, ids=[b.name for b in RUN_BLOCKS])
def test_code_block_runs(block, tmp_path):
    """Each block alone, in a fresh process, in an empty folder, with this checkout on PYTHONPATH: what a reader
    who copies it gets."""
    if block.no_run:
        pytest.skip(f"marked no-run: {block.no_run}")
    script = tmp_path / "block.py"
    script.write_text(block.code, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1"}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    took = time.perf_counter() - start
    assert proc.returncode == 0, f"{block.name} exited {proc.returncode} after {took:.0f} s:\n{proc.stderr[-4000:]}"


# A file a docstring names: ALL-CAPS markdown (README.md, PAPERS.md, SOURCE.md) anywhere, or a path that starts
# at one of the repository's own top-level folders. Run outputs (results.md in a run folder) are neither.
_CITED = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[A-Z][A-Z_]+\.md|(?:docs|data|results|figures|notebooks|scripts|tests"
                    r"|benchmarks|setpo_lab|setpo)/[\w./-]+\.\w+)")


def _docstrings(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield getattr(node, "lineno", 1), doc


def test_no_docstring_cites_a_missing_file():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    files = set(tracked.split())
    names = {Path(f).name for f in files}
    bad = []
    for folder in ("setpo", "setpo_lab", "scripts", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for line, doc in _docstrings(path):
                for cited in _CITED.findall(doc):
                    cited = cited.rstrip(".")
                    known = cited in files or (("/" not in cited) and cited in names) or (ROOT / cited).is_dir()
                    if not known:
                        bad.append(f"{path.relative_to(ROOT)}:{line}: {cited}")
    assert not bad, "docstrings cite files the repository does not hold:\n" + "\n".join(bad)
