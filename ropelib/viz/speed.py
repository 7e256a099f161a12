"""Chapter 11's speed figures and table, and the memory traffic behind them.

RoPE is memory-bound, so the chapter explains times by bytes: ``memory_traffic`` runs a
function under a PyTorch dispatch mode and adds up, for every ATen operator it executes, the
bytes the operator reads and writes (views move nothing). ``draw_roofline`` draws the roofline
model (attainable flop rate against arithmetic intensity), ``draw_speed_bars`` the measured
time of each formulation relative to a copy, and ``speed_table_html`` renders measured medians
as an HTML table (no pandas) with ratios to ``clone`` and to ``copy_`` and the bandwidth.
Times are measured elsewhere (``ropelib.book.bench.time_round_robin``); these functions only count,
draw and format.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.ticker import FuncFormatter, NullFormatter
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["Traffic", "draw_clock_quantiles", "draw_roofline", "draw_speed_bars",
           "memory_traffic", "speed_table_html", "traffic_in_copies"]

# Operators that create a tensor without reading any data (their tensor argument, if any,
# only gives a shape) and operators that overwrite their first argument without reading it.
_NO_READ = ("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided")
_OVERWRITE_SELF = ("copy_", "fill_", "zero_")


@dataclass
class Traffic:
    """Bytes read and written by the operators one call executed, in call order."""

    ops: list[tuple[str, int, int]] = field(default_factory=list)  # (operator, read, written)

    @property
    def read(self) -> int:
        return sum(r for _, r, _ in self.ops)

    @property
    def written(self) -> int:
        return sum(w for _, _, w in self.ops)

    @property
    def total(self) -> int:
        return self.read + self.written

    @property
    def names(self) -> list[str]:
        return [name for name, _, _ in self.ops]


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


# The backend a custom operator is opened at, by the device of its first tensor argument.
_BACKENDS = {"cpu": torch.DispatchKey.CPU, "cuda": torch.DispatchKey.CUDA}


class _TrafficMode(TorchDispatchMode):
    def __init__(self, traffic: Traffic) -> None:
        super().__init__()
        self.traffic = traffic

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        backend = _BACKENDS.get(tensors[0].device.type) if tensors else None
        if func.namespace != "aten" and backend is not None:
            # A custom operator (torch.library): run its implementation for the backend
            # with this mode pushed again, so the ATen operators inside it are counted.
            with self:
                return func.redispatch(torch.DispatchKeySet(backend), *args, **kwargs)
        result = func(*args, **kwargs)
        if func.is_view:
            return result
        schema = func._schema
        base = schema.name.split("::")[-1]
        if base in _NO_READ:
            return result
        inputs = [t for t in tree_flatten((args, {k: v for k, v in kwargs.items() if k != "out"}))[0]
                  if isinstance(t, torch.Tensor)]
        outputs = [t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)]
        if not schema.is_mutable and any(o is t for o in outputs for t in inputs):
            return result  # handed an input back (``to`` a dtype it has): nothing moved
        if base in _OVERWRITE_SELF:
            inputs = inputs[1:]
        name = schema.name + (f".{schema.overload_name}" if schema.overload_name else "")
        self.traffic.ops.append((name, sum(map(_nbytes, inputs)), sum(map(_nbytes, outputs))))
        return result


def memory_traffic(fn: Callable[[], object]) -> Traffic:
    """Run ``fn()`` once and count the bytes each ATen operator reads and writes.

    The model is the one of an eager program that keeps nothing in cache between operators:
    an operator reads every tensor argument once (all its elements, ``numel * element_size``
    bytes; a table broadcast against x counts once) and writes every result once. Views
    (slicing, ``view_as_complex``, reshapes that do not copy) move nothing; an operator that
    writes into a given tensor (``mul_``, ``addcmul_``, ``mul(..., out=...)``) reads its
    inputs, including the tensor it updates, and writes that tensor; ``copy_`` reads only its
    source; ``empty_like`` and its kin move nothing, and so does an operator that hands an
    input back unchanged (``to`` a dtype the tensor already has). A custom operator
    (registered with ``torch.library``, on the CPU or a GPU) is opened: its implementation
    runs under the mode, which counts the ATen operators it executes; what it does outside
    PyTorch, such as a compiled loop called through ctypes, is not seen. Strided views are
    counted by their elements, although the memory system moves whole cache lines.

    Returns:
        A ``Traffic`` with one ``(operator, bytes read, bytes written)`` entry per operator.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable with no arguments, got {type(fn).__name__}")
    traffic = Traffic()
    with _TrafficMode(traffic):
        fn()
    return traffic


