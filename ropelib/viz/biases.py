"""Figures for chapter 2: position-bias matrices and score terms against a common shift.

Both functions draw into a given matplotlib ``Figure`` (``draw(fig, ...)``, like the slider
functions) and return the axes they made, so a test can read back what was drawn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

# Line styles that tell the curves apart without colour (grey-scale print, colour blindness).
_STYLES = ("-", "--", "-.", ":")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def _as_2d(name: str, value: object) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor, without importing torch here
        value = value.detach().cpu().numpy()
    array = np.asarray(value, dtype=np.float64)
    if array.ndim != 2:
        raise ValueError(f"{name} must be a 2-D matrix (query position x key position), "
                         f"got shape {array.shape}")
    return array


def draw_bias_heatmaps(fig: Figure, biases: Sequence[object], titles: Sequence[str], *,
                       cmap: str = "viridis", xlabel: str = "key position n",
                       ylabel: str = "query position m",
                       colorbar_labels: Sequence[str] | None = None) -> list[Axes]:
    """One heatmap per bias matrix, side by side, each with its own colour bar.

    Row m (query) runs downwards and column n (key) to the right, so a bias that depends
    only on n - m shows as constant stripes parallel to the diagonal.

    Args:
        fig: the figure to draw into (cleared first is up to the caller).
        biases: 2-D matrices ``(q_len, k_len)`` (NumPy arrays or torch tensors).
        titles: one title per matrix.
        cmap: matplotlib colour map.
        xlabel, ylabel: axis labels (the y label only on the first panel).
        colorbar_labels: optional label of each colour bar.

    Returns:
        The heatmap axes, in the order of ``biases``.
    """
    matrices = [_as_2d(f"biases[{i}]", b) for i, b in enumerate(biases)]
    if not matrices:
        raise ValueError("biases must hold at least one matrix, got none")
    if len(titles) != len(matrices):
        raise ValueError(f"titles must have one entry per matrix ({len(matrices)}), "
                         f"got {len(titles)}")
    if colorbar_labels is not None and len(colorbar_labels) != len(matrices):
        raise ValueError(f"colorbar_labels must have one entry per matrix ({len(matrices)}), "
                         f"got {len(colorbar_labels)}")
    axes = fig.subplots(1, len(matrices), squeeze=False)[0]
    for i, (ax, matrix, title) in enumerate(zip(axes, matrices, titles, strict=True)):
        image = ax.imshow(matrix, cmap=cmap, origin="upper", interpolation="nearest",
                          aspect="equal")
        ax.set_title(title, fontsize="medium")
        ax.set_xlabel(xlabel)
        if i == 0:
            ax.set_ylabel(ylabel)
        bar = fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
        if colorbar_labels is not None:
            bar.set_label(colorbar_labels[i])
    return list(axes)


def draw_score_terms_vs_shift(fig: Figure, shifts: Sequence[float],
                              curves: Mapping[str, Sequence[float]], *,
                              title: str | None = None,
                              xlabel: str = "common shift s (query at m + s, key at n + s)",
                              ylabel: str = "score") -> Axes:
    """Curves of score terms against a shift s applied to both positions.

    A term that depends on the positions only through n - m is a flat line; every other
    term wobbles. Each curve gets its own line style and marker as well as its colour.

    Args:
        fig: the figure to draw into.
        shifts: the x values (the common shifts s).
        curves: label -> values, one value per shift, in legend order.
        title: optional axes title.
        xlabel, ylabel: axis labels.

    Returns:
        The axes.
    """
    x = np.asarray(shifts, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"shifts must be a non-empty 1-D sequence, got shape {x.shape}")
    if not curves:
        raise ValueError("curves must hold at least one labelled curve, got none")
    ax = fig.add_subplot(1, 1, 1)
    for i, (label, values) in enumerate(curves.items()):
        y = np.asarray(values.detach().cpu() if hasattr(values, "detach") else values,
                       dtype=np.float64)
        if y.shape != x.shape:
            raise ValueError(f"curves[{label!r}] must have one value per shift ({x.size}), "
                             f"got shape {y.shape}")
        ax.plot(x, y, linestyle=_STYLES[i % len(_STYLES)], marker=_MARKERS[i % len(_MARKERS)],
                markersize=4, label=label)
    ax.axhline(0.0, color="0.6", linewidth=0.8, zorder=0)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize="medium")
    ax.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    ax.grid(alpha=0.3)
    return ax
