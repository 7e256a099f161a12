"""pytest on the chapters (``pytest --nbval-lax book/...``): each cell
waits for its reply through book/_ext/kernel_watchdog.py, so a lost execute
reply costs seconds instead of the cell timeout and is not taken for a timed
out cell (after which nbval would mark the rest of the chapter xfail)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "_ext"))

import kernel_watchdog  # noqa: E402

kernel_watchdog.patch_nbval()

# nbval waits 5 s for each of a cell's output messages once its reply has
# come. A long cell that printed many progress updates (chapter 13's
# training) can still be flushing them then: on a loaded machine a gap of
# 5 s was seen (1 of 2 runs beside `yes`), and the cell failed with "Timeout
# of 5 seconds exceeded waiting for output". --nbval-cell-timeout still
# bounds a kernel that hangs.
OUTPUT_TIMEOUT = 60


def pytest_collection_modifyitems(items) -> None:
    for item in items:
        if hasattr(item, "output_timeout"):
            item.output_timeout = OUTPUT_TIMEOUT
