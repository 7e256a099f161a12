"""Sphinx extension: author-year citations carrying the bibliography's suffix.

The bibliography labels two works of one author and year ``CISC25a`` and
``CISC25b``, but sphinxcontrib-bibtex's ``author_year`` citations printed the
bare year for both, "[CISC, 2025, CISC, 2025]". The reference style
``author_year_suffixed`` (``bibtex_reference_style`` in ``_config.yml``) is
``author_year`` with each year followed by the letters that end the entry's
bibliography label after its year digits: "[CISC, 2025a, CISC, 2025b]".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pybtex.richtext import Text
from pybtex.style.template import join, node
from sphinxcontrib.bibtex.plugin import register_plugin
from sphinxcontrib.bibtex.style.referencing.author_year import (
    AuthorYearReferenceStyle,
)
from sphinxcontrib.bibtex.style.referencing.basic_author_year import (
    BasicAuthorYearParentheticalReferenceStyle,
    BasicAuthorYearTextualReferenceStyle,
)
from sphinxcontrib.bibtex.style.referencing.extra_year import (
    ExtraYearReferenceStyle,
)
from sphinxcontrib.bibtex.style.template import (
    join2,
    post_text,
    pre_text,
    reference,
    year,
)

STYLE_NAME = "author_year_suffixed"
SUFFIX = re.compile(r"\d([a-z]+)$")  # letters after the label's year digits


def label_suffix(label: str) -> str:
    """The letters that tell apart labels of one author and year:
    'CISC25a' -> 'a', 'Su21' -> '', 'CISC' (no year) -> ''."""
    found = SUFFIX.search(label)
    return found.group(1) if found else ""


@node
def suffixed_year(children, data: dict[str, Any]):
    """The entry's year, then its bibliography label's suffix letters."""
    assert not children
    suffix = label_suffix(data["formatted_entry"].label)
    return Text(year.format_data(data), suffix)


@dataclass
class _Parenthetical(BasicAuthorYearParentheticalReferenceStyle):
    def inner(self, role_name: str):
        author = self.person.author_or_editor_or_title(full="s" in role_name)
        return join2(sep1=self.pre_text_sep, sep2=self.post_text_sep)[
            pre_text,
            reference[join(sep=self.author_year_sep)[author, suffixed_year]],
            post_text,
        ]


@dataclass
class _Textual(BasicAuthorYearTextualReferenceStyle):
    def inner(self, role_name: str):
        author = self.person.author_or_editor_or_title(full="s" in role_name)
        cited = join2(sep1=self.pre_text_sep, sep2=self.post_text_sep)[
            pre_text, reference[suffixed_year], post_text]
        return join(sep=self.text_reference_sep)[
            author, join[self.bracket.left, cited, self.bracket.right]]


@dataclass
class _Year(ExtraYearReferenceStyle):
    def inner(self, role_name: str):
        return reference[suffixed_year]


SUFFIXED = {BasicAuthorYearParentheticalReferenceStyle: _Parenthetical,
            BasicAuthorYearTextualReferenceStyle: _Textual,
            ExtraYearReferenceStyle: _Year}


@dataclass
class AuthorYearSuffixedReferenceStyle(AuthorYearReferenceStyle):
    """``author_year`` with the bibliography label's suffix after each year."""

    def __post_init__(self):
        super().__post_init__()
        self.styles[:] = [
            SUFFIXED[type(style)](**vars(style)) if type(style) in SUFFIXED
            else style for style in self.styles]
        self.role_style.clear()
        self.role_style.update((role, style) for style in self.styles
                               for role in style.role_names())


def setup(app):
    register_plugin("sphinxcontrib.bibtex.style.referencing", STYLE_NAME,
                    AuthorYearSuffixedReferenceStyle)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
