"""Figures of chapter 13 ("Which frequencies matter"): pairs, spectra, factors, layer patterns.

- ``draw_pair_bands``: per rotation pair, the share of the query-key score it carries and
  how much its contribution moves with the distance, in a trained model.
- ``draw_spectra``: per-pair frequencies of full RoPE, partial rotation and p-RoPE.
- ``draw_stretch_factors``: theta_i / theta_i' per pair: LongRoPE's searched factors against
  YaRN's ramp and PI's constant.
- ``draw_layer_patterns``: a grid, one row per architecture, one cell per layer, coloured by
  what the layer does with positions.
- ``draw_accuracy_by_position_bars``: accuracy per position for a few models (NoPE's task).
- ``draw_seed_spread`` and ``seed_table_html``: accuracy against length over several seeds,
  mean and range (the comparison of the toy models).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from .extension import checked_lengths

__all__ = ["LAYER_KINDS", "draw_accuracy_by_position_bars", "draw_layer_patterns",
           "draw_pair_bands", "draw_seed_spread", "draw_spectra", "draw_stretch_factors",
           "seed_table_html"]

LAYER_KINDS = {
    "RoPE": "#1f77b4",
    "RoPE, sliding window": "#9ecae1",
    "RoPE, chunked": "#6baed6",
    "p-RoPE": "#ff7f0e",
    "NoPE": "#d9d9d9",
    "linear attention": "#2ca02c",
}
"""The kinds of layer ``draw_layer_patterns`` knows, with their colours."""


def _vector(name: str, values: Any) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence, got shape {array.shape}")
    return array


def draw_pair_bands(fig: Figure, share: Mapping[str, Any], variation: Mapping[str, Any], *,
                    turns: Any) -> tuple[Axes, Axes, Axes]:
    """Three panels over the pair index i, one line per layer (or head) in the first two.

    Left: the share of the score's magnitude that pair i carries (the shares of one line sum
    to 1). Middle: how much pair i's contribution changes with the distance (0: not at all).
    Right: the number of turns pair i makes over the distances the task uses (``turns``).
    The legend sits under the panels, clear of every line.
    """
    if not share or share.keys() != variation.keys():
        raise ValueError("share and variation must hold the same, non-empty set of lines, got "
                         f"{list(share)} and {list(variation)}")
    turns = _vector("turns", turns)
    left, right, bars = fig.subplots(1, 3, sharex=True)
    for label in share:
        s, v = _vector(f"share[{label!r}]", share[label]), _vector(f"variation[{label!r}]",
                                                                  variation[label])
        if s.size != turns.size or v.size != turns.size:
            raise ValueError(f"share and variation of {label!r} must have one value per pair "
                             f"({turns.size}), got {s.size} and {v.size}")
        pairs = np.arange(s.size)
        left.plot(pairs, s, marker="o", markersize=3, label=label)
        right.plot(pairs, v, marker="o", markersize=3, label=label)
    bars.bar(np.arange(turns.size), turns, color="0.6")
    left.set(xlabel="pair i (fast to slow)", ylabel="share of |score|")
    right.set(xlabel="pair i (fast to slow)", ylabel="change with distance")
    bars.set(xlabel="pair i (fast to slow)", ylabel="turns over the distances")
    # the legend goes under the panels, where it covers no data (inside the left panel it
    # hid the fast pairs, the ones the text is about)
    handles, labels = left.get_legend_handles_labels()
    fig.tight_layout()
    rows = -(-len(labels) // 3)
    fig.subplots_adjust(bottom=fig.subplotpars.bottom + 0.09 * rows)
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize="small", frameon=False)
    return left, right, bars


def draw_spectra(ax: Axes, spectra: Mapping[str, Any], *, channels: Mapping[str, Any]) -> None:
    """Frequency against channel position (log y): each spectrum's pairs plotted at the first
    channel of the pair in the head (``channels[label]``); a frequency of 0 (a pair that
    never rotates) cannot sit on a log axis: it is drawn as a cross on a line a decade below
    the smallest frequency, whose tick reads 0, with a break in the axis above it."""
    if not spectra or spectra.keys() != channels.keys():
        raise ValueError("spectra and channels must name the same, non-empty set of lines")
    lines = {}
    for label, values in spectra.items():
        theta = _vector(f"spectra[{label!r}]", values)
        where = _vector(f"channels[{label!r}]", channels[label])
        if theta.size != where.size:
            raise ValueError(f"spectra[{label!r}] and channels[{label!r}] must have the same "
                             f"length, got {theta.size} and {where.size}")
        if np.any(theta < 0) or not np.any(theta > 0):
            raise ValueError(f"spectra[{label!r}] must be >= 0 with at least one value > 0")
        lines[label] = (theta, where)
    floor = min(theta[theta > 0].min() for theta, _ in lines.values()) / 10
    for label, (theta, where) in lines.items():
        rotating = theta > 0
        zero = "" if rotating.all() else " (x: frequency 0)"
        line, = ax.plot(where[rotating], theta[rotating], marker="o", markersize=3,
                        label=label + zero)
        ax.plot(where[~rotating], np.full((~rotating).sum(), floor), linestyle="none",
                marker="x", markersize=4, color=line.get_color())
    ax.set_yscale("log")
    if any(not (theta > 0).all() for theta, _ in lines.values()):
        top = max(theta.max() for theta, _ in lines.values())
        decades = 10.0 ** np.arange(np.ceil(np.log10(floor * 10)), np.log10(top) + 1, 2)
        ax.set_yticks([floor, *decades], ["0", *(f"$10^{{{int(np.log10(v))}}}$"
                                                 for v in decades)])
        ax.minorticks_off()
        gap = floor * 10 ** 0.5                     # the axis break, between 0 and the rest
        ax.axhline(gap, color="0.6", linewidth=0.8, linestyle=(0, (2, 2)))
        ax.annotate("axis break", (1.0, gap), xycoords=("axes fraction", "data"),
                    xytext=(-4, 3), textcoords="offset points", ha="right", va="bottom",
                    fontsize="small", color="0.4")
    ax.set(xlabel="channel of the head", ylabel=r"$\theta$ (rad per position)")
    ax.legend(fontsize="small")


def draw_stretch_factors(ax: Axes, factors: Mapping[str, Any]) -> None:
    """theta_i / theta_i' against the pair index i (log y), one line per method."""
    if not factors:
        raise ValueError("factors must hold at least one method, got an empty mapping")
    for label, values in factors.items():
        ax.plot(np.arange(len(values)), _vector(f"factors[{label!r}]", values), label=label)
    ax.set_yscale("log")
    ax.set(xlabel="pair i (fast to slow)", ylabel=r"stretch $\theta_i / \theta_i'$")
    ax.legend(fontsize="small")


