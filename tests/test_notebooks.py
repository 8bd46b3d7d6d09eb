"""Every notebook runs headless in its SMOKE setting and writes its figures, each with an HTML twin and a run
record; the executed notebook can be saved back with small, static outputs (what `make figures` commits).

Each notebook's `parameters` cell defines SMOKE and OUT_DIR; here SMOKE=True and OUT_DIR is a temp dir.
"""

import re
import shutil
from pathlib import Path

import nbformat
import pytest

from setpo.studies.figures import ROOT
from setpo.studies.notebook_runs import execute_notebook, write_back

NOTEBOOKS = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))


def test_every_notebook_has_a_py_twin_and_writes_to_scratch_by_default():
    assert NOTEBOOKS, "no notebooks found"
    for name in NOTEBOOKS:
        py = ROOT / "notebooks" / f"{name}.py"
        assert py.exists(), f"{name}.ipynb has no .py twin"
        out_dir = re.search(r'^OUT_DIR = "([^"]+)"', py.read_text(), re.M)
        assert out_dir and "figures" not in out_dir.group(1), f"{name}: OUT_DIR must default to a scratch folder"


def test_lab_opens_only_the_ipynb_as_notebooks():
    config = (ROOT / "notebooks" / "jupytext.toml").read_text()
    assert 'notebook_extensions = ["ipynb"]' in config


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """run(name) executes a notebook in smoke mode once per module and returns (its OUT_DIR, the executed copy);
    a second test of the same notebook reuses that run."""
    runs = {}

    def run(name):
        if name not in runs:
            out_dir = tmp_path_factory.mktemp(name)
            runs[name] = out_dir, execute_notebook(name, out_dir, smoke=True)
        return runs[name]

    return run


@pytest.mark.slow
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_in_smoke_mode(name, smoke_run):
    out_dir, executed = smoke_run(name)
    written = [p for p in Path(out_dir).iterdir() if p.name != "plotly.min.js"]
    assert written, f"{name} wrote no figure into OUT_DIR"
    for p in written:
        assert p.stat().st_size > 0
        if p.suffix in (".png", ".md"):
            assert p.with_suffix(".json").exists(), f"{p.name} has no run record"
        if p.suffix == ".png":
            assert p.with_suffix(".html").exists(), f"{p.name} has no interactive twin"
    nb = nbformat.read(str(executed), as_version=4)
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            assert "application/vnd.plotly.v1+json" not in out.get("data", {}), "figures must show as static PNGs"


@pytest.mark.slow
def test_saved_back_notebook_keeps_its_cells_and_small_outputs(tmp_path, smoke_run):
    name = "02_estimator_explained"
    src = tmp_path / f"{name}.ipynb"
    shutil.copy(ROOT / "notebooks" / f"{name}.ipynb", src)
    _, executed = smoke_run(name)  # the smoke test's run of the same notebook
    write_back(src, executed)
    before = nbformat.read(str(ROOT / "notebooks" / f"{name}.ipynb"), as_version=4)
    after = nbformat.read(str(src), as_version=4)
    assert [c.source for c in after.cells] == [c.source for c in before.cells]  # the .py twin stays in sync
    images = [o for c in after.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) == 3 and src.stat().st_size < 1_000_000
    assert "papermill" not in after.metadata and not any("injected-parameters" in c.metadata.get("tags", [])
                                                         for c in after.cells)
