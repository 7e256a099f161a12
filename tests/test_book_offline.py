"""The rendered book works offline in a real browser (headless Chromium).

Uses the HTML in $BOOK_HTML when set (``make test`` builds the book first, exactly as
``make book`` does); otherwise builds the book into a temporary folder.

For every page of the table of contents, with every non-file request blocked: nothing asks
for the network, MathJax typesets every formula from the book's own files, no script fails,
no widget is left without a kernel, every figure has a caption and every image alt text, and
the jshtml sliders step through their frames. At a phone's width (390 px) every page of the
build reads without sideways scrolling and its figures shrink to the column.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 900}


def toc_pages() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]
    for part in toc.get("parts", []):
        files += [chapter["file"] for chapter in part["chapters"]]
    return [f"{name}.html" for name in files]


def test_every_toc_page_was_built(html_dir):
    missing = [page for page in toc_pages() if not (html_dir / page).exists()]
    assert not missing, f"pages in _toc.yml without HTML: {missing}"


def test_no_script_or_stylesheet_from_the_network(html_dir):
    pattern = re.compile(r'<(?:script|link|img)[^>]+(?:src|href)="(https?:)?//[^"]*"')
    for page in toc_pages():
        found = pattern.search((html_dir / page).read_text())
        assert found is None, f"{page} loads {found.group(0)} from the network"


@pytest.mark.parametrize("page", toc_pages())
def test_page_renders_offline(browser, html_dir, page):
    tab = browser.new_page()
    blocked, errors = [], []
    tab.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:")
              else (blocked.append(route.request.url), route.abort()))
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    tab.goto((html_dir / page).as_uri(), wait_until="load")
    has_math = tab.locator(".math").count() > 0
    if has_math:
        tab.wait_for_function("window.MathJax && MathJax.startup && MathJax.startup.promise",
                              timeout=20000)
        tab.evaluate("MathJax.startup.promise")
        untypeset = tab.evaluate(
            "[...document.querySelectorAll('.math')].filter("
            "e => !e.querySelector('mjx-container')).length")
        assert untypeset == 0, f"{page}: {untypeset} formulas were not typeset"
        assert "$$" not in tab.inner_text("main"), f"{page}: raw TeX is visible"
    assert not blocked, f"{page} asked the network for {blocked}"
    assert not errors, f"{page} raised JavaScript errors: {errors}"
    assert tab.locator(".jupyter-widgets, .widget-area, "
                       "script[type='application/vnd.jupyter.widget-view+json']").count() == 0, (
        f"{page} shows a widget with no kernel behind it")
    for figure in tab.locator("main figure").all():
        assert figure.locator("figcaption").inner_text().strip(), f"{page}: figure without caption"
    no_alt = tab.evaluate("[...document.querySelectorAll('main img')].filter("
                          "i => !(i.getAttribute('alt') || '').trim()).map(i => i.src.slice(-40))")
    assert not no_alt, f"{page}: images without alt text: {no_alt}"
    tab.close()


def test_jshtml_sliders_step_offline(browser, html_dir):
    """Each jshtml animation changes its picture when stepped, with no kernel and no network."""
    stepped = 0
    for page in toc_pages():
        tab = browser.new_page()
        tab.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:")
                  else route.abort())
        tab.goto((html_dir / page).as_uri(), wait_until="load")
        for animation in tab.locator("div.animation").all():
            image = animation.locator("img").first
            before = image.get_attribute("src")
            animation.locator("button[title='Next frame']").first.click()
            assert image.get_attribute("src") != before, f"{page}: a slider did not move its frame"
            stepped += 1
        tab.close()
    assert stepped > 0, "the book has no kernel-free slider"


def offline_tab(browser, url: str, viewport: dict = PHONE):
    """A tab that may load only files (the book is read offline), at ``url``, typeset."""
    tab = browser.new_page()
    tab.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:")
              else route.abort())
    tab.set_viewport_size(viewport)
    tab.goto(url, wait_until="load")
    if tab.locator(".math").count():
        tab.wait_for_function("window.MathJax && MathJax.startup && MathJax.startup.promise",
                              timeout=20000)
        tab.evaluate("MathJax.startup.promise")
    return tab


# How far the page scrolls sideways; in the article (not the off-screen side panels) the prose
# blocks wider than their box or the screen, the controls cut off by the screen or their output
# box, and the images wider than their column or the screen.
PHONE_LAYOUT = """() => {
  const width = window.innerWidth, out = {page: document.scrollingElement.scrollWidth - width,
                                          prose: [], images: [], controls: []};
  const article = document.querySelector('main article') || document.body;
  for (const el of article.querySelectorAll('p, li, dt, dd, h1, h2, h3, figcaption')) {
    if (el.closest('pre, table, .highlight, .math, mjx-container, .cell_output')) continue;
    const box = el.getBoundingClientRect();
    if (box.width && (box.right > width + 1 || el.scrollWidth > el.clientWidth + 1))
      out.prose.push(el.textContent.trim().slice(0, 60));
  }
  for (const control of article.querySelectorAll('button, input')) {
    const box = control.getBoundingClientRect(), scroller = control.closest('.output');
    const right = scroller ? Math.min(width, scroller.getBoundingClientRect().right) : width;
    if (box.width && box.right > right + 1)
      out.controls.push(control.title || control.className || control.type);
  }
  for (const img of article.querySelectorAll('img')) {
    const box = img.getBoundingClientRect(), column = img.parentElement.clientWidth;
    if (box.width > column + 1 || box.right > width + 1)
      out.images.push(`${img.src.slice(-40)}: ${Math.round(box.width)} px`);
  }
  return out;
}"""


def built_pages(html_dir: Path) -> list[Path]:
    """Every page of the build but the redirect (index.html) and Sphinx's own folders."""
    return sorted(path for path in html_dir.rglob("*.html")
                  if not path.relative_to(html_dir).parts[0].startswith("_")
                  and 'http-equiv="Refresh"' not in path.read_text()[:1000])


