"""Attention-weight heatmaps: one matrix on an Axes, or a grid of them on a Figure.

The weights may be NumPy arrays, nested lists or torch tensors (detached and moved to the CPU
here). Rows are queries, columns are keys; the tick labels are the tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.image import AxesImage

__all__ = ["draw_attention_grid", "draw_attention_heatmap"]


def _as_matrix(name: str, weights: Any) -> np.ndarray:
    """``weights`` as a 2-D float array (a torch tensor is detached and copied to the CPU)."""
    if hasattr(weights, "detach"):
        weights = weights.detach().cpu().numpy()
    matrix = np.asarray(weights, dtype=float)
    if matrix.ndim != 2:
        raise ValueError(f"{name} must be a 2-D (queries, keys) matrix, got shape {matrix.shape}; "
                         "select one batch element and one head first, e.g. weights[0, 0]")
    return matrix


def draw_attention_heatmap(ax: Axes, weights: Any, query_labels: Sequence[str],
                           key_labels: Sequence[str] | None = None, *, vmin: float = 0.0,
                           vmax: float = 1.0, cmap: str = "viridis", annotate: bool = True,
                           fmt: str = "{:.2f}") -> AxesImage:
    """Draw one attention matrix on ``ax`` and return its image.

    Args:
        ax: the Axes to draw on.
        weights: ``(queries, keys)`` attention weights.
        query_labels: one tick label per row (query token).
        key_labels: one tick label per column (key token); default ``query_labels``
            (self-attention).
        vmin, vmax: the colour scale; the default 0..1 is the range of softmax weights, so that
            several heatmaps share one scale.
        cmap: a Matplotlib colormap name.
        annotate: write each weight in its cell, in black or white, whichever reads better.
        fmt: the format of the annotations.

    Returns:
        The ``AxesImage`` (pass it to ``Figure.colorbar``).
    """
    matrix = _as_matrix("weights", weights)
    key_labels = query_labels if key_labels is None else key_labels
    if len(query_labels) != matrix.shape[0] or len(key_labels) != matrix.shape[1]:
        raise ValueError(f"weights of shape {matrix.shape} need {matrix.shape[0]} query labels and "
                         f"{matrix.shape[1]} key labels, got {len(query_labels)} and "
                         f"{len(key_labels)}")
    if not vmin < vmax:
        raise ValueError(f"vmin must be smaller than vmax, got vmin={vmin}, vmax={vmax}")
    image = ax.imshow(matrix, cmap=cmap, vmin=vmin, vmax=vmax)
    ax.set_xticks(range(matrix.shape[1]), labels=list(key_labels))
    ax.set_yticks(range(matrix.shape[0]), labels=list(query_labels))
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    ax.tick_params(length=0)
    if annotate:
        colormap = colormaps[cmap]
        for (row, col), value in np.ndenumerate(matrix):
            red, green, blue, _ = colormap((value - vmin) / (vmax - vmin))
            luminance = 0.299 * red + 0.587 * green + 0.114 * blue
            ax.text(col, row, fmt.format(value), ha="center", va="center",
                    color="black" if luminance > 0.5 else "white", fontsize="small")
    return image


def draw_attention_grid(fig: Figure, weights: Sequence[Sequence[Any]],
                        labels: Sequence[Sequence[str]], *,
                        row_titles: Sequence[str] | None = None,
                        col_titles: Sequence[str] | None = None, vmin: float = 0.0,
                        vmax: float = 1.0, cmap: str = "viridis", annotate: bool = True,
                        colorbar: bool = True) -> np.ndarray:
    """Draw a grid of self-attention heatmaps on ``fig`` with one shared colour scale.

    ``weights[r][c]`` is drawn in grid row ``r``, column ``c``; all matrices in column ``c``
    belong to the same token sequence ``labels[c]`` (for instance one sentence per column and
    one model per row).

    Args:
        fig: the Figure to draw on (it gets the constrained layout if it has no layout engine).
        weights: rows of ``(n, n)`` attention matrices, all rows of the same length.
        labels: the tokens of each column's sequence.
        row_titles: one title per grid row, written on the left of the row.
        col_titles: one title per grid column, written above the top row.
        vmin, vmax, cmap, annotate: as in ``draw_attention_heatmap``.
        colorbar: add one colorbar for the whole grid.

    Returns:
        The Axes as an array of shape ``(rows, columns)``.
    """
    n_rows = len(weights)
    n_cols = len(weights[0]) if n_rows else 0
    if n_rows == 0 or n_cols == 0:
        raise ValueError("weights must be a non-empty grid of matrices (a list of rows)")
    if any(len(row) != n_cols for row in weights):
        raise ValueError(f"every row of weights must have {n_cols} matrices, got row lengths "
                         f"{[len(row) for row in weights]}")
    if len(labels) != n_cols:
        raise ValueError(f"labels must hold one token sequence per grid column ({n_cols}), "
                         f"got {len(labels)}")
    for name, titles, expected in (("row_titles", row_titles, n_rows),
                                   ("col_titles", col_titles, n_cols)):
        if titles is not None and len(titles) != expected:
            raise ValueError(f"{name} must have {expected} entries, got {len(titles)}")
    if fig.get_layout_engine() is None:
        fig.set_layout_engine("constrained")
    axes = np.asarray(fig.subplots(n_rows, n_cols, squeeze=False))
    image = None
    for r in range(n_rows):
        for c in range(n_cols):
            image = draw_attention_heatmap(axes[r, c], weights[r][c], labels[c], vmin=vmin,
                                           vmax=vmax, cmap=cmap, annotate=annotate)
            if r < n_rows - 1:
                axes[r, c].set_xlabel("")
            if c > 0:
                axes[r, c].set_ylabel("")
    if col_titles is not None:
        for c, title in enumerate(col_titles):
            axes[0, c].set_title(title)
    if row_titles is not None:
        for r, title in enumerate(row_titles):
            axes[r, 0].set_ylabel(f"{title}\n\nquery")
    if colorbar:
        fig.colorbar(image, ax=axes.ravel().tolist(), label="attention weight", shrink=0.8)
    return axes
