"""The book as a reader meets it in headless Chromium, offline (every non-file request
blocked), in the HTML of $BOOK_HTML (or a fresh build, see tests/conftest.py):

- no page logs an error to the console or raises one, the search page included;
- a search runs offline, shows a snippet under every result, and ranks the pages whose text
  contains the query exactly before the others;
- every table's cells are padded, and on a phone a table wider than its box says so;
- no printed output is wider than its box (cut off mid-word);
- the landing page links every chapter and does not repeat the book's title in its tab;
- every exercise's worked code sits inside its Solution dropdown.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from test_book_offline import DESKTOP, PHONE, built_pages, toc_pages

WINDOW = {"width": 1400, "height": 1000}
QUERY = "M-RoPE"
# Chapters with exercises, all laid out as book/AUTHORING.md says.
EXERCISE_CHAPTERS = [page for page in toc_pages()
                     if Path(page).name[:2].isdigit() and 1 <= int(Path(page).name[:2])]


def open_tab(browser, url: str, viewport: dict, problems: list | None = None):
    """A tab that may load only files, at ``url``; console errors and uncaught exceptions
    are appended to ``problems``."""
    tab = browser.new_page()
    tab.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:")
              else route.abort())
    if problems is not None:
        tab.on("console", lambda message: problems.append(f"console: {message.text}")
               if message.type == "error" else None)
        tab.on("pageerror", lambda error: problems.append(f"uncaught: {error}"))
    tab.set_viewport_size(viewport)
    tab.goto(url, wait_until="load")
    return tab


def test_no_console_errors_on_any_page(browser, html_dir):
    """Every page of the build, the search page and the index included, loads without a
    console error or an uncaught exception (the theme's "invalid theme mode" among them)."""
    pages = built_pages(html_dir)
    assert any(page.name == "search.html" for page in pages)
    found = {}
    for page in pages:
        problems: list[str] = []
        tab = open_tab(browser, page.as_uri(), DESKTOP, problems)
        tab.wait_for_timeout(200)  # scripts that run after load
        tab.close()
        if problems:
            found[str(page.relative_to(html_dir))] = problems[:3]
    assert not found, f"pages with console errors: {found}"


def page_text(path: Path) -> str:
    """The visible text of a built page's article, lower case (tags and scripts dropped)."""
    html = path.read_text()
    start, end = html.find("<article"), html.rfind("</article>")
    article = re.sub(r"<(script|style)\b.*?</\1>", " ", html[start:end], flags=re.S)
    text = re.sub(r"<[^>]+>", " ", article)
    return re.sub(r"\s+", " ", text.replace("&#8209;", "-")).lower()


def test_search_works_offline_with_snippets_and_exact_matches_first(browser, html_dir):
    problems: list[str] = []
    url = (html_dir / "search.html").as_uri() + f"?q={QUERY}"
    tab = open_tab(browser, url, DESKTOP, problems)
    tab.wait_for_function("/Search finished/.test(document.querySelector('main').innerText)",
                          timeout=20000)
    tab.wait_for_timeout(500)  # the last results and their snippets
    results = tab.evaluate("""() => [...document.querySelectorAll('ul.search > li')].map(li => ({
        href: li.querySelector('a').getAttribute('href'),
        snippet: (li.querySelector('p.context') || {innerText: ''}).innerText}))""")
    tab.close()
    assert not problems, f"the search page logged errors: {problems[:3]}"
    assert results, f"no results for {QUERY!r}"
    empty = [r["href"] for r in results if not r["snippet"].strip()]
    assert not empty, f"results without a snippet: {empty}"
    contains = [QUERY.lower() in page_text(html_dir / r["href"].split("#")[0]) for r in results]
    assert any(contains), f"no result contains {QUERY!r}: {results}"
    first_without = contains.index(False) if False in contains else len(contains)
    assert all(contains[:first_without]) and not any(contains[first_without:]), (
        f"pages containing {QUERY!r} do not all come first: "
        f"{[(r['href'], c) for r, c in zip(results, contains, strict=True)]}")
    for result, has_query in zip(results, contains, strict=True):
        if has_query:
            assert QUERY.lower() in result["snippet"].lower(), result


# The cells of every table in the article whose left or right padding is under 3 px.
UNPADDED_CELLS = """() => [...document.querySelectorAll('main article table')].flatMap(
  table => [...table.querySelectorAll('td, th')].filter(cell => {
    const style = getComputedStyle(cell);
    return parseFloat(style.paddingLeft) < 3 || parseFloat(style.paddingRight) < 3;
  }).slice(0, 1).map(cell => cell.textContent.trim().slice(0, 30)))"""

# Printed outputs wider than their box, with their longest line's length.
WIDE_OUTPUTS = """() => [...document.querySelectorAll('main article div.cell_output pre')]
  .filter(pre => pre.scrollWidth > pre.clientWidth + 1)
  .map(pre => Math.max(...pre.textContent.split('\\n').map(line => line.length)))"""


def test_tables_are_padded_and_outputs_fit_their_box(browser, html_dir):
    """At 1400 x 1000 px: every table cell has padding on both sides, and every printed
    output fits its box (it wraps rather than being cut off)."""
    problems = {}
    for page in built_pages(html_dir):
        tab = open_tab(browser, page.as_uri(), WINDOW)
        unpadded, wide = tab.evaluate(UNPADDED_CELLS), tab.evaluate(WIDE_OUTPUTS)
        tab.close()
        if unpadded or wide:
            problems[str(page.relative_to(html_dir))] = {"unpadded cells": unpadded,
                                                         "outputs wider than the box": wide}
    assert not problems, problems


# Tables wider than the box they scroll in, and whether a hint line stands above that box.
WIDE_TABLES = """() => [...document.querySelectorAll('main article table')].map(table => {
  let box = table.parentElement;
  while (box && box.tagName !== 'ARTICLE' && !['auto', 'scroll'].includes(
      getComputedStyle(box).overflowX)) box = box.parentElement;
  if (!box || box.tagName === 'ARTICLE' || box.scrollWidth <= box.clientWidth + 1) return null;
  const hint = box.previousElementSibling;
  return {table: table.textContent.trim().slice(0, 40),
          hinted: !!hint && hint.classList.contains('book-scroll-hint')
                  && hint.getBoundingClientRect().height > 0};
}).filter(Boolean)"""


def test_wide_tables_say_they_scroll_on_a_phone(browser, html_dir):
    wide_seen, problems = 0, {}
    for page in built_pages(html_dir):
        tab = open_tab(browser, page.as_uri(), PHONE)
        tables = tab.evaluate(WIDE_TABLES)
        tab.close()
        wide_seen += len(tables)
        silent = [t["table"] for t in tables if not t["hinted"]]
        if silent:
            problems[str(page.relative_to(html_dir))] = silent
    assert not problems, f"tables that scroll sideways at 390 px without a hint: {problems}"
    assert wide_seen, "no table is wider than a phone: the check saw nothing to check"


def test_landing_page_links_every_chapter_and_names_the_book_once(browser, html_dir):
    root = toc_pages()[0]
    tab = open_tab(browser, (html_dir / root).as_uri(), WINDOW)
    linked = set(tab.evaluate(
        "[...document.querySelectorAll('main article a[href]')].map(a => a.href.split('#')[0])"))
    title = tab.title()
    tab.close()
    missing = [page for page in toc_pages()[1:]
               if (html_dir / page).as_uri() not in linked]
    assert not missing, f"the landing page does not link {missing}"
    book = "Rotary Position Embedding from first principles"
    assert title.count(book) == 1, title


@pytest.mark.parametrize("page", EXERCISE_CHAPTERS)
def test_exercise_code_is_inside_its_solution(browser, html_dir, page):
    """Each exercise: its admonition, then one Solution dropdown holding the reasoning and
    the worked code (book/AUTHORING.md); no solution code outside a dropdown."""
    tab = open_tab(browser, (html_dir / page).as_uri(), WINDOW)
    layout = tab.evaluate("""() => [...document.querySelectorAll(
        'main article div.admonition[class*="admonition-exercise"]')].map(exercise => {
      const next = exercise.nextElementSibling;
      const solution = next && next.matches('details.sd-dropdown') ? next : null;
      return {title: exercise.querySelector('.admonition-title').innerText,
              solution: solution ? solution.querySelector('summary').innerText.trim() : null,
              code: solution ? solution.querySelectorAll('div.cell div.cell_input').length : 0};
    })""")
    stray = tab.evaluate("[...document.querySelectorAll('main article div.cell')].filter("
                         "c => c.classList.contains('tag_solution') && !c.closest('details'))"
                         ".length")
    tab.close()
    assert len(layout) >= 2, f"{page}: exercises not found: {layout}"
    wrong = [e for e in layout if e["solution"] != "Solution" or e["code"] != 1]
    assert not wrong and not stray, f"{page}: {wrong}, {stray} solution cells outside"


CITATION = re.compile(r'<a class="reference internal" href="(?:[^"]*/)?bibliography\.html'
                      r'#([^"]+)"[^>]*>([^<]+)</a>')
SPAN = re.compile(r'<span class="bibtex-citation"[^>]*>(.*?)</span>', re.S)
LABEL = re.compile(r'<div class="citation" id="([^"]+)"[^>]*>\s*<span class="label">'
                   r'<span class="fn-bracket">\[</span>([^<]+)<')


def test_citations_tell_apart_works_of_one_author_and_year(html_dir):
    """Two entries never share a citation text, and a year carries the letter its
    bibliography label ends with ("[CISC, 2025a, CISC, 2025b]")."""
    labels = dict(LABEL.findall((html_dir / "book" / "bibliography.html").read_text()))
    assert labels, "bibliography labels not found"
    text_of: dict[str, set[str]] = {}
    for page in built_pages(html_dir):
        for span in SPAN.findall(page.read_text()):
            # a textual citation names the authors outside its links: "Heo et al. [2024]"
            authors = re.sub(r"<[^>]+>", "", span).split("[")[0].strip()
            for target, text in CITATION.findall(span):
                text_of.setdefault(f"{authors} {text.strip()}".strip(), set()).add(target)
                suffix = re.search(r"\d([a-z]*)$", labels[target])
                if suffix and suffix.group(1):
                    assert text.strip().endswith(suffix.group(1)), (page.name, text,
                                                                    labels[target])
    shared = {text: sorted(labels[t] for t in targets)
              for text, targets in text_of.items() if len(targets) > 1}
    assert not shared, f"one citation text for several entries: {shared}"


def test_prose_does_not_name_the_authors_twice(html_dir):
    """Where the prose names the authors, the textual citation names them once: no
    "Heo et al. [Heo et al., 2024]"."""
    twice = {}
    for page in built_pages(html_dir):
        found = re.findall(r"(\w+) et al\. \[\1 et al\.", page_text(page))
        if found:
            twice[page.name] = found
    assert not twice, twice


# ------------------------------------------------------------------------------------------
# A lesson, not a lab notebook (issue 46): checks on every page of the table of contents.

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = [ROOT / page.replace(".html", ".ipynb") for page in toc_pages()
             if (ROOT / page.replace(".html", ".ipynb")).exists()]
CHAPTERS = [page for page in toc_pages()
            if Path(page).name[:2].isdigit() and int(Path(page).name[:2]) >= 1]
# What the reader should not be told about: how the book is built and tested.
MACHINERY = re.compile(
    r"\b(?:hidden|collapsed) (?:code )?cells?\b|\bnbval\b|show code cell|\bnext cell\b"
    r"|hide-input|remove-input|remove-cell|source_hidden"
    r"|\bformats? (?:these|the|its) numbers\b|\bnumbers? (?:quoted|formatted) (?:next|below)\b",
    re.IGNORECASE)
# How the book keeps itself honest is told once, in the preface's last paragraph: no other
# page's prose speaks of its asserts, its build or tests, runs, commits or stored results.
HONESTY = re.compile(
    r"\(asserted\)|\bassert(?:s|ed|ions?)?\b|\bwhen the book is (?:built|executed|run)\b"
    r"|\bthe (?:book'?s? )?(?:build|tests)\b|\bthis page'?s? (?:tests|code|run)\b"
    r"|\brun \d+\b|\bcommit(?:s|ted)?\b|\bresults? files?\b|\bstored (?:runs?|files?|results?)\b"
    r"|\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b",
    re.IGNORECASE)
HIDING = {"hide-input", "remove-input", "remove-cell", "solution"}


def machinery_phrases(notebook, honesty: bool = True) -> list[str]:
    """The sentences of a notebook's prose, and the lines of its code shown in the HTML,
    that talk about the build machinery; with ``honesty``, also the sentences that speak of
    the book's checks (all pages but the preface)."""
    found = []
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type == "markdown":
            for sentence in re.split(r"(?<=[.;:!?])\s+", cell.source):
                if MACHINERY.search(sentence) or honesty and HONESTY.search(sentence):
                    found.append(f"cell {index}: {' '.join(sentence.split())[:120]}")
        elif cell.cell_type == "code" and not HIDING & set(cell.metadata.get("tags", [])):
            found += [f"cell {index} (code): {line.strip()}"
                      for line in cell.source.splitlines() if MACHINERY.search(line)]
    return found


def test_the_machinery_check_finds_what_it_looks_for():
    import nbformat

    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_markdown_cell("A collapsed cell formats these numbers for the text. "
                                      "The code below checks it."),
        nbformat.v4.new_code_cell("# nbval compares this output\nx = 1"),
        nbformat.v4.new_code_cell("# nbval: hidden from the HTML"),
        nbformat.v4.new_markdown_cell("The hidden cell below checks it; the next cell too."),
        nbformat.v4.new_markdown_cell("The angle is exact (asserted). Run 4 of 3f2a9c1 said "
                                      "so. The book's tests check it. A rotation is exact.")]
    notebook.cells[2].metadata["tags"] = ["remove-cell"]
    found = machinery_phrases(notebook)
    assert [line.split(":")[0] for line in found] == [
        "cell 0", "cell 1 (code)", "cell 3", "cell 3", "cell 4", "cell 4", "cell 4"]
    assert [line.split(":")[0] for line in machinery_phrases(notebook, honesty=False)] == [
        "cell 0", "cell 1 (code)", "cell 3", "cell 3"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_prose_says_nothing_about_the_build_machinery(path):
    """No "hidden cell", "collapsed cell", "nbval", "next cell"... in a page's prose or in
    the code it shows: the reader sees neither the cells' tags nor the tests."""
    import nbformat

    found = machinery_phrases(nbformat.read(path, as_version=4),
                              honesty=path.stem != "00_preface")
    assert not found, f"{path.name}: " + " | ".join(found)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_cells_that_only_draw_are_collapsed(path):
    """A cell that makes a captioned figure or an animation shows its figure, not its
    plotting code (collapsed in the HTML and in JupyterLab)."""
    import nbformat

    notebook = nbformat.read(path, as_version=4)
    shown = [index for index, cell in enumerate(notebook.cells) if cell.cell_type == "code"
             and ("figure" in cell.metadata.get("mystnb", {})
                  or re.match(r"\s*scrubber\(", cell.source))
             and not ({"hide-input", "remove-input", "remove-cell"}
                      & set(cell.metadata.get("tags", []))
                      and cell.metadata.get("jupyter", {}).get("source_hidden"))]
    assert not shown, f"{path.name}: cells {shown} show the code that draws their figure"


# Where, in the article, the first figure (or animation), the first paragraph and the first
# code a reader sees without opening anything start.
FIRST_SCREEN = """() => {
  const article = document.querySelector('main article');
  const top = el => el.getBoundingClientRect().top + window.scrollY;
  const figure = article.querySelector('figure, div.animation');
  const code = [...article.querySelectorAll('div.cell_input')].find(
      el => !el.closest('details') && el.offsetParent !== null);
  const prose = [...article.querySelectorAll('section p')].find(
      p => !p.closest('figure, .cell, details, .admonition') && p.innerText.trim().length > 80);
  return {figure: figure ? top(figure) : null, code: code ? top(code) : null,
          prose: prose ? top(prose) : null, screen: window.innerHeight};
}"""


@pytest.mark.parametrize("page", CHAPTERS)
def test_chapters_open_with_prose_and_a_figure_not_code(browser, html_dir, page):
    """The first screen of a chapter: its title, prose, then a figure; the first code a
    reader sees without opening a toggle comes after that figure."""
    tab = open_tab(browser, (html_dir / page).as_uri(), WINDOW)
    found = tab.evaluate(FIRST_SCREEN)
    tab.close()
    assert found["figure"] is not None, f"{page}: no figure"
    assert found["prose"] is not None and found["prose"] < found["figure"], (page, found)
    assert found["code"] is None or found["figure"] < found["code"], (
        f"{page}: code before the first figure: {found}")
    assert found["figure"] < 1.5 * found["screen"], (
        f"{page}: the first figure starts {found['figure']:.0f} px down: {found}")


# At a phone's width: inline formulas that reach past their line's box, and display
# equations that need sideways scrolling or were shrunk below MATH_FLOOR of the text.
PHONE_MATH = """(floor) => {
  const body = parseFloat(getComputedStyle(document.querySelector('main article p')).fontSize);
  const out = {inline: [], display: [], small: []};
  for (const c of document.querySelectorAll('main article mjx-container')) {
    const label = (c.getAttribute('aria-label') || c.textContent).slice(0, 50);
    if (c.hasAttribute('display')) {
      if (c.scrollWidth > c.clientWidth + 1) out.display.push(label);
      if (parseFloat(getComputedStyle(c).fontSize) < floor * body) out.small.push(label);
    } else {
      let box = c.parentElement;
      while (box && getComputedStyle(box).display.startsWith('inline')) box = box.parentElement;
      if (c.getBoundingClientRect().right > box.getBoundingClientRect().right + 1)
        out.inline.push(label);
    }
  }
  return out;
}"""
MATH_FLOOR = 0.8  # of the body text: a display equation shrunk to fit stays readable


@pytest.mark.parametrize("page", toc_pages())
def test_math_fits_a_phone(browser, html_dir, page):
    """At 390 x 844 px every inline formula fits its line (long ones are displayed), and
    every display equation fits the column without sideways scrolling, at no less than
    MATH_FLOOR of the body text."""
    from test_book_offline import offline_tab

    tab = offline_tab(browser, (html_dir / page).as_uri(), PHONE)
    tab.wait_for_timeout(300)  # _static/math_fit.js runs once MathJax has typeset
    found = tab.evaluate(PHONE_MATH, MATH_FLOOR)
    tab.close()
    problems = {kind: items for kind, items in found.items() if items}
    assert not problems, f"{page}: {problems}"


def search_results(browser, html_dir, query: str) -> list[dict]:
    url = (html_dir / "search.html").as_uri() + f"?q={query}"
    tab = open_tab(browser, url, DESKTOP)
    tab.wait_for_function("/Search finished/.test(document.querySelector('main').innerText)",
                          timeout=20000)
    tab.wait_for_timeout(500)
    results = tab.evaluate("""() => [...document.querySelectorAll('ul.search > li')].map(li => ({
        href: li.querySelector('a').getAttribute('href'),
        snippet: (li.querySelector('p.context') || {innerText: ''}).innerText}))""")
    tab.close()
    return results


def test_search_ranks_a_title_match_first_and_shows_text(browser, html_dir):
    """"interleaved" finds chapter 8, whose title it is, first, "M-RoPE" chapter 12; no
    snippet shows TeX or code."""
    results = search_results(browser, html_dir, "interleaved")
    assert results and results[0]["href"].split("#")[0].endswith(
        "08_interleaved_vs_half.html"), [r["href"] for r in results[:5]]
    # "M-RoPE" is chapter 12's subject; "decode" is not chapter 1's (it never decodes)
    results = search_results(browser, html_dir, "M-RoPE")
    assert results and results[0]["href"].split("#")[0].endswith(
        "12_rope_in_more_dimensions.html"), [r["href"] for r in results[:5]]
    assert not any("01_why_positions" in r["href"]
                   for r in search_results(browser, html_dir, "decode"))
    for query in ("interleaved", "theta", "apply_rope"):
        for result in search_results(browser, html_dir, query):
            assert not re.search(r"\\[a-zA-Z(\[]|\$|>>>|import torch", result["snippet"]), (
                query, result)


def test_search_text_is_the_prose(html_dir):
    """The text the search reads (and quotes) holds no TeX source and no code cells."""
    text = (html_dir / "_static" / "book_search_text.js").read_text()
    pages = json.loads(text[text.index("{"):text.rindex("}") + 1])
    assert len(pages) >= len(toc_pages())
    for doc, words in pages.items():
        assert not re.search(r"\\\(|\\\[|\\frac|\\theta", words), doc
        assert "import torch" not in words and "assert torch" not in words, doc


def test_one_search_box_on_a_page(browser, html_dir):
    """The sidebar's search box is the only one at 1400 px (the empty header bar that held a
    second one is gone)."""
    tab = open_tab(browser, (html_dir / toc_pages()[1]).as_uri(), WINDOW)
    boxes = tab.evaluate("""() => [...document.querySelectorAll(
        '.search-button-field, form.bd-search, input[type=search]')].filter(
        el => el.offsetParent !== null && el.getBoundingClientRect().width > 0).length""")
    header = tab.evaluate("""() => { const h = document.querySelector('header.bd-header');
        return h ? h.getBoundingClientRect().height : 0; }""")
    tab.close()
    assert boxes == 1 and header == 0, (boxes, header)


def test_landing_page_starts_the_reader_and_offers_the_source(browser, html_dir):
    """The landing page says what the reader will be able to do, has a button to chapter 1
    above its map, and links a zip of the book's source that holds ropelib and the
    chapters; the preface does not repeat the map."""
    import zipfile

    root = html_dir / toc_pages()[0]
    tab = open_tab(browser, root.as_uri(), WINDOW)
    found = tab.evaluate("""() => {
      const article = document.querySelector('main article');
      const start = [...article.querySelectorAll('a.sd-btn')].find(
          a => a.href.split('#')[0].endsWith('01_why_positions.html'));
      const map = article.querySelector('.book-map');
      const zip = [...article.querySelectorAll('a[href]')].find(a => a.href.endsWith('.zip'));
      const outcomes = [...article.querySelectorAll('h2')].find(
          h => /able to/i.test(h.innerText));
      return {start: start ? start.getBoundingClientRect().top : null,
              map: map ? map.getBoundingClientRect().top : null,
              zip: zip ? zip.href : null,
              outcomes: outcomes ? outcomes.parentElement.querySelectorAll('li').length : 0};
    }""")
    tab.close()
    assert found["start"] is not None and found["map"] is not None, found
    assert found["start"] < found["map"] and found["outcomes"] >= 4, found
    archive = Path(found["zip"].removeprefix("file://"))
    names = zipfile.ZipFile(archive).namelist()
    for needed in ("rope-book/ropelib/__init__.py", "rope-book/book/intro.ipynb",
                   "rope-book/Makefile", "rope-book/requirements.txt"):
        assert needed in names, needed
    preface = (html_dir / toc_pages()[1]).read_text()
    article = preface[preface.find("<article"):preface.rfind("</article>")]
    linked = set(re.findall(r'href="(\d\d_[a-z_0-9]+)\.html', article))
    assert len(linked) <= 3, f"the preface links {sorted(linked)}: the map is repeated"


BIB_ENTRY = re.compile(r'<div class="citation" id="([^"]+)"[^>]*>\s*<span class="label">'
                       r'<span class="fn-bracket">\[</span>([^<]+)<.*?<p>(.*?)</p>', re.S)


def test_bibliography_entries_are_named_sorted_and_linked(html_dir):
    """Every entry has a link; its label is its author-year name, the one the text cites
    it by (GitHub threads by repository and number, never a handle); the list runs in
    alphabetical order, case aside; nobody is "and others"."""
    html = (html_dir / "book" / "bibliography.html").read_text()
    entries = BIB_ENTRY.findall(html)
    assert len(entries) > 50
    labels = [label for _, label, _ in entries]
    unlinked = [label for _, label, text in entries if 'href="http' not in text]
    assert not unlinked, f"entries without a link: {unlinked}"
    assert all(re.search(r", \d{4}[a-z]?$", label) for label in labels), labels

    def name_then_year(label):
        name, year = label.rsplit(", ", 1)
        return name.casefold(), year

    assert labels == sorted(labels, key=name_then_year), "not in alphabetical order"
    threads = [label for _, label, text in entries if re.search(
        r'href="https://github\.com/[^"]+/(?:issues|pull)/\d+"', text)]
    assert threads and all(re.match(r"[\w.-]+ #\d+, \d{4}", t) for t in threads), threads
    assert "and others" not in html
    cited = {}
    for page in built_pages(html_dir):
        for span in SPAN.findall(page.read_text()):
            authors = re.sub(r"<[^>]+>", "", span).split("[")[0].strip()
            for target, text in CITATION.findall(span):
                text = re.sub(r"<[^>]+>", "", text).strip()
                cited[target] = f"{authors}, {text}" if authors else text
    labels_by_id = {target: label for target, label, _ in entries}
    differ = {labels_by_id[t]: c for t, c in cited.items() if c != labels_by_id[t]}
    assert cited and not differ, f"cited otherwise than labelled: {differ}"


def test_the_map_follows_the_table_of_contents():
    """book/_ext/book_map.py: a page appears on the landing page's map once _toc.yml lists
    it, numbered as the sidebar numbers it; a page of the table without a line stops the
    build."""
    import nbformat
    from book_map import map_markdown, parse_lines, toc_parts

    parts = toc_parts(ROOT / "_toc.yml")
    landing = nbformat.read(ROOT / "book" / "intro.ipynb", as_version=4)
    (source,) = [c.source for c in landing.cells if ":::{book-map}" in c.source]
    entries = parse_lines(source.split(":::{book-map}")[1].split(":::")[0].splitlines())
    here = "book/intro"
    listed = "\n".join(map_markdown(parts, entries, here))
    in_toc = [f for part in parts for f in part["files"] if f != here]
    assert all(f"{{doc}}`{Path(f).name}`" in listed for f in in_toc)
    assert "14. {doc}`14_rope_bugs`" in listed
    assert "15. {doc}`15_rope_on_a_gpu`" in listed
    without_15 = [dict(part, files=[f for f in part["files"] if f != "book/15_rope_on_a_gpu"])
                  for part in parts]
    assert "15_rope_on_a_gpu" not in "\n".join(map_markdown(without_15, entries, here))
    without = {name: text for name, text in entries.items() if name != "04_rope_2d"}
    with pytest.raises(ValueError, match="no line for '04_rope_2d'"):
        map_markdown(parts, without, here)
    with pytest.raises(ValueError, match="docname: what it teaches"):
        parse_lines(["a line without its docname"])
