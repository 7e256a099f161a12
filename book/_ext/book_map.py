"""Sphinx extension: the landing page's map of the book, from ``_toc.yml``.

The directive ``book-map`` takes one line per page, ``docname: what it
teaches``, and draws one card per part of the table of contents (its caption
as the card's title), listing the part's pages in the table's order, each
linked by its title and numbered as the sidebar numbers it, followed by its
line::

    :::{book-map}
    01_why_positions: attention treats its input as a set
    :::

So the map follows the table of contents: a page added to ``_toc.yml``
appears on the map as soon as its line is there, and a line for a page that
is not (yet) in the table is left out. A page of the table without a line, or
a line that is not ``docname: text``, fails the build.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import yaml
from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective


def toc_parts(toc_file: Path) -> list[dict]:
    """The parts of a Jupyter Book table of contents: ``caption``,
    ``numbered`` and the ``files`` of their chapters, in order."""
    toc = yaml.safe_load(toc_file.read_text())
    return [
        {
            "caption": part.get("caption", ""),
            "numbered": bool(part.get("numbered")),
            "files": [chapter["file"] for chapter in part.get("chapters", [])],
        }
        for part in toc.get("parts", [])
    ]


def parse_lines(lines: list[str]) -> dict[str, str]:
    """``{docname: text}`` from the directive's ``docname: text`` lines."""
    entries = {}
    for line in lines:
        if not line.strip():
            continue
        name, sep, text = line.partition(":")
        if not sep or not name.strip() or not text.strip():
            raise ValueError(
                f"book-map: expected 'docname: what it teaches', got {line!r}"
            )
        entries[name.strip()] = text.strip()
    return entries


def map_markdown(
    parts: list[dict], entries: dict[str, str], here: str
) -> list[str]:
    """MyST source of the map: a grid of one card per part that lists a page of
    ``entries``; ``here`` is the docname of the page holding the map (links are
    relative to its folder)."""
    folder = PurePosixPath(here).parent
    lines = ["::::{grid} 1 1 2 2", ":gutter: 3", ""]
    number = 0
    listed = set()
    for part in parts:
        items = []
        for file in part["files"]:
            name = str(PurePosixPath(file).relative_to(folder))
            if part["numbered"]:
                number += 1
            if file == here:
                continue
            if name not in entries:
                raise ValueError(
                    f"book-map: the table of contents lists {file!r} but the "
                    f"map has no line for {name!r}"
                )
            listed.add(name)
            marker = f"{number}." if part["numbered"] else "-"
            items.append(f"{marker} {{doc}}`{name}`: {entries[name]}")
        if not items:
            continue
        lines += [
            f":::{{grid-item-card}} {part['caption']}",
            "",
            *items,
            ":::",
            "",
        ]
    lines.append("::::")
    return lines


class BookMap(SphinxDirective):
    has_content = True

    def run(self) -> list[nodes.Node]:
        try:
            entries = parse_lines(list(self.content))
            parts = toc_parts(
                Path(self.env.srcdir) / self.config.external_toc_path
            )
            source = map_markdown(parts, entries, self.env.docname)
        except ValueError as exc:
            raise self.error(str(exc)) from exc
        container = nodes.container(classes=["book-map"])
        self.state.nested_parse(
            StringList(source, source=self.env.docname),
            self.content_offset,
            container,
        )
        return [container]


def setup(app):
    app.add_directive("book-map", BookMap)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