def test_every_page_fits_a_phone(browser, html_dir):
    """At 390 px: no page scrolls sideways, prose wraps inside its column, every figure
    (including the frames of the jshtml animations) is scaled down to the column, and every
    button and slider of the animations can be reached without scrolling."""
    pages = built_pages(html_dir)
    assert pages, f"no HTML pages in {html_dir}"
    problems = {}
    for page in pages:
        tab = offline_tab(browser, page.as_uri())
        layout = tab.evaluate(PHONE_LAYOUT)
        tab.close()
        if layout["page"] > 1 or layout["prose"] or layout["images"] or layout["controls"]:
            problems[str(page.relative_to(html_dir))] = layout
    assert not problems, f"pages that do not fit 390 px: {problems}"


# The longest line of every code cell's input that is wider than its box (scrolls sideways).
CODE_WIDER_THAN_ITS_BOX = """() => [...document.querySelectorAll('main article div.cell_input pre')]
  .filter(pre => pre.scrollWidth > pre.clientWidth + 1)
  .map(pre => Math.max(...pre.textContent.split('\\n').map(line => line.length)))"""


def test_chapter_code_fits_its_box_at_1280_px(browser, html_dir):
    """At 1280 px a reader sees every line of the chapters' code without scrolling inside a
    cell: the code is kept within 79 columns (book/ruff.toml) and _static/book.css sizes the
    code font and padding so that 79 columns fit the box."""
    problems = {}
    for page in built_pages(html_dir):
        tab = offline_tab(browser, page.as_uri(), DESKTOP)
        wide = tab.evaluate(CODE_WIDER_THAN_ITS_BOX)
        tab.close()
        if wide:
            problems[str(page.relative_to(html_dir))] = wide
    assert not problems, f"code cells wider than their box at 1280 px (longest lines): {problems}"
