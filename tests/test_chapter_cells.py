"""What a reader sees of a chapter's code: the idea, not the formatting of prose numbers.

Cells that format numbers for the prose (``shown(...)``, read by the ``{eval}`` role) are
collapsed, in the HTML (tag ``hide-input``, or removed with ``remove-input`` /
``remove-cell``, or tag ``solution``: an exercise's code, shown inside its collapsed
Solution dropdown, book/_ext/solutions.py) and in JupyterLab
(``"jupyter": {"source_hidden": true}``), as chapter 9 set the style.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "book").glob("*.ipynb"))
HIDING_TAGS = {"hide-input", "remove-input", "remove-cell", "solution"}
SHOWN_CALL = re.compile(r"\bshown\(")


def visible_in_html(cell) -> bool:
    return not HIDING_TAGS & set(cell.metadata.get("tags", []))


def visible_in_lab(cell) -> bool:
    return not cell.metadata.get("jupyter", {}).get("source_hidden", False)


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_prose_number_formatting_is_collapsed(path):
    nb = nbformat.read(path, as_version=4)
    code = [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    html = [i for i, c in code if SHOWN_CALL.search(c.source) and visible_in_html(c)]
    lab = [i for i, c in code if SHOWN_CALL.search(c.source) and visible_in_lab(c)]
    assert not html, f"{path.name}: cells {html} show shown(...) calls in the HTML"
    assert not lab, f"{path.name}: cells {lab} show shown(...) calls in JupyterLab"


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_cells_collapsed_in_html_are_collapsed_in_lab(path):
    nb = nbformat.read(path, as_version=4)
    mismatched = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"
                  and "hide-input" in c.metadata.get("tags", []) and visible_in_lab(c)]
    assert not mismatched, f"{path.name}: cells {mismatched} are tagged hide-input but open in JupyterLab"
