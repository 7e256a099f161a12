"""What a chapter holds, read from its notebook, for pages that quote it.

The landing page says how many bugs chapter 14 reproduces. That number is the chapter's, so it
is read from the chapter: the rows of its table "The bugs at a glance", one per bug, each
linking the section that reproduces it (a label the chapter defines). A row without such a
link, or a table that is gone, raises instead of returning a stale count.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

BOOK = Path(__file__).resolve().parents[2] / "book"
"""The book's folder in a checkout of the project (``pip install -e .``)."""

BUGS_CHAPTER = BOOK / "14_rope_bugs.ipynb"
BUGS_TABLE = "The bugs at a glance"

_LABEL = re.compile(r"^\(([A-Za-z0-9_-]+)\)=\s*$", re.M)
_REF = re.compile(r"\{ref\}`[^`]*?<([A-Za-z0-9_-]+)>`|\{ref\}`([A-Za-z0-9_-]+)`")


def markdown_of(notebook: Path) -> list[str]:
    """The sources of a notebook's Markdown cells, in order."""
    path = Path(notebook)
    if not path.is_file():
        raise ValueError(f"notebook: {path} does not exist")
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return ["".join(cell["source"]) for cell in cells if cell["cell_type"] == "markdown"]


def table_rows(notebook: Path, heading: str) -> list[str]:
    """The body rows of the first Markdown table under the heading ``heading`` (any level),
    header and separator rows left out."""
    text = "\n".join(markdown_of(notebook))
    found = re.search(rf"^#+\s+{re.escape(heading)}\s*$", text, re.M)
    if not found:
        raise ValueError(f"heading: {notebook} has no heading {heading!r}")
    rows = []
    for line in text[found.end():].splitlines():
        if line.startswith("|"):
            rows.append(line)
        elif rows or line.startswith("#"):
            break
    if len(rows) < 3 or not re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", rows[1].replace(" ", "")):
        raise ValueError(f"heading: no Markdown table (header, separator, rows) under "
                         f"{heading!r} in {notebook}")
    return rows[2:]


def bugs_in_chapter(notebook: Path = BUGS_CHAPTER, heading: str = BUGS_TABLE) -> int:
    """How many bugs a chapter reproduces: the rows of its table under ``heading``, each of
    which must link a different section of the chapter ({ref} to a label it defines)."""
    labels = set(_LABEL.findall("\n".join(markdown_of(notebook))))
    linked = []
    for row in table_rows(notebook, heading):
        first_cell = row.strip("|").split("|")[0]
        refs = [a or b for a, b in _REF.findall(first_cell)]
        if len(refs) != 1 or refs[0] not in labels:
            raise ValueError(f"notebook: the row {row.strip()[:60]!r} of {heading!r} in "
                             f"{notebook} should link one section the chapter defines; "
                             f"it links {refs}")
        linked.append(refs[0])
    if len(set(linked)) != len(linked):
        raise ValueError(f"notebook: two rows of {heading!r} in {notebook} link one section")
    return len(linked)
