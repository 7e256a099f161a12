"""Execute chapters and store them the way nbval checks them.

    .venv/bin/python tests/notebook_store.py book/04_rope_2d.ipynb [...]

Each notebook is executed top to bottom in this environment's kernel, then every output is
dropped (with the widget state and the ``{eval}`` results a JupyterLab session saves) except
those of cells tagged ``nbval-check-output``: those cells print a claim (a
number, a shape, a table) and nbval (run with ``--nbval-lax``) compares their fresh output
with the stored one. Every other claim is an ``assert`` in a code cell.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

CHECK_TAG = "nbval-check-output"


def is_checked(cell) -> bool:
    return cell.cell_type == "code" and CHECK_TAG in cell.metadata.get("tags", [])


def store(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    for cell in nb.cells:
        if cell.cell_type != "code":
            # what jupyterlab-myst saves of a live run: {eval} results, not the source
            cell.metadata.pop("user_expressions", None)
            continue
        cell.metadata.pop("execution", None)
        if not is_checked(cell):
            cell.outputs = []
            cell.execution_count = None
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, path)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        store(Path(arg))
        print(f"stored {arg}")
