"""ropelib.viz.style: figure sizes as fractions of the text column, one resolution and font
sizes for every figure (the rendered result is checked in tests/test_book_figures.py)."""

import ast
import base64
import io
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib as mpl  # noqa: E402
import pytest  # noqa: E402
from matplotlib.font_manager import FontProperties  # noqa: E402
from PIL import Image  # noqa: E402

import ropelib.viz  # noqa: E402, F401  (applies the style)
from ropelib.viz import style  # noqa: E402
from ropelib.viz.sliders import DEFAULT_ASPECT, scrubber  # noqa: E402

VIZ = Path(style.__file__).parent
# Keywords through which matplotlib calls take a text's size.
SIZE_KEYWORDS = {"fontsize", "labelsize", "title_fontsize"}


def test_figsize_is_a_fraction_of_the_column():
    assert style.figsize(0.5) == (style.COLUMN_WIDTH_IN, style.COLUMN_WIDTH_IN / 2)
    width, height = style.figsize(1.0, width=0.6)
    assert width == pytest.approx(0.6 * style.COLUMN_WIDTH_IN) and height == width


@pytest.mark.parametrize("kwargs, match", [
    ({"aspect": 0.5, "width": 1.5}, "width must be a fraction of the column in \\(0, 1\\], got 1.5"),
    ({"aspect": 0.5, "width": 0.0}, "width must be a fraction"),
    ({"aspect": -1.0}, "aspect \\(height / width\\) must be > 0, got -1.0"),
])
def test_figsize_rejects_sizes_outside_the_column(kwargs, match):
    with pytest.raises(ValueError, match=match):
        style.figsize(**kwargs)


def test_importing_ropelib_viz_applies_the_style():
    for key, value in style.RC.items():
        assert mpl.rcParams[key] == value, key
    assert matplotlib.figure.Figure().dpi == style.DPI


def points(size) -> float:
    """A matplotlib font size (points or a name such as "small") in points, under the style."""
    return FontProperties(size=size).get_size_in_points()


def test_style_draws_no_text_below_its_smallest_size():
    sizes = {key: mpl.rcParams[key] for key in mpl.rcParams
             if key.endswith(("labelsize", "titlesize", "fontsize")) or key == "font.size"}
    small = {key: points(size) for key, size in sizes.items()
             if size is not None and points(size) < style.SMALLEST_FONT_PT - 1e-9}
    assert not small, f"rcParams below SMALLEST_FONT_PT = {style.SMALLEST_FONT_PT}: {small}"
    assert points("small") == pytest.approx(style.SMALLEST_FONT_PT)
    assert points("x-small") < style.SMALLEST_FONT_PT  # so the check below can fail


def size_arguments(path: Path) -> list[tuple[int, object, bool]]:
    """(line, value, is_literal) of every font size a module's source passes by keyword; a
    value that is not a literal comes as its source text."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.keyword) and node.arg in SIZE_KEYWORDS:
            if isinstance(node.value, ast.Constant):
                found.append((node.value.lineno, node.value.value, True))
            else:
                found.append((node.value.lineno, ast.unparse(node.value), False))
    return found


@pytest.mark.parametrize("path", sorted(VIZ.glob("*.py")), ids=lambda p: p.name)
def test_plot_code_sizes_text_no_smaller_than_the_style(path):
    """Text sized in the plot code itself (a legend, an annotation) is a literal size at
    least the style's smallest, so that the rendered check of the book holds for every
    figure."""
    too_small = [(line, value) for line, value, literal in size_arguments(path)
                 if not literal or points(value) < style.SMALLEST_FONT_PT - 1e-9]
    assert not too_small, f"{path.name}: font sizes below the style's smallest: {too_small}"


def test_the_size_check_finds_small_text(tmp_path):
    module = tmp_path / "plot.py"
    module.write_text('ax.legend(fontsize="x-small")\nax.tick_params(labelsize=7)\n'
                      'ax.text(0, 0, "a", fontsize=SIZE)\nax.set_title("t", fontsize=12)\n')
    found = size_arguments(module)
    assert found == [(1, "x-small", True), (2, 7, True), (3, "SIZE", False), (4, 12, True)]
    assert [points(v) < style.SMALLEST_FONT_PT for _, v, lit in found if lit] == [
        True, True, False]


def test_scrubber_frames_span_the_column_at_the_style_resolution():
    def draw(fig, slope):
        fig.add_subplot().plot([0, 1], [0, slope])

    html = scrubber(draw, "slope", [1.0, 2.0], alt="two lines").data
    frame = base64.b64decode(re.search(r'data:image/png;base64,([^"]+)"', html).group(1))
    image = Image.open(io.BytesIO(frame))
    width_in, height_in = style.figsize(DEFAULT_ASPECT)
    dense = style.DPI * style.DENSITY
    assert style.DENSITY >= 2  # sharp on a screen with two pixels per page pixel
    assert image.size == (round(width_in * dense), round(height_in * dense))
    assert image.info["dpi"][0] == pytest.approx(dense, abs=0.05)  # PNG keeps px per metre
    # laid out at the page size, like a figure: the tag gives it DPI pixels per inch
    assert f'width="{round(width_in * style.DPI)}" id="_anim_img' in html


def test_a_notebook_shows_figures_as_retina_pngs():
    """In an IPython kernel, importing ropelib.viz has figures drawn at DENSITY times DPI and
    tagged with their size at DPI (the inline backend's "retina" format)."""
    from IPython.core.interactiveshell import InteractiveShell
    from matplotlib_inline.config import InlineBackend

    shell = InteractiveShell.instance()
    try:
        style.use_book_style()
        assert InlineBackend.instance().figure_formats == {"retina"}
        fig = matplotlib.figure.Figure(figsize=style.figsize(0.5))
        fig.add_subplot().plot([0, 1])
        data, metadata = shell.display_formatter.formatters["image/png"](fig)
        image = Image.open(io.BytesIO(data if isinstance(data, bytes)
                                      else base64.b64decode(data)))
        assert image.size[0] == pytest.approx(style.DENSITY * metadata["width"], abs=1)
        assert metadata["width"] <= round(style.COLUMN_WIDTH_IN * style.DPI)
    finally:
        InteractiveShell.clear_instance()
