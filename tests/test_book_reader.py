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
