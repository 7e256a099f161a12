"""Sphinx extension: one author-year name per source, in the text and in the
bibliography alike.

A source is named by its authors and year, "Abdin et al., 2024" (one author
"Dao, 2024", two "Wang and Komatsuzaki, 2021", three or more, or a list that
ends in "others", "Dubey et al., 2024"); a GitHub issue or pull request by its
repository and number instead of its author's handle, "transformers #25199,
2023". Two works with one name and year are told apart by a letter after the
year, "Su, 2021a" and "Su, 2021b".

- The bibliography style ``book`` (``bibtex_default_style``) labels each entry
  with that name, sorts the entries by it, case aside (so GitHub threads sit
  among the authors, under their repository), and writes "et al." where a
  BibTeX author list ends in "and others".
- The reference style ``author_year_suffixed`` (``bibtex_reference_style``)
  cites with the same name, and each year carries the letters that end the
  entry's bibliography label: "[Su, 2021a, Su, 2021b]".
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pybtex.plugin
from pybtex.richtext import Text
from pybtex.style.formatting.unsrt import Style as UnsrtStyle
from pybtex.style.labels import BaseLabelStyle
from pybtex.style.sorting import BaseSortingStyle
from pybtex.style.template import FieldIsMissing, join, node, sentence
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
BIBLIOGRAPHY_STYLE = "book"
SUFFIX = re.compile(r"\d([a-z]+)$")  # letters after the label's year digits
GITHUB_THREAD = re.compile(
    r"^https?://github\.com/[^/]+/([^/]+)/(?:issues|pull)/(\d+)/?$")


def label_suffix(label: str) -> str:
    """The letters that tell apart labels of one name and year:
    'Su, 2021a' -> 'a', 'Su, 2021' -> '', 'CISC' (no year) -> ''."""
    found = SUFFIX.search(label)
    return found.group(1) if found else ""


def _surname(person) -> str:
    parts = person.rich_prelast_names + person.rich_last_names
    return " ".join(str(part.render_as("text")) for part in parts)


def cited_name(entry) -> str:
    """How the book names a source: its GitHub repository and number, or its
    authors' (else editors') surnames, with "et al." from three authors on
    and for a list that ends in "others"."""
    thread = GITHUB_THREAD.match(entry.fields.get("url", "").strip())
    if thread:
        return f"{thread.group(1)} #{thread.group(2)}"
    persons = entry.persons.get("author") or entry.persons.get("editor") or []
    names = [_surname(person) for person in persons]
    more = bool(names) and names[-1] == "others"
    names = [name for name in names if name != "others"]
    if not names:
        return str(entry.fields.get("title", entry.key))
    if more or len(names) >= 3:
        return f"{names[0]} et al."
    return " and ".join(names)


def _year(entry) -> str:
    return str(entry.fields.get("year", "")).strip()


class AuthorYearLabels(BaseLabelStyle):
    """Labels "Name, Year", with a, b, ... after the year where one name
    and year belong to several entries (in the order of the sorted
    bibliography)."""

    def format_labels(self, sorted_entries):
        sorted_entries = list(sorted_entries)
        bases = [", ".join(filter(None, (cited_name(e), _year(e))))
                 for e in sorted_entries]
        total, seen = Counter(bases), Counter()
        for base in bases:
            seen[base] += 1
            yield base + (chr(ord("a") + seen[base] - 1)
                          if total[base] > 1 else "")


class AuthorYearSorting(BaseSortingStyle):
    """By name (case aside), then year, then title."""

    def sorting_key(self, entry):
        return (cited_name(entry).casefold(), _year(entry),
                str(entry.fields.get("title", "")).casefold())


@node
def names_et_al(children, context, role, **kwargs):
    """The persons of ``role``, joined; a last person "others" becomes
    "et al.", as in the text."""
    assert not children
    try:
        persons = list(context["entry"].persons[role])
    except KeyError:
        raise FieldIsMissing(role, context["entry"]) from None
    more = bool(persons) and str(persons[-1]) == "others"
    persons = [person for person in persons if str(person) != "others"]
    style = context["style"]
    formatted = [style.format_name(person, style.abbreviate_names)
                 for person in persons]
    if not more:
        return join(**kwargs)[formatted].format_data(context)
    listed = join(sep=", ")[formatted].format_data(context)
    return Text(listed, ", et al." if len(formatted) > 1 else " et al.")


class BookStyle(UnsrtStyle):
    """pybtex's ``unsrt`` entries with the book's labels and order."""

    default_label_style = BIBLIOGRAPHY_STYLE
    default_sorting_style = BIBLIOGRAPHY_STYLE

    def format_names(self, role, as_sentence=True):
        formatted = names_et_al(role, sep=", ", sep2=" and ",
                                last_sep=", and ")
        return sentence[formatted] if as_sentence else formatted


@node
def cited_author(children, data: dict[str, Any]):
    """The entry's name as the bibliography labels it (``cited_name``)."""
    assert not children
    return Text(cited_name(data["entry"]))


@node
def suffixed_year(children, data: dict[str, Any]):
    """The entry's year, then its bibliography label's suffix letters."""
    assert not children
    suffix = label_suffix(data["formatted_entry"].label)
    return Text(year.format_data(data), suffix)


@dataclass
class _Parenthetical(BasicAuthorYearParentheticalReferenceStyle):
    def inner(self, role_name: str):
        return join2(sep1=self.pre_text_sep, sep2=self.post_text_sep)[
            pre_text,
            reference[join(sep=self.author_year_sep)[cited_author,
                                                     suffixed_year]],
            post_text,
        ]


@dataclass
class _Textual(BasicAuthorYearTextualReferenceStyle):
    def inner(self, role_name: str):
        cited = join2(sep1=self.pre_text_sep, sep2=self.post_text_sep)[
            pre_text, reference[suffixed_year], post_text]
        return join(sep=self.text_reference_sep)[
            cited_author, join[self.bracket.left, cited, self.bracket.right]]


@dataclass
class _Year(ExtraYearReferenceStyle):
    def inner(self, role_name: str):
        return reference[suffixed_year]


SUFFIXED = {BasicAuthorYearParentheticalReferenceStyle: _Parenthetical,
            BasicAuthorYearTextualReferenceStyle: _Textual,
            ExtraYearReferenceStyle: _Year}


@dataclass
class AuthorYearSuffixedReferenceStyle(AuthorYearReferenceStyle):
    """``author_year`` with the book's names and the bibliography label's
    suffix after each year."""

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
    for group, klass in (("pybtex.style.formatting", BookStyle),
                         ("pybtex.style.labels", AuthorYearLabels),
                         ("pybtex.style.sorting", AuthorYearSorting)):
        pybtex.plugin.register_plugin(group, BIBLIOGRAPHY_STYLE, klass,
                                      force=True)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
