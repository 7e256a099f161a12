"""ropelib.book.timing: the log-log fit recovers exact power laws; time_call times every call once."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ropelib.book import timing
from ropelib.book.timing import fit_loglog_slope, fit_power_law, time_call


@pytest.mark.parametrize("exponent", [-1.0, 0.0, 0.5, 1.0, 2.0, 3.0])
@pytest.mark.parametrize("coefficient", [1e-6, 1.0, 37.5])
def test_fit_recovers_an_exact_power_law(exponent, coefficient):
    x = np.array([256, 512, 1024, 2048, 4096], dtype=float)
    y = coefficient * x**exponent
    slope, c = fit_power_law(x, y)
    assert slope == pytest.approx(exponent, abs=1e-10)
    assert c == pytest.approx(coefficient, rel=1e-9)
    assert fit_loglog_slope(x, y) == pytest.approx(exponent, abs=1e-10)


def test_fit_is_least_squares_in_log_space():
    # Points on y = x^2 except one, multiplied by e: in log space one residual of 1, whose
    # least-squares effect on the slope is known in closed form.
    x = np.array([1.0, 2.0, 4.0, 8.0])
    y = x**2
    y[-1] *= math.e
    u = np.log(x)
    expected = 2.0 + (u[-1] - u.mean()) / ((u - u.mean()) ** 2).sum()
    assert fit_loglog_slope(x, y) == pytest.approx(expected, rel=1e-12)


def test_fit_accepts_lists_and_integers():
    assert fit_loglog_slope([1, 10, 100], [3, 30, 300]) == pytest.approx(1.0)


@pytest.mark.parametrize("x, y, error, match", [
    ([1.0, 2.0], [1.0, 2.0, 3.0], ValueError, "same length"),
    ([1.0], [1.0], ValueError, "at least 2"),
    ([2.0, 2.0, 2.0], [1.0, 2.0, 3.0], ValueError, "distinct"),
    ([1.0, 0.0], [1.0, 2.0], ValueError, "x must be finite and > 0"),
    ([1.0, 2.0], [1.0, -2.0], ValueError, "y must be finite and > 0"),
    ([1.0, 2.0], [1.0, float("nan")], ValueError, "y must be finite"),
    ([[1.0, 2.0]], [[1.0, 2.0]], ValueError, "1-D"),
])
def test_fit_rejects_bad_inputs(x, y, error, match):
    with pytest.raises(error, match=match):
        fit_power_law(x, y)


@pytest.mark.parametrize("repeats, warmup", [(1, 0), (3, 1), (5, 2)])
def test_time_call_calls_fn_warmup_plus_repeats_times(repeats, warmup):
    calls = []

    def fn():
        calls.append(1)
        return sum(range(1000))

    times = time_call(fn, repeats=repeats, warmup=warmup)
    assert len(calls) == warmup + repeats
    assert len(times) == repeats
    assert all(isinstance(t, float) and t > 0 for t in times)


def test_time_call_measures_each_call():
    # A call that sleeps 20 ms is timed at >= 20 ms (perf_counter is monotonic and includes
    # sleep); the warm-up call is not in the list.
    import time

    durations = iter([0.0, 0.02, 0.02])
    times = time_call(lambda: time.sleep(next(durations)), repeats=2, warmup=1)
    assert len(times) == 2
    assert all(t >= 0.02 for t in times)


def test_time_call_reads_the_given_clock_around_each_timed_call():
    # A fake clock that advances by 1, 2, 3, ... seconds per reading: the warm-up call reads
    # nothing, each timed call reads it twice and sees the increment of the second reading.
    readings = []

    def clock():
        readings.append(len(readings) + 1)
        return float(sum(readings))

    events = []
    times = time_call(lambda: events.append(len(readings)), repeats=3, warmup=2, clock=clock)
    assert events == [0, 0, 1, 3, 5]      # two warm-up calls before the first reading
    assert times == [2.0, 4.0, 6.0]
    assert len(readings) == 6


def test_time_call_with_process_time_counts_cpu_work():
    import time

    times = time_call(lambda: sum(i * i for i in range(20_000)), repeats=3, warmup=0,
                      clock=time.process_time)
    assert len(times) == 3 and all(isinstance(t, float) and t > 0 for t in times)


def test_time_call_defaults():
    calls = []
    times = time_call(lambda: calls.append(1))
    assert len(times) == 5 and len(calls) == 6


@pytest.mark.parametrize("kwargs, error, match", [
    ({"repeats": 0}, ValueError, "repeats must be >= 1"),
    ({"warmup": -1}, ValueError, "warmup must be >= 0"),
    ({"repeats": 2.0}, TypeError, "repeats must be an int"),
    ({"repeats": True}, TypeError, "repeats must be an int"),
])
def test_time_call_rejects_bad_counts(kwargs, error, match):
    with pytest.raises(error, match=match):
        time_call(lambda: None, **kwargs)


def test_time_call_rejects_a_non_callable():
    with pytest.raises(TypeError, match="fn must be callable"):
        time_call(42)
    with pytest.raises(TypeError, match="clock must be callable"):
        time_call(lambda: None, clock=1.0)


def test_cpu_medians_time_each_case_in_turn_on_this_threads_clock(monkeypatch):
    calls = []
    ticks = iter(range(1000))
    monkeypatch.setattr(timing.time, "thread_time", lambda: float(next(ticks)))
    medians = timing.cpu_medians({"a": lambda: calls.append("a"),
                                  "b": lambda: calls.append("b")}, rounds=3)
    # each round: an untimed call, then a timed one, of a, then of b
    assert calls == ["a", "a", "b", "b"] * 3
    assert medians == {"a": 1.0, "b": 1.0}      # two clock reads around each timed call
    with pytest.raises(ValueError, match="at least one function"):
        timing.cpu_medians({})
    with pytest.raises(TypeError, match=r"cases\['x'\] must be callable"):
        timing.cpu_medians({"x": 3})
    with pytest.raises(ValueError, match="rounds must be >= 1, got 0"):
        timing.cpu_medians({"a": lambda: None}, rounds=0)


def test_last_level_cache_bytes_reads_the_highest_level(tmp_path):
    for name, level, size in (("index0", 1, "32K"), ("index2", 2, "512K"), ("index3", 3, "16M")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "level").write_text(f"{level}\n")
        (tmp_path / name / "size").write_text(f"{size}\n")
    assert timing.last_level_cache_bytes(tmp_path) == 16 << 20
    (tmp_path / "index3" / "size").write_text("garbage\n")       # unreadable: skipped
    assert timing.last_level_cache_bytes(tmp_path) == 512 << 10
    assert timing.last_level_cache_bytes(tmp_path / "nowhere") is None
