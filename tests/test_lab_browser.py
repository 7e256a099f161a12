"""The chapters live in JupyterLab, as a reader runs them (headless Chromium).

JupyterLab starts as ``make lab`` starts it (lab/ as Jupyter's config folder, the pinned
JupyterLab with jupyterlab-myst), on 127.0.0.1 with a random port and token, serving a copy of
book/ so that nothing is written into the chapters, with fresh user settings and workspaces.
Every chapter with a live slider (found by scanning the notebooks for ``live_slider``) is
opened and run with Run All Cells. Then: no cell has an error output; moving each slider
redraws its figure; the markdown shows no raw MyST and every ``{eval}`` name shows the value
the kernel computed; the saved notebook keeps its widget state, and reopened it shows the
widgets or the hint to run the cells, never "model not found". Every wait is bounded.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import json5
import pytest
from chromium import launch
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from playwright.sync_api import sync_playwright

from ropelib.viz.sliders import LIVE_HINT

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
RAW_MYST = ("{glue", "{eval", ":::{", "```{", "{cite}", "{numref}", "{doc}")
EVAL = re.compile(r"\{eval\}`([^`]+)`")
START_S, OPEN_S, RUN_S, REDRAW_S = 120, 120, 300, 60


def live_chapters() -> list[str]:
    """Chapters whose code calls ``live_slider``."""
    names = []
    for path in sorted((ROOT / "book").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        if any(c["cell_type"] == "code" and "live_slider(" in "".join(c["source"])
               for c in cells):
            names.append(path.name)
    return names


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """(base URL, token, served folder) of a JupyterLab started like ``make lab``."""
    work = tmp_path_factory.mktemp("lab")
    served = work / "book"
    shutil.copytree(ROOT / "book", served,
                    ignore=shutil.ignore_patterns("_build", ".ipynb_checkpoints", "__pycache__"))
    port, token = free_port(), secrets.token_hex(16)
    log = (work / "lab.log").open("w")
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(ROOT / "lab"),
               JUPYTER_RUNTIME_DIR=str(work / "runtime"))
    server = subprocess.Popen(
        [str(BIN / "jupyter"), "lab", f"--ServerApp.root_dir={served}",
         f"--LabApp.user_settings_dir={work / 'user-settings'}",
         f"--LabApp.workspaces_dir={work / 'workspaces'}", "--ServerApp.ip=127.0.0.1",
         f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
         f"--IdentityProvider.token={token}", "--ServerApp.open_browser=False",
         "--LabApp.expose_app_in_browser=True"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_S
        while True:
            assert server.poll() is None, f"JupyterLab exited: {(work / 'lab.log').read_text()}"
            request = urllib.request.Request(f"{base}/api/status",
                                             headers={"Authorization": f"token {token}"})
            try:
                urllib.request.urlopen(request, timeout=5)
                break
            except OSError:
                assert time.monotonic() < deadline, f"JupyterLab did not answer in {START_S} s"
                time.sleep(0.5)
        yield base, token, served
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)
        log.close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    with sync_playwright() as p:
        context = launch(p, str(tmp_path_factory.mktemp("chromium-profile")))
        context.set_default_timeout(REDRAW_S * 1000)
        yield context
        context.close()


PANEL = "jupyterapp.shell.currentWidget"
KERNEL_IDLE = (f"() => window.jupyterapp && {PANEL} && {PANEL}.context && "
               f"{PANEL}.context.path === %s && {PANEL}.sessionContext.session && "
               f"{PANEL}.sessionContext.session.kernel && "
               f"{PANEL}.sessionContext.session.kernel.status === 'idle'")
# The code cells' state: cells not run yet, cells queued or running, error outputs.
RUN_STATE = f"""() => {{
  const panel = {PANEL}, model = panel.content.model;
  const state = {{unrun: 0, errors: [], busy: panel.sessionContext.session.kernel.status
                  !== 'idle' || panel.content.widgets.some(w => w.model.type === 'code'
                  && w.promptNode && w.promptNode.textContent.includes('*'))}};
  for (let i = 0; i < model.cells.length; i++) {{
    const cell = model.cells.get(i), json = cell.toJSON();
    if (cell.type !== 'code' || !cell.sharedModel.getSource().trim()) continue;
    if (cell.executionCount === null) state.unrun += 1;
    for (const out of json.outputs)
      if (out.output_type === 'error') state.errors.push(`cell ${{i}}: ${{out.ename}}: `
                                                          + out.evalue);
  }}
  return state;
}}"""
MARKDOWN = f"""() => {PANEL}.content.widgets.map((w, i) => w.model.type !== 'markdown' ? null
  : {{index: i, rendered: w.node.querySelector('.myst') !== null,
      text: (w.node.querySelector('.myst') || {{textContent: ''}}).textContent,
      source: w.model.sharedModel.getSource(),
      expressions: w.model.getMetadata('user_expressions') || []}}).filter(x => x)"""


def open_notebook(browser, base: str, token: str, name: str):
    tab = browser.new_page()
    tab.set_viewport_size({"width": 1200, "height": 900})
    tab.goto(f"{base}/lab/tree/{name}?reset&token={token}", timeout=OPEN_S * 1000)
    tab.wait_for_function(KERNEL_IDLE % json.dumps(name), timeout=OPEN_S * 1000, polling=500)
    return tab


def run_all(tab) -> dict:
    tab.evaluate(f"{PANEL}.content.activate()")
    tab.evaluate("jupyterapp.commands.execute('notebook:run-all-cells')")
    tab.wait_for_function(f"() => {{ const s = ({RUN_STATE})(); "
                          "return !s.busy && (s.unrun === 0 || s.errors.length > 0); }",
                          timeout=RUN_S * 1000, polling=500)
    return tab.evaluate(f"({RUN_STATE})()")


def unquoted(text: str) -> str:
    """A str's repr shown by jupyterlab-myst without its quotes."""
    return text[1:-1] if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"" else text


