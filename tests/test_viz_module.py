"""ropelib.viz.module draws exactly the data it is given, and refuses data that does not fit."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ropelib.viz.module import (
    draw_decode_cost,
    draw_layer_measurements,
    draw_masks,
    draw_short_table_scores,
    draw_weight_panels,
)


def agg_figure(**kwargs) -> Figure:
    fig = Figure(**kwargs)
    FigureCanvasAgg(fig)
    return fig


def test_weight_panels_draw_each_matrix_with_its_labels_and_one_colorbar():
    square = np.full((3, 3), 1 / 3)
    wide = torch.softmax(torch.randn(2, 5), -1)
    fig = agg_figure()
    axes = draw_weight_panels(fig, [("self", square, "abc", "abc"),
                                    ("cross", wide, ["q0", "q1"], list("vwxyz"))])
    assert [ax.get_title() for ax in axes] == ["self", "cross"]
    np.testing.assert_array_equal(axes[0].get_images()[0].get_array(), square)
    np.testing.assert_allclose(axes[1].get_images()[0].get_array(), wide.numpy())
    assert [t.get_text() for t in axes[1].get_xticklabels()] == list("vwxyz")
    assert [t.get_text() for t in axes[1].get_yticklabels()] == ["q0", "q1"]
    assert len(fig.axes) == 3  # two panels and the colour bar
    fig.canvas.draw()


def test_weight_panels_refuse_nothing_and_wrong_labels():
    with pytest.raises(ValueError, match="panels must hold at least one"):
        draw_weight_panels(agg_figure(), [])
    with pytest.raises(ValueError, match=r"need 2 query labels and 2 key labels, got 3 and 2"):
        draw_weight_panels(agg_figure(), [("x", np.eye(2), "abc", "ab")])


def test_masks_are_drawn_as_given():
    causal = torch.tril(torch.ones(4, 4, dtype=torch.bool))
    block = torch.tensor([[True, True, False], [True, True, True]])
    fig = agg_figure()
    axes = draw_masks(fig, {"causal": causal, "block": block})
    assert [ax.get_title() for ax in axes] == ["causal", "block"]
    np.testing.assert_array_equal(axes[0].get_images()[0].get_array(), causal.numpy())
    np.testing.assert_array_equal(axes[1].get_images()[0].get_array(), block.numpy())
    assert axes[0].get_ylabel() == "query" and axes[1].get_xlabel() == "key"
    fig.canvas.draw()


def test_masks_must_be_boolean_matrices():
    with pytest.raises(ValueError, match="masks must map at least one title"):
        draw_masks(agg_figure(), {})
    with pytest.raises(ValueError, match=r"masks\['float'\] must be boolean"):
        draw_masks(agg_figure(), {"float": np.array([[0.0, -np.inf]])})
    with pytest.raises(ValueError, match="must be a 2-D"):
        draw_masks(agg_figure(), {"3-d": np.ones((1, 2, 2), dtype=bool)})


def test_short_table_scores_plot_each_curve_and_shade_past_the_table():
    fig = agg_figure()
    ax = fig.add_subplot()
    full = np.sin(np.arange(10.0))
    repeated = np.r_[full[:4], np.full(6, 0.5)]
    draw_short_table_scores(ax, range(10), {"full": full, "repeated": repeated}, 4, 9)
    lines = ax.get_lines()
    assert [line.get_label() for line in lines] == ["full", "repeated"]
    np.testing.assert_array_equal(lines[0].get_ydata(), full)
    np.testing.assert_array_equal(lines[1].get_ydata(), repeated)
    np.testing.assert_array_equal(lines[0].get_xdata(), np.arange(10.0))
    (shade,) = ax.patches
    assert (shade.get_x(), shade.get_x() + shade.get_width()) == pytest.approx((3.5, 9.5))
    assert "m = 9" in ax.get_ylabel()
    fig.canvas.draw()


def test_short_table_scores_refuse_data_that_does_not_fit():
    ax = agg_figure().add_subplot()
    with pytest.raises(ValueError, match=r"every curve in scores must be 1-D with 5 values"):
        draw_short_table_scores(ax, range(5), {"a": np.zeros(4)}, 2, 4)
    with pytest.raises(ValueError, match=r"table_len=9 must fall inside the key positions 0..4"):
        draw_short_table_scores(ax, range(5), {"a": np.zeros(5)}, 9, 4)
    with pytest.raises(ValueError, match="scores must map at least one label"):
        draw_short_table_scores(ax, range(5), {}, 2, 4)


def test_layer_measurements_put_probes_left_and_shifts_right_on_a_log_axis():
    fig = agg_figure(figsize=(8, 3))
    probes = {"every": [0.1, 0.1, 0.2], "once": [0.9, 0.85, 0.8]}
    shifts = {"every": [0.0, 1e-16], "once": [0.1, 0.2]}
    left, right = draw_layer_measurements(fig, probes, shifts, floor=1e-17)
    np.testing.assert_array_equal(left.get_lines()[1].get_ydata(), probes["once"])
    np.testing.assert_array_equal(left.get_lines()[0].get_xdata(), [0, 1, 2])
    np.testing.assert_array_equal(right.get_lines()[0].get_ydata(), [1e-17, 1e-16])  # floored
    np.testing.assert_array_equal(right.get_lines()[1].get_xdata(), [1, 2])
    assert right.get_yscale() == "log"
    assert [t.get_text() for t in left.get_legend().get_texts()] == ["every", "once"]
    fig.canvas.draw()


def test_layer_measurements_refuse_ragged_or_negative_data():
    with pytest.raises(ValueError, match=r"every curve in probe_r2 must be 1-D"):
        draw_layer_measurements(agg_figure(), {"a": [0.1, 0.2], "b": [0.1]}, {"a": [0.0]})
    with pytest.raises(ValueError, match="cannot be negative"):
        draw_layer_measurements(agg_figure(), {"a": [0.1]}, {"a": [-1.0]})


def test_decode_cost_is_drawn_in_milliseconds_and_skips_unmeasured_points():
    ax = agg_figure().add_subplot()
    lengths = [256, 1024, 4096]
    seconds = {"recompute": [1e-3, 8e-3, math.nan], "cache": [2e-4, 2.5e-4, 4e-4]}
    draw_decode_cost(ax, lengths, seconds)
    recompute, cache = ax.get_lines()
    np.testing.assert_allclose(cache.get_ydata(), [0.2, 0.25, 0.4])
    np.testing.assert_array_equal(recompute.get_xdata(), lengths)
    assert np.isnan(recompute.get_ydata()[-1])
    assert ax.get_xscale() == ax.get_yscale() == "log"
    assert "ms" in ax.get_ylabel()


def test_decode_cost_refuses_bad_lengths_and_times():
    ax = agg_figure().add_subplot()
    with pytest.raises(ValueError, match="context_lengths must be at least 2 positive lengths"):
        draw_decode_cost(ax, [0, 10], {"a": [1.0, 1.0]})
    with pytest.raises(ValueError, match="seconds must be positive"):
        draw_decode_cost(ax, [1, 10], {"a": [1.0, 0.0]})
    with pytest.raises(ValueError, match=r"every curve in seconds must be 1-D with 2 values"):
        draw_decode_cost(ax, [1, 10], {"a": [1.0]})
