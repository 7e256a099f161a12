"""A lost execute reply during notebook execution (issue 33, item 14).

A real kernel runs each case; the client drops every ``execute_reply`` it
receives, as a lost message would. Without the watchdog (book/_ext/
kernel_watchdog.py) nbval and nbclient wait for the whole timeout; with it
they finish from the iopub messages soon after the probe. The timeouts here
are generous: a stall shows as the timeout's own error (``Empty``,
``CellTimeoutError``), not as a measured time.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path
from queue import Empty

import kernel_watchdog  # book/_ext, on the path by conftest.py
import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError
from nbval.kernel import CURRENT_ENV_KERNEL_NAME, RunningKernel

ROOT = Path(__file__).resolve().parent.parent

TIMEOUT = 60  # s: a stall fails the test with the timeout's error


@pytest.fixture
def fast_probe(monkeypatch):
    monkeypatch.setattr(kernel_watchdog, "PROBE_AFTER", 0.5)


def drop_execute_replies(channel) -> None:
    """The shell channel ``channel`` loses every execute_reply."""
    get_msg = channel.get_msg

    def lossy(*args, **kwargs):
        while True:
            msg = get_msg(*args, **kwargs)
            if msg["msg_type"] != "execute_reply":
                return msg

    async def lossy_async(*args, **kwargs):
        while True:
            msg = await get_msg(*args, **kwargs)
            if msg["msg_type"] != "execute_reply":
                return msg

    channel.get_msg = lossy_async if inspect.iscoroutinefunction(
        get_msg) else lossy


def test_nbval_cell_completes_after_a_lost_reply(fast_probe):
    kernel = RunningKernel(CURRENT_ENV_KERNEL_NAME)
    try:
        drop_execute_replies(kernel.kc.shell_channel)
        msg_id = kernel.execute_cell_input("print(6 * 7)", allow_stdin=False)
        kernel_watchdog.await_reply(kernel, msg_id, timeout=TIMEOUT)
        outputs = []
        while True:  # the outputs and the idle status came on iopub
            msg = kernel.get_message(stream="iopub", timeout=5)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                outputs.append(msg["content"]["text"])
            if msg["content"].get("execution_state") == "idle":
                break
        assert outputs == ["42\n"]
        # nbval's own wait stalls until its timeout on the same loss (its
        # own: book/conftest.py patched it when pytest also runs book/)
        nbval_own = kernel_watchdog.nbval_await_reply or RunningKernel.await_reply
        assert nbval_own is not kernel_watchdog.await_reply
        msg_id = kernel.execute_cell_input("x = 1", allow_stdin=False)
        with pytest.raises(Empty):
            nbval_own(kernel, msg_id, timeout=2)
    finally:
        kernel.stop()


def notebook(*sources: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(s) for s in sources])


def run_lossy(client_class, nb, timeout=TIMEOUT) -> nbformat.NotebookNode:
    client = client_class(nb, timeout=timeout, kernel_name="python3")
    with client.setup_kernel():
        drop_execute_replies(client.kc.shell_channel)
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index)
    return nb


def test_nbclient_cells_complete_after_lost_replies(fast_probe):
    client_class = kernel_watchdog.watchdog_client(NotebookClient)
    nb = run_lossy(client_class, notebook("x = 6 * 7", "print(x)", "x + 1"))
    assert nb.cells[1].outputs[0]["text"] == "42\n"
    assert nb.cells[2].outputs[0]["data"]["text/plain"] == "43"
    # nbclient's own client waits out its timeout on the same loss
    with pytest.raises(CellTimeoutError):
        run_lossy(NotebookClient, notebook("x = 1"), timeout=2)


def test_a_cell_running_past_the_probe_is_not_taken_for_a_lost_reply(
        fast_probe, capfd):
    """The probe goes out while the cell still runs: its reply queues behind
    the cell's, which comes first, so nothing is reported lost."""
    client_class = kernel_watchdog.watchdog_client(NotebookClient)
    nb = notebook("import time; time.sleep(2); print('slept')", "print(1)")
    client = client_class(nb, timeout=TIMEOUT, kernel_name="python3")
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index)
    assert [c.outputs[0]["text"] for c in nb.cells] == ["slept\n", "1\n"]
    assert "was lost" not in capfd.readouterr().err


def test_nbclient_error_is_still_an_error_after_a_lost_reply(fast_probe):
    client_class = kernel_watchdog.watchdog_client(NotebookClient)
    with pytest.raises(CellExecutionError, match="lost but loud") as error:
        run_lossy(client_class, notebook("raise ValueError('lost but loud')"))
    assert error.value.ename == "ValueError"


