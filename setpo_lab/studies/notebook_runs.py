"""Running the notebooks headless: smoke checks into a scratch folder, and ``make figures``, which writes the
committed figures and saves each executed notebook back over ``notebooks/<name>.ipynb`` with its outputs.

Committed notebooks stay small and readable on GitHub: the run sets ``SETPO_STATIC_FIGURES=1``, so
``setpo_lab.studies.figures.show`` puts each figure's PNG twin into the notebook instead of plotly's JavaScript;
what gets written back is the original cells with the new outputs, minus papermill's injected-parameters cell,
timing metadata, stderr streams and widget state; a progress bar (a tqdm widget) becomes one line of text in
its final state, read from the run's widget state (its saved fallback text is the bar at 0%); execution counts
are numbered 1, 2, 3... over the cells that ran. The notebook's metadata is what JupyterLab writes when it opens
and saves it (the kernel's display name and language_info, from the kernel that ran it), and the ``.py`` twin
is written by jupytext as JupyterLab's jupytext extension writes it, so that opening a committed notebook in
``make lab`` finds nothing to change.
"""

from __future__ import annotations

import html
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from setpo_lab.repro.arithmetic import children_environment
from setpo_lab.studies.figures import ROOT, STATIC_ENV

NOTEBOOKS_DIR = ROOT / "notebooks"
SCRATCH_DIR = ROOT / "runs" / "notebooks"
_WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
_WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
_DROPPED_MIME = (_WIDGET_VIEW, "application/vnd.plotly.v1+json")


def _out_dir_param(out_dir: Path) -> str:
    """OUT_DIR as the notebook sees it: relative to notebooks/ when inside the repository (so committed
    outputs name ``../figures/...``, not this machine's paths), absolute otherwise."""
    out_dir = Path(out_dir).resolve()
    return os.path.relpath(out_dir, NOTEBOOKS_DIR) if out_dir.is_relative_to(ROOT) else str(out_dir)


def widget_text(model_id: str, widgets: Mapping) -> str | None:
    """The final state of a progress-bar widget as one line of text, or None when ``model_id`` is not one.

    widgets: the run's widget state (model id -> {"model_name", "state"}), as nbclient saves it. A progress bar
    is a box holding text (``HTMLModel``) and a progress model (tqdm: description, bar, counts and times)."""
    box = widgets.get(model_id, {})
    children = [widgets.get(str(c).removeprefix("IPY_MODEL_"), {}) for c in box.get("state", {}).get("children", [])]
    if not any(c.get("model_name") in ("FloatProgressModel", "IntProgressModel") for c in children):
        return None
    parts = []
    for child in children:
        state = child.get("state", {})
        if child.get("model_name") in ("FloatProgressModel", "IntProgressModel"):
            span = (state.get("max") or 0) - (state.get("min") or 0)
            done = round(10 * ((state.get("value") or 0) - (state.get("min") or 0)) / span) if span > 0 else 0
            parts.append("|" + "█" * max(0, min(done, 10)) + " " * (10 - max(0, min(done, 10))) + "|")
        elif child.get("model_name") == "HTMLModel":
            parts.append(html.unescape(str(state.get("value", ""))).replace("\u2007", " "))
    return "".join(parts).strip() or None


def clean_outputs(cell: dict, widgets: Mapping | None = None) -> list:
    """A code cell's outputs fit to commit: no stderr (warnings), no plotly JS, no widgets: a progress bar becomes
    its final state as text (``widget_text``, from ``widgets``, the run's widget state); any other widget, or a
    bar whose state the run did not keep, is left out (its saved fallback text shows the bar as first drawn)."""
    kept = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream" and out.get("name") == "stderr":
            continue
        data = out.get("data")
        if data is not None and _WIDGET_VIEW in data:
            text = widget_text(str(data[_WIDGET_VIEW].get("model_id")), widgets or {})
            if text is not None:
                kept.append({"output_type": "stream", "name": "stdout", "text": text + "\n"})
            continue
        if data is not None:
            data = {k: v for k, v in data.items() if k not in _DROPPED_MIME}
            if not data:
                continue
            if "image/png" in data or "text/markdown" in data:
                data.pop("text/html", None)  # one representation is enough
            out = {**out, "data": data}
        kept.append(out)
    return kept


def lab_metadata(nb, run) -> None:
    """Give notebook ``nb`` the metadata JupyterLab sets when it opens it with the kernel that made ``run``: the
    kernel's display name (e.g. "Python 3 (ipykernel)") and the kernel's language_info. Without them, opening a
    committed notebook marks it modified at once."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    spec = nb.metadata.get("kernelspec", {})
    try:
        spec["display_name"] = KernelSpecManager().get_kernel_spec(spec.get("name", "python3")).display_name
    except NoSuchKernel:
        pass
    if "language_info" in run.metadata:
        nb.metadata["language_info"] = run.metadata["language_info"]


def write_back(src: Path, executed: Path) -> Path:
    """Copy the outputs of ``executed`` into the cells of ``src`` (matched by cell id), numbered 1, 2, 3... in
    the order they ran, and save ``src`` and its jupytext twin (``src`` with .py) as JupyterLab would."""
    import jupytext
    import nbformat

    nb = nbformat.read(str(src), as_version=4)
    run = nbformat.read(str(executed), as_version=4)
    widgets = run.metadata.get("widgets", {}).get(_WIDGET_STATE, {}).get("state", {})
    outputs = {c.get("id"): c for c in run.cells
               if c.cell_type == "code" and "injected-parameters" not in c.metadata.get("tags", [])}
    count = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        done = outputs.get(cell.get("id"))
        ran = done is not None and done.get("execution_count") is not None
        count += ran
        cell.outputs = [nbformat.from_dict(o) for o in clean_outputs(done, widgets)] if done else []
        cell.execution_count = count if ran else None
        cell.metadata.pop("papermill", None)
        cell.metadata.pop("execution", None)
    nb.metadata.pop("widgets", None)
    nb.metadata.pop("papermill", None)
    lab_metadata(nb, run)
    nbformat.write(nb, str(src))
    if "jupytext" in nb.metadata:  # a paired notebook: its text twin, header included, as jupytext writes it
        jupytext.write(nb, str(src.with_suffix(".py")), fmt="py:percent")
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
    # the kernel inherits this process's environment: static figures, and the clone on its path (the lab is not
    # installed; the kernel runs in notebooks/), whether or not the venv holds make's setpo_lab.pth
    kernel_env = {STATIC_ENV: "1", "PYTHONPATH": os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    t0 = time.time()
    with children_environment(kernel_env):
        # the cells' stdout goes straight to ours: papermill's own log_output goes to a logger that nothing here
        # configures, so a long notebook (04 trains for minutes) would print nothing until it ended
        papermill.execute_notebook(str(src), str(executed), cwd=str(NOTEBOOKS_DIR), progress_bar=False,
                                   stdout_file=sys.stdout if log_output else None,
                                   parameters={"SMOKE": smoke, "OUT_DIR": _out_dir_param(out_dir), **params})
    if save_to_notebook:
        write_back(src, executed)
    if log_output:
        print(f"{name}: {time.time() - t0:.0f} s", flush=True)
    return executed
