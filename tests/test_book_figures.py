"""Every chapter figure is read at the width of the text column, sharp, with readable text.

At a desktop window (1400 x 1000 px) in headless Chromium, for each figure of each chapter
(myst-nb's figure images and the frames of the jshtml scrubbers) in the HTML of $BOOK_HTML
(or a fresh build, see tests/conftest.py):

- its shown width against the text column's: landscape figures (wider than 1.25 times their
  height) and scrubbers at least ``LANDSCAPE``, the others at least ``SQUARE``;
- its density: at least ``DENSITY`` pixels of the PNG per pixel of the page, so that a
  screen with two pixels per page pixel (a phone, most laptops) shows it sharp;
- its smallest text as shown: ``ropelib.viz.style.SMALLEST_FONT_PT`` points are
  ``pt * dpi / 72`` pixels of the PNG (the dpi read from the PNG itself), scaled by the
  page as the image is (shown width / PNG width), no smaller than the page's figure
  captions (and at least ``FONT_SHARE`` of the body text).

And on every page of the build, at a desktop's width (1280 px) and a phone's (390 px), with
every dropdown open: each image is shown at its PNG's aspect ratio (width / height within
``ASPECT_TOLERANCE``), however far the column scales it down.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
from PIL import Image
from test_book_offline import DESKTOP, PHONE, built_pages, offline_tab, toc_pages

from ropelib.viz import style

WINDOW = {"width": 1400, "height": 1000}
LANDSCAPE, SQUARE, FONT_SHARE = 0.85, 0.6, 0.8
DENSITY = 1.95  # PNG pixels per page pixel (style.DENSITY = 2, less rounding)
LANDSCAPE_ASPECT = 1.25  # width / height above which a figure is landscape
# the chapters and the landing page (the preface and the bibliography draw nothing)
CHAPTERS = [toc_pages()[0]] + [page for page in toc_pages() if Path(page).name[:2].isdigit()]

# The text column (the article's content box), the body text's size, and every figure image
# of the article with its shown and natural sizes, once each image has loaded.
MEASURE = """async () => {
  const article = document.querySelector('main article');
  const box = getComputedStyle(article);
  const column = article.clientWidth - parseFloat(box.paddingLeft)
                 - parseFloat(box.paddingRight);
  const paragraph = article.querySelector('section > p');
  const caption = article.querySelector('figure figcaption');
  const images = [...article.querySelectorAll('figure img, div.animation img')];
  await Promise.all(images.map(img => img.decode().catch(() => null)));
  return {column, body: parseFloat(getComputedStyle(paragraph).fontSize),
          caption: caption ? parseFloat(getComputedStyle(caption).fontSize) : null,
          paragraph: paragraph.getBoundingClientRect().width,
          figures: images.map(img => ({
            src: img.src, shown: img.getBoundingClientRect().width,
            natural: img.naturalWidth, height: img.naturalHeight,
            scrubber: !!img.closest('div.animation'),
            name: (img.closest('figure') || {}).id || img.alt.slice(0, 50)}))};
}"""


def png_dpi(src: str) -> float:
    """The resolution a PNG was drawn at, from its own pHYs chunk (a file or a data URL)."""
    if src.startswith("data:"):
        data = base64.b64decode(src.split(",", 1)[1])
    else:
        data = Path(unquote(urlparse(src).path)).read_bytes()
    dpi = Image.open(io.BytesIO(data)).info.get("dpi")
    assert dpi, f"{src[-40:]}: the PNG does not record its resolution"
    return float(dpi[0])


def figure_problems(page: dict) -> list[str]:
    """What is too narrow or too small in a measured page, one line per figure."""
    problems = []
    smallest = max(FONT_SHARE * page["body"], page["caption"] or 0.0)
    for fig in page["figures"]:
        share = fig["shown"] / page["column"]
        landscape = fig["scrubber"] or fig["natural"] > LANDSCAPE_ASPECT * fig["height"]
        need = LANDSCAPE if landscape else SQUARE
        density = fig["natural"] / fig["shown"]
        font_px = (style.SMALLEST_FONT_PT * png_dpi(fig["src"]) / 72
                   * fig["shown"] / fig["natural"])
        if share < need or font_px < smallest - 0.05 or density < DENSITY:
            problems.append(
                f"{fig['name']}: {fig['shown']:.0f} px = {share:.2f} of the column "
                f"(needs {need}), smallest text {font_px:.1f} px = "
                f"{font_px / page['body']:.2f} of the body text (needs {smallest:.1f} px: "
                f"the caption's size, at least {FONT_SHARE} of the body text); "
                f"{density:.2f} PNG pixels per page pixel (needs {DENSITY}); "
                f"PNG {fig['natural']} x {fig['height']} px")
    return problems


@pytest.fixture(scope="module")
def measured(browser, html_dir) -> dict:
    pages = {}
    for page in CHAPTERS:
        tab = offline_tab(browser, (html_dir / page).as_uri(), WINDOW)
        # the scrubbers show their first frame from a script that runs after the page loads
        tab.wait_for_function("[...document.querySelectorAll('div.animation img')]"
                              ".every(img => img.complete && img.naturalWidth > 0)")
        pages[page] = tab.evaluate(MEASURE)
        tab.close()
    return pages


def test_the_column_is_the_prose_width(measured):
    """The measured column is where the prose runs (the reference of every share below)."""
    for page, found in measured.items():
        assert abs(found["paragraph"] - found["column"]) < 1, (page, found["column"],
                                                               found["paragraph"])
        assert found["column"] > 600 and found["body"] >= 14, (page, found)


def test_chapters_have_figures_and_scrubbers(measured):
    figures = [fig for page in measured.values() for fig in page["figures"]]
    assert sum(not fig["scrubber"] for fig in figures) >= 30
    assert sum(fig["scrubber"] for fig in figures) >= 3
    assert all(fig["natural"] > 0 for fig in figures), "an image did not load"


@pytest.mark.parametrize("page", CHAPTERS)
def test_figures_span_the_column_with_readable_text(measured, page):
    problems = figure_problems(measured[page])
    assert not problems, f"{page}: " + "; ".join(problems)


def test_the_check_finds_a_narrow_blurry_figure_and_small_text(tmp_path):
    """A figure drawn at 72 dpi and shown at half the column, one pixel per pixel, fails
    all three checks; the same figure at twice the pixels, shown at the column, passes."""
    png = tmp_path / "small.png"
    Image.new("RGB", (400, 300)).save(png, dpi=(72, 72))
    page = {"column": 800.0, "body": 16.0, "caption": 14.4, "figures": [
        {"src": png.as_uri(), "shown": 400.0, "natural": 400, "height": 300,
         "scrubber": False, "name": "fig-small"}]}
    (problem,) = figure_problems(page)
    assert "fig-small: 400 px = 0.50 of the column (needs 0.85)" in problem
    assert f"smallest text {style.SMALLEST_FONT_PT:.1f} px" in problem
    assert "(needs 14.4 px: the caption's size" in problem
    assert "1.00 PNG pixels per page pixel (needs 1.95)" in problem

    dense = tmp_path / "dense.png"
    dpi = 72 * 16 / style.SMALLEST_FONT_PT * 1600 / 800  # smallest text shown at 16 px
    Image.new("RGB", (1600, 1200)).save(dense, dpi=(dpi, dpi))
    page["figures"] = [{"src": dense.as_uri(), "shown": 800.0, "natural": 1600,
                        "height": 1200, "scrubber": False, "name": "fig-dense"}]
    assert figure_problems(page) == []


# Every image of the article once it has loaded (the dropdowns opened, so that the images of
# the solutions are laid out too): its shown box and its PNG's pixels.
IMAGE_BOXES = """async () => {
  document.querySelectorAll('main article details').forEach(d => { d.open = true; });
  const images = [...document.querySelectorAll('main article img')];
  await Promise.all(images.map(img => img.decode().catch(() => null)));
  return images.map(img => {
    const box = img.getBoundingClientRect();
    return {name: (img.closest('figure') || {}).id || img.alt.slice(0, 50) || img.src.slice(-40),
            width: box.width, height: box.height,
            natural: img.naturalWidth, natural_height: img.naturalHeight};
  });
}"""
ASPECT_TOLERANCE = 0.01  # of the PNG's width / height: a pixel of rounding on a phone


def aspect_problems(images: list[dict]) -> list[str]:
    """The images shown at another aspect ratio than their PNG's, one line each."""
    problems = []
    for img in images:
        if not (img["width"] and img["height"] and img["natural"] and img["natural_height"]):
            problems.append(f"{img['name']}: not shown or not loaded ({img})")
            continue
        natural = img["natural"] / img["natural_height"]
        shown = img["width"] / img["height"]
        if abs(shown / natural - 1) > ASPECT_TOLERANCE:
            problems.append(
                f"{img['name']}: shown {img['width']:.0f} x {img['height']:.0f} px "
                f"(width / height {shown:.3f}) for a PNG of {img['natural']} x "
                f"{img['natural_height']} px ({natural:.3f}): {natural / shown:.2f} times "
                f"too tall")
    return problems


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["1280px", "390px"])
def test_figures_keep_their_aspect_ratio(browser, html_dir, viewport):
    """A figure scaled down to the column keeps its shape: a circle stays a circle."""
    problems, measured = {}, 0
    for page in built_pages(html_dir):
        tab = offline_tab(browser, page.as_uri(), viewport)
        tab.wait_for_function("[...document.querySelectorAll('div.animation img')]"
                              ".every(img => img.complete && img.naturalWidth > 0)")
        images = tab.evaluate(IMAGE_BOXES)
        tab.close()
        measured += len(images)
        if found := aspect_problems(images):
            problems[str(page.relative_to(html_dir))] = found
    assert measured, f"no image in the pages of {html_dir}"
    assert not problems, (f"{sum(map(len, problems.values()))} of {measured} images "
                          f"stretched at {viewport['width']} px: {problems}")


