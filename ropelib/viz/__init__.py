"""Figures and sliders for the book (needs matplotlib and ipywidgets: ``pip install ropelib[viz]``).

Every interactive figure is a ``draw(fig, **params)`` function. ``live_slider`` wraps it in
ipywidgets sliders for a running kernel (JupyterLab); ``scrubber`` renders the same function
over a list of values into a self-contained HTML animation (matplotlib's ``to_jshtml``) that
works in the static, offline book, where a widget would have no kernel behind it.

Importing this package applies the book's figure style (``style.use_book_style``: the
resolution and font sizes that make a figure sized with ``style.figsize`` read at the width
of the book's text column).
"""

from .sliders import live_slider, scrubber
from .style import use_book_style

use_book_style()

__all__ = ["live_slider", "scrubber"]
