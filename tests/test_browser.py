"""The notebooks as a user meets them: JupyterLab in a real browser (Debian's chromium, driven by Playwright) at
a laptop's width, 1280 px with the file browser open.

Every notebook opens with no dialog and nothing marked modified, and its saved outputs hold no error and no
plotly figure wider than its output area; 02 and 05 run to the end (Run All) without an error output and with
every figure inside its output area; moving 02's slider redraws its plot.

JupyterLab runs on its own port, token and Jupyter state in a temp folder, on a temporary copy of notebooks/,
figures/ and results/ (tests/browser_lab.py), so running the notebooks never touches the repository.
Needs `chromium` on PATH (`make test` installs it) and the `test` extra's playwright; never
`playwright install`: the test uses the system browser. A failing check saves a screenshot of the page to
/tmp/setpo-browser-<test>.png and names it.
"""

import json
import re
import shutil
import tempfile
from pathlib import Path

import pytest
from browser_lab import (CODE_CELLS, DIRTY_TAB, DOCUMENT, KERNEL_IDLE, PLOT_WIDTHS, RUN_FINISHED, WIDGET_PLOT_DATA,
                         differences, notebook_json, running_lab)

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p.stem for p in (REPO / "notebooks").glob("*.ipynb"))
WINDOW = {"width": 1280, "height": 900}  # a laptop's browser window; Lab opens with its file browser shown
SETTLE_MS = 3000  # after the kernel is idle: time for late changes (kernel metadata, widgets) to mark the document
RUN_TIMEOUT_MS = 240_000  # Run All of 02 or 05 (measured: 6 s and 17 s of cell time on a free CPU)
SHOTS = Path(tempfile.gettempdir())
STDERR_PROBLEM = re.compile(r"Traceback|\b\w*(Error|Warning)\b")


# Our own Playwright, started and stopped with this module. pytest-playwright's fixtures are session-scoped: its
# sync event loop would stay "running" on the main thread until the whole session ends, and every later test that
# calls asyncio.run (tests/test_verl_cpu.py) would fail with "cannot be called from a running event loop".
@pytest.fixture(scope="module")
def chromium():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as e:
        pytest.fail(f"tests/test_browser.py needs the test extra's playwright (pip install -e '.[test]'; "
                    f"`make test` does): {e}", pytrace=False)
    executable = shutil.which("chromium")
    if executable is None:
        pytest.fail("tests/test_browser.py needs Debian's chromium on PATH: `make test` installs it as root "
                    "(apt-get install chromium); never `playwright install`", pytrace=False)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with running_lab(REPO, tmp_path_factory.mktemp("lab")) as running:
        yield running


@pytest.fixture
def lab_page(chromium, lab):
    """A fresh laptop-sized page, with uncaught page errors collected in ``page.errors``."""
    context = chromium.new_context(viewport=WINDOW)
    page = context.new_page()
    page.errors = []
    page.on("pageerror", lambda err: page.errors.append(str(err)))
    try:
        yield page
    finally:
        context.close()


def open_notebook(page, lab, name):
    page.goto(lab.notebook_url(name))
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=90_000)
    page.wait_for_function(KERNEL_IDLE, timeout=120_000)
    page.wait_for_timeout(SETTLE_MS)


def run_all(page):
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
    page.wait_for_timeout(1000)  # the first cell is queued before the kernel reports busy
    page.wait_for_function(RUN_FINISHED, timeout=RUN_TIMEOUT_MS)


def text_of(value) -> str:
    return "".join(value) if isinstance(value, list) else (value or "")


def output_problems(cells) -> list[str]:
    """Error outputs, and stderr that shows a traceback, an error or a warning."""
    found = []
    for cell in cells:
        for out in cell["outputs"]:
            if out["output_type"] == "error":
                found.append(f"cell {cell['index']}: error output {out.get('ename')}: {out.get('evalue')}")
            elif out["output_type"] == "stream" and out.get("name") == "stderr":
                text = text_of(out.get("text"))
                if STDERR_PROBLEM.search(text):
                    found.append(f"cell {cell['index']}: stderr {text.strip()[:300]!r}")
    return found