def traffic_in_copies(cases: Mapping[str, Callable[[], object]], copy_bytes: int, *,
                      modelled: Mapping[str, int] | None = None) -> dict[str, float]:
    """Each case's memory traffic in units of a copy's: ``memory_traffic(fn).total /
    copy_bytes``, or, for the names in ``modelled``, the bytes given there (a model, for code
    the dispatch mode cannot see) over ``copy_bytes``. Every case runs once."""
    if not (isinstance(copy_bytes, int) and copy_bytes > 0):
        raise ValueError(f"copy_bytes must be a positive int, got {copy_bytes!r}")
    modelled = dict(modelled or {})
    unknown = set(modelled) - set(cases)
    if unknown:
        raise ValueError(f"modelled names cases that do not exist: {sorted(unknown)}")
    return {name: (modelled[name] if name in modelled else memory_traffic(fn).total) / copy_bytes
            for name, fn in cases.items()}


def _check_medians(name: str, medians: Mapping[str, float], *required: str) -> None:
    if not medians:
        raise ValueError(f"{name} must hold at least one time, got an empty mapping")
    for key in required:
        if key not in medians:
            raise ValueError(f"{name} has no entry {key!r} (the baseline the ratios divide by); "
                             f"entries: {sorted(medians)}")
    for key, value in medians.items():
        if not (isinstance(value, (int, float)) and np.isfinite(value) and value > 0):
            raise ValueError(f"{name}[{key!r}] must be a positive number of seconds, got {value!r}")


def _colour(label: str, baselines: Sequence[str], highlight: str) -> str:
    if label in baselines:
        return "0.65"
    return "C0" if label.startswith(highlight) else "C1"


def draw_speed_bars(ax: Axes, medians: Mapping[str, float], *, baseline: str = "copy_",
                    baselines: Sequence[str] = ("clone", "copy_"), highlight: str = "ropelib",
                    title: str | None = None, xmax: float | None = None,
                    annotate: bool = True, value_format: str = ".1f") -> dict[str, float]:
    """Horizontal bars of each formulation's time divided by the baseline's, on a log axis.

    Bars are drawn top to bottom in the order given; the baselines are grey, names starting
    with ``highlight`` blue and the rest (the peers) orange. A dotted line marks ratio 1, and
    each bar is labelled with its ratio when ``annotate``.

    Args:
        ax: the Axes to draw on.
        medians: ``{formulation: seconds}`` measured in one run; must contain ``baseline``.
        baseline: the entry every time is divided by.
        baselines: entries drawn in grey.
        highlight: prefix of the entries drawn in blue.
        title: the Axes title.
        xmax: right end of the x axis (e.g. the same for every panel); default from the data.
        annotate: write each ratio at the end of its bar.
        value_format: the format spec of those labels (``".1%"`` for shares of a whole).

    Returns:
        ``{formulation: time / baseline time}``, in the order given.
    """
    _check_medians("medians", medians, baseline)
    ratios = {label: medians[label] / medians[baseline] for label in medians}
    labels = list(ratios)
    y = np.arange(len(labels))
    ax.barh(y, list(ratios.values()), color=[_colour(lb, baselines, highlight) for lb in labels],
            height=0.7)
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.axvline(1.0, color="0.3", linestyle=":", linewidth=1)
    ax.set_yticks(y, labels)
    ax.invert_yaxis()
    low = min(0.5, 0.8 * min(ratios.values()))
    # past the longest bar, room for its label: a quarter of the axis on the log scale,
    # whatever the values span (a label beyond the axes would widen the saved figure)
    largest = max(ratios.values())
    span = math.log10(largest / low)
    high = xmax if xmax is not None else largest * 10 ** max(math.log10(2.5), span / 3)
    ax.set_xlim(low, high)
    if annotate:
        for yi, value in zip(y, ratios.values(), strict=True):
            ax.annotate(format(value, value_format), (value, yi), xytext=(3, 0),
                        textcoords="offset points", va="center", fontsize="small")
    ax.set_xlabel(f"time / time of {baseline}")
    ax.grid(True, axis="x", which="both", alpha=0.25)
    if title is not None:
        ax.set_title(title, fontsize="medium")
    return ratios


