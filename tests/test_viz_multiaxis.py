"""ropelib.viz.multiaxis draws the data it is given, with clear errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from ropelib import axis_frequencies, mrope_positions
from ropelib.viz.multiaxis import (
    draw_axis_spectra,
    draw_grid_accuracy,
    draw_moving_key,
    draw_mrope_positions,
    draw_score_maps,
)


def agg_figure(**kwargs) -> Figure:
    fig = Figure(**kwargs)
    FigureCanvasAgg(fig)
    return fig


def outlines(ax):
    return [(p.get_x() + 0.5, p.get_y() + 0.5, p.get_label()) for p in ax.patches
            if isinstance(p, Rectangle)]


def test_score_maps_show_each_map_with_one_scale_and_the_marks():
    maps = {"a": np.arange(16.0).reshape(4, 4), "b": -np.ones((4, 4))}
    fig = agg_figure()
    axes = draw_score_maps(fig, maps, query=(1, 2), key=(3, 0))
    assert [ax.get_title() for ax in axes] == ["a", "b"]
    for ax, array in zip(axes, maps.values(), strict=True):
        (image,) = ax.get_images()
        np.testing.assert_array_equal(image.get_array(), array)
        assert image.get_clim() == (-1.0, 15.0)
        # (x, y) of the outline centres: (column, row)
        assert outlines(ax) == [(2, 1, "query"), (0, 3, "key")]
    fig.canvas.draw()


def test_score_maps_accept_tensors_and_reject_mismatches():
    fig = agg_figure()
    axes = draw_score_maps(fig, {"t": torch.ones(3, 3, requires_grad=True) * 2})
    np.testing.assert_array_equal(axes[0].get_images()[0].get_array(), np.full((3, 3), 2.0))
    with pytest.raises(ValueError, match="same"):
        draw_score_maps(agg_figure(), {"a": np.ones((3, 3)), "b": np.ones((4, 4))})
    with pytest.raises(ValueError, match="at least one"):
        draw_score_maps(agg_figure(), {})
    with pytest.raises(ValueError, match="2 dims"):
        draw_score_maps(agg_figure(), {"a": np.ones(3)})


def test_moving_key_calls_each_map_at_the_offset_key():
    seen = []

    def fn(key):
        seen.append(key)
        return np.full((5, 5), float(key[0] * 10 + key[1]))

    fig = agg_figure()
    axes = draw_moving_key(fig, -1, 2, center=(2, 2), maps_for_key={"m": fn})
    assert seen == [(1, 4)]
    assert outlines(axes[0]) == [(4, 1, "key")]
    assert "(-1, 2)" in fig._suptitle.get_text()
    with pytest.raises(ValueError, match="off the 5 x 5 grid"):
        draw_moving_key(agg_figure(), 3, 0, center=(2, 2), maps_for_key={"m": fn})


def test_mrope_positions_panels_hold_each_axis():
    positions = mrope_positions([2, (1, 2, 3), 1])
    kinds = ["text"] * 2 + ["image"] * 6 + ["text"]
    fig = agg_figure()
    axes = draw_mrope_positions(fig, positions, kinds)
    assert [ax.get_ylabel() for ax in axes] == ["t", "h", "w"]
    for a, ax in enumerate(axes):
        (line,) = ax.get_lines()
        np.testing.assert_array_equal(line.get_ydata(), positions[:, a].numpy())
    assert [t.get_text() for t in axes[0].get_legend().get_texts()] == ["text", "image"]
    fig.canvas.draw()
    with pytest.raises(ValueError, match="kinds must name every token"):
        draw_mrope_positions(agg_figure(), positions, kinds[:-1])
    with pytest.raises(ValueError, match="kinds must be among"):
        draw_mrope_positions(agg_figure(), positions, ["audio"] * 9)


def test_axis_spectra_colour_each_pair_by_its_axis():
    W = axis_frequencies(24, [4, 4, 4], base=100.0, order="interleaved")
    fig = agg_figure()
    (ax,) = draw_axis_spectra(fig, {"interleaved": W})
    collections = ax.collections
    assert len(collections) == 3
    for a, collection in enumerate(collections):
        pairs, freqs = collection.get_offsets().T
        np.testing.assert_array_equal(pairs, np.flatnonzero(W[:, a].numpy()))
        np.testing.assert_allclose(freqs, W[W[:, a] != 0, a].numpy())
    assert ax.get_yscale() == "log"
    with pytest.raises(ValueError, match="exactly one axis"):
        draw_axis_spectra(agg_figure(), {"mixed": torch.ones(4, 3)})


def test_grid_accuracy():
    results = {"axial": {"accuracy": {8: 1.0, 16: 0.9}, "parameters": 10},
               "absolute": {"accuracy": {8: 0.8, 16: 0.5}, "parameters": 12}}
    fig = agg_figure()
    ax = fig.add_subplot()
    draw_grid_accuracy(ax, results, train_grid=8, chance=0.25)
    lines = {line.get_label(): line for line in ax.get_lines()}
    np.testing.assert_array_equal(lines["axial"].get_ydata(), [100.0, 90.0])
    np.testing.assert_array_equal(lines["absolute"].get_xdata(), [8, 16])



def test_score_maps_over_offsets():
    fig = agg_figure()
    grid = np.arange(25.0).reshape(5, 5)
    (ax,) = draw_score_maps(fig, {"fit": grid}, labels=("dx", "dy"), radius=2,
                            colorbar_label="value")
    assert ax.get_xlabel() == "dx" and ax.get_ylabel() == "dy"
    assert ax.images[0].get_extent() == [-2.5, 2.5, 2.5, -2.5]
    np.testing.assert_array_equal(ax.images[0].get_array(), grid)
    with pytest.raises(ValueError, match=r"radius 3 needs maps of shape \(7, 7\)"):
        draw_score_maps(agg_figure(), {"fit": grid}, radius=3)
