"""ropelib.viz.layouts draws the pairs, matrices and mismatch curves it is given."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ropelib.layouts import half_from_interleaved_index
from ropelib.viz.layouts import (
    draw_layout_matrices,
    draw_layout_mismatch,
    draw_layout_pairs,
    layout_pairs,
)


def agg_figure():
    fig = Figure()
    FigureCanvasAgg(fig)
    return fig


@pytest.mark.parametrize("dim", [2, 8, 12])
def test_pairs_match_the_library_permutation(dim):
    """Listing the half layout's pairs in order (first members, then second members) gives
    the channel order that ropelib.layouts uses to convert interleaved -> half."""
    interleaved = layout_pairs(dim, "interleaved")
    half = layout_pairs(dim, "half")
    assert interleaved == [(2 * i, 2 * i + 1) for i in range(dim // 2)]
    assert half == [(i, i + dim // 2) for i in range(dim // 2)]
    # channel j of the half layout holds channel perm[j] of the interleaved layout:
    # pair i's members sit at (i, i + d/2) in half and (2i, 2i+1) in interleaved
    perm = [None] * dim
    for (ha, hb), (ia, ib) in zip(half, interleaved, strict=True):
        perm[ha], perm[hb] = ia, ib
    assert perm == half_from_interleaved_index(dim).tolist()


def test_draw_pairs_colours_each_pair_and_joins_it():
    fig = agg_figure()
    drawn = draw_layout_pairs(fig, 6)
    assert drawn == {"interleaved": layout_pairs(6, "interleaved"), "half": layout_pairs(6, "half")}
    for ax, layout in zip(fig.axes, ("interleaved", "half"), strict=True):
        cells = {p.get_gid(): p for p in ax.patches if "pair" in (p.get_gid() or "")}
        arcs = [p for p in ax.patches if "arc" in (p.get_gid() or "")]
        assert len(cells) == 6 and len(arcs) == 3
        for i, (a, b) in enumerate(drawn[layout]):
            first, second = cells[f"{layout}-{a}-pair-{i}"], cells[f"{layout}-{b}-pair-{i}"]
            assert first.get_facecolor() == second.get_facecolor()
            assert first.get_x() == a and second.get_x() == b
        assert layout in ax.get_title(loc="left")
    fig.canvas.draw()


def test_draw_matrices_on_one_scale():
    fig = agg_figure()
    eye, perm = np.eye(4), np.eye(4)[[0, 2, 1, 3]]
    images = draw_layout_matrices(fig, {"I": torch.tensor(eye), "P": perm})
    assert len(images) == 2
    np.testing.assert_array_equal(images[1].get_array(), perm)
    assert all(im.get_clim() == (-1.0, 1.0) for im in images)
    assert [ax.get_title() for ax in fig.axes[:2]] == ["I", "P"]
    fig.canvas.draw()


def test_draw_mismatch_plots_both_curves():
    fig = agg_figure()
    dist, err = np.arange(5), np.array([0.0, 0.3, 0.6, 1.0, 1.2])
    pos, tv = torch.arange(4), torch.tensor([0.0, 0.1, 0.2, 0.4])
    left, right = draw_layout_mismatch(fig, dist, err, pos, tv)
    np.testing.assert_allclose(left.get_lines()[0].get_ydata(), err)
    np.testing.assert_allclose(right.get_lines()[0].get_ydata(), tv.numpy())
    assert left.get_xscale() == "symlog"
    assert right.get_ylim() == (0.0, 1.0)
    fig.canvas.draw()


@pytest.mark.parametrize("call, match", [
    (lambda: layout_pairs(7, "half"), "positive even int"),
    (lambda: layout_pairs(8, "neox"), "layout must be one of"),
    (lambda: draw_layout_pairs(agg_figure(), 0), "positive even int"),
    (lambda: draw_layout_matrices(agg_figure(), {}), "at least one matrix"),
    (lambda: draw_layout_matrices(agg_figure(), {"A": np.ones((2, 3))}), "square"),
    (lambda: draw_layout_matrices(agg_figure(), {"A": 2 * np.eye(2)}), r"\[-1, 1\]"),
    (lambda: draw_layout_mismatch(agg_figure(), [0, 1], [0.0], [0], [0.0]), "same length"),
    (lambda: draw_layout_mismatch(agg_figure(), [0], [0.0], [0, 1], [0.0]), "same length"),
    (lambda: draw_layout_mismatch(agg_figure(), [-1], [0.0], [0], [0.0]), ">= 0"),
    (lambda: draw_layout_mismatch(agg_figure(), [0], [np.nan], [0], [0.0]), "finite"),
])
def test_rejects_bad_inputs(call, match):
    with pytest.raises(ValueError, match=match):
        call()