def draw_clock_quantiles(ax: Axes, samples: Mapping[str, tuple[Sequence[float], Sequence[float]]]
                         ) -> dict[str, tuple[float, float]]:
    """The times of repeated calls read by two clocks, sorted: for each candidate, its
    wall-clock times (dashed) and the CPU times of its thread (solid), in one colour, in
    microseconds on a log axis against the fraction of calls at or below each time.

    Args:
        ax: the Axes to draw on.
        samples: ``{name: (wall seconds, CPU seconds)}``, one value per call in each, of one
            length, all > 0.

    Returns:
        ``{name: (median wall seconds, median CPU seconds)}``.
    """
    if not samples:
        raise ValueError("samples must hold at least one candidate, got none")
    medians = {}
    for i, (name, pair) in enumerate(samples.items()):
        if len(pair) != 2:
            raise ValueError(f"samples[{name!r}] must be a (wall, cpu) pair, got {len(pair)} items")
        wall, cpu = (np.sort(np.asarray(v, dtype=float)) for v in pair)
        if wall.ndim != 1 or wall.shape != cpu.shape or wall.size == 0:
            raise ValueError(f"samples[{name!r}]: wall and cpu must be 1-D of one non-zero length, "
                             f"got shapes {wall.shape} and {cpu.shape}")
        if not (np.all(np.isfinite(wall)) and np.all(np.isfinite(cpu))
                and wall.min() > 0 and cpu.min() > 0):
            raise ValueError(f"samples[{name!r}]: times must be finite and > 0")
        share = (np.arange(wall.size) + 1) / wall.size
        colour = _POINT_COLOURS[i % len(_POINT_COLOURS)]
        ax.plot(share, cpu * 1e6, color=colour, label=f"{name}, CPU time of the thread")
        ax.plot(share, wall * 1e6, color=colour, linestyle="--", label=f"{name}, wall clock")
        medians[name] = (float(np.median(wall)), float(np.median(cpu)))
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("fraction of calls at or below")
    ax.set_ylabel("time of a call (µs)")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize="small", loc="upper left")
    return medians


_POINT_MARKERS = ("o", "s", "^", "D", "v", "P", "X")
_POINT_SIZE = 11.0
_POINT_COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown",
                  "tab:pink")


def draw_roofline(ax: Axes, peak_flops: float, bandwidth: float,
                  points: Mapping[str, tuple[float, float]], *,
                  intensity_range: tuple[float, float] = (1 / 16, 256.0),
                  label: str = "roofline", more_roofs: Mapping[str, float] | None = None) -> float:
    """The roofline model: attainable flop rate min(peak, intensity * bandwidth), log-log.

    Args:
        ax: the Axes to draw on.
        peak_flops: the compute roof, in flop/s (e.g. measured with a matrix product).
        bandwidth: the memory roof's slope, in bytes/s (e.g. measured with a copy).
        points: ``{label: (arithmetic intensity in flop/byte, achieved flop/s)}``, drawn as
            hollow markers, each in its own shape and colour; a point that lands on one
            drawn before it is drawn smaller, inside it.
        intensity_range: the x range, in flop/byte.
        label: the roofline's name in the legend.
        more_roofs: further memory roofs under the same compute roof, ``{name: bytes/s}``
            (e.g. a cache's bandwidth), drawn dashed; the balance marked stays that of
            ``bandwidth``.

    Returns:
        The machine balance ``peak_flops / bandwidth`` (flop/byte), the intensity where the
        two roofs meet; it is marked with a dotted line.
    """
    if not (peak_flops > 0 and bandwidth > 0):
        raise ValueError(f"peak_flops and bandwidth must be > 0, got {peak_flops}, {bandwidth}")
    lo, hi = intensity_range
    if not 0 < lo < hi:
        raise ValueError(f"intensity_range must be (low, high) with 0 < low < high, got {intensity_range}")
    balance = peak_flops / bandwidth
    intensity = np.geomspace(lo, hi, 200)
    more_roofs = dict(more_roofs or {})
    for name, other in more_roofs.items():
        if not other > 0:
            raise ValueError(f"more_roofs[{name!r}] must be a bandwidth > 0, got {other}")
    ax.plot(intensity, np.minimum(peak_flops, intensity * bandwidth) / 1e9, color="0.2",
            label=f"{label}: {bandwidth / 1e9:.0f} GB/s, {peak_flops / 1e9:.0f} GFLOP/s")
    ax.axvline(balance, color="0.5", linestyle=":", linewidth=1)
    for name, other in more_roofs.items():
        ax.plot(intensity, np.minimum(peak_flops, intensity * other) / 1e9, color="0.45",
                linestyle="--", linewidth=1, label=f"{name}: {other / 1e9:.0f} GB/s")
    ax.annotate(f"machine balance\n{balance:.1f} flop/byte", (balance, peak_flops / 1e9),
                xytext=(4, -28), textcoords="offset points", fontsize="small", color="0.35")
    drawn: list[tuple[float, float, float]] = []   # (log2 x, log10 y, marker size)
    for i, (label, (x, flops)) in enumerate(points.items()):
        if not (x > 0 and flops > 0):
            raise ValueError(f"points[{label!r}] must be (intensity > 0, flop/s > 0), got {(x, flops)}")
        # hollow markers of distinct shapes and colours; a point that lands on one drawn
        # before (within a fifth of an octave and of a decade) is drawn smaller, inside it,
        # so that both stay visible (down to a readable size)
        here = (np.log2(x), np.log10(flops))
        near = [size for lx, ly, size in drawn
                if abs(lx - here[0]) < 0.2 and abs(ly - here[1]) < 0.2]
        size = max(0.6 * min(near), 5.0) if near else _POINT_SIZE
        drawn.append((*here, size))
        ax.plot([x], [flops / 1e9], _POINT_MARKERS[i % len(_POINT_MARKERS)], markersize=size,
                markerfacecolor="none", markeredgewidth=1.8,
                color=_POINT_COLOURS[i % len(_POINT_COLOURS)], label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (flop / byte)")
    ax.set_ylabel("GFLOP/s")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize="small", loc="lower right")
    return balance


