"""nbval runs the chapters under portable CPU kernels (issue 42).

`make book` executes every chapter with the kernels the machine picks (AVX-512 or AVX2);
book/conftest.py has nbval execute the chapters that do not time code again under
PyTorch's, MKL's and oneDNN's portable kernels, so a trained or fitted claim that holds with
one CPU's rounding only fails `make test` on the machine where it was written.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"
VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA",
             "TORCHINDUCTOR_CACHE_DIR")
TRAINS = ("torch.optim", "train(", "train_variant(", "run_experiment(", "lstsq(")


def code_of(path: Path) -> str:
    notebook = nbformat.read(path, as_version=4)
    return "".join(cell.source for cell in notebook.cells if cell.cell_type == "code")


def test_nbval_starts_a_chapters_kernel_with_portable_kernels_unless_it_times_code(tmp_path):
    book = tmp_path / "book"
    book.mkdir()
    (book / "conftest.py").write_text((BOOK / "conftest.py").read_text())
    (book / "_ext").symlink_to(BOOK / "_ext")
    trained = ("import os, torch\n"
               "assert torch.backends.cpu.get_cpu_capability() == 'DEFAULT'\n"
               "assert os.environ['MKL_ENABLE_INSTRUCTIONS'] == 'AVX2'\n"
               "assert os.environ['ONEDNN_MAX_CPU_ISA'] == 'AVX2'\n"
               "assert 'portable' in os.environ['TORCHINDUCTOR_CACHE_DIR']\n")
    timed = ("import os\n"
             "from ropelib.book.timing import time_call\n"
             f"assert not any(name in os.environ for name in {VARIABLES!r})\n")
    for name, source in (("trained", trained), ("timed", timed)):
        notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
        nbformat.write(notebook, book / f"{name}.ipynb")
    env = {name: value for name, value in os.environ.items() if name not in VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax",
         "--nbval-current-env", "trained.ipynb", "timed.ipynb"],
        cwd=book, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "2 passed" in run.stdout, run.stdout + run.stderr


def test_no_chapter_that_trains_or_fits_keeps_the_machines_kernels():
    """A chapter that imports the timers keeps the machine's kernels under nbval; none of
    them may also train or fit, or its claim would be checked on one kernel set only."""
    timers = ("ropelib.book.timing", "ropelib.book.bench")
    chapters = sorted(BOOK.glob("*.ipynb"))
    trains = {path.name for path in chapters if any(m in code_of(path) for m in TRAINS)}
    timed = {path.name for path in chapters if any(t in code_of(path) for t in timers)}
    assert {"12_rope_in_more_dimensions.ipynb", "13_which_frequencies_matter.ipynb"} <= trains
    assert "11_making_rope_fast.ipynb" in timed
    assert not trains & timed, trains & timed
