"""ropelib.viz.sliders: the live slider and its offline equivalent."""

import re

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

from ropelib.viz.sliders import LIVE_HINT, live_slider, scrubber  # noqa: E402


def draw_line(fig, slope, offset=0.0):
    ax = fig.add_subplot()
    ax.plot([0, 1], [offset, offset + slope])
    ax.set_title(f"slope {slope}")


def test_scrubber_embeds_one_frame_per_value_and_needs_no_network():
    html = scrubber(draw_line, "slope", np.array([0.5, 1.0, 2.0]), fixed={"offset": 1.0},
                    alt='A line whose slope grows from 0.5 to 2 & "more"').data
    frames = re.findall(r'"data:image/png;base64,', html)
    assert len(frames) == 3
    assert 'alt="A line whose slope grows from 0.5 to 2 &amp; &quot;more&quot;"' in html
    assert not re.search(r"https?://", html)
    assert "fa fa-" not in html and 'title="Next frame"' in html


def test_every_control_is_a_drawn_shape_not_a_font_symbol():
    """The buttons hold inline SVG paths (no font can lack them) and no non-ASCII symbol:
    U+23EE/U+23ED (first/last frame) showed as empty boxes with common fonts."""
    html = scrubber(draw_line, "slope", [0.0, 1.0], alt="two lines").data
    buttons = re.findall(r'<button title="([^"]+)"[^>]*>(.*?)</button>', html, re.S)
    assert [title for title, _ in buttons] == [
        "Decrease speed", "First frame", "Previous frame", "Play backwards", "Pause", "Play",
        "Next frame", "Last frame", "Increase speed"]
    paths = []
    for title, inner in buttons:
        found = re.fullmatch(r'\s*<svg viewBox="0 0 16 16"[^>]*><path d="([^"]+)"/></svg>',
                             inner)
        assert found, f"{title}: {inner!r} is not one drawn shape"
        paths.append(found.group(1))
    assert len(set(paths)) == len(paths), "two buttons look alike"
    assert html.isascii(), "a non-ASCII symbol is left in the controls"


def test_controls_fit_a_narrow_column():
    """matplotlib fixes the scrub bar at 374 px and the buttons on one line (the phone-width
    test in tests/test_book_offline.py shows them cut off without these rules)."""
    html = scrubber(draw_line, "slope", [0.0, 1.0], alt="two lines").data
    rules = {selector.strip(): body for selector, body in
             re.findall(r"([^{}<>]+)\{([^}]*)\}", html.split("</style>")[0])}
    assert "max-width: 100%" in rules[".animation"]
    assert "max-width: 100%" in rules["input[type=range].anim-slider"]
    assert "flex-wrap: wrap" in rules[".anim-buttons"]
    assert html.index("</style>") < html.index('class="animation"')


def test_scrubber_frames_differ_with_the_parameter():
    html = scrubber(draw_line, "slope", [0.0, 3.0], alt="two lines").data
    first, second = re.findall(r'data:image/png;base64,([^"]+)"', html)
    assert first != second


def test_scrubber_rejects_no_values():
    with pytest.raises(ValueError, match="values must be a non-empty sequence for 'slope'"):
        scrubber(draw_line, "slope", [], alt="nothing")


def test_scrubber_requires_alt_text():
    with pytest.raises(ValueError, match="alt must be a non-empty description"):
        scrubber(draw_line, "slope", [1.0], alt=" ")


def test_live_slider_builds_sliders_and_redraws():
    calls = []

    def draw(fig, slope, offset):
        calls.append((slope, offset))
        draw_line(fig, slope, offset)

    widget = live_slider(draw, slope=(0.0, 2.0, 0.5, 1.0), offset=(0, 4, 1, 2))
    sliders = widget.children[0].children
    assert [s.description for s in sliders] == ["slope", "offset"]
    assert type(sliders[1]).__name__ == "IntSlider" and type(sliders[0]).__name__ == "FloatSlider"
    assert calls == [(1.0, 2)]
    sliders[0].value = 1.5
    assert calls[-1] == (1.5, 2)


def test_live_slider_shows_each_drawing_as_a_png_whatever_the_backend(monkeypatch):
    """Without the inline backend (no pyplot import in the kernel) a Figure displays as text;
    the slider shows PNG bytes itself, one new picture per move."""
    shown = []
    monkeypatch.setattr("ropelib.viz.sliders.display", shown.append)
    widget = live_slider(draw_line, slope=(0.0, 2.0, 0.5, 1.0))
    widget.children[0].children[0].value = 2.0
    assert [type(image).__name__ for image in shown] == ["Image", "Image"]
    assert all(image.format == "png" and image.data.startswith(b"\x89PNG") for image in shown)
    assert shown[0].data != shown[1].data


def test_live_slider_text_is_a_hint_to_run_the_cells():
    """JupyterLab shows a widget's text/plain where it cannot draw the widget (a reopened,
    untrusted notebook): the reader then sees what to do, not a "VBox(children=...)" dump."""
    widget = live_slider(draw_line, slope=(0.0, 2.0, 0.5, 1.0))
    bundle = widget._repr_mimebundle_()
    assert bundle["text/plain"] == LIVE_HINT
    assert "Run All Cells" in LIVE_HINT
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == widget.model_id


def test_live_slider_rejects_a_bad_spec():
    with pytest.raises(ValueError, match="slider 'slope' must be"):
        live_slider(draw_line, slope=(0.0, 1.0))
