"""Sphinx extension: an unnumbered page numbers its own figures.

Sphinx numbers a figure by its chapter ("Fig. 4.1"), and the figures of every
page without a chapter number (the landing page, the appendix) from one
counter shared by all of them: the appendix's first figure came out as
"Fig. 2" because the landing page holds figure 1. Here each unnumbered page
counts its own figures (tables and code blocks alike) from 1, and the pages
of an appendix part of ``_toc.yml`` (its caption starts with "Appendix") take
a letter in order: "Fig. A.1", "Fig. A.2". References (``numref``) read the
same numbers.
"""

from __future__ import annotations

from pathlib import Path
from string import ascii_uppercase

from book_map import toc_parts


def appendix_letters(parts: list[dict]) -> dict[str, str]:
    """``{docname: letter}`` for the pages of the appendix parts, in order."""
    pages = [
        file
        for part in parts
        if part["caption"].lower().startswith("appendix")
        for file in part["files"]
    ]
    return dict(zip(pages, ascii_uppercase, strict=False))


def renumber(
    fignumbers: dict[str, dict[str, dict[str, tuple]]],
    secnumbers: dict[str, dict[str, tuple]],
    letters: dict[str, str],
) -> list[str]:
    """Number the figures of each page without a section number from 1 (after
    its appendix letter), in place; the pages whose numbers changed."""
    changed = []
    for docname, by_type in fignumbers.items():
        if any(secnumbers.get(docname, {}).values()):
            continue
        prefix = (letters[docname],) if docname in letters else ()
        before = {kind: dict(numbers) for kind, numbers in by_type.items()}
        for numbers in by_type.values():
            ordered = sorted(numbers, key=numbers.get)
            for count, figure_id in enumerate(ordered, start=1):
                numbers[figure_id] = (*prefix, count)
        if by_type != before:
            changed.append(docname)
    return changed


def number_unnumbered_pages(app, env) -> list[str]:
    parts = toc_parts(Path(env.srcdir) / app.config.external_toc_path)
    letters = appendix_letters(parts)
    return renumber(env.toc_fignumbers, env.toc_secnumbers, letters)


def setup(app):
    # after Sphinx's own numbering (the toctree collector, priority 500)
    app.connect("env-get-updated", number_unnumbered_pages, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