def test_the_watchdog_is_wired_into_the_book_build_and_nbval(tmp_path):
    assert "scripts/build_book.sh" in (ROOT / "Makefile").read_text()
    import yaml

    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert config["sphinx"]["local_extensions"]["kernel_watchdog"] == "book/_ext"
    from myst_nb.core.execute import inline

    kernel_watchdog.setup(None)
    assert inline.ModifiedNotebookClient.watchdog
    # pytest --nbval on a chapter alone (book/conftest.py) uses it too
    (tmp_path / "which_await.py").write_text(
        "def pytest_collection_finish(session):\n"
        "    from nbval.kernel import RunningKernel\n"
        "    print('AWAIT', RunningKernel.await_reply.__module__)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--collect-only", "-p",
         "which_await", "--nbval-lax", "--nbval-current-env",
         "book/00_preface.ipynb"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert "AWAIT kernel_watchdog" in run.stdout, run.stdout + run.stderr


FAKE_BUILD = """#!/usr/bin/env bash
# a jupyter-book that fails with the message in $FAIL_WITH until $PASS_AT
n=$(($(cat "$COUNT" 2>/dev/null || echo 0) + 1)); echo $n > "$COUNT"
[ "$n" -ge "$PASS_AT" ] && { echo built; exit 0; }
echo "$FAIL_WITH"; exit 1
"""


@pytest.mark.parametrize(("fail_with", "pass_at", "status", "builds"), [
    ("nbclient.exceptions.CellTimeoutError: Timeout waiting for IOPub output", 2,
     0, 2),
    ("AssertionError: the chapter's claim is false", 2, 1, 1),  # no retry
    ("CellTimeoutError: Cell execution timed out", 3, 1, 2),  # one retry only
])
def test_book_build_retries_once_after_a_kernel_timeout(tmp_path, fail_with,
                                                         pass_at, status,
                                                         builds):
    fake = tmp_path / "bin" / "jupyter-book"
    fake.parent.mkdir()
    fake.write_text(FAKE_BUILD)
    fake.chmod(0o755)
    env = {**os.environ, "FAIL_WITH": fail_with, "PASS_AT": str(pass_at),
           "COUNT": str(tmp_path / "count")}
    work = tmp_path / "repo"
    work.mkdir()
    run = subprocess.run(["bash", str(ROOT / "scripts" / "build_book.sh"),
                          str(fake.parent)], cwd=work, env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == status, run.stdout + run.stderr
    assert int((tmp_path / "count").read_text()) == builds
    assert ("retrying once" in run.stderr) == (builds == 2)


LOSSY_EXTENSION = """
import kernel_watchdog
from myst_nb.core.execute import inline


def setup(app):
    kernel_watchdog.PROBE_AFTER = 0.5

    class Lossy(inline.ModifiedNotebookClient):
        def start_new_kernel_client(self):
            super().start_new_kernel_client()
            get_msg = self.kc.shell_channel.get_msg

            async def lossy(*args, **kwargs):
                while True:
                    msg = await get_msg(*args, **kwargs)
                    if msg["msg_type"] != "execute_reply":
                        return msg

            self.kc.shell_channel.get_msg = lossy

    inline.ModifiedNotebookClient = Lossy
    return {"parallel_read_safe": True}
"""
BOOK_CONFIG = """title: lossy
only_build_toc_files: true
exclude_patterns: [".*", "**/.*", "_build"]
execute:
  execute_notebooks: inline
  timeout: 300
sphinx:
  local_extensions:
    kernel_watchdog: _ext
    lossy: _ext
  config:
    nb_execution_raise_on_error: true
"""


def test_a_book_build_whose_kernel_loses_every_reply_completes(tmp_path):
    """A one-page book built as ``make book`` builds (inline execution, the
    {eval} role), with every execute reply lost: without the watchdog each
    of its three requests would wait out the 300 s timeout."""
    (tmp_path / "_ext").mkdir()
    (tmp_path / "_ext" / "kernel_watchdog.py").write_text(
        (ROOT / "book" / "_ext" / "kernel_watchdog.py").read_text())
    (tmp_path / "_ext" / "lossy.py").write_text(LOSSY_EXTENSION)
    (tmp_path / "_config.yml").write_text(BOOK_CONFIG)
    (tmp_path / "_toc.yml").write_text("format: jb-book\nroot: page\n")
    nb = notebook("x = 6 * 7", "print(x)")
    nb.cells.append(nbformat.v4.new_markdown_cell("x is {eval}`x`"))
    nb.cells.insert(0, nbformat.v4.new_markdown_cell("# Page"))
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python",
                                 "display_name": "Python 3"}
    nbformat.write(nb, tmp_path / "page.ipynb")
    build = subprocess.run(
        [str(Path(sys.executable).parent / "jupyter-book"), "build",
         str(tmp_path), "-W", "-n", "--keep-going"],
        capture_output=True, text=True, timeout=240)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    assert build.stderr.count("execute_reply to request") == 3
    html = (tmp_path / "_build" / "html" / "page.html").read_text()
    assert "x is <span" in html and ">42<" in html
