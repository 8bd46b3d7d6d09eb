"""Every notebook runs headless in its SMOKE setting and writes its figures, each with an HTML twin and a run
record; the executed notebook can be saved back with small, static outputs (what `make figures` commits).

Each notebook's `parameters` cell defines SMOKE and OUT_DIR; here SMOKE=True and OUT_DIR is a temp dir.
"""

import re
import shutil
from pathlib import Path

import nbformat
import pytest

from setpo_lab.studies.figures import ROOT
from setpo_lab.studies.notebook_runs import execute_notebook, write_back

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


#: jupytext's own version stamp in a .py twin's header: it changes with each jupytext release, not with the notebook
TOOL_STAMP = re.compile(r"^(#\s+jupytext_version:).*$", re.M)


def without_tool_stamp(text: str) -> str:
    """A .py twin with jupytext's version line blanked: what the test compares is the notebook, not which jupytext
    release wrote it (a new release must not turn `make test` red)."""
    return TOOL_STAMP.sub(r"\1 <any>", text)


def lab_display_name(nb) -> str:
    from jupyter_client.kernelspec import KernelSpecManager

    return KernelSpecManager().get_kernel_spec(nb.metadata.kernelspec.name).display_name


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_a_committed_notebook_opens_unmodified_and_shows_what_ran(name):
    """Opening a committed notebook in JupyterLab marked it modified at once (the kernel's display name and
    language_info were not the ones Lab sets), and a save then rewrote the .py twin's header: the committed
    files carry what JupyterLab and jupytext write. Their outputs show what ran: execution counts 1, 2, 3...,
    no progress bar frozen at 0%, no stray return value."""
    import jupytext

    path = ROOT / "notebooks" / f"{name}.ipynb"
    nb = nbformat.read(str(path), as_version=4)
    assert nb.metadata.kernelspec.display_name == lab_display_name(nb)
    assert nb.metadata.get("language_info", {}).get("name") == "python", "Lab adds language_info on open"
    assert without_tool_stamp(jupytext.writes(nb, fmt="py:percent")) == \
        without_tool_stamp(path.with_suffix(".py").read_text()), \
        f"{name}.py is not what jupytext writes on save: run `make figures` (or jupytext --sync)"
    counts = [c.execution_count for c in nb.cells if c.cell_type == "code" and c.execution_count is not None]
    assert counts == list(range(1, len(counts) + 1))
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            text = "".join(out.get("text", "")) + "".join(out.get("data", {}).get("text/plain", ""))
            assert not re.search(r"\b0%\|", text), f"{name}: a progress bar saved at 0%: {text[:80]}"
            assert "PosixPath(" not in text, f"{name}: a stray return value: {text[:80]}"


def test_written_back_notebooks_number_their_cells_and_carry_labs_metadata(tmp_path):
    """``write_back`` without running anything: papermill's injected cell (count 2) is dropped and the rest
    renumbered; the metadata and the .py twin are what JupyterLab would save."""
    import jupytext

    src = nbformat.v4.new_notebook()
    src.metadata.update(kernelspec={"name": "python3", "display_name": "Python 3", "language": "python"},
                        jupytext={"formats": "ipynb,py:percent"})
    src.cells = [nbformat.v4.new_code_cell("SMOKE = False", metadata={"tags": ["parameters"]}),
                 nbformat.v4.new_markdown_cell("text"), nbformat.v4.new_code_cell("1 + 1"),
                 nbformat.v4.new_code_cell("# never ran")]
    run = nbformat.v4.new_notebook(metadata={**src.metadata, "language_info": {"name": "python", "version": "3"},
                                             "papermill": {}})
    injected = nbformat.v4.new_code_cell("SMOKE = True", metadata={"tags": ["injected-parameters"]},
                                         execution_count=2)
    ran = [nbformat.from_dict(c) for c in src.cells]
    ran[0].execution_count, ran[2].execution_count = 1, 3
    ran[2].outputs = [nbformat.v4.new_output("execute_result", {"text/plain": "2"}, execution_count=3)]
    run.cells = [ran[0], injected, *ran[1:]]
    nbformat.write(src, str(tmp_path / "nb.ipynb"))
    nbformat.write(run, str(tmp_path / "run.ipynb"))
    write_back(tmp_path / "nb.ipynb", tmp_path / "run.ipynb")
    saved = nbformat.read(str(tmp_path / "nb.ipynb"), as_version=4)
    assert [c.get("execution_count") for c in saved.cells if c.cell_type == "code"] == [1, 2, None]
    assert saved.cells[2].outputs[0]["data"]["text/plain"] == "2"
    assert saved.metadata.kernelspec.display_name == lab_display_name(saved)
    assert saved.metadata.language_info == {"name": "python", "version": "3"} and "papermill" not in saved.metadata
    assert (tmp_path / "nb.py").read_text() == jupytext.writes(saved, fmt="py:percent")
    assert "jupytext_version" in (tmp_path / "nb.py").read_text()


def test_the_twin_comparison_ignores_only_jupytexts_version_stamp():
    """The version line of another jupytext release compares equal; any other change to the header does not."""
    twin = (ROOT / "notebooks" / f"{NOTEBOOKS[0]}.py").read_text()
    assert TOOL_STAMP.search(twin), "the twin's header has no jupytext_version line to ignore"
    assert without_tool_stamp(TOOL_STAMP.sub(r"\1 99.0.0", twin)) == without_tool_stamp(twin)
    assert without_tool_stamp(twin.replace("format_name: percent", "format_name: light")) != without_tool_stamp(twin)


def test_a_long_notebook_run_streams_its_cells_output(tmp_path, monkeypatch, capsys):
    """``make figures`` runs notebook 04 for minutes: each line a cell prints must reach our stdout as it comes,
    not only in the executed copy at the end."""
    from setpo_lab.studies import notebook_runs

    nb = nbformat.v4.new_notebook()
    nb.metadata.update(kernelspec={"name": "python3", "display_name": "Python 3", "language": "python"})
    nb.cells = [nbformat.v4.new_code_cell("SMOKE = False\nOUT_DIR = None", metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell("print('step 1/2', flush=True)\nprint('step 2/2', flush=True)")]
    nbformat.write(nb, str(tmp_path / "nb.ipynb"))
    monkeypatch.setattr(notebook_runs, "NOTEBOOKS_DIR", tmp_path)
    monkeypatch.setattr(notebook_runs, "SCRATCH_DIR", tmp_path / "runs")
    execute_notebook("nb", tmp_path / "out", log_output=True)
    printed = capsys.readouterr().out
    assert "step 1/2" in printed and "step 2/2" in printed
    execute_notebook("nb", tmp_path / "out")  # without log_output the cells' output stays in the notebook
    assert "step 1/2" not in capsys.readouterr().out


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
    counts = [c.execution_count for c in after.cells if c.cell_type == "code"]
    assert counts == list(range(1, len(counts) + 1))
