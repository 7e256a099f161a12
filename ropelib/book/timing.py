"""Timing helpers for scaling measurements: time a call, fit a power law in log-log space.

The book times attention at several sequence lengths N and reports how time grows with N as
the slope of a straight line through (log N, log time): about 2 for an O(N^2) algorithm and
about 1 for an O(N) one, once N is large enough that fixed per-call overheads stop mattering.
These helpers need only the standard library and NumPy; what is timed is up to the caller.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

__all__ = ["fit_loglog_slope", "fit_power_law", "time_call"]


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
