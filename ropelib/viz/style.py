"""The book's figure style: one width for every figure, readable fonts at that width.

Chapters size figures with ``figsize`` instead of typing inches, so that every figure spans
the text column and its fonts keep the same size relative to the body text::

    fig = plt.figure(figsize=figsize(0.45))            # landscape: full column
    fig = plt.figure(figsize=figsize(1.0, width=0.6))  # square: 60% of the column
"""

from __future__ import annotations

COLUMN_WIDTH_IN = 7.0
"""Width of a full-column figure in inches (the fonts below are sized for it)."""


def figsize(aspect: float, *, width: float = 1.0) -> tuple[float, float]:
    """``(width_in, height_in)`` of a figure ``width`` (a fraction of the text column) wide
    whose height is ``aspect`` times its width."""
    if not 0.0 < width <= 1.0:
        raise ValueError(f"width must be a fraction of the column in (0, 1], got {width!r}")
    if not aspect > 0.0:
        raise ValueError(f"aspect (height / width) must be > 0, got {aspect!r}")
    inches = COLUMN_WIDTH_IN * width
    return inches, inches * aspect