def draw_layer_patterns(ax: Axes, patterns: Mapping[str, Sequence[str]]) -> None:
    """One row per architecture, one cell per layer, coloured by the layer's kind (a key of
    ``LAYER_KINDS``); rows shorter than the longest are left blank at the end."""
    if not patterns:
        raise ValueError("patterns must hold at least one architecture, got an empty mapping")
    kinds = list(LAYER_KINDS)
    width = max(len(row) for row in patterns.values())
    grid = np.full((len(patterns), width), np.nan)
    for r, (label, row) in enumerate(patterns.items()):
        for c, kind in enumerate(row):
            if kind not in LAYER_KINDS:
                raise ValueError(f"patterns[{label!r}][{c}] must be one of {kinds}, got {kind!r}")
            grid[r, c] = kinds.index(kind)
    cmap = ListedColormap([LAYER_KINDS[k] for k in kinds]).with_extremes(bad="white")
    ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=-0.5, vmax=len(kinds) - 0.5,
              aspect="auto", interpolation="nearest")
    ax.set_yticks(range(len(patterns)), list(patterns))
    ax.set_xticks(range(0, width, 4))
    ax.set_xticks(np.arange(-0.5, width, 1), minor=True)
    ax.set_yticks(np.arange(-0.5, len(patterns), 1), minor=True)
    ax.grid(which="minor", color="white", linewidth=1)
    ax.tick_params(which="minor", length=0)
    ax.set_xlabel("layer")
    used = {kind for row in patterns.values() for kind in row}
    ax.legend(handles=[Patch(color=LAYER_KINDS[k], label=k) for k in kinds if k in used],
              loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3, fontsize="small",
              frameon=False)


