"""pytest on the chapters (``pytest --nbval-lax book/...``): each cell
waits for its reply through book/_ext/kernel_watchdog.py, so a lost execute
reply costs seconds instead of the cell timeout and is not taken for a timed
out cell (after which nbval would mark the rest of the chapter xfail)."""

from __future__ import annotations

import os
import sys
import tempfile
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


# `make book` executes every chapter with the CPU kernels this machine picks
# (AVX-512 or AVX2 in PyTorch, MKL and oneDNN); nbval executes the chapters
# again under the portable ones. Float rounding differs between the two, so a
# claim that rests on training, fitting or random draws and holds on one CPU
# only fails one of the two runs, on the machine where it was written. (The
# 300-step counting model of chapter 13 learned with AVX-512 kernels and not
# with AVX2 ones.) Chapters that time code keep the machine's kernels: their
# claims are about this machine's speed. Inductor keeps its own cache: its
# on-disk cache does not key on ATEN_CPU_CAPABILITY, and C++ it generated for
# AVX2 then fails to build under the portable kernels (torch 2.13).
PORTABLE_CACHE = Path(tempfile.gettempdir()) / "torchinductor_portable"
PORTABLE_KERNELS = {"ATEN_CPU_CAPABILITY": "default",
                    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
                    "ONEDNN_MAX_CPU_ISA": "AVX2",
                    "TORCHINDUCTOR_CACHE_DIR": str(PORTABLE_CACHE)}
TIMERS = ("ropelib.book.timing", "ropelib.book.bench")


def times_code(notebook) -> bool:
    """Whether a chapter imports the project's timers."""
    return any(timer in "".join(cell.source) for cell in notebook.cells
               if cell.cell_type == "code" for timer in TIMERS)


def kernel_env(notebook) -> dict[str, str]:
    """What nbval adds to the environment of a chapter's kernel."""
    return {} if times_code(notebook) else dict(PORTABLE_KERNELS)


def _start_kernel_with_env(setup):
    def start(self) -> None:
        saved = {name: os.environ.get(name) for name in PORTABLE_KERNELS}
        os.environ.update(kernel_env(self.nb))
        try:
            setup(self)
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
    start.with_kernel_env = True
    return start


def pytest_collection_modifyitems(items) -> None:
    from nbval.plugin import IPyNbFile

    if not getattr(IPyNbFile.setup, "with_kernel_env", False):
        IPyNbFile.setup = _start_kernel_with_env(IPyNbFile.setup)
    for item in items:
        if hasattr(item, "output_timeout"):
            item.output_timeout = OUTPUT_TIMEOUT
