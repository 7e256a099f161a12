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


def wavelength_label(wavelength: float) -> str:
    """A wavelength in positions as a short tick label: ``6.3``, ``63``, ``19,869``."""
    return f"{wavelength:.1f}" if wavelength < 10 else f"{wavelength:,.0f}"


def draw_sinusoidal_table(fig: Figure, table: object, wavelengths: Sequence[float], *,
                          cmap: str = "RdBu_r") -> Axes:
    """The sinusoidal position table as a heatmap, each channel pair labelled by its wavelength.

    Row m (position) runs downwards, column j (channel) to the right; channels 2i and 2i+1
    (sin and cos of m * omega_i) form pair i, whose wavelength 2 pi / omega_i is written on
    the top axis, above the middle of the pair. Colours run from -1 to 1.

    Args:
        fig: the figure to draw into.
        table: the ``(positions, d)`` table, d even (NumPy array or torch tensor).
        wavelengths: ``d / 2`` positive wavelengths, in positions, one per pair.
        cmap: a diverging matplotlib colour map.

    Returns:
        The heatmap axes (its top axis, with the wavelengths, is ``ax.secondary_xaxis``'s).
    """
    matrix = _as_2d("table", table)
    if matrix.shape[1] % 2:
        raise ValueError(f"table must have an even number of channels (sin, cos pairs), "
                         f"got shape {matrix.shape}")
    waves = np.asarray(wavelengths, dtype=np.float64)
    if waves.shape != (matrix.shape[1] // 2,):
        raise ValueError(f"wavelengths must have one entry per channel pair "
                         f"({matrix.shape[1] // 2}), got shape {waves.shape}")
    if not np.all(np.isfinite(waves) & (waves > 0)):
        raise ValueError(f"wavelengths must be positive and finite, got {waves.tolist()}")
    ax = fig.add_subplot(1, 1, 1)
    image = ax.imshow(matrix, cmap=cmap, vmin=-1.0, vmax=1.0, origin="upper",
                      interpolation="nearest", aspect="auto")
    ax.set_xlabel("channel j (pair i = j // 2: sin at 2i, cos at 2i + 1)")
    ax.set_ylabel("position m")
    ax.set_xticks(np.arange(matrix.shape[1]))
    top = ax.secondary_xaxis("top")
    top.set_xticks(np.arange(waves.size) * 2 + 0.5, [wavelength_label(w) for w in waves])
    top.set_xlabel("wavelength 2π/ω_i of the pair (positions)")
    for boundary in np.arange(1.5, matrix.shape[1] - 1, 2):
        ax.axvline(boundary, color="0.3", linewidth=0.6)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="value")
    return ax
