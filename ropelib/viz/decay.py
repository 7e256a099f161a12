"""Figures for chapter 6: RoFormer's long-term decay and what it does and does not say.

- ``draw_decay_bound(ax, distances, head_dim, base)``: the relative upper bound
  (1/(d/2)) sum_j |S_j| against the distance (RoFormer's figure 2).
- ``draw_phasor_walk(fig, distance, head_dim, base)``: the partial sums S_j as a walk of unit
  phasors in the complex plane, beside the bound curve with the distance marked; in the
  ``draw(fig, **params)`` form of :func:`ropelib.viz.live_slider` and
  :func:`ropelib.viz.scrubber`.
- ``draw_score_curves(ax, distances, curves)``: scores against the distance, with marked
  points.
- ``draw_score_spread(ax, distances, mean, std)``: the mean and spread of scores of random
  query/key pairs.
- ``draw_base_bounds(ax, context_lengths, bases, models)``: Men et al.'s lower bound on the
  base against the context length, with the (context, base) of real models.

The numbers come from :mod:`ropelib.analysis`; these functions only draw.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ..analysis import decay_upper_bound, phasor_partial_sums

__all__ = ["draw_base_bounds", "draw_decay_bound", "draw_phasor_walk", "draw_score_curves",
           "draw_score_spread"]

_STYLES = ("-", "--", "-.", ":")


def _vector(name: str, values: object) -> np.ndarray:
    if hasattr(values, "detach"):  # a torch tensor, without importing torch here
        values = values.detach().cpu().numpy()
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence, got shape {array.shape}")
    return array


def _same_length(name: str, values: object, x: np.ndarray) -> np.ndarray:
    y = _vector(name, values)
    if y.shape != x.shape:
        raise ValueError(f"{name} must have one value per distance ({x.size}), got {y.size}")
    return y


def draw_decay_bound(ax: Axes, distances: Sequence[float], head_dim: int = 128,
                     base: float = 10000.0) -> Line2D:
    """RoFormer's relative upper bound (1/(d/2)) sum_{j=1}^{d/2} |S_j| against the distance.

    Returns:
        The curve (x: distances, y: :func:`ropelib.analysis.decay_upper_bound`).
    """
    x = _vector("distances", distances)
    (line,) = ax.plot(x, decay_upper_bound(x, head_dim, base), color="tab:blue", lw=1.2,
                      gid="bound_curve")
    ax.set_xlabel("relative distance")
    ax.set_ylabel("relative upper bound")
    ax.set_xlim(x.min(), x.max())
    ax.set_ylim(0.0, 1.05 * (head_dim // 2 + 1) / 2)
    ax.grid(True, color="0.9", lw=0.6)
    return line


def draw_phasor_walk(fig: Figure, distance: float, head_dim: int = 128,
                     base: float = 10000.0, *, max_distance: int = 256) -> dict[str, float]:
    """The walk S_0 = 0, S_1, ..., S_{d/2} of unit steps exp(i distance theta_k), coloured
    by the pair of each step, above the bound curve over 0 .. max_distance with ``distance``
    marked (a figure about as tall as it is wide: ``style.figsize(0.8)``).

    Both panels have axes fixed by ``head_dim``, ``base`` and ``max_distance`` only (the
    walk's box holds the walks of every distance 0 .. max_distance), so frames over the
    distance compare.

    Returns:
        ``{"bound": the bound at distance, "end": |S_{d/2}|}``.
    """
    if not 0 <= distance <= max_distance:
        raise ValueError(f"distance must be in [0, max_distance = {max_distance}], "
                         f"got {distance!r}")
    walk = phasor_partial_sums(float(distance), head_dim, base)
    half = head_dim // 2
    # the walk above, at full width (its box is wide and low), the bound curve below
    grid = fig.add_gridspec(2, 2, height_ratios=[1.35, 1.0], width_ratios=[1.0, 0.025],
                            left=0.1, right=0.9, bottom=0.09, top=0.94, hspace=0.38,
                            wspace=0.04)
    plane = fig.add_subplot(grid[0, 0])
    curve = fig.add_subplot(grid[1, 0])
    colour_bar = fig.add_subplot(grid[0, 1])

    points = np.column_stack([walk.real, walk.imag])
    segments = np.stack([points[:-1], points[1:]], axis=1)
    steps = LineCollection(segments, cmap="viridis", lw=2.6, gid="walk", zorder=3)
    steps.set_array(np.arange(half))
    plane.add_collection(steps)
    plane.plot(walk.real, walk.imag, ".", ms=1.5, color="0.75", gid="walk_points", zorder=2)
    plane.plot([0.0], [0.0], "+", color="k", ms=8, zorder=4)
    plane.plot([walk[-1].real], [walk[-1].imag], "o", color="tab:red", ms=6, gid="walk_end",
               zorder=5)
    every_walk = phasor_partial_sums(np.arange(0, max_distance + 1), head_dim, base)
    pad = 0.05 * half
    plane.set_xlim(every_walk.real.min() - pad, every_walk.real.max() + pad)
    plane.set_ylim(every_walk.imag.min() - pad, every_walk.imag.max() + pad)
    plane.set_aspect("equal", anchor="W")
    plane.axhline(0.0, color="0.85", lw=0.6, zorder=0)
    plane.axvline(0.0, color="0.85", lw=0.6, zorder=0)
    plane.set_xlabel("Re")
    plane.set_ylabel("Im")
    fig.colorbar(steps, cax=colour_bar, label="pair i")
    bound = float(np.abs(walk[1:]).mean())
    # titles as plain text: set_title re-measures the axes on every draw (slow in animations)
    plane.text(0.0, 1.03, f"distance {distance:g}: S_j for d = {head_dim}, base {base:,.0f}",
               transform=plane.transAxes, ha="left", va="bottom", fontsize="small")
    plane.text(0.98, 0.05, f"|S_d/2| = {abs(walk[-1]):.2f}", transform=plane.transAxes,
               ha="right", fontsize="small", color="tab:red")

    draw_decay_bound(curve, np.arange(0, max_distance + 1), head_dim, base)
    curve.plot([distance], [bound], "o", color="tab:red", ms=7, gid="current_bound")
    curve.text(0.97, 0.92, f"bound = {bound:.2f}", transform=curve.transAxes, ha="right",
               va="top", fontsize="small", color="tab:red")
    return {"bound": bound, "end": float(abs(walk[-1]))}


def draw_score_curves(ax: Axes, distances: Sequence[float],
                      curves: Mapping[str, Sequence[float]], *,
                      marks: Sequence[float] = (), ylabel: str = "score") -> list[Line2D]:
    """Scores against the distance, one line per curve, with dots at the ``marks``.

    Args:
        ax: the Axes to draw on.
        distances: the x values.
        curves: ``{label: value at each distance}``.
        marks: distances at which every curve gets a dot (must be among ``distances``).
        ylabel: label of the y axis.

    Returns:
        One line per curve, in the mapping's order.
    """
    x = _vector("distances", distances)
    lines = []
    for j, (label, values) in enumerate(curves.items()):
        y = _same_length(f"curves[{label!r}]", values, x)
        (line,) = ax.plot(x, y, lw=1.1, linestyle=_STYLES[j % len(_STYLES)], label=label)
        lines.append(line)
        for mark in marks:
            hits = np.flatnonzero(x == mark)
            if hits.size == 0:
                raise ValueError(f"marks must be among the distances, got {mark!r}")
            ax.plot([mark], [y[hits[0]]], "o", color=line.get_color(), ms=5)
    ax.axhline(0.0, color="0.75", lw=0.6, zorder=0)
    ax.set_xlabel("relative distance")
    ax.set_ylabel(ylabel)
    ax.set_xlim(x.min(), x.max())
    ax.legend(fontsize="small", loc="upper right")
    return lines


def draw_score_spread(ax: Axes, distances: Sequence[float], mean: Sequence[float],
                      std: Sequence[float], *, label: str = "random q, k") -> Line2D:
    """The mean score (line) and mean +- one standard deviation (band) against the distance.

    Returns:
        The mean's line.
    """
    x = _vector("distances", distances)
    mu, sigma = _same_length("mean", mean, x), _same_length("std", std, x)
    band = ax.fill_between(x, mu - sigma, mu + sigma, color="tab:gray", alpha=0.3,
                           label=f"{label}: mean ± std")
    band.set_gid("spread_band")
    (line,) = ax.plot(x, mu, color="k", lw=1.0, label=f"{label}: mean", gid="spread_mean")
    ax.axhline(0.0, color="0.75", lw=0.6, zorder=0)
    ax.set_xlabel("relative distance")
    ax.set_ylabel("score")
    ax.set_xlim(x.min(), x.max())
    return line


def draw_base_bounds(ax: Axes, context_lengths: Sequence[float], bases: Sequence[float],
                     models: Mapping[str, tuple[float, float]] | None = None,
                     others: Mapping[str, Sequence[float]] | None = None) -> Line2D:
    """Lower bound on the base against the context length (log-log), with model points.

    Args:
        ax: the Axes to draw on.
        context_lengths: context lengths L.
        bases: the smallest feasible base for each L.
        models: ``{name: (context length, base)}`` of models, drawn as labelled markers.
        others: ``{name: bases}``, other bounds at the same context lengths (another search
            grid, values from a paper), drawn as open markers.

    Returns:
        The bound's line.
    """
    x = _vector("context_lengths", context_lengths)
    y = _same_length("bases", bases, x)
    (line,) = ax.plot(x, y, "o-", color="tab:blue", lw=1.2, label="smallest feasible base",
                      gid="base_bound")
    for j, (name, values) in enumerate((others or {}).items()):
        ax.plot(x, _same_length(f"others[{name!r}]", values, x), marker="ox+"[j % 3],
                ls="none", ms=9, mfc="none", color=f"C{j + 4}", label=name, gid="other_bound")
    for j, (name, (length, base)) in enumerate((models or {}).items()):
        ax.plot([length], [base], marker="s^Dv"[j % 4], ls="none", ms=7, label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context length L")
    ax.set_ylabel("base")
    ax.grid(True, which="major", color="0.9", lw=0.6)
    ax.legend(fontsize="small", loc="upper left")
    return line
