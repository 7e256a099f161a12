"""A chapter shows the idea once and checks it out of sight (issue 58): the assert lines a
reader sees in the HTML are few, and no page opens with a wall of code before its first
section. Read from the notebooks: a code cell is shown in the HTML unless a hiding tag (or
the exercise's ``solution`` tag, shown inside its collapsed dropdown) takes it away."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from test_book_offline import toc_pages

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = [ROOT / page.replace(".html", ".ipynb") for page in toc_pages()
             if (ROOT / page.replace(".html", ".ipynb")).exists()]
HIDING = {"hide-input", "remove-input", "remove-cell", "solution"}
ASSERTS_PER_PAGE = 3
ASSERTS_IN_BOOK = 59
LINES_BEFORE_FIRST_SECTION = 10
SECTION = re.compile(r"^##\s", re.M)


def shown_code(cell) -> list[str]:
    """The non-blank lines of a code cell that the HTML shows without a click."""
    if cell.cell_type != "code" or HIDING & set(cell.metadata.get("tags", [])):
        return []
    return [line for line in cell.source.splitlines() if line.strip()]


def shown_asserts(notebook) -> int:
    return sum(line.lstrip().startswith("assert ") or line.strip() == "assert"
               for cell in notebook.cells for line in shown_code(cell))


def lines_before_first_section(notebook) -> int:
    lines = 0
    for cell in notebook.cells:
        if cell.cell_type == "markdown" and SECTION.search(cell.source):
            break
        lines += len(shown_code(cell))
    return lines


def notebook_of(*cells: str):
    """A notebook of these cells: markdown when a cell starts with "md:", else code."""
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_markdown_cell(cell[3:]) if cell.startswith("md:")
                      else nbformat.v4.new_code_cell(cell) for cell in cells]
    return notebook


def test_the_counts_see_what_a_reader_sees():
    notebook = notebook_of("md:# Title\n\nProse.", "x = 1\n\nassert x == 1\n    assert x",
                           "assert x == 2\ny = 2", "md:## First section", "assert y == 2")
    notebook.cells[2].metadata["tags"] = ["hide-input"]
    assert shown_asserts(notebook) == 3
    assert lines_before_first_section(notebook) == 3


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_a_page_shows_few_asserts(path):
    count = shown_asserts(nbformat.read(path, as_version=4))
    assert count <= ASSERTS_PER_PAGE, (
        f"{path.name} shows {count} assert lines; move checks into a collapsed cell after "
        f"the code they check (at most {ASSERTS_PER_PAGE} shown)")


def test_the_book_shows_fewer_than_sixty_asserts():
    counts = {path.stem: shown_asserts(nbformat.read(path, as_version=4)) for path in NOTEBOOKS}
    assert sum(counts.values()) <= ASSERTS_IN_BOOK, counts


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_no_wall_of_code_before_the_first_section(path):
    lines = lines_before_first_section(nbformat.read(path, as_version=4))
    assert lines <= LINES_BEFORE_FIRST_SECTION, (
        f"{path.name} shows {lines} lines of code before its first section "
        f"(at most {LINES_BEFORE_FIRST_SECTION})")


EVAL = re.compile(r"\{eval\}`([^`]+)`")


def evaluated_before_defined(notebook) -> list[str]:
    """The ``{eval}`` names a markdown cell reads before any code cell above it assigns them:
    the book evaluates each name where its cell stands, so such a name fails the build."""
    import ast

    defined: set[str] = set()
    early = []
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type == "code":
            tree = ast.parse("\n".join(line for line in cell.source.splitlines()
                                       if not line.lstrip().startswith(("%", "!"))))
            defined |= {node.id for node in ast.walk(tree)
                        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)}
            defined |= {node.name for node in ast.walk(tree)
                        if isinstance(node, ast.FunctionDef | ast.ClassDef)}
            defined |= {(alias.asname or alias.name).split(".")[0] for node in ast.walk(tree)
                        if isinstance(node, ast.Import | ast.ImportFrom) for alias in node.names}
        elif cell.cell_type == "markdown":
            early += [f"cell {index}: {name}" for name in EVAL.findall(cell.source)
                      if name not in defined]
    return early


def test_the_eval_check_finds_a_name_read_too_early():
    notebook = notebook_of("a_txt, (b_txt, c) = 1, (2, 3)\nimport math as m",
                           "md:{eval}`a_txt` {eval}`b_txt` {eval}`m` {eval}`d_txt`", "d_txt = 4")
    assert evaluated_before_defined(notebook) == ["cell 1: d_txt"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_prose_reads_only_names_set_above_it(path):
    early = evaluated_before_defined(nbformat.read(path, as_version=4))
    assert not early, f"{path.name}: " + ", ".join(early)
