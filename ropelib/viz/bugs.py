"""Figures for the chapter on RoPE bugs in the wild.

The functions draw errors the chapter has measured and check only that the data fits the
figure: nothing is computed here that the chapter has not measured.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.axes import Axes

__all__ = ["draw_onsets", "first_above"]


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
                ylabel: str = "error") -> dict[str, float | None]:
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

    Returns:
        ``{label: first x above threshold, or None}``, the points marked on the curves.
    """
    if not curves:
        raise ValueError("curves must map at least one label to (x, errors), got nothing")
    _check_threshold(threshold)
    if not 0.0 < floor < threshold:
        raise ValueError(f"floor must be in (0, threshold={threshold:g}), got {floor!r}")
    onsets: dict[str, float | None] = {}
    for label, pair in curves.items():
        if len(pair) != 2:
            raise ValueError(f"curves[{label!r}] must be an (x, errors) pair, got {len(pair)} "
                             "items")
        xs, ys = _curve(f"curves[{label!r}]", *pair)
        (line,) = ax.plot(xs, np.maximum(ys, floor), label=label, linewidth=1.4)
        onset = first_above(xs, ys, threshold)
        if onset is not None:
            ax.plot([onset], [ys[xs == onset][0]], marker="o", color=line.get_color(),
                    linestyle="none")
        onsets[label] = onset
    ax.axhline(threshold, color="0.4", linestyle="--", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f"{ylabel}\n(values below {floor:g} drawn at {floor:g})")
    ax.legend(fontsize="small", loc="lower right")
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
