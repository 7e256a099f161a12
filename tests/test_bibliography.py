"""book/references.bib parses, with one entry per key, and every cited key exists."""

from __future__ import annotations

import re
from pathlib import Path

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
