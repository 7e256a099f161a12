"""ropelib.viz.bugs draws exactly the errors it is given and marks where each passes the line."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ropelib.viz.bugs import draw_cells, draw_onsets, first_above


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


def test_onsets_at_one_place_get_markers_of_different_shapes():
    _, ax = agg_axes()
    x = np.arange(4)
    step = [0.0, 0.0, 0.5, 0.5]
    draw_onsets(ax, {"a": (x, step), "b": (x, step)}, threshold=0.1, floor=1e-12,
                xlabel="n", ylabel="e")
    markers = [line for line in ax.get_lines() if line.get_marker() not in ("None", None, "")]
    assert len(markers) == 2 and markers[0].get_marker() != markers[1].get_marker()
    assert all(m.get_markerfacecolor() == "none" for m in markers)   # hollow: both visible


def test_one_curve_can_go_without_a_legend():
    """A single curve named by its caption: no legend box over the data."""
    _, ax = agg_axes()
    draw_onsets(ax, {"a": (np.arange(4), [0.0, 0.0, 0.5, 0.5])}, threshold=0.1,
                floor=1e-12, legend=None)
    assert ax.get_legend() is None
    draw_onsets(ax, {"b": (np.arange(4), [0.0, 0.5, 0.5, 0.5])}, threshold=0.1,
                floor=1e-12, legend="upper left")
    assert ax.get_legend()._loc == 2                  # matplotlib's code for upper left


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


def test_cells_show_each_value_in_its_cell_and_refuse_ragged_rows():
    _, ax = agg_axes()
    draw_cells(ax, {"mask": [0, 1, 1], "position": [None, 0, 1]},
               marked={"mask": [False, True, True]}, column_label="column")
    texts = {(t.get_position(), t.get_text()) for t in ax.texts}
    assert ((0.5, -0.5), "0") in texts and ((2.5, -1.5), "1") in texts
    assert len(ax.texts) == 5                      # the pad cell stays empty
    faces = [p.get_facecolor() for p in ax.patches]
    assert len(faces) == 6 and faces[3] != faces[4]   # the pad is grey
    assert faces[0] != faces[1]                       # a marked cell is shaded
    assert [t.get_text() for t in ax.get_yticklabels()] == ["mask", "position"]
    with pytest.raises(ValueError, match="same number of cells"):
        draw_cells(agg_axes()[1], {"a": [1, 2], "b": [1]})
    with pytest.raises(ValueError, match="marked names rows that do not exist"):
        draw_cells(agg_axes()[1], {"a": [1]}, marked={"b": [True]})
