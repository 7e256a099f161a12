"""How attention's cost grows: measured times against N, and singular values against index.

``draw_time_scaling`` plots times measured at several sequence lengths on log-log axes, with
the fitted power law of each series (its slope is the empirical order of growth) and faint
reference lines of slope 1 and 2. ``draw_operation_counts`` plots counted (not measured)
operations against N the same way, with the length where two orders of work cross.
``draw_singular_values`` plots the normalised singular values of a few matrices on a log
scale, which shows their rank: a cliff after index r means rank r. Inputs may be sequences,
NumPy arrays or torch tensors (detached and copied here).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.lines import Line2D

from ..book.timing import fit_power_law

__all__ = ["draw_operation_counts", "draw_singular_values", "draw_time_scaling"]

_UNITS = {"s": 1.0, "ms": 1e3, "us": 1e6}


def _as_vector(name: str, values: Any) -> np.ndarray:
    if hasattr(values, "detach"):
        values = values.detach().cpu().numpy()
    vector = np.asarray(values, dtype=float)
    if vector.ndim != 1 or vector.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence, got shape {vector.shape}")
    return vector


def _series_per_size(name: str, label: str, values: Any, n: np.ndarray, one: str
                     ) -> np.ndarray:
    """``name[label]`` as a vector of one positive value (a ``one``) per size of ``n``."""
    v = _as_vector(f"{name}[{label!r}]", values)
    if v.shape != n.shape:
        raise ValueError(f"{name}[{label!r}] has {v.size} values but there are {n.size} "
                         f"sizes; give one {one} per size")
    if np.any(v <= 0):
        raise ValueError(f"{name}[{label!r}] must be > 0 (log axes), got {v.tolist()}")
    return v


def draw_time_scaling(ax: Axes, sizes: Sequence[float], times: Mapping[str, Any], *,
                      time_unit: str = "ms", fit: bool = True,
                      guides: Sequence[float] = (1.0, 2.0),
                      quantity: str = "time") -> dict[str, float]:
    """Draw measured times against problem size on log-log axes.

    Args:
        ax: the Axes to draw on.
        sizes: the sizes N (positive, at least two distinct values when ``fit``).
        times: ``{label: seconds}``, one time per size for each series (e.g. medians).
        time_unit: ``"s"``, ``"ms"`` or ``"us"`` for the y axis.
        fit: draw each series' least-squares power law as a dashed line and put its slope in
            the legend.
        guides: slopes of the faint reference lines, all drawn through one point (the
            geometric mean of the times at the smallest size), labelled at the right end.
        quantity: what was measured, for the y label (e.g. ``"CPU time"``).

    Returns:
        ``{label: fitted slope}`` (empty when ``fit`` is false).
    """
    if time_unit not in _UNITS:
        raise ValueError(f"time_unit must be one of {sorted(_UNITS)}, got {time_unit!r}")
    n = _as_vector("sizes", sizes)
    if np.any(n <= 0):
        raise ValueError(f"sizes must be > 0 (log axes), got {n.tolist()}")
    if not times:
        raise ValueError("times must hold at least one series, got an empty mapping")
    scale = _UNITS[time_unit]
    series = {}
    for label, values in times.items():
        series[label] = _series_per_size("times", label, values, n, "time") * scale
    slopes = {}
    for label, t in series.items():
        if fit:
            slope, c = fit_power_law(n, t)
            slopes[label] = slope
            (line,) = ax.plot(n, t, "o-", label=f"{label} (slope {slope:.2f})")
            ax.plot(n, c * n**slope, "--", color=line.get_color(), alpha=0.6, linewidth=1)
        else:
            ax.plot(n, t, "o-", label=label)
    anchor = float(np.exp(np.mean([np.log(t[0]) for t in series.values()])))
    for p in guides:
        guide = anchor * (n / n[0]) ** p
        ax.plot(n, guide, ":", color="0.6", linewidth=1, zorder=0)
        ax.annotate(f"slope {p:g}", (n[-1], guide[-1]), textcoords="offset points",
                    xytext=(4, 0), va="center", fontsize="small", color="0.45")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(n, [f"{int(v)}" if float(v).is_integer() else f"{v:g}" for v in n])
    ax.minorticks_off()
    ax.set_xlabel("sequence length N")
    ax.set_ylabel(f"{quantity} ({time_unit})")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper left", fontsize="small")
    return slopes


def draw_operation_counts(ax: Axes, sizes: Sequence[float], counts: Mapping[str, Any], *,
                          crossover: float | None = None, crossover_label: str | None = None,
                          quantity: str = "floating-point operations") -> list[Line2D]:
    """Draw operation counts against the sequence length on log-log axes.

    Args:
        ax: the Axes to draw on.
        sizes: the sequence lengths N (positive, increasing).
        counts: ``{label: counts}``, one count per size for each series.
        crossover: a length to mark with a dotted vertical line (where two series cross).
        crossover_label: the text written at that line.
        quantity: what was counted, for the y label.

    Returns:
        The series' lines, in the order of ``counts``.
    """
    n = _as_vector("sizes", sizes)
    if np.any(n <= 0) or np.any(np.diff(n) <= 0):
        raise ValueError(f"sizes must be positive and increasing (log axes), got {n.tolist()}")
    if not counts:
        raise ValueError("counts must hold at least one series, got an empty mapping")
    lines = []
    for label, values in counts.items():
        c = _series_per_size("counts", label, values, n, "count")
        (line,) = ax.plot(n, c, "-", linewidth=2, label=label)
        lines.append(line)
    if crossover is not None:
        if not n[0] <= crossover <= n[-1]:
            raise ValueError(f"crossover must lie within the sizes [{n[0]:g}, {n[-1]:g}], "
                             f"got {crossover!r}")
        ax.axvline(crossover, color="0.45", linestyle=":", linewidth=1)
        if crossover_label:
            ax.annotate(crossover_label, (crossover, 0.04), xycoords=("data", "axes fraction"),
                        textcoords="offset points", xytext=(5, 0), fontsize="small",
                        color="0.3")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length N")
    ax.set_ylabel(quantity)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper left", fontsize="small")
    return lines


def draw_singular_values(ax: Axes, spectra: Mapping[str, Any], *, mark: float | None = None,
                         mark_label: str | None = None, floor: float = 1e-20) -> list[Line2D]:
    """Draw each spectrum's singular values divided by its largest, on a log y axis.

    Args:
        ax: the Axes to draw on.
        spectra: ``{label: singular values}`` in decreasing order (e.g. from
            ``torch.linalg.svdvals``), each with a positive largest value.
        mark: an index to mark with a vertical line (e.g. the head dimension d, the largest
            rank a product of an (N, d) and a (d, N) matrix can have).
        mark_label: the legend entry of that line.
        floor: relative values below it (exact zeros included) are drawn at ``floor``.

    Returns:
        One line per spectrum, in the order given.
    """
    if not spectra:
        raise ValueError("spectra must hold at least one spectrum, got an empty mapping")
    if not floor > 0:
        raise ValueError(f"floor must be > 0 (log axis), got {floor}")
    lines = []
    for label, values in spectra.items():
        s = _as_vector(f"spectra[{label!r}]", values)
        if not s[0] > 0 or np.any(s < 0) or np.any(np.diff(s) > 1e-12 * s[0]):
            raise ValueError(f"spectra[{label!r}] must be non-negative singular values in "
                             f"decreasing order with a positive first value, got {s[:5].tolist()}...")
        index = np.arange(1, s.size + 1)
        (line,) = ax.plot(index, np.maximum(s / s[0], floor), ".-", markersize=3, label=label)
        lines.append(line)
    if mark is not None:
        ax.axvline(mark, color="0.4", linestyle=":", label=mark_label)
    ax.set_yscale("log")
    ax.set_xlabel("index i of the singular value")
    ax.set_ylabel(r"$\sigma_i / \sigma_1$")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    return lines
