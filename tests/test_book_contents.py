"""ropelib.book.contents counts what a chapter holds from the chapter itself (the landing
page quotes chapter 14's number of bugs): each row of the table must link a section the
chapter defines, and a missing table or a row without its section raises."""

from __future__ import annotations

import re

import nbformat
import pytest

from ropelib.book.contents import BUGS_CHAPTER, bugs_in_chapter, table_rows

TABLE = """## The bugs at a glance

| bug | what you see |
| --- | --- |
| {ref}`first <ch-a>` | one |
| {ref}`second <ch-b>` | two |
| {ref}`ch-c` | three |

After the table.
"""
SECTIONS = "(ch-a)=\n## A\n\n(ch-b)=\n## B\n\n(ch-c)=\n## C\n"


def notebook(tmp_path, *markdown):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(text) for text in markdown]
    nb.cells.insert(1, nbformat.v4.new_code_cell("x = 1"))
    path = tmp_path / "chapter.ipynb"
    nbformat.write(nb, path)
    return path


def test_counts_the_rows_that_link_a_section(tmp_path):
    path = notebook(tmp_path, TABLE, SECTIONS)
    assert len(table_rows(path, "The bugs at a glance")) == 3
    assert bugs_in_chapter(path) == 3


@pytest.mark.parametrize("table, sections, match", [
    (TABLE, SECTIONS.replace("(ch-c)=\n", ""), "should link one section"),
    (TABLE.replace("{ref}`ch-c`", "plain text"), SECTIONS, "should link one section"),
    (TABLE.replace("ch-c", "ch-b"), SECTIONS, "two rows"),
    (TABLE.replace("## The bugs at a glance", "## Other"), SECTIONS, "has no heading"),
    (TABLE.replace("| --- | --- |\n", ""), SECTIONS, "no Markdown table"),
])
def test_a_stale_table_raises(tmp_path, table, sections, match):
    path = notebook(tmp_path, table, sections)
    with pytest.raises(ValueError, match=match):
        bugs_in_chapter(path)


def test_chapter_14_count_is_its_linked_sections():
    """The real chapter: one row per bug section, every ch14- section but the checklist."""
    source = "\n".join(cell.source for cell in nbformat.read(BUGS_CHAPTER, as_version=4).cells
                     if cell.cell_type == "markdown")
    sections = set(re.findall(r"^\((ch14-[a-z0-9-]+)\)=", source, re.M))
    count = bugs_in_chapter()
    assert count >= 10
    assert count == len(sections - {"ch14-checklist"}), sorted(sections)
