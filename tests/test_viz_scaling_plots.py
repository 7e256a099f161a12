"""ropelib.viz.scaling_plots draws the data it is given, with its fitted slopes, on log axes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ropelib.viz.scaling_plots import (
    draw_operation_counts,
    draw_singular_values,
    draw_time_scaling,
)

SIZES = [256, 512, 1024, 2048, 4096]


def agg_axes():
    fig = Figure()
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def power_law(c, p):
    return [c * n**p for n in SIZES]


def test_time_scaling_plots_data_fits_and_guides_on_log_axes():
    fig, ax = agg_axes()
    times = {"quadratic": power_law(1e-9, 2.0), "linear": power_law(1e-6, 1.0)}
    slopes = draw_time_scaling(ax, SIZES, times)
    assert slopes == pytest.approx({"quadratic": 2.0, "linear": 1.0})
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    lines = ax.get_lines()
    # per series: data and fit; then the two guides
    assert len(lines) == 2 * 2 + 2
    np.testing.assert_array_equal(lines[0].get_xdata(), SIZES)
    np.testing.assert_allclose(lines[0].get_ydata(), np.array(times["quadratic"]) * 1e3)
    np.testing.assert_allclose(lines[1].get_ydata(), lines[0].get_ydata(), rtol=1e-9)  # exact fit
    assert lines[1].get_linestyle() == "--"
    assert lines[0].get_color() == lines[1].get_color()
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["quadratic (slope 2.00)", "linear (slope 1.00)"]
    assert [t.get_text() for t in ax.texts] == ["slope 1", "slope 2"]
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(n) for n in SIZES]
    assert ax.get_ylabel() == "time (ms)"
    fig.canvas.draw()


def test_guides_fan_out_from_the_geometric_mean_of_the_first_times():
    _, ax = agg_axes()
    draw_time_scaling(ax, SIZES, {"a": power_law(1e-3, 1.0), "b": power_law(4e-3, 1.0)},
                      time_unit="s", guides=(2.0,))
    guide = ax.get_lines()[-1]
    first = np.sqrt(1e-3 * SIZES[0] * 4e-3 * SIZES[0])
    np.testing.assert_allclose(guide.get_ydata(), first * (np.array(SIZES) / SIZES[0]) ** 2)


def test_time_scaling_without_fit_accepts_tensors():
    _, ax = agg_axes()
    slopes = draw_time_scaling(ax, torch.tensor(SIZES), {"x": torch.tensor(power_law(1e-6, 1.5))},
                               fit=False, guides=(), time_unit="us", quantity="CPU time")
    assert slopes == {}
    assert len(ax.get_lines()) == 1
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["x"]
    assert ax.get_ylabel() == "CPU time (us)"


@pytest.mark.parametrize("sizes, times, kwargs, match", [
    (SIZES, {"a": [1.0, 2.0]}, {}, "one time per size"),
    (SIZES, {}, {}, "at least one series"),
    (SIZES, {"a": [1.0, 2.0, 0.0, 4.0, 5.0]}, {}, "must be > 0"),
    ([0, 1], {"a": [1.0, 2.0]}, {}, "sizes must be > 0"),
    (SIZES, {"a": power_law(1.0, 1.0)}, {"time_unit": "h"}, "time_unit"),
    ([[1, 2]], {"a": [1.0, 2.0]}, {}, "1-D"),
])
def test_time_scaling_rejects_bad_inputs(sizes, times, kwargs, match):
    _, ax = agg_axes()
    with pytest.raises(ValueError, match=match):
        draw_time_scaling(ax, sizes, times, **kwargs)


def test_singular_values_are_normalised_floored_and_marked():
    fig, ax = agg_axes()
    low_rank = torch.linalg.svdvals(torch.randn(16, 2, dtype=torch.float64)
                                    @ torch.randn(2, 16, dtype=torch.float64))
    full = [4.0, 2.0, 1.0, 0.5]
    lines = draw_singular_values(ax, {"rank 2": low_rank, "full": full}, mark=2, mark_label="d")
    assert len(lines) == 2
    assert ax.get_yscale() == "log"
    np.testing.assert_array_equal(lines[1].get_xdata(), [1, 2, 3, 4])
    np.testing.assert_allclose(lines[1].get_ydata(), [1.0, 0.5, 0.25, 0.125])
    assert lines[0].get_ydata()[0] == 1.0
    assert np.all(lines[0].get_ydata()[2:] < 1e-12)
    assert np.all(lines[0].get_ydata() >= 1e-20)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["rank 2", "full", "d"]
    fig.canvas.draw()


def test_singular_values_draw_exact_zeros_at_the_floor():
    _, ax = agg_axes()
    (line,) = draw_singular_values(ax, {"a": [2.0, 0.0]}, floor=1e-10)
    np.testing.assert_array_equal(line.get_ydata(), [1.0, 1e-10])


@pytest.mark.parametrize("spectra, kwargs, match", [
    ({}, {}, "at least one spectrum"),
    ({"a": [1.0, 2.0]}, {}, "decreasing"),
    ({"a": [0.0, 0.0]}, {}, "positive first value"),
    ({"a": [1.0]}, {"floor": 0.0}, "floor"),
])
def test_singular_values_reject_bad_inputs(spectra, kwargs, match):
    _, ax = agg_axes()
    with pytest.raises(ValueError, match=match):
        draw_singular_values(ax, spectra, **kwargs)


def test_operation_counts_draws_each_series_and_the_crossover():
    fig, ax = agg_axes()
    sizes = [16, 64, 256, 1024]
    counts = {"quadratic order": [4 * n * n * 64 for n in sizes],
              "linear order": [4 * n * 64 * 64 for n in sizes]}
    lines = draw_operation_counts(ax, sizes, counts, crossover=64, crossover_label="N = d")
    assert [line.get_label() for line in lines] == list(counts)
    for line, values in zip(lines, counts.values(), strict=True):
        np.testing.assert_array_equal(line.get_xdata(), sizes)
        np.testing.assert_array_equal(line.get_ydata(), values)
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    marks = [line for line in ax.get_lines() if line not in lines]
    assert len(marks) == 1 and list(marks[0].get_xdata()) == [64, 64]
    assert [t.get_text() for t in ax.texts] == ["N = d"]


@pytest.mark.parametrize("kwargs, match", [
    ({"sizes": [64, 16]}, "positive and increasing"),
    ({"counts": {"a": [1.0, 2.0]}}, "has 2 values but there are 3 sizes"),
    ({"counts": {"a": [1.0, 0.0, 2.0]}}, "must be > 0"),
    ({"counts": {}}, "at least one series"),
    ({"crossover": 1000}, "crossover must lie within the sizes"),
])
def test_operation_counts_rejects_bad_inputs(kwargs, match):
    _, ax = agg_axes()
    args = {"sizes": [16, 32, 64], "counts": {"a": [1.0, 2.0, 3.0]}} | kwargs
    with pytest.raises(ValueError, match=match):
        draw_operation_counts(ax, **args)
