"""Figures for chapter 5: RoPE's frequencies against the context.

- ``draw_wavelengths(ax, configs, context_length)``: the wavelength 2 pi / theta_i of every
  pair, one series per (base, head_dim), on a log axis, with the context length as a line.
- ``draw_wavelength_slider(fig, log10_base, head_dim)``: the same for one configuration, in
  the ``draw(fig, **params)`` form of :func:`ropelib.viz.live_slider` and
  :func:`ropelib.viz.scrubber`, with fixed axes so the frames compare.
- ``draw_distance_similarity(ax, gaps, similarities)``: how alike two distances look
  (cosine similarity of their rotation angles) against the gap between them.

The numbers come from :mod:`ropelib.analysis`; these functions only draw.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ..analysis import wavelengths

__all__ = ["draw_distance_similarity", "draw_wavelength_slider", "draw_wavelengths"]

_MARKERS = ("o", "s", "^", "D", "v")
_STYLES = ("-", "--", "-.", ":")


def _check_context(context_length: object) -> int:
    if isinstance(context_length, bool) or not isinstance(context_length, int) \
            or context_length < 1:
        raise ValueError(f"context_length must be a positive int, got {context_length!r}")
    return context_length


def draw_wavelengths(ax: Axes, configs: Sequence[tuple[float, int]], context_length: int
                     ) -> list[Line2D]:
    """Wavelength of every pair against its index, one series per ``(base, head_dim)``.

    Args:
        ax: the Axes to draw on (its y axis becomes logarithmic).
        configs: ``(base, head_dim)`` pairs.
        context_length: drawn as a horizontal line; a pair above it never completes a
            turn inside the context.

    Returns:
        The series' lines, in the order of ``configs`` (x: pair index i, y: 2 pi / theta_i).
    """
    context_length = _check_context(context_length)
    if not configs:
        raise ValueError("configs must name at least one (base, head_dim) pair, got none")
    lines = []
    for j, (base, head_dim) in enumerate(configs):
        wl = wavelengths(head_dim, base)
        (line,) = ax.plot(np.arange(wl.size), wl, marker=_MARKERS[j % len(_MARKERS)],
                          linestyle=_STYLES[j % len(_STYLES)], ms=3, lw=1.0,
                          label=f"base {base:,.0f}, d = {head_dim}")
        lines.append(line)
    ax.axhline(context_length, color="0.3", lw=1.0, ls=":", gid="context_line")
    ax.text(0.0, context_length * 1.3, f"context {context_length:,} tokens", color="0.3",
            fontsize="small", va="bottom")
    ax.set_yscale("log")
    ax.set_xlabel("pair index i")
    ax.set_ylabel("wavelength 2π/θ_i (positions)")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(0.0, 0.93))
    ax.grid(True, which="major", color="0.9", lw=0.6)
    return lines


def draw_wavelength_slider(fig: Figure, log10_base: float, head_dim: int, *,
                           context_length: int = 4096, max_log10_base: float = 7.0,
                           max_head_dim: int = 256) -> dict[str, float]:
    """One configuration's wavelengths, coloured by whether the pair turns inside the context.

    The axes are fixed by ``max_log10_base`` and ``max_head_dim`` (the slider ranges), so
    frames over different bases or head dims share them.

    Returns:
        ``{"never_turn": pairs with a wavelength above the context, "fastest_turns": turns
        of pair 0 inside the context}``.
    """
    context_length = _check_context(context_length)
    if not 0.0 < log10_base <= max_log10_base:
        raise ValueError(f"log10_base must be in (0, {max_log10_base}], got {log10_base!r}")
    if head_dim > max_head_dim:
        raise ValueError(f"head_dim must be at most max_head_dim = {max_head_dim}, "
                         f"got {head_dim!r}")
    wl = wavelengths(head_dim, 10.0**log10_base)
    ax = fig.add_subplot()
    pairs = np.arange(wl.size)
    slow = wl > context_length
    ax.plot(pairs[~slow], wl[~slow], "o", ms=3, color="tab:blue", gid="turning",
            label="turns inside the context")
    ax.plot(pairs[slow], wl[slow], "o", ms=3, color="tab:orange", gid="never_turn",
            label="never completes a turn")
    ax.axhline(context_length, color="0.3", lw=1.0, ls=":", gid="context_line")
    ax.set_yscale("log")
    ax.set_xlim(-2, max_head_dim // 2 + 2)
    ax.set_ylim(1.0, 2 * math.pi * 10.0**max_log10_base * 1.5)
    ax.set_xlabel("pair index i")
    ax.set_ylabel("wavelength 2π/θ_i")
    fastest = context_length / wl[0]
    ax.text(0.98, 0.04, f"base = {10.0**log10_base:,.0f}, d = {head_dim}\n"
            f"{int(slow.sum())} of {wl.size} pairs never turn in {context_length:,} tokens\n"
            f"pair 0 turns {fastest:,.0f} times", transform=ax.transAxes, ha="right",
            va="bottom", fontsize="small")
    ax.legend(fontsize="small", loc="upper left")
    ax.grid(True, which="major", color="0.9", lw=0.6)
    return {"never_turn": float(slow.sum()), "fastest_turns": float(fastest)}


def draw_distance_similarity(ax: Axes, gaps: Sequence[float],
                             similarities: Mapping[str, Sequence[float]], *,
                             closest: tuple[float, float] | None = None,
                             zoom: float | None = None) -> list[Line2D]:
    """Cosine similarity of two distances' rotation angles against their gap.

    Args:
        ax: the Axes to draw on.
        gaps: the gaps D1 - D2 (x axis).
        similarities: ``{label: similarity at each gap}``.
        closest: an optional ``(gap, similarity)`` marked with a red dot (the most alike
            pair, :func:`ropelib.analysis.most_similar_distances`).
        zoom: for a series that turns faster than the panel can draw (one frequency: a turn
            every 2 pi gaps), the largest gap of an inset (gid ``"zoom"``) that draws the
            curve as a line; the main panel then draws each gap's value as a dot, so that
            thousands of turns read as samples, not as a filled block.

    Returns:
        One line per series, in the mapping's order.
    """
    x = np.asarray(gaps, dtype=np.float64)
    if zoom is not None and not (math.isfinite(zoom) and zoom > x.min()):
        raise ValueError(f"zoom must be a gap above the smallest one ({x.min():g}), "
                         f"got {zoom!r}")
    lines, series = [], []
    for j, (label, values) in enumerate(similarities.items()):
        y = np.asarray(values, dtype=np.float64)
        if y.shape != x.shape:
            raise ValueError(f"similarities[{label!r}] must have one value per gap "
                             f"({x.shape}), got shape {y.shape}")
        style = _STYLES[j % len(_STYLES)]
        if zoom is None:
            (line,) = ax.plot(x, y, lw=0.8, linestyle=style, label=label)
        else:
            (line,) = ax.plot(x, y, ".", ms=1.0, alpha=0.6, label=label)
        lines.append(line)
        series.append((y, style, line.get_color()))
    if zoom is not None:
        inset = ax.inset_axes((0.32, 0.24, 0.3, 0.45))
        inset.set_gid("zoom")
        near = x <= zoom
        for y, style, color in series:
            inset.plot(x[near], y[near], lw=0.8, linestyle=style, color=color, marker=".",
                       ms=2.0)
        inset.set_ylim(-1.1, 1.1)
        inset.set_yticks([-1, 0, 1])
        inset.tick_params(labelsize="small")
        inset.set_title(f"gaps up to {zoom:g}", fontsize="small")
    if closest is not None:
        ax.plot([closest[0]], [closest[1]], "o", color="tab:red", ms=6, gid="closest")
    ax.axhline(1.0, color="0.6", lw=0.6, ls=":")
    ax.set_ylim(-1.05, 1.05)
    ax.set_xlabel("gap between the two distances")
    ax.set_ylabel("cosine similarity")
    ax.legend(fontsize="small", loc="lower right", markerscale=1 if zoom is None else 6)
    return lines