def move(slider) -> None:
    """Move a slider from its value to the far end with the keyboard, as a reader can."""
    handle = slider.locator(".noUi-handle").first
    handle.scroll_into_view_if_needed()
    at_max = handle.get_attribute("aria-valuenow") == handle.get_attribute("aria-valuemax")
    handle.focus()
    handle.press("Home" if at_max else "End")


def test_lab_config_runs_as_any_user_and_keeps_its_settings_in_the_project(monkeypatch):
    """``make lab``'s configuration: --allow-root exactly when root, 127.0.0.1 unless LAB_IP
    says otherwise, no news or update checks, widget state saved, nothing in the home folder."""
    from traitlets.config.loader import PyFileConfigLoader

    def load(uid: int, **env: str):
        monkeypatch.setattr(os, "geteuid", lambda: uid)
        for key in ("LAB_IP", "LAB_PORT"):
            monkeypatch.delenv(key, raising=False)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        return PyFileConfigLoader("jupyter_lab_config.py", path=str(ROOT / "lab")).load_config()

    root, user = load(0), load(1000, LAB_IP="0.0.0.0", LAB_PORT="9999")
    assert root.ServerApp.allow_root is True and user.ServerApp.allow_root is False
    assert (root.ServerApp.ip, root.ServerApp.port) == ("127.0.0.1", 8888)
    assert (user.ServerApp.ip, user.ServerApp.port) == ("0.0.0.0", 9999)
    assert root.ServerApp.root_dir == str(ROOT / "book")
    assert root.LabApp.news_url is None
    assert root.LabApp.custom_css and (ROOT / "lab" / "custom" / "custom.css").is_file()
    for folder in (root.LabApp.app_settings_dir, root.LabApp.user_settings_dir,
                   root.LabApp.workspaces_dir, root.NotebookNotary.data_dir):
        assert Path(folder).is_relative_to(ROOT), f"{folder} is outside the project"
    overrides = json5.loads((Path(root.LabApp.app_settings_dir) / "overrides.json5").read_text())
    assert overrides["@jupyterlab/apputils-extension:notification"] == {
        "fetchNews": "false", "checkForUpdates": False}
    assert overrides["@jupyter-widgets/jupyterlab-manager:plugin"] == {"saveState": True}
    assert overrides["@jupyterlab/notebook-extension:tracker"] == {"windowingMode": "none"}


def test_the_book_has_live_chapters():
    assert live_chapters(), "no chapter calls live_slider: the scan found nothing to test"


