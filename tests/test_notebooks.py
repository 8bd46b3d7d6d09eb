"""Every notebook runs headless in its SMOKE setting and writes its figures.

Each notebook's `parameters` cell defines SMOKE and OUT_DIR; here SMOKE=True and OUT_DIR is a temp dir.
"""

from pathlib import Path

import pytest

from setpo.cli import ROOT, run_notebook

NOTEBOOKS = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))


def test_every_notebook_has_a_py_twin():
    assert NOTEBOOKS, "no notebooks found"
    for name in NOTEBOOKS:
        assert (ROOT / "notebooks" / f"{name}.py").exists(), f"{name}.ipynb has no .py twin"


@pytest.mark.slow
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_in_smoke_mode(name, tmp_path):
    run_notebook(name, tmp_path, smoke=True)
    written = [p for p in Path(tmp_path).iterdir() if p.name != "plotly.min.js"]
    assert written, f"{name} wrote no figure into OUT_DIR"
    for p in written:
        assert p.stat().st_size > 0
