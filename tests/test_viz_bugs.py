"""ropelib.viz.bugs draws exactly the errors it is given and marks where each passes the line."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ropelib.viz.bugs import draw_onsets, first_above


def agg_axes():
    fig = Figure()
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def test_first_above_is_the_first_position_past_the_threshold():
    x = [0, 1, 2, 3, 4]
    assert first_above(x, [0.0, 0.05, 0.2, 0.0, 0.5], 0.1) == 2.0
    assert first_above(x, [0.0] * 5, 0.1) is None
    assert first_above(x, [0.1] * 5, 0.1) is None  # strictly above


def test_onsets_are_drawn_at_the_data_and_zeros_at_the_floor():
    fig, ax = agg_axes()
    x = np.arange(6)
    late = [0.0, 0.0, 0.0, 0.3, 0.4, 0.5]
    never = [0.0, 1e-20, 1e-3, 1e-3, 0.0, 1e-4]
    onsets = draw_onsets(ax, {"late": (x, late), "never": (x, never)}, threshold=0.1,
                         floor=1e-12, xlabel="n", ylabel="score error")
    assert onsets == {"late": 3.0, "never": None}
    lines = ax.get_lines()
    # late's curve, its onset marker, never's curve, the threshold line
    assert len(lines) == 4
    np.testing.assert_array_equal(lines[0].get_xdata(), x)
    np.testing.assert_array_equal(lines[0].get_ydata(), np.maximum(late, 1e-12))
    assert list(lines[1].get_xdata()) == [3.0] and list(lines[1].get_ydata()) == [0.3]
    np.testing.assert_array_equal(lines[2].get_ydata(), np.maximum(never, 1e-12))
    assert list(lines[3].get_ydata()) == [0.1, 0.1]
    assert ax.get_yscale() == "log" and ax.get_xlabel() == "n"
    assert ax.get_ylabel().startswith("score error")
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["late", "never"]
    fig.canvas.draw()


def test_bad_data_is_refused_with_the_name_of_the_curve():
    _, ax = agg_axes()
    with pytest.raises(ValueError, match="at least one label"):
        draw_onsets(ax, {}, threshold=0.1)
    with pytest.raises(ValueError, match=r"curves\['a'\]: x and errors must be 1-D"):
        draw_onsets(ax, {"a": ([0, 1, 2], [0.0, 1.0])}, threshold=0.1)
    with pytest.raises(ValueError, match=r"curves\['b'\]: errors must be finite and >= 0"):
        draw_onsets(ax, {"b": ([0, 1], [0.0, -1.0])}, threshold=0.1)
    with pytest.raises(ValueError, match=r"curves\['c'\] must be an \(x, errors\) pair"):
        draw_onsets(ax, {"c": ([0, 1],)}, threshold=0.1)
    with pytest.raises(ValueError, match="threshold must be a finite number > 0"):
        draw_onsets(ax, {"a": ([0], [0.0])}, threshold=0.0)
    with pytest.raises(ValueError, match=r"floor must be in \(0, threshold=0.1\)"):
        draw_onsets(ax, {"a": ([0], [0.0])}, threshold=0.1, floor=0.5)
