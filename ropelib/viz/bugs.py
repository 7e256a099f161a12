"""Figures for the chapter on RoPE bugs in the wild.

The functions draw errors the chapter has measured and check only that the data fits the
figure: nothing is computed here that the chapter has not measured.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.patches import Rectangle

__all__ = ["draw_cells", "draw_onsets", "first_above"]


def first_above(x: Sequence[float], errors: Sequence[float], threshold: float) -> float | None:
    """The first ``x`` whose error exceeds ``threshold``, or None if none does.

    Args:
        x: positions, shape ``(n,)``.
        errors: non-negative errors at those positions, shape ``(n,)``.
        threshold: a positive number.
    """
    xs, ys = _curve("errors", x, errors)
    _check_threshold(threshold)
    above = np.flatnonzero(ys > threshold)
    return float(xs[above[0]]) if above.size else None


def draw_onsets(ax: Axes, curves: Mapping[str, tuple[Sequence[float], Sequence[float]]], *,
                threshold: float, floor: float = 1e-16, xlabel: str = "position",
                ylabel: str = "error", legend: str | None = "lower right"
                ) -> dict[str, float | None]:
    """Error curves on a log scale, each marked where it first exceeds ``threshold``.

    Exact zeros cannot be drawn on a log scale: errors below ``floor`` are drawn at ``floor``
    (the axis is labelled so), which is where a bug that has not started yet lies.

    Args:
        ax: the Axes to draw on.
        curves: ``{label: (x, errors)}``, each a pair of 1-D sequences of one length, errors
            non-negative.
        threshold: the error that counts as wrong, drawn as a dashed line; > 0.
        floor: the smallest error drawn; > 0 and below ``threshold``.
        xlabel, ylabel: axis labels.
        legend: where the legend goes (a matplotlib ``loc``), or None for no legend (one
            curve that the caption names).

    Returns:
        ``{label: first x above threshold, or None}``, the points marked on the curves.
    """
    if not curves:
        raise ValueError("curves must map at least one label to (x, errors), got nothing")
    _check_threshold(threshold)
    if not 0.0 < floor < threshold:
        raise ValueError(f"floor must be in (0, threshold={threshold:g}), got {floor!r}")
    onsets: dict[str, float | None] = {}
    shapes = ("o", "s", "^", "D", "v", "P", "X")   # onsets that coincide stay apart
    for index, (label, pair) in enumerate(curves.items()):
        if len(pair) != 2:
            raise ValueError(f"curves[{label!r}] must be an (x, errors) pair, got {len(pair)} "
                             "items")
        xs, ys = _curve(f"curves[{label!r}]", *pair)
        (line,) = ax.plot(xs, np.maximum(ys, floor), label=label, linewidth=1.4)
        onset = first_above(xs, ys, threshold)
        if onset is not None:
            ax.plot([onset], [ys[xs == onset][0]], marker=shapes[index % len(shapes)],
                    markersize=8, markerfacecolor="none", markeredgewidth=1.6,
                    color=line.get_color(), linestyle="none")
        onsets[label] = onset
    ax.axhline(threshold, color="0.4", linestyle="--", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f"{ylabel}\n(values below {floor:g} drawn at {floor:g})")
    if legend is not None:
        ax.legend(fontsize="small", loc=legend)
    return onsets


def _curve(name: str, x: Sequence[float], errors: Sequence[float]
           ) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = np.asarray(x, dtype=float), np.asarray(errors, dtype=float)
    if xs.ndim != 1 or xs.shape != ys.shape or xs.size == 0:
        raise ValueError(f"{name}: x and errors must be 1-D of one non-zero length, got shapes "
                         f"{xs.shape} and {ys.shape}")
    if not np.all(np.isfinite(ys)) or np.any(ys < 0):
        raise ValueError(f"{name}: errors must be finite and >= 0, got min {np.nanmin(ys):g}")
    return xs, ys


def _check_threshold(threshold: float) -> None:
    if not (isinstance(threshold, (int, float)) and np.isfinite(threshold) and threshold > 0):
        raise ValueError(f"threshold must be a finite number > 0, got {threshold!r}")


def draw_cells(ax: Axes, rows: Mapping[str, Sequence[object]], *, title: str | None = None,
               marked: Mapping[str, Sequence[bool]] | None = None,
               column_label: str | None = None) -> None:
    """Rows of labelled cells, one value per cell, drawn as a small table: positions of a
    row of tokens, cache slots, or a mask of 1s and 0s.

    ``rows[label]`` holds one value per column (``None``: an empty, grey cell, e.g. a pad);
    all rows have the same length. ``marked[label]`` (optional) shades the cells where it is
    True, to show which cells the text talks about (the keys a query may see, say).
    """
    if not rows:
        raise ValueError("rows must hold at least one labelled row, got an empty mapping")
    widths = {label: len(values) for label, values in rows.items()}
    if len(set(widths.values())) != 1:
        raise ValueError(f"every row must have the same number of cells, got {widths}")
    marked = marked or {}
    unknown = set(marked) - set(rows)
    if unknown:
        raise ValueError(f"marked names rows that do not exist: {sorted(unknown)}")
    n_cols = next(iter(widths.values()))
    for r, (label, values) in enumerate(rows.items()):
        shade = list(marked.get(label, [False] * n_cols))
        if len(shade) != n_cols:
            raise ValueError(f"marked[{label!r}] must have {n_cols} entries, got {len(shade)}")
        for c, value in enumerate(values):
            face = "0.85" if value is None else ("#9ecae1" if shade[c] else "white")
            ax.add_patch(Rectangle((c, -r - 1), 1, 1, facecolor=face, edgecolor="0.3"))
            if value is not None:
                ax.text(c + 0.5, -r - 0.5, str(value), ha="center", va="center")
    ax.set_xlim(0, n_cols)
    ax.set_ylim(-len(rows), 0)
    ax.set_yticks([-r - 0.5 for r in range(len(rows))], list(rows))
    ax.set_xticks([c + 0.5 for c in range(n_cols)], [str(c) for c in range(n_cols)])
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    if column_label is not None:
        ax.set_xlabel(column_label)
    if title is not None:
        ax.set_title(title)