def draw_accuracy_by_position_bars(ax: Axes, accuracy: Mapping[str, Any], *,
                                   chance: float | None = None) -> None:
    """Accuracy at each position (one line per model), with chance as a dotted line."""
    if not accuracy:
        raise ValueError("accuracy must hold at least one model, got an empty mapping")
    for label, values in accuracy.items():
        acc = _vector(f"accuracy[{label!r}]", values)
        ax.plot(np.arange(acc.size), acc, marker="o", markersize=3, label=label)
    if chance is not None:
        ax.axhline(chance, color="0.4", linestyle=":", label="chance")
    ax.set(xlabel="position m", ylabel="accuracy", ylim=(-0.03, 1.03))
    ax.legend(fontsize="small")


def _seed_matrix(label: str, values: Any, n_lengths: int) -> np.ndarray:
    runs = np.asarray(values, dtype=float)
    if runs.ndim != 2 or runs.shape[0] == 0 or runs.shape[1] != n_lengths:
        raise ValueError(f"accuracies[{label!r}] must be (seeds, lengths) with {n_lengths} "
                         f"lengths and at least one seed, got shape {runs.shape}")
    if np.any((runs < 0) | (runs > 1)):
        raise ValueError(f"accuracies[{label!r}] must lie in [0, 1], got {runs.tolist()}")
    return runs


def draw_seed_spread(ax: Axes, lengths: Sequence[int], accuracies: Mapping[str, Any], *,
                     train_length: int, chance: float | None = None) -> None:
    """Accuracy against length (log2 x): per model the mean over its seeds (line) and the
    range from the worst to the best seed (error bar). ``accuracies[label]`` is
    ``(seeds, lengths)``; the training length is a dashed vertical line, chance dotted."""
    n = checked_lengths(lengths, accuracies)
    for label, values in accuracies.items():
        runs = _seed_matrix(label, values, n.size)
        mean = runs.mean(0)
        ax.errorbar(n, mean, yerr=[mean - runs.min(0), runs.max(0) - mean], marker="o",
                    markersize=4, capsize=3, label=f"{label} ({runs.shape[0]} seeds)"
                    if runs.shape[0] > 1 else f"{label} (1 seed)")
    ax.axvline(train_length, color="0.5", linewidth=1, linestyle="--",
               label="training length")
    if chance is not None:
        ax.axhline(chance, color="0.5", linewidth=1, linestyle=":", label="chance")
    ax.set_xscale("log", base=2)
    ax.set_xticks(n, [f"{int(v)}" for v in n])
    ax.minorticks_off()
    ax.set(xlabel="sequence length", ylabel="accuracy", ylim=(-0.03, 1.03))
    ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2,
              frameon=False)                  # below the axes: the figure keeps its width


def seed_table_html(lengths: Sequence[int], accuracies: Mapping[str, Any], *,
                    train_length: int, caption: str | None = None) -> str:
    """An HTML table, one row per model, one column per length: the mean accuracy over the
    seeds in percent and, for several seeds, the range (worst to best seed) below it; an
    optional ``caption`` above it."""
    if not accuracies:
        raise ValueError("accuracies must hold at least one model, got an empty mapping")
    pad = ' style="padding: 0.25em 0.75em; text-align: right"'
    head = "".join(f"<th{pad}>{n} tokens ({n / train_length:g}x)</th>" for n in lengths)
    rows = []
    for label, values in accuracies.items():
        runs = 100 * _seed_matrix(label, values, len(lengths))
        cells = "".join(
            f"<td{pad}>{m:.1f}%" + (f"<br><small>{lo:.1f}&ndash;{hi:.1f}</small>"
                                   if runs.shape[0] > 1 else "") + "</td>"
            for m, lo, hi in zip(runs.mean(0), runs.min(0), runs.max(0), strict=True))
        rows.append(f'<tr><td style="padding: 0.25em 0.75em">{escape(label)} '
                    f"({runs.shape[0]} seed{'s' if runs.shape[0] > 1 else ''})</td>{cells}</tr>")
    top = "" if caption is None else f"<caption>{escape(caption)}</caption>"
    return (f'<table>{top}<thead><tr><th style="padding: 0.25em 0.75em">model</th>'
            f"{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")
