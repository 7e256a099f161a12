"""The chapters are stored as nbval checks them: outputs only where a claim is printed."""

from pathlib import Path

import nbformat
import pytest
from notebook_store import is_checked

CHAPTERS = sorted((Path(__file__).parent.parent / "book").glob("*.ipynb"))


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_outputs_stored_only_for_checked_cells(path):
    nb = nbformat.read(path, as_version=4)
    assert "widgets" not in nb.metadata, f"{path.name} stores a live session's widget state"
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            assert "user_expressions" not in cell.metadata, (
                f"{path.name} cell {i} stores a live session's {{eval}} results")
            continue
        if is_checked(cell):
            assert cell.outputs, f"{path.name} cell {i} is checked by nbval but has no stored output"
        else:
            assert not cell.outputs, f"{path.name} cell {i} stores outputs nbval never compares"
