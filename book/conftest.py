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
