"""ropelib.viz.linear draws the rows and row sums it is given, and marks negative weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ropelib.viz.linear import draw_linear_weights


def agg_figure():
    fig = Figure()
    FigureCanvasAgg(fig)
    return fig


def weights():
    plain = np.full((4, 5), 0.2)
    rope = np.array([[0.3, -0.1, 0.2, 0.0, 0.1],
                     [0.5, 0.4, -0.2, 0.1, 0.0],
                     [0.1, 0.1, 0.1, 0.1, 0.1],
                     [-0.3, 0.2, 0.2, 0.2, 0.2]])
    return plain, rope


def test_draws_one_row_and_every_row_sum():
    plain, rope = weights()
    fig = agg_figure()
    left, right = draw_linear_weights(fig, plain, torch.tensor(rope), query=1)
    lines = left.get_lines()
    np.testing.assert_array_equal(lines[0].get_xdata(), np.arange(5))
    np.testing.assert_allclose(lines[0].get_ydata(), plain[1])
    np.testing.assert_allclose(lines[1].get_ydata(), rope[1])
    marked = [ln for ln in lines if ln.get_label() == "negative weights"][0]
    np.testing.assert_array_equal(marked.get_xdata(), [2])          # the one negative weight
    np.testing.assert_allclose(marked.get_ydata(), [-0.2])
    sums = right.get_lines()
    np.testing.assert_allclose(sums[0].get_ydata(), np.ones(4))
    np.testing.assert_allclose(sums[1].get_ydata(), [0.5, 0.8, 0.5, 0.5])
    np.testing.assert_allclose(sums[2].get_ydata(), [1.0, 1.0])     # the dotted line at 1
    assert [t.get_text() for t in left.get_legend().get_texts()] == [
        "without positions", "RoPE, eq. (19)", "negative weights"]
    assert "m = 1" in left.get_ylabel()
    fig.canvas.draw()


def test_custom_labels():
    plain, rope = weights()
    left, right = draw_linear_weights(agg_figure(), plain, rope, query=0, labels=("a", "b"))
    assert [t.get_text() for t in right.get_legend().get_texts()] == ["a", "b"]


@pytest.mark.parametrize("kwargs, error, match", [
    ({"rope": np.zeros((4, 4))}, ValueError, "same shape"),
    ({"plain": np.zeros(5)}, ValueError, "2-D"),
    ({"rope": np.full((4, 5), np.nan)}, ValueError, "finite"),
    ({"query": 4}, ValueError, r"\[0, 4\)"),
    ({"query": 1.0}, TypeError, "query must be an int"),
    ({"labels": ("one",)}, ValueError, "2 entries"),
])
def test_rejects_bad_inputs(kwargs, error, match):
    plain, rope = weights()
    args = {"plain": plain, "rope": rope, "query": 1} | kwargs
    with pytest.raises(error, match=match):
        draw_linear_weights(agg_figure(), **args)
