"""Figures of chapter 10: what context-extension methods do to RoPE's frequencies, and how
the toy models of the look-back experiment fare at lengths they were not trained on.

``extension_frequencies`` computes, with ``ropelib.scaling``, the per-pair frequencies of every
method for one scale factor s; ``draw_frequency_scaling`` draws them as wavelengths against the
trained context (left) and as the ratio theta_i' / theta_i (right), in the ``draw(fig, **params)``
form that ``live_slider`` and ``scrubber`` take. ``draw_accuracy_by_length``,
``draw_accuracy_by_position`` and ``draw_training_losses`` draw the experiment's results and
``accuracy_table_html`` tabulates them. ``draw_decoding_gap`` draws how far step-by-step
decoding with a KV cache strays from a full forward pass.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

import matplotlib as mpl
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ..scaling import scaled_frequencies

__all__ = ["METHOD_STYLES", "accuracy_table_html", "draw_accuracy_by_length",
           "draw_accuracy_by_position", "draw_accuracy_panels", "draw_decoding_gap",
           "draw_frequency_scaling",
           "draw_training_losses", "extension_frequencies"]

# label -> (color, linestyle); the order is the legend's
METHOD_STYLES = {
    "original": ("0.2", "-"),
    "PI (linear)": ("tab:blue", "-"),
    "NTK-aware": ("tab:orange", "-"),
    "dynamic NTK": ("tab:orange", ":"),
    "YaRN": ("tab:green", "-"),
    "Llama 3": ("tab:red", "--"),
}


def extension_frequencies(factor: float, *, dim: int = 128, base: float = 10000.0,
                          original_len: int = 4096, dynamic_factor: float = 2.0
                          ) -> dict[str, np.ndarray]:
    """Per-pair frequencies theta_i' of each method for the scale factor s = ``factor``.

    The target length is s * ``original_len``. Dynamic NTK is evaluated at that length with
    its own config factor ``dynamic_factor``; the other methods use s as their factor
    (YaRN with beta_fast = 32, beta_slow = 1; Llama 3 with low/high frequency factors 1 and 4).

    Returns:
        ``{label: (dim // 2,) float64 array}`` with the labels of ``METHOD_STYLES``.
    """
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor >= 1:
        raise ValueError(f"factor must be a number >= 1, got {factor!r}")
    s = float(factor)
    original = {"original_max_position_embeddings": original_len}
    configs = {
        "original": None,
        "PI (linear)": {"rope_type": "linear", "factor": s},
        "NTK-aware": {"rope_type": "ntk", "factor": s},
        "dynamic NTK": {"rope_type": "dynamic", "factor": float(dynamic_factor), **original},
        "YaRN": {"rope_type": "yarn", "factor": s, **original},
        "Llama 3": {"rope_type": "llama3", "factor": s, **original},
    }
    target_len = math.ceil(s * original_len)
    return {label: scaled_frequencies(dim, base, config, seq_len=target_len)[0].numpy()
            for label, config in configs.items()}


def draw_frequency_scaling(fig: Figure, factor: float, *, dim: int = 128,
                           base: float = 10000.0, original_len: int = 4096,
                           dynamic_factor: float = 2.0, max_factor: float = 32.0
                           ) -> dict[str, np.ndarray]:
    """Two panels for the scale factor s = ``factor``.

    Left: the wavelength 2 pi / theta_i' of every pair i (log scale), with the trained
    context L0 and the target s * L0 as horizontal lines; a pair whose wavelength lies above a
    line never completes a turn within that many positions. Right: theta_i' / theta_i, from 1
    (the pair is kept) down to 1/s (the pair is interpolated like PI).

    ``max_factor`` fixes the axes (the largest s a slider offers), so frames of a slider
    compare. Returns the frequencies drawn, as ``extension_frequencies``.
    """
    if not 1 <= factor <= max_factor:
        raise ValueError(f"factor must be in [1, max_factor={max_factor}], got {factor!r}")
    freqs = extension_frequencies(factor, dim=dim, base=base, original_len=original_len,
                                  dynamic_factor=dynamic_factor)
    left, right = fig.subplots(1, 2)
    pairs = np.arange(dim // 2)
    theta = freqs["original"]
    for label, inv_freq in freqs.items():
        color, style = METHOD_STYLES[label]
        left.plot(pairs, 2 * np.pi / inv_freq, style, color=color, label=label, linewidth=1.5)
        right.plot(pairs, inv_freq / theta, style, color=color, label=label, linewidth=1.5)
    left.axhline(original_len, color="0.5", linewidth=1)
    left.annotate(f"trained context L0 = {original_len}", (0, original_len),
                  textcoords="offset points", xytext=(2, 3), fontsize="small", color="0.35")
    target = factor * original_len
    left.axhline(target, color="0.5", linewidth=1, linestyle="--")
    left.annotate(f"target s L0 = {target:g}", (0, target), textcoords="offset points",
                  xytext=(2, 3), fontsize="small", color="0.35")
    left.set_yscale("log")
    left.set_ylim(1.0, 2 * np.pi / theta[-1] * max_factor * 4)
    left.set_xlabel("pair index i")
    left.set_ylabel(r"wavelength $2\pi / \theta_i'$ (positions)")
    left.set_title(f"s = {factor:g}", fontsize="medium")
    right.set_yscale("log")
    # dynamic NTK's effective factor at length s L0 reaches dynamic_factor * s
    right.set_ylim(1 / (max(1.0, dynamic_factor) * max_factor * 1.5), 1.5)
    right.set_xlabel("pair index i")
    right.set_ylabel(r"$\theta_i' / \theta_i$")
    right.axhline(1 / factor, color="0.5", linewidth=1, linestyle="--")
    for ax in (left, right):
        ax.set_xlim(0, dim // 2 - 1)
        ax.minorticks_off()
        ax.grid(True, alpha=0.3)
    # fixed margins, not tight_layout: every frame of a slider gets the same layout, fast
    # the legend in rows of three, so that it never runs past the figure's width
    fig.subplots_adjust(left=0.1, right=0.98, bottom=0.34, top=0.92, wspace=0.3)
    fig.legend(*left.get_legend_handles_labels(), loc="lower center",
               ncol=math.ceil(len(freqs) / 2), fontsize="small", frameon=False)
    return freqs


def checked_lengths(lengths: Sequence[int], accuracies: Mapping[str, Any]) -> np.ndarray:
    """``lengths`` as a float array, after checking that they are positive and that
    ``accuracies`` holds at least one model (for the accuracy-by-length figures)."""
    n = np.asarray(lengths, dtype=float)
    if n.ndim != 1 or n.size == 0 or np.any(n <= 0):
        raise ValueError(f"lengths must be a non-empty 1-D sequence of positive numbers, "
                         f"got {lengths!r}")
    if not accuracies:
        raise ValueError("accuracies must hold at least one model, got an empty mapping")
    return n


def draw_accuracy_by_length(ax: Axes, lengths: Sequence[int], accuracies: Mapping[str, Any], *,
                            train_length: int, chance: float | None = None,
                            colors: Mapping[str, str] | None = None,
                            legend: bool = True) -> list[Line2D]:
    """Accuracy against evaluation length (log2 x axis), one line per model.

    Args:
        ax: the Axes to draw on.
        lengths: evaluation lengths (positive).
        accuracies: ``{label: one accuracy in [0, 1] per length}``; ``NaN`` leaves a gap
            (a method not evaluated at that length).
        train_length: drawn as a vertical line.
        chance: the accuracy of guessing, drawn as a dotted line.
        colors: optional ``{label: color}``, so a model keeps its color across panels.
        legend: put the legend below the axes (``draw_accuracy_panels`` draws one for all).

    Returns:
        One line per model, in the order given.
    """
    n = checked_lengths(lengths, accuracies)
    lines = []
    for label, values in accuracies.items():
        acc = np.asarray(values, dtype=float)
        if acc.shape != n.shape:
            raise ValueError(f"accuracies[{label!r}] has {acc.size} values but there are "
                             f"{n.size} lengths; give one accuracy per length")
        finite = acc[np.isfinite(acc)]
        if np.any((finite < 0) | (finite > 1)):
            raise ValueError(f"accuracies[{label!r}] must lie in [0, 1], got {acc.tolist()}")
        color = (colors or {}).get(label)
        (line,) = ax.plot(n, acc, "o-", label=label, markersize=4, color=color)
        lines.append(line)
    ax.axvline(train_length, color="0.5", linewidth=1, linestyle="--")
    if chance is not None:
        ax.axhline(chance, color="0.5", linewidth=1, linestyle=":", label="chance")
    ax.set_xscale("log", base=2)
    ax.set_xticks(n, [f"{int(v)}" for v in n])
    ax.minorticks_off()
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("evaluation length N")
    ax.set_ylabel("look-back accuracy")
    ax.grid(True, alpha=0.3)
    if legend:
        ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2,
                  frameon=False)
    return lines


def draw_accuracy_panels(fig: Figure, lengths: Sequence[int],
                         panels: Sequence[tuple[str, Mapping[str, Any]]], *, train_length: int,
                         chance: float | None = None, ncol: int = 3) -> list[Axes]:
    """Side-by-side ``draw_accuracy_by_length`` panels sharing the y axis, a model in one
    colour in every panel, and one legend for all of them below the panels (each model
    once), so that the panels' legends cannot run into each other.

    Args:
        fig: the Figure to draw on.
        lengths: evaluation lengths (positive).
        panels: ``(title, accuracies)`` per panel, left to right.
        train_length, chance: as in ``draw_accuracy_by_length``.
        ncol: columns of the shared legend.

    Returns:
        The panels' Axes, left to right.
    """
    if not panels:
        raise ValueError("panels must hold at least one (title, accuracies) pair, got none")
    labels = list(dict.fromkeys(label for _, acc in panels for label in acc))
    cycle = mpl.rcParams["axes.prop_cycle"].by_key()["color"]
    colors = {label: cycle[i % len(cycle)] for i, label in enumerate(labels)}
    axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    handles: dict[str, Any] = {}
    for ax, (title, accuracies) in zip(axes, panels, strict=True):
        draw_accuracy_by_length(ax, lengths, accuracies, train_length=train_length,
                                chance=chance, colors=colors, legend=False)
        ax.set_title(title, fontsize="medium")
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    for ax in axes[1:]:
        ax.set_ylabel("")
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=ncol,
               fontsize="small", frameon=False)
    return list(axes)


def draw_accuracy_by_position(ax: Axes, correct: Mapping[str, Any], *, train_length: int,
                              bin_size: int, start: int = 0,
                              colors: Mapping[str, str] | None = None) -> dict[str, np.ndarray]:
    """Accuracy against the query's position m, in bins of ``bin_size`` positions.

    Args:
        ax: the Axes to draw on.
        correct: ``{label: (batch, seq) array}`` of 1 (right), 0 (wrong) or NaN (no target),
            all of one shape.
        train_length: drawn as a vertical line (positions beyond it see unseen distances).
        bin_size: positions per bin; the sequence length must be a multiple of it.
        start: positions before it are left out (e.g. those without a target).
        colors: optional ``{label: color}``.

    Returns:
        ``{label: accuracy per bin}``, the values drawn at the bins' centres.
    """
    if not correct:
        raise ValueError("correct must hold at least one model, got an empty mapping")
    arrays = {label: np.asarray(v, dtype=float) for label, v in correct.items()}
    shapes = {a.shape for a in arrays.values()}
    if len(shapes) != 1 or len(next(iter(shapes))) != 2:
        raise ValueError(f"correct must hold (batch, seq) arrays of one shape, got {shapes}")
    seq = next(iter(shapes))[1]
    if isinstance(bin_size, bool) or not isinstance(bin_size, int) or bin_size < 1 \
            or seq % bin_size:
        raise ValueError(f"bin_size must be a positive int dividing seq={seq}, got {bin_size!r}")
    edges = np.arange(0, seq + 1, bin_size)
    centres = (edges[:-1] + edges[1:] - 1) / 2
    drawn = {}
    for label, a in arrays.items():
        a = a.copy()
        a[:, :start] = np.nan
        per_bin = np.array([np.nanmean(a[:, lo:hi]) if np.isfinite(a[:, lo:hi]).any()
                            else np.nan for lo, hi in zip(edges[:-1], edges[1:], strict=True)])
        ax.plot(centres, per_bin, ".-", label=label, color=(colors or {}).get(label))
        drawn[label] = per_bin
    ax.axvline(train_length, color="0.5", linewidth=1, linestyle="--")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlim(0, seq)
    ax.set_xlabel("query position m")
    ax.set_ylabel("look-back accuracy")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small", loc="lower left")
    return drawn


def draw_training_losses(ax: Axes, losses: Mapping[str, Sequence[float]], *,
                         smooth: int = 10) -> list[Line2D]:
    """Training loss per step (log y), each curve a running mean over ``smooth`` steps."""
    if not losses:
        raise ValueError("losses must hold at least one curve, got an empty mapping")
    if isinstance(smooth, bool) or not isinstance(smooth, int) or smooth < 1:
        raise ValueError(f"smooth must be a positive int, got {smooth!r}")
    lines = []
    for label, values in losses.items():
        curve = np.asarray(values, dtype=float)
        if curve.ndim != 1 or curve.size < smooth or np.any(curve <= 0):
            raise ValueError(f"losses[{label!r}] must be at least smooth={smooth} positive "
                             f"values, got shape {curve.shape}")
        mean = np.convolve(curve, np.ones(smooth) / smooth, mode="valid")
        (line,) = ax.plot(np.arange(smooth, curve.size + 1), mean, label=label)
        lines.append(line)
    ax.set_yscale("log")
    ax.set_xlabel("training step")
    ax.set_ylabel("cross-entropy (running mean)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    return lines


def accuracy_table_html(lengths: Sequence[int], accuracies: Mapping[str, Any], *,
                        train_length: int) -> str:
    """An HTML table: one row per model, one column per length (as a multiple of
    ``train_length``), accuracies in percent with one decimal; ``NaN`` shows as a dash."""
    if not accuracies:
        raise ValueError("accuracies must hold at least one model, got an empty mapping")
    head = "".join(f"<th>N = {n} ({n / train_length:g}x)</th>" for n in lengths)
    rows = []
    for label, values in accuracies.items():
        acc = [float(v) for v in values]
        if len(acc) != len(lengths):
            raise ValueError(f"accuracies[{label!r}] has {len(acc)} values but there are "
                             f"{len(lengths)} lengths; give one accuracy per length")
        cells = "".join("<td>&ndash;</td>" if math.isnan(a) else f"<td>{100 * a:.1f}</td>"
                        for a in acc)
        rows.append(f"<tr><td>{escape(label)}</td>{cells}</tr>")
    return (f"<table><thead><tr><th>model (accuracy, %)</th>{head}</tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>")


def draw_decoding_gap(ax: Axes, gaps: Mapping[str, Sequence[float]], *, train_length: int,
                      floor: float = 1e-17) -> dict[str, np.ndarray]:
    """The gap between decoding step by step and a full forward pass, per step (log y).

    Args:
        ax: the Axes to draw on.
        gaps: ``{label: one non-negative gap per decoding step}`` (step t decodes position t),
            e.g. the largest absolute difference of the logits.
        train_length: the trained context, drawn as a vertical line.
        floor: gaps below it (an exact 0 among them) are drawn at ``floor``, the bottom of
            the log axis.

    Returns:
        ``{label: the values drawn}``.
    """
    if not gaps:
        raise ValueError("gaps must hold at least one curve, got an empty mapping")
    if not floor > 0:
        raise ValueError(f"floor must be > 0 (the bottom of a log axis), got {floor!r}")
    drawn = {}
    for label, values in gaps.items():
        gap = np.asarray(values, dtype=float)
        if gap.ndim != 1 or gap.size == 0 or not np.all(np.isfinite(gap)) or np.any(gap < 0):
            raise ValueError(f"gaps[{label!r}] must be a non-empty 1-D sequence of finite "
                             f"values >= 0, got {values!r}")
        drawn[label] = np.maximum(gap, floor)
        ax.plot(np.arange(gap.size), drawn[label], ".-", markersize=3, label=label)
    ax.axvline(train_length, color="0.5", linewidth=1, linestyle="--")
    ax.annotate(f"trained context L0 = {train_length}", (train_length, 1),
                xycoords=("data", "axes fraction"), textcoords="offset points",
                xytext=(4, -4), va="top", fontsize="small", color="0.35")
    ax.set_yscale("log")
    ax.set_xlabel("decoding step t (position of the new token)")
    ax.set_ylabel("largest |logit difference|")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small", loc="center right")
    return drawn
