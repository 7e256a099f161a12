"""Figures for the chapter on the attention module in practice.

Each function draws data computed by the caller (weights, masks, scores, probe results,
timings) and checks only that the data fits the figure: nothing is computed here that the
chapter has not measured.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure

from .heatmaps import _as_matrix, draw_attention_heatmap

__all__ = ["draw_decode_cost", "draw_layer_measurements", "draw_masks", "draw_short_table_scores",
           "draw_weight_panels"]

# grey for "blocked", a blue for "may attend": readable in greyscale too
_MASK_CMAP = ListedColormap(["#d9d9d9", "#2b6cb0"])


def _layout(fig: Figure) -> None:
    if fig.get_layout_engine() is None:
        fig.set_layout_engine("constrained")


def _curves(name: str, curves: Mapping[str, Sequence[float]], length: int | None = None
            ) -> dict[str, np.ndarray]:
    """``curves`` as 1-D float arrays of one common length (``length`` if given)."""
    if not curves:
        raise ValueError(f"{name} must map at least one label to its values, got nothing")
    arrays = {label: np.asarray(values, dtype=float) for label, values in curves.items()}
    lengths = {label: a.shape for label, a in arrays.items()}
    expected = (length,) if length is not None else next(iter(lengths.values()))
    if any(a.ndim != 1 or a.shape != expected for a in arrays.values()):
        raise ValueError(f"every curve in {name} must be 1-D with {expected[0]} values, got "
                         f"shapes {lengths}")
    return arrays


def draw_weight_panels(fig: Figure, panels: Sequence[tuple[str, Any, Sequence[str],
                                                            Sequence[str]]],
                       *, annotate: bool = False) -> list[Axes]:
    """One attention-weight heatmap per panel, side by side, with one shared 0..1 colour bar.

    Args:
        fig: the Figure to draw on.
        panels: ``(title, weights, query_labels, key_labels)`` each; ``weights`` is a
            ``(queries, keys)`` matrix (e.g. one batch element, averaged over heads).
        annotate: write each weight in its cell.

    Returns:
        The Axes, one per panel.
    """
    if not panels:
        raise ValueError("panels must hold at least one (title, weights, query_labels, "
                         "key_labels) entry")
    _layout(fig)
    axes = list(np.atleast_1d(fig.subplots(1, len(panels))))
    image = None
    for ax, (title, weights, query_labels, key_labels) in zip(axes, panels, strict=True):
        image = draw_attention_heatmap(ax, weights, query_labels, key_labels, annotate=annotate)
        ax.set_title(title, fontsize="medium")
    fig.colorbar(image, ax=axes, label="attention weight", shrink=0.8)
    return axes


def draw_masks(fig: Figure, masks: Mapping[str, Any]) -> list[Axes]:
    """Boolean attention masks side by side: blue where a query may attend, grey where not.

    Args:
        fig: the Figure to draw on.
        masks: ``{title: (queries, keys) boolean matrix}``; rows are queries, columns keys.

    Returns:
        The Axes, one per mask.
    """
    if not masks:
        raise ValueError("masks must map at least one title to a boolean matrix")
    matrices = {}
    for title, mask in masks.items():
        matrix = _as_matrix(f"masks[{title!r}]", mask)
        if not np.isin(matrix, (0.0, 1.0)).all():
            raise ValueError(f"masks[{title!r}] must be boolean (True = may attend), got values "
                             f"{sorted(set(np.unique(matrix).tolist()))[:5]}")
        matrices[title] = matrix
    _layout(fig)
    axes = list(np.atleast_1d(fig.subplots(1, len(matrices))))
    for ax, (title, matrix) in zip(axes, matrices.items(), strict=True):
        ax.imshow(matrix, cmap=_MASK_CMAP, vmin=0, vmax=1)
        ax.set_xticks(range(matrix.shape[1]))
        ax.set_yticks(range(matrix.shape[0]))
        ax.tick_params(labelsize="small", length=0)
        ax.set_xlabel("key")
        ax.set_title(title, fontsize="medium")
    axes[0].set_ylabel("query")
    return axes


def draw_short_table_scores(ax: Axes, key_positions: Sequence[int],
                            scores: Mapping[str, Sequence[float]], table_len: int,
                            query_position: int) -> None:
    """Scores of one query against keys at each position, for tables of several kinds.

    The region of key positions the table does not cover (``>= table_len``) is shaded.

    Args:
        ax: the Axes to draw on.
        key_positions: the key positions n (x axis).
        scores: ``{label: score per key position}``.
        table_len: rows in the short cos/sin table.
        query_position: the query's position m (named in the title).
    """
    positions = np.asarray(key_positions, dtype=float)
    if positions.ndim != 1 or positions.size < 2:
        raise ValueError(f"key_positions must be 1-D with at least 2 positions, got shape "
                         f"{positions.shape}")
    arrays = _curves("scores", scores, positions.size)
    if not positions.min() < table_len <= positions.max():
        raise ValueError(f"table_len={table_len} must fall inside the key positions "
                         f"{positions.min():g}..{positions.max():g}, or there is nothing to show")
    ax.axvspan(table_len - 0.5, positions.max() + 0.5, color="0.9", zorder=0,
               label="past the table")
    for (label, values), style in zip(arrays.items(), ("-", "--", ":", "-."), strict=False):
        ax.plot(positions, values, style, marker="o", markersize=3, label=label)
    ax.set_xlim(positions.min() - 0.5, positions.max() + 0.5)
    ax.set_xlabel("key position n")
    ax.set_ylabel(f"score of the query at m = {query_position}")
    ax.legend(fontsize="small")
    ax.grid(True, alpha=0.25)


def draw_layer_measurements(fig: Figure, probe_r2: Mapping[str, Sequence[float]],
                            shift_change: Mapping[str, Sequence[float]], *,
                            floor: float = 1e-17) -> tuple[Axes, Axes]:
    """Two panels over the layers of a stack: what a linear probe reads from the hidden states
    (left) and how much the attention changes when the sequence is moved (right, log scale).

    Args:
        fig: the Figure to draw on.
        probe_r2: ``{stack: R^2 of the probe after each layer}``, index 0 = the input.
        shift_change: ``{stack: largest change of the attention weights of layers 1, 2, ...}``
            when every position is shifted by the same amount.
        floor: values below it (exact zeros) are drawn at it, on the log axis.

    Returns:
        The two Axes.
    """
    probes = _curves("probe_r2", probe_r2)
    shifts = _curves("shift_change", shift_change)
    if any(np.any(v < 0) for v in shifts.values()):
        raise ValueError("shift_change holds sizes of changes, which cannot be negative")
    _layout(fig)
    left, right = fig.subplots(1, 2)
    for label, values in probes.items():
        left.plot(np.arange(values.size), values, marker="o", label=label)
    left.set_xlabel("after layer (0 = the input)")
    left.set_ylabel("probe R² for the distance m − n")
    left.set_ylim(0.0, 1.05)
    left.set_xticks(range(next(iter(probes.values())).size))
    for label, values in shifts.items():
        right.semilogy(np.arange(1, values.size + 1), np.maximum(values, floor), marker="o",
                       label=label)
    right.set_xlabel("layer")
    right.set_ylabel("change of the attention weights")
    right.set_xticks(range(1, next(iter(shifts.values())).size + 1))
    for ax in (left, right):
        ax.grid(True, alpha=0.25)
        ax.legend(fontsize="small")
    return left, right


def draw_decode_cost(ax: Axes, context_lengths: Sequence[int],
                     seconds: Mapping[str, Sequence[float]]) -> None:
    """Time per generated token against the context length, log-log, one line per method.

    A method measured only at some lengths gives NaN at the others (not drawn).

    Args:
        ax: the Axes to draw on.
        context_lengths: the tokens already in the context at each measurement.
        seconds: ``{method: median seconds per token at each context length}``.
    """
    lengths = np.asarray(context_lengths, dtype=float)
    if lengths.ndim != 1 or lengths.size < 2 or np.any(lengths <= 0):
        raise ValueError(f"context_lengths must be at least 2 positive lengths, got "
                         f"{lengths.tolist()}")
    arrays = _curves("seconds", seconds, lengths.size)
    if any(np.any(v[~np.isnan(v)] <= 0) for v in arrays.values()):
        raise ValueError("seconds must be positive (or NaN where a method was not measured)")
    for label, values in arrays.items():
        ax.loglog(lengths, values * 1e3, marker="o", label=label)
    ax.set_xlabel("tokens already in the context")
    ax.set_ylabel("ms per generated token (this run)")
    ax.legend(fontsize="small")
    ax.grid(True, which="both", alpha=0.25)
