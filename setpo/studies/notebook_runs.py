"""Running the notebooks headless: smoke checks into a scratch folder, and ``make figures``, which writes the
committed figures and saves each executed notebook back over ``notebooks/<name>.ipynb`` with its outputs.

Committed notebooks stay small and readable on GitHub: the run sets ``SETPO_STATIC_FIGURES=1``, so
``setpo.studies.figures.show`` puts each figure's PNG twin into the notebook instead of plotly's JavaScript;
what gets written back is the original cells (so the ``.py`` twin stays in sync) with the new outputs, minus
papermill's injected-parameters cell, timing metadata, stderr streams (progress bars) and widget state.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from setpo.studies.figures import ROOT, STATIC_ENV

NOTEBOOKS_DIR = ROOT / "notebooks"
SCRATCH_DIR = ROOT / "runs" / "notebooks"
_DROPPED_MIME = ("application/vnd.jupyter.widget-view+json", "application/vnd.plotly.v1+json")


def _out_dir_param(out_dir: Path) -> str:
    """OUT_DIR as the notebook sees it: relative to notebooks/ when inside the repository (so committed
    outputs name ``../figures/...``, not this machine's paths), absolute otherwise."""
    out_dir = Path(out_dir).resolve()
    try:
        out_dir.relative_to(ROOT)
        return os.path.relpath(out_dir, NOTEBOOKS_DIR)
    except ValueError:
        return str(out_dir)


def clean_outputs(cell: dict) -> list:
    """A code cell's outputs fit to commit: no stderr (progress bars, warnings), no widgets or plotly JS."""
    kept = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream" and out.get("name") == "stderr":
            continue
        data = out.get("data")
        if data is not None:
            data = {k: v for k, v in data.items() if k not in _DROPPED_MIME}
            if not data:
                continue
            if "image/png" in data or "text/markdown" in data:
                data.pop("text/html", None)  # one representation is enough
            out = {**out, "data": data}
        kept.append(out)
    return kept


def write_back(src: Path, executed: Path) -> Path:
    """Copy the outputs of ``executed`` into the cells of ``src`` (matched by cell id) and save ``src``."""
    import nbformat

    nb = nbformat.read(str(src), as_version=4)
    run = nbformat.read(str(executed), as_version=4)
    outputs = {c.get("id"): c for c in run.cells
               if c.cell_type == "code" and "injected-parameters" not in c.metadata.get("tags", [])}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        done = outputs.get(cell.get("id"))
        cell.outputs = [nbformat.from_dict(o) for o in clean_outputs(done)] if done else []
        cell.execution_count = done.get("execution_count") if done else None
        cell.metadata.pop("papermill", None)
        cell.metadata.pop("execution", None)
    nb.metadata.pop("widgets", None)
    nb.metadata.pop("papermill", None)
    nbformat.write(nb, str(src))
    return src


def execute_notebook(name: str, out_dir: Path, smoke: bool = False, save_to_notebook: bool = False,
                     log_output: bool = False, **params) -> Path:
    """Execute ``notebooks/<name>.ipynb`` headless with papermill and return the executed copy.

    out_dir: the notebook's OUT_DIR (always passed explicitly; only ``make figures`` passes figures/).
    smoke: the notebook's SMOKE parameter. The executed copy goes to runs/notebooks/<name>[.smoke].ipynb;
    with ``save_to_notebook`` (``make figures``) its outputs are also written back into notebooks/<name>.ipynb
    (``write_back``). Figures are shown as static PNGs in the executed notebook (``SETPO_STATIC_FIGURES=1``).
    log_output: stream the cells' output to this process's stdout, so a long run shows progress.
    """
    import papermill

    src = NOTEBOOKS_DIR / f"{name}.ipynb"
    if not src.exists():
        raise FileNotFoundError(f"no notebook {src}")
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    executed = SCRATCH_DIR / f"{name}{'.smoke' if smoke else ''}.ipynb"
    executed.parent.mkdir(parents=True, exist_ok=True)
    previous = os.environ.get(STATIC_ENV)
    os.environ[STATIC_ENV] = "1"  # the kernel inherits this process's environment
    t0 = time.time()
    try:
        papermill.execute_notebook(str(src), str(executed), cwd=str(NOTEBOOKS_DIR), progress_bar=False,
                                   log_output=log_output,
                                   parameters={"SMOKE": smoke, "OUT_DIR": _out_dir_param(out_dir), **params})
    finally:
        if previous is None:
            os.environ.pop(STATIC_ENV, None)
        else:
            os.environ[STATIC_ENV] = previous
    if save_to_notebook:
        write_back(src, executed)
    if log_output:
        print(f"{name}: {time.time() - t0:.0f} s", flush=True)
    return executed