def width_problems(page) -> tuple[list[str], int | None]:
    """Plotly figures wider than their output area, and the index of the first (to scroll to it)."""
    found, first = [], None
    for plot in page.evaluate(PLOT_WIDTHS):
        if plot["area"] is None or plot["width"] > plot["area"] + 1:
            first = plot["index"] if first is None else first
            found.append(f"plotly figure {plot['index']} {plot['title'][:60]!r}"
                         f"{' (in a widget)' if plot['in_widget'] else ''}: {plot['width']:.0f} px wide in an "
                         f"output area of {plot['area']} px")
    return found, first


def fail_with_screenshot(page, test, problems, scroll_to_plot=None):
    if scroll_to_plot is not None:
        page.evaluate("(i) => window.jupyterapp.shell.currentWidget.node.querySelectorAll('.js-plotly-plot')[i]"
                      ".scrollIntoView({block: 'center'})", scroll_to_plot)
    shot = SHOTS / f"setpo-browser-{test}.png"
    page.screenshot(path=str(shot))
    pytest.fail(f"{len(problems)} problem(s) (screenshot {shot}):\n  " + "\n  ".join(problems), pytrace=False)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_opens_unmodified_without_dialogs_errors_or_cut_off_figures(name, lab, lab_page):
    page = lab_page
    open_notebook(page, lab, name)
    problems = []
    for dialog in page.locator(".jp-Dialog").all():
        problems.append(f"a dialog is open: {dialog.inner_text()[:200]!r}")
    doc = page.evaluate(DOCUMENT)
    if page.locator(DIRTY_TAB).count() or doc["dirty"]:
        changed = differences(notebook_json(lab.root / "notebooks" / f"{name}.ipynb"), doc["content"])
        problems.append(f"opening marks the notebook modified (tab {DIRTY_TAB}: {page.locator(DIRTY_TAB).count()}, "
                        f"model dirty: {doc['dirty']}); Lab's copy differs from the file in: "
                        + ("; ".join(changed[:8]) or "nothing it would save"))
    problems += output_problems(page.evaluate(CODE_CELLS))
    widths, first_wide = width_problems(page)
    problems += widths + [f"page error: {e}" for e in page.errors]
    if problems:
        fail_with_screenshot(page, f"open-{name}", problems, first_wide)


def check_full_run(page, test):
    """Run All, then: every code cell ran, no error output, every figure inside its output area."""
    run_all(page)
    cells = page.evaluate(CODE_CELLS)
    problems = [f"cell {c['index']} did not run" for c in cells if c["execution_count"] is None]
    problems += output_problems(cells)
    widths, first_wide = width_problems(page)
    problems += widths + [f"page error: {e}" for e in page.errors]
    if problems:
        fail_with_screenshot(page, test, problems, first_wide)


def test_02_runs_and_its_slider_redraws_the_plot(lab, lab_page):
    page = lab_page
    open_notebook(page, lab, "02_estimator_explained")
    check_full_run(page, "run-02")
    handle = page.locator(".widget-slider .noUi-handle")
    readout = page.locator(".widget-slider .widget-readout")
    if handle.count() != 1 or not page.evaluate(WIDGET_PLOT_DATA):
        fail_with_screenshot(page, "slider-02", [f"expected one slider with a plot under it, found "
                                                 f"{handle.count()} slider(s), plots {page.evaluate(WIDGET_PLOT_DATA)!r:.80}"])
    before, angle_before = page.evaluate(WIDGET_PLOT_DATA), readout.inner_text()
    handle.scroll_into_view_if_needed()
    handle.focus()
    for _ in range(3):  # the keyboard moves the slider by its step, as dragging does
        page.keyboard.press("ArrowLeft")
    try:
        page.wait_for_function(f"() => ({WIDGET_PLOT_DATA})().length > 0 && "
                               f"JSON.stringify(({WIDGET_PLOT_DATA})()) !== {json.dumps(json.dumps(before))}", timeout=30_000)
    except Exception:  # playwright's TimeoutError
        fail_with_screenshot(page, "slider-02", [f"moving the slider from {angle_before} to "
                                                 f"{readout.inner_text()} did not change the plot within 30 s"])
    assert readout.inner_text() != angle_before


def test_05_runs(lab, lab_page):
    page = lab_page
    open_notebook(page, lab, "05_setgrpo_noisy_graders")
    check_full_run(page, "run-05")
