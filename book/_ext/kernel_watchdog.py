"""Notebook execution that does not wait out a lost execute reply.

A chapter executes cell by cell: the client sends an ``execute_request`` on
the kernel's shell channel and waits there for its ``execute_reply``, while
the outputs and the kernel's ``idle`` status come on the iopub channel. When
the reply is lost between kernel and client, the kernel sits idle and the
client waits out the whole cell timeout (300 s here):

- nbclient (myst-nb's inline execution, the book build) then raises
  ``CellTimeoutError``: the build fails after five silent minutes;
- nbval (``make test``) interrupts the idle kernel, reads the cell's
  outputs from iopub, lets the cell pass and marks every later cell of the
  notebook xfail: the rest of the chapter goes untested, silently.

The watchdog asks the kernel for ``kernel_info`` after ``PROBE_AFTER``
seconds without the reply. The kernel answers shell requests one at a time,
in order, so a ``kernel_info_reply`` that comes first proves that the cell
has finished and its reply was lost. The cell then completes from what iopub
carried (nbval compares those outputs; for nbclient an ``error`` output
makes the reply an error, as the lost one was), with a warning on stderr. A
cell still running only delays the probe's reply, and the wait goes on up to
the cell timeout, as before.

A Sphinx extension (``_config.yml``: it wraps myst-nb's inline client), and
``patch_nbval`` for nbval (``tests/conftest.py``).
"""

from __future__ import annotations

import asyncio
import sys
import time
from queue import Empty

from jupyter_core.utils import ensure_async
from nbclient.exceptions import CellTimeoutError

PROBE_AFTER = 10.0  # seconds without the reply before the probe


class ReplyWatch:
    """Waits for the reply to ``msg_id`` until ``timeout`` seconds (None: no
    deadline), with one ``kernel_info`` probe (``probe``: its msg_id once
    sent)."""

    def __init__(self, msg_id: str, timeout: float | None) -> None:
        self.msg_id, self.probe = msg_id, None
        self.deadline = (None if timeout is None
                         else time.monotonic() + timeout)

    def wait(self) -> float | None:
        """Seconds to wait for the next shell message: until the probe is
        due, then until the deadline (None: no deadline)."""
        left = (None if self.deadline is None
                else max(0.0, self.deadline - time.monotonic()))
        if self.probe is None:
            return PROBE_AFTER if left is None else min(PROBE_AFTER, left)
        return left

    def expired(self) -> bool:
        return (self.deadline is not None
                and time.monotonic() >= self.deadline)

    def classify(self, msg: dict) -> str | None:
        """``"reply"`` for the awaited reply, ``"lost"`` for the probe's
        reply coming first, None for anything else (a late reply to an
        earlier request)."""
        parent = msg["parent_header"].get("msg_id")
        if parent == self.msg_id:
            return "reply"
        if self.probe is not None and parent == self.probe:
            print(f"kernel_watchdog: WARNING: the execute_reply to request "
                  f"{self.msg_id} was lost (the kernel answered a later "
                  "kernel_info first); the cell completes from its iopub "
                  "messages", file=sys.stderr, flush=True)
            return "lost"
        return None


def await_reply(self, msg_id: str, timeout: float | None = None) -> None:
    """nbval's ``RunningKernel.await_reply`` with the probe: returns once the
    reply came or was proved lost; raises ``Empty`` at the timeout, as
    nbval's own does."""
    watch = ReplyWatch(msg_id, timeout)
    while True:
        try:
            msg = self.get_message(stream="shell", timeout=watch.wait())
        except Empty:
            if watch.expired():
                raise
            if watch.probe is None:
                watch.probe = self.kc.kernel_info()
            continue
        kind = watch.classify(msg)
        if kind == "reply" and msg["content"]["status"] == "aborted":
            raise RuntimeError("Kernel aborted execution request")
        if kind is not None:
            return


nbval_await_reply = None  # nbval's own, once patch_nbval has replaced it


def patch_nbval() -> None:
    """nbval's cells wait for their reply through the watchdog."""
    global nbval_await_reply
    from nbval.kernel import RunningKernel

    if RunningKernel.await_reply is not await_reply:
        nbval_await_reply = RunningKernel.await_reply
        RunningKernel.await_reply = await_reply


def watchdog_client(base: type) -> type:
    """A subclass of the nbclient ``NotebookClient`` class ``base`` whose
    cells wait for their reply through the watchdog."""

    class WatchdogNotebookClient(base):
        watchdog = True

        async def _async_poll_for_reply(self, msg_id, cell, timeout,
                                        task_poll_output_msg,
                                        task_poll_kernel_alive):
            watch = ReplyWatch(msg_id, timeout)
            shell = self.kc.shell_channel
            while True:
                try:
                    msg = await ensure_async(
                        shell.get_msg(timeout=watch.wait()))
                except Empty:
                    if watch.expired():
                        task_poll_kernel_alive.cancel()
                        await self._async_check_alive()
                        raise CellTimeoutError.error_from_timeout_and_cell(
                            "Cell execution timed out", timeout,
                            cell) from None
                    if watch.probe is None:
                        watch.probe = self.kc.kernel_info()
                    continue
                kind = watch.classify(msg)
                if kind is None:
                    continue
                try:
                    await asyncio.wait_for(task_poll_output_msg,
                                           self.iopub_timeout)
                except (asyncio.TimeoutError, Empty):
                    if kind == "lost" or self.raise_on_iopub_timeout:
                        task_poll_kernel_alive.cancel()
                        raise CellTimeoutError.error_from_timeout_and_cell(
                            "Timeout waiting for IOPub output",
                            self.iopub_timeout, cell) from None
                    self.log.warning("Timeout waiting for IOPub output")
                task_poll_kernel_alive.cancel()
                if kind == "reply":
                    return msg
                return _reply_from_outputs(msg_id, cell)

    return WatchdogNotebookClient


def _reply_from_outputs(msg_id: str, cell) -> dict:
    """The execute reply that was lost: an error if iopub carried one."""
    errors = [out for out in cell.get("outputs", [])
              if out.get("output_type") == "error"]
    content = {"status": "ok"}
    if errors:
        content = {"status": "error", "ename": errors[-1]["ename"],
                   "evalue": errors[-1]["evalue"],
                   "traceback": errors[-1]["traceback"]}
    return {"parent_header": {"msg_id": msg_id}, "content": content,
            "header": {"msg_type": "execute_reply"}, "metadata": {}}


def setup(app) -> dict:
    """Sphinx: myst-nb's inline execution waits through the watchdog."""
    from myst_nb.core.execute import inline

    client = inline.ModifiedNotebookClient
    if not getattr(client, "watchdog", False):
        inline.ModifiedNotebookClient = watchdog_client(client)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
