"""A JupyterLab of its own for tests/test_browser.py: a temporary copy of the notebooks and of what they read,
Jupyter's state in a temp folder, a free port on 127.0.0.1 and a random token, started the way `make lab`
starts it (under setpo_lab.repro.arithmetic). Nothing it does reaches the repository or the user's Jupyter settings.

Also the JavaScript the test evaluates in the page. It reads JupyterLab's own model through
``window.jupyterapp`` (the server runs with ``LabApp.expose_app_in_browser``): the current notebook's outputs,
execution counts and kernel status, which the DOM shows only as text.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

#: What the notebooks read or write relative to notebooks/ (../figures, ../results/countdown, ../runs/...).
COPIED_FOLDERS = ("notebooks", "figures", "results")

#: Lab settings of the test's own JupyterLab: no news or update checks (no network; their pop-up would cover
#: the page). Everything else is Lab's default, as a new user has it.
LAB_SETTINGS = {"@jupyterlab/apputils-extension/notification.jupyterlab-settings":
                {"fetchNews": "false", "checkForUpdates": False}}


@dataclass(frozen=True)
class Lab:
    url: str
    token: str
    root: Path  # the temporary copy of the repository's folders; notebooks are served from root / "notebooks"

    def notebook_url(self, name: str) -> str:
        """Opens ``name`` in a fresh workspace (``reset``): no tab left over from another test."""
        return f"{self.url}/lab/tree/{name}.ipynb?reset&token={self.token}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_lab(repo: Path, tmp: Path, start_timeout: float = 120.0):
    """Start JupyterLab on a copy of ``repo``'s notebooks in ``tmp``; yield a ``Lab``; stop it."""
    root = tmp / "repo"
    for folder in COPIED_FOLDERS:
        shutil.copytree(repo / folder, root / folder)
    state = tmp / "jupyter"
    env = {**os.environ,
           "JUPYTER_CONFIG_DIR": str(state / "config"), "JUPYTER_DATA_DIR": str(state / "data"),
           "JUPYTER_RUNTIME_DIR": str(state / "runtime"), "JUPYTERLAB_SETTINGS_DIR": str(state / "settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(state / "workspaces"), "IPYTHONDIR": str(state / "ipython")}
    for rel, values in LAB_SETTINGS.items():
        path = state / "settings" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    port, token = free_port(), secrets.token_hex(16)
    log_path = tmp / "jupyterlab.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "setpo_lab.repro.arithmetic", sys.executable, "-m", "jupyter", "lab", "--no-browser",
             "--ip=127.0.0.1", f"--port={port}", "--ServerApp.port_retries=0",
             f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root / 'notebooks'}",
             "--LabApp.expose_app_in_browser=True", "--allow-root"],
            env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"JupyterLab did not answer within {start_timeout:.0f} s:\n"
                                       f"{log_path.read_text()[-3000:]}") from None
                time.sleep(0.5)
        yield Lab(url, token, root)
    finally:
        proc.terminate()  # the server shuts its kernels down on SIGTERM
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ---- JavaScript evaluated in the page (the current notebook is shell.currentWidget) -----------------------

KERNEL_IDLE = "() => window.jupyterapp.shell.currentWidget?.sessionContext?.kernelDisplayStatus === 'idle'"

#: Run All has finished: the kernel is idle and no cell is queued or running ("[*]").
RUN_FINISHED = """() => {
  const w = window.jupyterapp.shell.currentWidget;
  if (w?.sessionContext?.kernelDisplayStatus !== 'idle') return false;
  return !Array.from(w.node.querySelectorAll('.jp-InputPrompt')).some(p => p.innerText.includes('*'));
}"""

#: Every code cell of the current notebook: its index, execution count and outputs (nbformat JSON).
CODE_CELLS = """() => {
  const cells = Array.from(window.jupyterapp.shell.currentWidget.content.model.cells);
  return cells.map((c, i) => ({index: i, ...c.toJSON()})).filter(c => c.cell_type === 'code')
              .map(c => ({index: c.index, execution_count: c.execution_count, outputs: c.outputs}));
}"""

#: The document as JupyterLab holds it (what it would save), and whether it counts as modified.
DOCUMENT = """() => {
  const w = window.jupyterapp.shell.currentWidget;
  return {dirty: w.context.model.dirty, content: w.context.model.toJSON()};
}"""

#: The tab of a modified document carries JupyterLab's dirty class (the dot in place of the close button).
DIRTY_TAB = ".lm-DockPanel-tabBar .lm-TabBar-tab.jp-mod-dirty"

#: Every plotly figure drawn in the current notebook: its widest part (the div, its plot container, its SVG
#: layers) against the width of the output area it sits in. Each is scrolled into view first, so that a cell
#: JupyterLab skips while off screen is laid out.
PLOT_WIDTHS = """() => {
  const panel = window.jupyterapp.shell.currentWidget.node;
  return Array.from(panel.querySelectorAll('.js-plotly-plot')).map((plot, i) => {
    plot.scrollIntoView({block: 'center'});
    const area = plot.closest('.jp-OutputArea-output');
    const parts = [plot, ...plot.querySelectorAll('.plot-container, .svg-container, .main-svg')];
    const title = plot.querySelector('.gtitle');
    return {index: i, width: Math.max(...parts.map(e => e.getBoundingClientRect().width)),
            area: area ? area.clientWidth : null, title: title ? title.textContent : '',
            in_widget: !!plot.closest('.widget-output')};
  });
}"""

#: The data of the plotly figures inside widget outputs (what the slider redraws).
WIDGET_PLOT_DATA = """() => Array.from(window.jupyterapp.shell.currentWidget.node
    .querySelectorAll('.widget-output .js-plotly-plot')).map(p => JSON.stringify(p.data))"""


def notebook_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def differences(saved: dict, held: dict) -> list[str]:
    """Where the document JupyterLab holds differs from the file it opened, in what marks it modified on open:
    the notebook's metadata (kernelspec, language_info, jupytext), its nbformat version, its cells' ids and
    sources. (Cell metadata and outputs come back from Lab in other spellings, e.g. text as one string, so a
    plain comparison of them would name differences that do not make the document dirty.)"""
    out = []
    for key in sorted(set(saved.get("metadata", {})) | set(held.get("metadata", {}))):
        a, b = saved.get("metadata", {}).get(key), held.get("metadata", {}).get(key)
        if a != b:
            out.append(f"metadata.{key}: file {json.dumps(a)} -> Lab {json.dumps(b)}")
    for key in ("nbformat", "nbformat_minor"):
        if saved.get(key) != held.get(key):
            out.append(f"{key}: file {saved.get(key)} -> Lab {held.get(key)}")
    if len(saved["cells"]) != len(held["cells"]):
        out.append(f"cells: file {len(saved['cells'])} -> Lab {len(held['cells'])}")
    for i, (a, b) in enumerate(zip(saved["cells"], held["cells"], strict=False)):
        if a.get("id") != b.get("id") or "".join(a.get("source") or "") != "".join(b.get("source") or ""):
            out.append(f"cell {i}: id or source differs")
    return out