# Spacing and right-aligned numbers, scoped to these tables (the page's theme styles tables
# in its own content, not in cell outputs).
_TABLE_STYLE = ("<style>.ropelib-speed th, .ropelib-speed td {padding: 0.1em 0.5em; "
                "white-space: nowrap} .ropelib-speed td:not(:first-child) {text-align: right}"
                "</style>")


def _fmt(value: float | None, spec: str) -> str:
    return "" if value is None else format(value, spec)


def speed_table_html(sections: Mapping[str, Mapping[str, float]], nbytes: Mapping[str, int], *,
                     traffic: Mapping[str, Mapping[str, float]] | None = None,
                     modelled: Collection[str] = (), clone: str = "clone",
                     copy: str = "copy_") -> str:
    """An HTML table of measured medians: one header row per section, one row per entry.

    The table (class ``ropelib-speed``) comes after a small ``<style>`` block scoped to that
    class, which spaces the columns and right-aligns the numbers.

    Columns: the formulation, its memory traffic in units of a copy's (when ``traffic`` has
    the section), the median in microseconds, the ratio to ``clone`` and to ``copy`` (blank
    when the section has no such entry), and the effective bandwidth ``nbytes / median``
    (the bytes a copy moves, divided by the time: what the formulation achieves as if it
    moved only those). A column blank in every row (no ``traffic`` at all, no ``copy``
    entry in any section) is left out.

    Args:
        sections: ``{title: {formulation: median seconds}}``; every section needs ``clone``.
        nbytes: ``{title: bytes a copy of that section's x moves}``.
        traffic: optional ``{title: {formulation: traffic / a copy's traffic}}``.
        modelled: formulations whose traffic is a model, not a count (e.g. a compiled
            loop a dispatch mode cannot see); their traffic is marked with ``*``.
        clone, copy: the names of the two baselines.
    """
    if not sections:
        raise ValueError("sections must hold at least one section, got an empty mapping")
    traffic = traffic or {}
    head = ["formulation", "traffic / copy", "median (µs)", "/ clone", "/ copy_", "GB/s"]
    body: list[tuple[str, list[str] | None, bool]] = []     # (title or name, cells, bold)
    for title, medians in sections.items():
        _check_medians(f"sections[{title!r}]", medians, clone)
        if title not in nbytes or nbytes[title] <= 0:
            raise ValueError(f"nbytes must give a positive byte count for section {title!r}")
        body.append((title, None, False))
        copy_time = medians.get(copy)
        for name, seconds in medians.items():
            body.append((name, [
                html.escape(name),
                _fmt(traffic.get(title, {}).get(name), ".2f")
                + ("*" if name in modelled and name in traffic.get(title, {}) else ""),
                f"{seconds * 1e6:,.0f}",
                f"{seconds / medians[clone]:.2f}",
                _fmt(seconds / copy_time if copy_time else None, ".2f"),
                f"{nbytes[title] / seconds / 1e9:.1f}",
            ], name.startswith("ropelib")))
    # A column that is blank in every row (no traffic given, no copy_ anywhere) is left out.
    keep = [i for i in range(len(head))
            if i == 0 or any(cells is not None and cells[i] for _, cells, _ in body)]
    rows = ["<thead><tr>" + "".join(f"<th>{html.escape(head[i])}</th>" for i in keep)
            + "</tr></thead>", "<tbody>"]
    for label, cells, bold in body:
        if cells is None:
            rows.append(f'<tr><th colspan="{len(keep)}" style="text-align:left">'
                        f"{html.escape(label)}</th></tr>")
            continue
        style = ' style="font-weight:bold"' if bold else ""
        rows.append(f"<tr{style}><td>" + "</td><td>".join(cells[i] for i in keep) + "</td></tr>")
    rows.append("</tbody>")
    return (_TABLE_STYLE + '<table class="ropelib-speed" style="font-variant-numeric: tabular-nums">'
            + "".join(rows) + "</table>")
