"""book/references.bib parses, with one entry per key, every cited key exists and every entry
links its source; book/_ext/citation_labels.py names each source by its authors and year
(a GitHub thread by its repository and number), the same in the text and in the list."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pybtex.database import parse_file

ROOT = Path(__file__).resolve().parent.parent
BIB = ROOT / "book" / "references.bib"


def test_bibliography_parses_with_unique_keys():
    entries = parse_file(str(BIB)).entries  # pybtex raises on a duplicate key or a syntax error
    keys = re.findall(r"(?m)^@\w+\{([^,]+),", BIB.read_text())
    assert len(keys) == len(entries) == len(set(keys))


def test_every_cited_key_is_in_the_bibliography():
    keys = set(parse_file(str(BIB)).entries)
    cited = set()
    for chapter in (ROOT / "book").glob("*.ipynb"):
        for group in re.findall(r"\{cite[a-z:]*\}`([^`]+)`", chapter.read_text()):
            cited.update(k.strip() for k in group.split(","))
    missing = sorted(cited - keys)
    assert not missing, f"cited but not in references.bib: {missing}"


def test_each_source_has_one_entry():
    """One source, one entry: no URL (or DOI) appears under two keys."""
    seen: dict[str, str] = {}
    repeated = []
    for key, entry in parse_file(str(BIB)).entries.items():
        for name in ("url", "doi"):
            value = entry.fields.get(name, "").strip().rstrip("/").lower()
            if value and value in seen:
                repeated.append(f"{key} and {seen[value]}: {value}")
            elif value:
                seen[value] = key
    assert not repeated, f"sources with two entries: {repeated}"


def test_every_entry_links_its_source():
    """A reader can follow every entry: a url or a doi field, or a \\url in howpublished
    (an arXiv number in the journal field is not a link)."""
    unlinked = [key for key, entry in parse_file(str(BIB)).entries.items()
                if not (entry.fields.get("url") or entry.fields.get("doi")
                        or "\\url{" in entry.fields.get("howpublished", ""))]
    assert not unlinked, f"entries without a link: {unlinked}"


def entry(source: str):
    from pybtex.database import parse_string

    (parsed,) = parse_string(source, "bibtex").entries.values()
    return parsed


@pytest.mark.parametrize("source, name", [
    ("@misc{a, author = {Dao, Tri}, year = {2024}}", "Dao"),
    ("@misc{a, author = {Wang, Ben and Komatsuzaki, Aran}, year = {2021}}",
     "Wang and Komatsuzaki"),
    ("@misc{a, author = {Shaw, P. and Uszkoreit, J. and Vaswani, A.}}", "Shaw et al."),
    ("@misc{a, author = {Dubey, Abhimanyu and others}}", "Dubey et al."),
    ("@misc{a, author = {{Mistral AI}}}", "Mistral AI"),
    ("@misc{a, author = {Rozi{\\`e}re, Baptiste and Gehring, Jonas and others}}",
     "Rozière et al."),
    ("@misc{a, author = {{majiayu000}}, "
     "url = {https://github.com/unslothai/unsloth/pull/3795}}", "unsloth #3795"),
    ("@misc{a, author = {{lytning98}}, "
     "url = {https://github.com/huggingface/transformers/issues/25199}}",
     "transformers #25199"),
    ("@misc{a, author = {{Meta}}, url = {https://github.com/meta-llama/llama-models}}",
     "Meta"),
])
def test_a_source_is_named_by_authors_or_by_repository_and_number(source, name):
    from citation_labels import cited_name

    assert cited_name(entry(source)) == name


def test_labels_are_name_and_year_with_a_letter_where_two_share_them():
    from citation_labels import AuthorYearLabels, AuthorYearSorting

    entries = [entry(s) for s in (
        "@misc{b, author = {Su, Jianlin}, year = {2021}, title = {Blog}}",
        "@misc{c, author = {Su, Jianlin and Lu, Yu and Pan, S.}, year = {2021}}",
        "@misc{a, author = {Su, Jianlin}, year = {2021}, title = {An earlier post}}",
        "@misc{d, author = {{abc}}, year = {2020}}",
    )]
    ordered = AuthorYearSorting().sort(entries)
    labels = list(AuthorYearLabels().format_labels(ordered))
    assert labels == ["abc, 2020", "Su, 2021a", "Su, 2021b", "Su et al., 2021"]
    assert [e.fields["title"] for e in ordered[1:3]] == ["An earlier post", "Blog"]
