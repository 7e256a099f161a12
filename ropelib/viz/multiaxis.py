"""Figures of chapter 12: RoPE in more dimensions.

``draw_score_maps`` lays scores out on the patch grid, one panel per method, with the query
(and a key) marked; ``draw_moving_key`` is its ``draw(fig, dy, dx)`` form for sliders, where
the key sits at an offset from the grid's centre. ``draw_mrope_positions`` draws the
(t, h, w) positions of a text/image/video sequence, ``draw_axis_spectra`` the frequency of
every pair coloured by its axis, ``draw_grid_accuracy`` the tiny ViT experiment.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

__all__ = ["AXIS_COLORS", "draw_axis_spectra", "draw_grid_accuracy",
           "draw_moving_key", "draw_mrope_positions", "draw_score_maps"]

AXIS_COLORS = ("tab:blue", "tab:orange", "tab:green")
_SEGMENT_COLORS = {"text": "0.9", "image": "#fde2c0", "video": "#cfe8cf"}


def _as_array(name: str, values: Any, ndim: int) -> np.ndarray:
    if hasattr(values, "detach"):
        values = values.detach().cpu().numpy()
    array = np.asarray(values, dtype=float)
    if array.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {array.shape}")
    return array


def _mark(ax: Axes, cell: tuple[int, int], color: str, label: str) -> None:
    row, col = cell
    ax.add_patch(Rectangle((col - 0.5, row - 0.5), 1, 1, fill=False, edgecolor=color,
                           linewidth=2.0, label=label))


def draw_score_maps(fig: Figure, maps: Mapping[str, Any], *, query: tuple[int, int] | None = None,
                    key: tuple[int, int] | None = None, colorbar_label: str = "score",
                    labels: tuple[str, str] = ("column", "row"), radius: int | None = None
                    ) -> list[Axes]:
    """One panel per ``(title, (G, G) map)``, a shared colour scale, the query patch outlined
    in white and the key patch in red. ``labels`` names the (x, y) axes; with ``radius`` R
    the cells are offsets -R .. R (G = 2R + 1) instead of indices 0 .. G - 1.

    Returns the panels' Axes; their images hold the maps unchanged.
    """
    if not maps:
        raise ValueError("maps must hold at least one (title, grid of scores) entry")
    arrays = {title: _as_array(f"maps[{title!r}]", m, 2) for title, m in maps.items()}
    shapes = {a.shape for a in arrays.values()}
    if len(shapes) != 1:
        raise ValueError(f"every map must have the same (G, G) shape, got {sorted(shapes)}")
    extent = None
    if radius is not None:
        if shapes != {(2 * radius + 1,) * 2}:
            raise ValueError(f"radius {radius} needs maps of shape {(2 * radius + 1,) * 2}, "
                             f"got {shapes.pop()}")
        extent = (-radius - 0.5, radius + 0.5, radius + 0.5, -radius - 0.5)
    low = min(a.min() for a in arrays.values())
    high = max(a.max() for a in arrays.values())
    if fig.get_layout_engine() is None:
        fig.set_layout_engine("constrained")
    axes = list(np.atleast_1d(fig.subplots(1, len(arrays))))
    image = None
    for ax, (title, array) in zip(axes, arrays.items(), strict=True):
        image = ax.imshow(array, cmap="viridis", vmin=low, vmax=high if high > low else low + 1,
                          extent=extent)
        ax.set_title(title)
        ax.set_xlabel(labels[0])
        ax.set_ylabel(labels[1])
        if query is not None:
            _mark(ax, query, "white", "query")
        if key is not None:
            _mark(ax, key, "tab:red", "key")
    fig.colorbar(image, ax=axes, label=colorbar_label, shrink=0.85)
    return axes


def draw_moving_key(fig: Figure, dy: int, dx: int, *, center: tuple[int, int],
                    maps_for_key: Mapping[str, Callable[[tuple[int, int]], Any]]) -> list[Axes]:
    """The key at ``center + (dy, dx)``; each panel shows ``maps_for_key[title](key)``, the
    score of a query at every patch against that key."""
    key = (center[0] + dy, center[1] + dx)
    maps = {title: fn(key) for title, fn in maps_for_key.items()}
    grid = next(iter(maps.values()))
    size = _as_array("map", grid, 2).shape
    if not (0 <= key[0] < size[0] and 0 <= key[1] < size[1]):
        raise ValueError(f"the key at {key} = center {center} + (dy, dx) = ({dy}, {dx}) is off "
                         f"the {size[0]} x {size[1]} grid")
    axes = draw_score_maps(fig, maps, key=key, colorbar_label="score against the key")
    fig.suptitle(f"key at (dy, dx) = ({dy}, {dx}) from the centre")
    return axes


def draw_mrope_positions(fig: Figure, positions: Any, kinds: Sequence[str],
                         axis_names: Sequence[str] = ("t", "h", "w")) -> list[Axes]:
    """The (t, h, w) position of every token against its index, one panel per axis, with
    the stretches of each kind (``"text"``, ``"image"``, ``"video"``) shaded.

    Args:
        positions: ``(seq, 3)``.
        kinds: one kind per token.
    """
    array = _as_array("positions", positions, 2)
    if array.shape[1] != len(axis_names):
        raise ValueError(f"positions must be (seq, {len(axis_names)}), got {array.shape}")
    if len(kinds) != array.shape[0]:
        raise ValueError(f"kinds must name every token ({array.shape[0]}), got {len(kinds)}")
    unknown = set(kinds) - set(_SEGMENT_COLORS)
    if unknown:
        raise ValueError(f"kinds must be among {sorted(_SEGMENT_COLORS)}, got {sorted(unknown)}")
    if fig.get_layout_engine() is None:
        fig.set_layout_engine("constrained")
    axes = list(fig.subplots(len(axis_names), 1, sharex=True))
    index = np.arange(array.shape[0])
    starts = [0] + [i for i in range(1, len(kinds)) if kinds[i] != kinds[i - 1]] + [len(kinds)]
    for a, (ax, name) in enumerate(zip(axes, axis_names, strict=True)):
        for start, end in zip(starts[:-1], starts[1:], strict=True):
            ax.axvspan(start - 0.5, end - 0.5, color=_SEGMENT_COLORS[kinds[start]], lw=0,
                       label=kinds[start] if a == 0 else None)
        ax.plot(index, array[:, a], ".", color=AXIS_COLORS[a % len(AXIS_COLORS)], ms=4)
        ax.set_ylabel(name)
    axes[-1].set_xlabel("token index")
    handles, labels = axes[0].get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    axes[0].legend(unique.values(), unique.keys(), loc="upper left", fontsize="small", ncol=3)
    return axes


def draw_axis_spectra(fig: Figure, layouts: Mapping[str, Any],
                      axis_names: Sequence[str] = ("t", "h", "w")) -> list[Axes]:
    """One panel per ``(title, W)``: the frequency of every pair (log scale) against its
    index, coloured by the axis it follows. W is ``(d/2, k)`` with one nonzero per row."""
    if not layouts:
        raise ValueError("layouts must hold at least one (title, W) entry")
    if fig.get_layout_engine() is None:
        fig.set_layout_engine("constrained")
    axes = list(np.atleast_1d(fig.subplots(1, len(layouts), sharey=True)))
    for ax, (title, W) in zip(axes, layouts.items(), strict=True):
        array = _as_array(f"layouts[{title!r}]", W, 2)
        if array.shape[1] != len(axis_names):
            raise ValueError(f"layouts[{title!r}] must have {len(axis_names)} columns (axes), "
                             f"got {array.shape}")
        if ((array != 0).sum(1) != 1).any():
            raise ValueError(f"layouts[{title!r}]: every pair must follow exactly one axis")
        pairs = np.arange(array.shape[0])
        axis = np.abs(array).argmax(1)
        for a, name in enumerate(axis_names):
            mine = axis == a
            ax.scatter(pairs[mine], np.abs(array[mine, a]), s=10, label=name,
                       color=AXIS_COLORS[a % len(AXIS_COLORS)])
        ax.set_yscale("log")
        ax.set_title(title)
        ax.set_xlabel("pair i")
    axes[0].set_ylabel("frequency (rad per position)")
    axes[0].legend(title="axis", fontsize="small")
    return axes


def draw_grid_accuracy(ax: Axes, results: Mapping[str, Mapping[str, Any]], *,
                       train_grid: int, chance: float) -> None:
    """Accuracy against grid size, one line per method (``results[method]["accuracy"]``
    maps grid size to accuracy); the training grid and chance level are marked."""
    if not results:
        raise ValueError("results must hold at least one method")
    # lines that coincide (several methods at 100%) stay apart by marker and dash
    styles = [("o", "-"), ("s", "--"), ("^", "-."), ("D", ":"), ("v", (0, (5, 1)))]
    for index, (method, entry) in enumerate(results.items()):
        grids = sorted(entry["accuracy"])
        marker, dash = styles[index % len(styles)]
        ax.plot(grids, [100 * entry["accuracy"][g] for g in grids], marker=marker,
                linestyle=dash, markersize=7 - index % len(styles), markerfacecolor="none",
                markeredgewidth=1.4, label=method)
    ax.axhline(100 * chance, color="0.5", ls=":", label="chance")
    ax.axvline(train_grid, color="0.5", ls="--", lw=1)
    ax.set_xticks(sorted({g for e in results.values() for g in e["accuracy"]}))
    ax.set_xlabel("grid size G (G x G patches)")
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(0, 105)
    ax.legend(fontsize="small", loc="lower left")