def check_live_chapter(browser, lab, name: str) -> None:
    """Open ``name`` in JupyterLab, run it, and check it as the module docstring says."""
    base, token, served = lab
    tab = open_notebook(browser, base, token, name)
    try:
        state = run_all(tab)
        assert not state["errors"], f"{name}: cells raised {state['errors']}"
        assert state["unrun"] == 0, f"{name}: {state['unrun']} code cells did not run"
        check_markdown(tab, name)
        check_sliders(tab, name)

        tab.evaluate("jupyterapp.commands.execute('docmanager:save')")
        tab.wait_for_function(f"() => !{PANEL}.context.model.dirty", timeout=OPEN_S * 1000)
        saved = json.loads((served / name).read_text())
        state = saved["metadata"].get("widgets", {}).get(
            "application/vnd.jupyter.widget-state+json", {}).get("state")
        assert state, f"{name}: the saved notebook holds no widget state"
        tab.evaluate(f"{PANEL}.sessionContext.shutdown()")
        tab.close()
        tab = open_notebook(browser, base, token, name)
        # Trusted, the saved state draws the widgets; untrusted (a notebook saved with {eval}
        # results, see jupyterlab-myst's notary), the widget's text: the hint to run the cells.
        tab.wait_for_function(f"() => document.querySelectorAll('.widget-slider').length > 0 || "
                              f"document.body.innerText.includes({json.dumps(LIVE_HINT)})",
                              timeout=OPEN_S * 1000, polling=500)
        assert "model not found" not in tab.evaluate(f"{PANEL}.content.node.innerText"), (
            f"{name}: the reopened notebook shows a widget error")
        tab.evaluate(f"{PANEL}.sessionContext.shutdown()")
    finally:
        tab.close()


def eval_problems(cell: dict) -> list[str]:
    """The cell's ``{eval}`` names that the kernel did not evaluate or the text does not show."""
    results = {e["expression"]: e["result"] for e in cell["expressions"]}
    problems = []
    for expression in EVAL.findall(cell["source"]):
        result = results.get(expression, {})
        if result.get("status") != "ok":
            problems.append(f"{{eval}}`{expression}` gave {result or 'nothing'}")
        elif unquoted(result["data"]["text/plain"]) not in cell["text"]:
            problems.append(f"{expression} = {result['data']['text/plain']} is not shown")
    return problems


def check_markdown(tab, name: str) -> None:
    """Every markdown cell rendered by jupyterlab-myst, no raw MyST in it, no ``{glue}`` role
    (jupyterlab-myst shows its bare key, e.g. "ch4_gap", instead of the number), and every
    ``{eval}`` name evaluated by the kernel and its value in the text."""
    deadline = time.monotonic() + REDRAW_S
    while True:  # jupyterlab-myst evaluates a cell's names after the run: wait for them
        cells = tab.evaluate(MARKDOWN)
        if not any(eval_problems(c) for c in cells) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    for cell in cells:
        where = f"{name}, markdown cell {cell['index']}"
        assert "{glue" not in cell["source"], f"{where}: a {{glue}} role shows its key"
        assert cell["rendered"], f"{where} was not rendered by jupyterlab-myst"
        raw = [marker for marker in RAW_MYST if marker in cell["text"]]
        assert not raw, f"{where} shows raw MyST {raw}: {cell['text'][:200]!r}"
        assert not eval_problems(cell), f"{where}: {eval_problems(cell)}"


def check_sliders(tab, name: str) -> None:
    """Each live slider, moved, redraws the figure of its own widget box."""
    boxes = [box for box in tab.locator(".widget-vbox").all()
             if box.locator(".widget-slider").count()]
    assert boxes, f"{name}: no live slider was displayed"
    for box in boxes:
        image = box.locator(".widget-output img").first
        for slider in box.locator(".widget-slider").all():
            label = slider.locator(".widget-label").first.inner_text()
            before = image.get_attribute("src")
            move(slider)
            try:
                tab.wait_for_function("([box, before]) => { const img = box.querySelector("
                                      "'.widget-output img'); return img && img.src !== before; }",
                                      arg=[box.element_handle(), before],
                                      timeout=REDRAW_S * 1000, polling=200)
            except PlaywrightTimeout:
                pytest.fail(f"{name}: moving slider {label} did not redraw its figure "
                            f"in {REDRAW_S} s")


@pytest.mark.parametrize("name", live_chapters())
def test_live_chapter_runs_and_its_sliders_redraw(browser, lab, name):
    check_live_chapter(browser, lab, name)