def test_the_aspect_check_finds_a_stretched_figure():
    """An 806 x 360 figure (a 1612 x 720 PNG) squeezed to a phone's column with its height
    kept is 2.25 times too tall; scaled with its height it passes."""
    png = {"name": "fig-ch4-plane", "natural": 1612, "natural_height": 720}
    (problem,) = aspect_problems([dict(png, width=358.0, height=360.0)])
    assert problem.startswith("fig-ch4-plane: shown 358 x 360 px (width / height 0.994)")
    assert "for a PNG of 1612 x 720 px (2.239): 2.25 times too tall" in problem
    assert aspect_problems([dict(png, width=358.0, height=159.9)]) == []
    (missing,) = aspect_problems([dict(png, width=0.0, height=0.0)])
    assert "not shown or not loaded" in missing


def test_unnumbered_pages_number_their_own_figures():
    """book/_ext/figure_numbers.py: Sphinx's one counter for every unnumbered page gave the
    appendix "Fig. 2" and "Fig. 3" after the landing page's figure 1; each such page counts
    from 1, an appendix after its letter, and the chapters keep their numbers."""
    from figure_numbers import appendix_letters, renumber

    parts = [{"caption": "Part I", "files": ["book/01_why_positions"]},
             {"caption": "Appendix", "files": ["book/appendix_a", "book/appendix_b"]}]
    letters = appendix_letters(parts)
    assert letters == {"book/appendix_a": "A", "book/appendix_b": "B"}
    fignumbers = {"book/intro": {"figure": {"fig-intro": (1,)}},
                  "book/01_why_positions": {"figure": {"fig-ch1-a": (1, 1),
                                                       "fig-ch1-b": (1, 2)}},
                  "book/appendix_a": {"figure": {"fig-a2": (3,), "fig-a1": (2,)},
                                      "table": {"tab-a": (1,)}},
                  "book/appendix_b": {"figure": {"fig-b": (4,)}}}
    secnumbers = {"book/01_why_positions": {"": (1,), "#a-section": (1, 1)},
                  "book/intro": {}}
    changed = renumber(fignumbers, secnumbers, letters)
    assert fignumbers == {"book/intro": {"figure": {"fig-intro": (1,)}},
                          "book/01_why_positions": {"figure": {"fig-ch1-a": (1, 1),
                                                               "fig-ch1-b": (1, 2)}},
                          "book/appendix_a": {"figure": {"fig-a1": ("A", 1),
                                                         "fig-a2": ("A", 2)},
                                              "table": {"tab-a": ("A", 1)}},
                          "book/appendix_b": {"figure": {"fig-b": ("B", 1)}}}
    assert changed == ["book/appendix_a", "book/appendix_b"]
    assert renumber(fignumbers, secnumbers, letters) == []
