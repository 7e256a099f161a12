"""The rendered book works offline in a real browser (headless Chromium).

Uses the HTML in $BOOK_HTML when set (``make test`` builds the book first, exactly as
``make book`` does); otherwise builds the book into a temporary folder.

For every page of the table of contents, with every non-file request blocked: nothing asks
for the network, MathJax typesets every formula from the book's own files, no script fails,
no widget is left without a kernel, every figure has a caption and every image alt text, and
the jshtml sliders step through their frames.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def toc_pages() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]
    for part in toc.get("parts", []):
        files += [chapter["file"] for chapter in part["chapters"]]
    return [f"{name}.html" for name in files]


@pytest.fixture(scope="module")
def html_dir(tmp_path_factory) -> Path:
    if os.environ.get("BOOK_HTML"):
        return Path(os.environ["BOOK_HTML"]).resolve()
    out = tmp_path_factory.mktemp("book")
    subprocess.run([str(Path(sys.executable).parent / "jupyter-book"), "build", str(ROOT),
                    "--path-output", str(out), "-W", "-n", "--keep-going"], check=True,
                   timeout=1800)
    return out / "_build" / "html"


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield context
        context.close()


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
