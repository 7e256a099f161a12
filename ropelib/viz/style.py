"""The book's figure style: one width for every figure, readable fonts at that width.

Chapters size figures with ``figsize`` instead of typing inches, so that every figure spans
the text column and its fonts keep the same size relative to the body text::

    fig = plt.figure(figsize=figsize(0.45))            # landscape: full column
    fig = plt.figure(figsize=figsize(1.0, width=0.6))  # square: 60% of the column

Importing ``ropelib.viz`` (any of its modules) applies ``RC`` to matplotlib's ``rcParams``:
the resolution (``DPI``, and ``DENSITY`` pixels per pixel of the page) and the font sizes
are set here, once, for every figure, every frame of a ``scrubber`` and every
``live_slider``. In a notebook it also has IPython show figures as "retina" PNGs: drawn at
``DENSITY`` times ``DPI`` and tagged with their size at ``DPI``, so that JupyterLab and the
HTML book lay a figure out at the size below while a dense screen (a phone, a laptop at 2x)
gets one pixel of the PNG per pixel of the screen.

The numbers come from the built book in Chromium at 1400 x 1000 px (the window of
``tests/test_book_figures.py``): the text column is 784 px wide, the body text 16 px and a
caption 14.4 px. A full-column figure is ``COLUMN_WIDTH_IN * DPI`` = 840 page pixels, a
little wider than the column, so the page scales it down to the column (768 px inside a
captioned figure's margins, the full 784 px for a scrubber) even after
``bbox_inches="tight"`` trims its margins; JupyterLab shows it at 840 px. At that width one
point of a figure is about 768 / (7 * 72) = 1.52 px, so the smallest text the style draws
(``SMALLEST_FONT_PT``, matplotlib's ``"small"``: tick labels, legends, annotations) is about
14.6 px, no smaller than a caption; axis labels and titles are ``FONT_PT``.
"""

from __future__ import annotations

import matplotlib as mpl
from matplotlib.font_manager import font_scalings

COLUMN_WIDTH_IN = 7.0
"""Width of a full-column figure in inches (the fonts below are sized for it)."""

DPI = 120
"""Page pixels per inch of every figure (inline PNGs, animation frames, live sliders): the
size at which JupyterLab and the HTML book lay a figure out."""

DENSITY = 2
"""PNG pixels per page pixel: figures are drawn at ``DENSITY * DPI`` dots per inch, sharp
on screens that show two pixels per page pixel (phones, most laptops)."""

FONT_PT = 11.5
"""matplotlib's ``font.size``: axis labels, titles and text drawn without a size."""

SMALLEST_FONT_PT = FONT_PT * font_scalings["small"]
"""The smallest text a figure of the book draws: tick labels, legends, annotations
(matplotlib's ``"small"``; ``"x-small"`` and smaller sizes are not used)."""

RC = {
    "figure.dpi": DPI,
    "savefig.dpi": DPI * DENSITY,
    "font.size": FONT_PT,
    "axes.titlesize": "medium",
    "axes.labelsize": "medium",
    "figure.titlesize": "medium",
    "xtick.labelsize": "small",
    "ytick.labelsize": "small",
    "legend.fontsize": "small",
    "legend.title_fontsize": "small",
}
"""The style's ``rcParams``, applied by ``use_book_style``."""


def use_book_style() -> None:
    """Apply ``RC`` to matplotlib's ``rcParams`` (``import ropelib.viz`` does), and in an
    IPython kernel show figures as retina PNGs (``DENSITY`` = 2)."""
    mpl.rcParams.update(RC)
    _show_dense_figures()


def _show_dense_figures() -> None:
    """Have the inline backend of a running IPython kernel draw figures at twice ``DPI``
    ("retina": the PNG carries its size at ``DPI``); nothing outside a kernel."""
    try:
        from IPython import get_ipython
        from IPython.core.pylabtools import select_figure_formats
        from matplotlib_inline.config import InlineBackend
    except ImportError:
        return
    shell = get_ipython()
    if shell is None:
        return
    backend = InlineBackend.instance()
    backend.figure_formats = {"retina"}  # kept when the inline backend is set up again
    select_figure_formats(shell, {"retina"}, **backend.print_figure_kwargs)


def figsize(aspect: float, *, width: float = 1.0) -> tuple[float, float]:
    """``(width_in, height_in)`` of a figure ``width`` (a fraction of the text column) wide
    whose height is ``aspect`` times its width."""
    if not 0.0 < width <= 1.0:
        raise ValueError(f"width must be a fraction of the column in (0, 1], got {width!r}")
    if not aspect > 0.0:
        raise ValueError(f"aspect (height / width) must be > 0, got {aspect!r}")
    inches = COLUMN_WIDTH_IN * width
    return inches, inches * aspect
