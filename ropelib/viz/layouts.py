"""Figures for the two pair layouts: which channels pair up, the matrices, a mismatch's cost.

``draw_layout_pairs`` draws the channels of one head as a row of cells per layout, each pair
``i`` in its own colour and joined by an arc: ``interleaved`` pairs (2i, 2i+1), ``half`` pairs
(i, i + d/2). ``draw_layout_matrices`` shows square matrices side by side on one colour scale
(R_interleaved, P, R_half). ``draw_layout_mismatch`` shows what applying RoPE in the wrong
layout does: the score error against the distance n - m, and the change of the attention
weights against the query position. Inputs may be sequences, NumPy arrays or torch tensors.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.image import AxesImage
from matplotlib.patches import Arc, Rectangle

__all__ = ["draw_layout_matrices", "draw_layout_mismatch", "draw_layout_pairs", "layout_pairs"]

LAYOUT_NAMES = ("interleaved", "half")


def _as_array(name: str, value: Any, ndim: int) -> np.ndarray:
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    array = np.asarray(value, dtype=float)
    if array.ndim != ndim or array.size == 0:
        raise ValueError(f"{name} must be a non-empty {ndim}-D array, got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must be finite, got NaN or inf")
    return array


def layout_pairs(dim: int, layout: str) -> list[tuple[int, int]]:
    """The channel pairs ``[(a_0, b_0), ..., (a_{d/2-1}, b_{d/2-1})]``; pair i turns at theta_i."""
    if isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0 or dim % 2:
        raise ValueError(f"dim must be a positive even int, got {dim!r}")
    if layout not in LAYOUT_NAMES:
        raise ValueError(f"layout must be one of {LAYOUT_NAMES}, got {layout!r}")
    half = dim // 2
    if layout == "interleaved":
        return [(2 * i, 2 * i + 1) for i in range(half)]
    return [(i, i + half) for i in range(half)]


def draw_layout_pairs(fig: Figure, dim: int, *, cmap: str = "viridis"
                      ) -> dict[str, list[tuple[int, int]]]:
    """One row of ``dim`` channel cells per layout; the two cells of pair i share a colour and
    an arc and are labelled i.

    Returns:
        ``{layout: pairs drawn}``, pairs as in ``layout_pairs``.
    """
    colours = colormaps[cmap]
    axes = fig.subplots(len(LAYOUT_NAMES), 1)
    drawn = {}
    for ax, layout in zip(axes, LAYOUT_NAMES, strict=True):
        pairs = layout_pairs(dim, layout)
        for i, (a, b) in enumerate(pairs):
            colour = colours(i / max(1, len(pairs) - 1))
            for channel in (a, b):
                ax.add_patch(Rectangle((channel, 0), 0.9, 0.9, facecolor=colour,
                                       edgecolor="0.2", gid=f"{layout}-{channel}-pair-{i}"))
                text_colour = "white" if i < 0.6 * len(pairs) else "black"
                ax.text(channel + 0.45, 0.45, f"{i}", ha="center", va="center",
                        fontsize="small", color=text_colour)
            width = b - a
            ax.add_patch(Arc((a + width / 2 + 0.45, 0.9), width, 0.6 + 0.25 * width,
                             theta1=0, theta2=180, color=colour, linewidth=1.5,
                             gid=f"{layout}-arc-{i}"))
        ax.set_xlim(-0.2, dim + 0.1)
        ax.set_ylim(-0.5, 1.4 + 0.125 * dim)
        ax.set_xticks(np.arange(dim) + 0.45, [str(c) for c in range(dim)], fontsize="small")
        ax.set_yticks([])
        for side in ("left", "right", "top"):
            ax.spines[side].set_visible(False)
        label = "pairs (2i, 2i+1)" if layout == "interleaved" else "pairs (i, i + d/2)"
        ax.set_title(f"{layout}: {label}", fontsize="medium", loc="left")
        ax.set_xlabel("channel")
        drawn[layout] = pairs
    return drawn


def draw_layout_matrices(fig: Figure, matrices: Mapping[str, Any], *,
                         cmap: str = "RdBu_r") -> list[AxesImage]:
    """Square matrices side by side on one symmetric colour scale, -1 to 1 (rotations and
    permutations have entries in [-1, 1]), with a shared colour bar.

    Returns:
        One image per matrix, in the order given.
    """
    if not matrices:
        raise ValueError("matrices must hold at least one matrix, got an empty mapping")
    arrays = {}
    for title, value in matrices.items():
        array = _as_array(f"matrices[{title!r}]", value, 2)
        if array.shape[0] != array.shape[1]:
            raise ValueError(f"matrices[{title!r}] must be square, got shape {array.shape}")
        if np.abs(array).max() > 1 + 1e-12:
            raise ValueError(f"matrices[{title!r}] has entries outside [-1, 1] (largest "
                             f"|entry| {np.abs(array).max():.3g}); the colour scale is -1..1")
        arrays[title] = array
    axes = fig.subplots(1, len(arrays), squeeze=False)[0]
    images = []
    for ax, (title, array) in zip(axes, arrays.items(), strict=True):
        images.append(ax.imshow(array, cmap=cmap, vmin=-1.0, vmax=1.0))
        ticks = np.arange(array.shape[0])
        ax.set_xticks(ticks, [str(t) for t in ticks], fontsize="small")
        ax.set_yticks(ticks, [str(t) for t in ticks], fontsize="small")
        ax.set_title(title, fontsize="medium")
    fig.colorbar(images[-1], ax=list(axes), shrink=0.8)
    return images


def draw_layout_mismatch(fig: Figure, distances: Any, score_error: Any, positions: Any,
                         weight_error: Any) -> tuple[Axes, Axes]:
    """Two panels: the relative score error against the distance (symlog x axis, so that
    distance 0 shows), and the attention-weight error against the query position.

    Args:
        fig: an empty Figure.
        distances, score_error: 1-D, the same length; distances >= 0.
        positions, weight_error: 1-D, the same length (e.g. total variation distance between
            the right and the wrong attention row of each query, between 0 and 1).

    Returns:
        The two Axes.
    """
    dist = _as_array("distances", distances, 1)
    err = _as_array("score_error", score_error, 1)
    pos = _as_array("positions", positions, 1)
    werr = _as_array("weight_error", weight_error, 1)
    if dist.shape != err.shape:
        raise ValueError(f"distances and score_error must have the same length, got "
                         f"{dist.size} and {err.size}")
    if pos.shape != werr.shape:
        raise ValueError(f"positions and weight_error must have the same length, got "
                         f"{pos.size} and {werr.size}")
    if np.any(dist < 0):
        raise ValueError(f"distances must be >= 0, got minimum {dist.min()}")
    left, right = fig.subplots(1, 2)
    left.plot(dist, err, ".-", color="C3", markersize=3)
    left.set_xscale("symlog", linthresh=1.0)
    left.set_xlim(0, dist.max() * 1.05)
    left.set_xlabel("distance |n - m|")
    left.set_ylabel("relative RMS score error")
    right.plot(pos, werr, ".-", color="C0", markersize=3)
    right.set_ylim(0, 1)
    right.set_xlabel("query position m")
    right.set_ylabel("total variation distance")
    for ax in (left, right):
        ax.grid(True, alpha=0.3)
    return left, right
