"""Live sliders (ipywidgets, need a kernel) and their kernel-free equivalent (jshtml)."""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Sequence
from html import escape

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import HTML, Image, display
from matplotlib.animation import FuncAnimation
from matplotlib.figure import Figure

from . import style

Draw = Callable[..., None]

DEFAULT_ASPECT = 0.5
"""Height / width of a slider's figure when no ``figsize`` is given (it spans the column)."""


def scrubber(draw: Draw, param: str, values: Sequence[float], *, alt: str,
             fixed: dict | None = None, figsize: tuple[float, float] | None = None,
             interval_ms: int = 500) -> HTML:
    """A self-contained HTML animation of ``draw(fig, **fixed, param=value)`` over ``values``.

    The result is a play/step/scrub control that needs no kernel and no network, so it is the
    static book's stand-in for a live slider over the same parameter. ``alt`` describes the
    animation for readers who cannot see it (the frames' alt text). ``figsize`` defaults to
    the full text column (``style.figsize(DEFAULT_ASPECT)``); frames are drawn at the book
    style's resolution (``style.DPI`` page pixels per inch, ``style.DENSITY`` PNG pixels per
    page pixel: matplotlib's ``savefig.dpi``), like every other figure.
    """
    if not isinstance(alt, str) or not alt.strip():
        raise ValueError(f"alt must be a non-empty description of the animation, got {alt!r}")
    values = list(values)
    if not values:
        raise ValueError(f"values must be a non-empty sequence for {param!r}, got {values!r}")
    fixed = dict(fixed or {})
    size = figsize or style.figsize(DEFAULT_ASPECT)
    fig = plt.figure(figsize=size, dpi=style.DPI)

    def frame(i: int) -> list:
        fig.clear()
        draw(fig, **fixed, **{param: values[i]})
        return []

    animation = FuncAnimation(fig, frame, frames=len(values), interval=interval_ms, blit=False)
    html = animation.to_jshtml(default_mode="once")
    plt.close(fig)
    # frames are DENSITY times the page pixels: the tag gives the page width, as a figure's
    width = round(size[0] * style.DPI)
    tag = f'<img alt="{escape(alt)}" width="{width}" id="_anim_img'
    return HTML(offline_controls(html).replace('<img id="_anim_img', tag, 1))


# Font Awesome icon -> SVG path (16 x 16 box). Drawn shapes need no font: Unicode media
# symbols such as U+23EE are missing from common fonts and show as empty boxes.
_ICONS = {"fa fa-minus": "M3 7h10v2H3z",
          "fa fa-fast-backward": "M1 3h2v10H1zM9 3v10L3.5 8zM15 3v10L9.5 8z",
          "fa fa-step-backward": "M2 3h2v10H2zM14 3v10L5 8z",
          "fa fa-play fa-flip-horizontal": "M13 3v10L3 8z",
          "fa fa-pause": "M4 3h3v10H4zM9 3h3v10H9z",
          "fa fa-play": "M3 3v10l10-5z",
          "fa fa-step-forward": "M12 3h2v10h-2zM2 3v10l9-5z",
          "fa fa-fast-forward": "M13 3h2v10h-2zM1 3v10l5.5-5zM7 3v10l5.5-5z",
          "fa fa-plus": "M3 7h10v2H3zM7 3h2v10H7z"}


# matplotlib gives the scrub bar a fixed 374 px and the nine 36 px buttons one line: on a
# phone both ran past the column's edge. Narrow columns shrink the bar and wrap the buttons.
_NARROW_CSS = """<style>
.animation { max-width: 100%; }
input[type=range].anim-slider { max-width: 100%; }
.anim-buttons { display: flex; flex-wrap: wrap; justify-content: center; gap: 2px; }
</style>"""


def offline_controls(html: str) -> str:
    """matplotlib's jshtml with its Font Awesome stylesheet (a CDN link) removed, each icon
    drawn as an inline SVG shape, so the controls show with no network and no font, and the
    controls fitted to narrow columns."""
    html = re.sub(r'<link[^>]*font-awesome[^>]*>', "", html)
    for css_class, path in _ICONS.items():
        svg = ('<svg viewBox="0 0 16 16" width="1em" height="1em" aria-hidden="true" '
               f'fill="currentColor"><path d="{path}"/></svg>')
        html = html.replace(f'<i class="{css_class}"></i>', svg)
    return _NARROW_CSS + html


LIVE_HINT = "Live sliders: run the notebook's cells (Run > Run All Cells) to use them."


class LiveSliders(widgets.VBox):
    """The sliders and their figure. Where the widget cannot be shown (a reopened notebook
    whose cells have not run again, a viewer without a kernel) its text says what to do."""

    def __repr__(self) -> str:
        return LIVE_HINT



def live_slider(draw: Draw, *, figsize: tuple[float, float] | None = None,
                **sliders: tuple[float, float, float, float]) -> LiveSliders:
    """ipywidgets sliders that redraw ``draw(fig, **values)`` whenever one moves.

    Each keyword is ``name=(min, max, step, initial)``; integer bounds give an IntSlider.
    Returns the widget (display it as a cell's last expression). The figure is shown as a PNG
    image, whatever matplotlib backend the kernel uses (without the inline backend a Figure
    displays as the text "<Figure size ...>"), at the book style's resolution; ``figsize``
    defaults to the full text column, as ``scrubber``'s.
    """
    controls = {}
    for name, spec in sliders.items():
        if len(spec) != 4:
            raise ValueError(f"slider {name!r} must be (min, max, step, initial), got {spec!r}")
        low, high, step, value = spec
        cls = widgets.IntSlider if all(isinstance(v, int) for v in spec) else widgets.FloatSlider
        controls[name] = cls(min=low, max=high, step=step, value=value, description=name,
                             continuous_update=False)
    output = widgets.Output()

    def redraw(change: object = None) -> None:
        with output:
            output.clear_output(wait=True)
            fig = Figure(figsize=figsize or style.figsize(DEFAULT_ASPECT), dpi=style.DPI)
            draw(fig, **{name: c.value for name, c in controls.items()})
            png = io.BytesIO()
            fig.savefig(png, format="png", bbox_inches="tight", dpi=style.DPI * style.DENSITY)
            display(Image(data=png.getvalue(), format="png", retina=True))

    for control in controls.values():
        control.observe(redraw, names="value")
    redraw()
    return LiveSliders([widgets.HBox(list(controls.values())), output])
