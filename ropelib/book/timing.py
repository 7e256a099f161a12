"""Timing helpers: time a call, time candidates in turn on this thread's CPU clock, fit a power
law in log-log space.

The book times attention at several sequence lengths N and reports how time grows with N as
the slope of a straight line through (log N, log time): about 2 for an O(N^2) algorithm and
about 1 for an O(N) one, once N is large enough that fixed per-call overheads stop mattering.
``cpu_medians`` is how chapter 11 and its appendix time: every round times each candidate
once, in turn, on the CPU time of the calling thread, so that load on the machine hits all
candidates alike and the moments the operating system gives the core to other programs are
not counted. ``last_level_cache_bytes`` reads the size of the CPU's last-level cache, so that
a chapter can size a tensor to come from main memory.
These helpers need only the standard library and NumPy; what is timed is up to the caller.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

__all__ = ["cpu_medians", "fit_loglog_slope", "fit_power_law", "last_level_cache_bytes",
           "time_call"]


def _check_count(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def time_call(fn: Callable[[], object], repeats: int = 5, warmup: int = 1, *,
              clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Seconds taken by each of ``repeats`` calls of ``fn()``, after ``warmup`` untimed calls.

    Each call is timed on its own, so the caller can take the median (robust to the
    occasional call slowed down by other load on the machine).

    Args:
        fn: a function of no arguments (wrap arguments with a lambda or functools.partial).
        repeats: timed calls, >= 1.
        warmup: untimed calls first (allocator and caches warm up, lazy initialisation runs),
            >= 0.
        clock: a function returning seconds. The default ``time.perf_counter`` gives wall-clock
            time. ``time.process_time`` gives the CPU time of this process: for work on the
            CPU with one thread (``torch.set_num_threads(1)``) it is the time the computation
            used, without the moments the operating system ran other programs on the core,
            so it is far less noisy on a shared machine. It does not see time spent waiting
            for a GPU or for other processes.

    Returns:
        ``repeats`` durations in seconds (floats), in call order.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable with no arguments, got {type(fn).__name__}")
    _check_count("repeats", repeats, 1)
    _check_count("warmup", warmup, 0)
    if not callable(clock):
        raise TypeError(f"clock must be callable with no arguments, got {type(clock).__name__}")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = clock()
        fn()
        times.append(float(clock() - start))
    return times


def cpu_medians(cases: Mapping[str, Callable[[], object]], rounds: int = 15
                ) -> dict[str, float]:
    """Median CPU seconds of the calling thread per call of each case.

    Every round times each case once, in turn, right after an untimed call of the same case
    (so that the call finds the caches as a repeated call would); the median over the rounds
    is reported. The clock is ``time.thread_time``: on a busy machine the operating system
    takes the core away for milliseconds at a time, which a wall clock would count as if the
    code had run. It sees only the calling thread's work: time with one PyTorch thread.

    Args:
        cases: ``{name: fn}``, each ``fn`` a function of no arguments; at least one.
        rounds: rounds of timing, >= 1.

    Returns:
        ``{name: median seconds}``, in the order of ``cases``.
    """
    if not cases:
        raise ValueError("cases must hold at least one function to time, got none")
    for name, fn in cases.items():
        if not callable(fn):
            raise TypeError(f"cases[{name!r}] must be callable with no arguments, got "
                            f"{type(fn).__name__}")
    _check_count("rounds", rounds, 1)
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            times[name] += time_call(fn, repeats=1, warmup=1, clock=time.thread_time)
    return {name: statistics.median(t) for name, t in times.items()}


def last_level_cache_bytes(root: str | Path = "/sys/devices/system/cpu/cpu0/cache"
                           ) -> int | None:
    """Size in bytes of the CPU's last-level cache as Linux reports it (the ``index*/size`` of
    the highest ``level`` under ``root``), or None where it cannot be read."""
    sizes = {}
    for index in Path(root).glob("index*"):
        try:
            level = int((index / "level").read_text())
            size = (index / "size").read_text().strip()
            unit = {"K": 10, "M": 20, "G": 30}.get(size[-1:], 0)
            sizes[level] = int(size.rstrip("KMG")) << unit
        except (OSError, ValueError):
            continue
    return sizes[max(sizes)] if sizes else None


def _positive_vector(name: str, values: Sequence[float]) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {array.shape}")
    if not np.all(np.isfinite(array)) or not np.all(array > 0):
        raise ValueError(f"{name} must be finite and > 0 (a log-log fit takes logarithms), "
                         f"got {array.tolist()}")
    return array


def fit_power_law(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """Least-squares fit of ``y = c * x**p`` in log-log space; returns ``(p, c)``.

    The fit is the straight line log y = p log x + log c that minimises the squared error of
    log y, so one slow point pulls the line less than in a fit of y itself.

    Args:
        x, y: the same number (>= 2) of positive values; ``x`` must not be constant.
    """
    xs, ys = _positive_vector("x", x), _positive_vector("y", y)
    if xs.shape != ys.shape:
        raise ValueError(f"x and y must have the same length, got {xs.size} and {ys.size}")
    if xs.size < 2:
        raise ValueError(f"a line needs at least 2 points, got {xs.size}")
    if np.ptp(np.log(xs)) == 0.0:
        raise ValueError(f"x must take at least two distinct values, got {xs.tolist()}")
    slope, intercept = np.polyfit(np.log(xs), np.log(ys), 1)
    return float(slope), float(np.exp(intercept))


def fit_loglog_slope(x: Sequence[float], y: Sequence[float]) -> float:
    """The exponent p of the least-squares power law ``y = c * x**p`` (see ``fit_power_law``).

    For times against problem size it is the empirical order of growth: about 2 for
    quadratic work, about 1 for linear work.
    """
    return fit_power_law(x, y)[0]
