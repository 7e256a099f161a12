"""ropelib.viz.biases draws what it is given (read back from the matplotlib artists)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("matplotlib")
from matplotlib.figure import Figure  # noqa: E402

from ropelib.viz.biases import draw_bias_heatmaps, draw_score_terms_vs_shift  # noqa: E402


def test_heatmaps_show_each_matrix_with_title_and_colorbar():
    a = torch.arange(12.0).reshape(3, 4)
    b = np.eye(5)
    fig = Figure()
    axes = draw_bias_heatmaps(fig, [a, b], ["A", "B"], colorbar_labels=["bias", "bucket"])
    assert len(axes) == 2
    assert [ax.get_title() for ax in axes] == ["A", "B"]
    np.testing.assert_array_equal(axes[0].images[0].get_array(), a.numpy())
    np.testing.assert_array_equal(axes[1].images[0].get_array(), b)
    assert axes[0].get_ylabel() == "query position m" and axes[1].get_ylabel() == ""
    assert axes[1].get_xlabel() == "key position n"
    assert len(fig.axes) == 4  # two heatmaps, two colour bars
    assert sorted(ax.get_ylabel() for ax in fig.axes[2:]) == ["bias", "bucket"]
    fig.canvas.draw()  # renders without error


def test_heatmaps_errors():
    fig = Figure()
    with pytest.raises(ValueError, match="biases\\[1\\] must be a 2-D matrix"):
        draw_bias_heatmaps(fig, [np.ones((2, 2)), np.ones(3)], ["a", "b"])
    with pytest.raises(ValueError, match="titles"):
        draw_bias_heatmaps(fig, [np.ones((2, 2))], ["a", "b"])
    with pytest.raises(ValueError, match="colorbar_labels"):
        draw_bias_heatmaps(fig, [np.ones((2, 2))], ["a"], colorbar_labels=[])
    with pytest.raises(ValueError, match="at least one"):
        draw_bias_heatmaps(fig, [], [])


def test_score_terms_curves_in_order_with_distinct_styles():
    shifts = [0, 1, 2, 3]
    curves = {"flat": [1.0, 1.0, 1.0, 1.0], "wobbly": torch.tensor([0.0, 2.0, -1.0, 0.5]),
              "third": np.array([3.0, 2.0, 1.0, 0.0])}
    fig = Figure()
    ax = draw_score_terms_vs_shift(fig, shifts, curves, title="T")
    lines = [line for line in ax.get_lines() if line.get_label() in curves]
    assert [line.get_label() for line in lines] == list(curves)
    for line, values in zip(lines, curves.values(), strict=True):
        np.testing.assert_array_equal(line.get_xdata(), shifts)
        np.testing.assert_array_equal(line.get_ydata(), np.asarray(values))
    assert len({line.get_linestyle() for line in lines}) == 3
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(curves)
    assert ax.get_title() == "T"
    fig.canvas.draw()


def test_score_terms_errors():
    fig = Figure()
    with pytest.raises(ValueError, match="curves\\['b'\\] must have one value per shift"):
        draw_score_terms_vs_shift(fig, [0, 1], {"a": [1, 2], "b": [1, 2, 3]})
    with pytest.raises(ValueError, match="shifts"):
        draw_score_terms_vs_shift(fig, [], {"a": []})
    with pytest.raises(ValueError, match="curves"):
        draw_score_terms_vs_shift(fig, [0], {})
