"""ropelib.viz.rope_today draws exactly the data it is given, and refuses data it cannot."""

from __future__ import annotations

import re

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_hex
from matplotlib.figure import Figure

from ropelib.viz.rope_today import (
    LAYER_KINDS,
    draw_accuracy_by_position_bars,
    draw_layer_patterns,
    draw_pair_bands,
    draw_seed_spread,
    draw_spectra,
    draw_stretch_factors,
    seed_table_html,
)


def agg_figure() -> Figure:
    fig = Figure()
    FigureCanvasAgg(fig)
    return fig


def test_pair_bands_plot_each_line_and_the_turns():
    fig = agg_figure()
    share = {"layer 1": [0.5, 0.3, 0.2], "untrained": [1 / 3] * 3}
    change = {"layer 1": [1.0, 0.5, 0.0], "untrained": [0.9, 0.4, 0.0]}
    left, right, bars = draw_pair_bands(fig, share, change, turns=[2.0, 0.5, 0.01])
    np.testing.assert_allclose(left.lines[0].get_ydata(), share["layer 1"])
    np.testing.assert_allclose(right.lines[1].get_ydata(), change["untrained"])
    np.testing.assert_allclose([p.get_height() for p in bars.patches], [2.0, 0.5, 0.01])
    assert len(fig.axes) == 3                      # no second y axis on any panel
    fig.canvas.draw()
    # the legend covers no panel (inside the left one it hid the fast pairs)
    legend = fig.legends[0].get_window_extent()
    assert [t.get_text() for t in fig.legends[0].get_texts()] == list(share)
    assert not any(legend.overlaps(ax.get_window_extent()) for ax in fig.axes)
    with pytest.raises(ValueError, match=r"one value per pair \(3\), got 2 and 3"):
        draw_pair_bands(agg_figure(), {"a": [1, 2]}, {"a": [1, 2, 3]}, turns=[1, 1, 1])
    with pytest.raises(ValueError, match=r"the same, non-empty set of lines"):
        draw_pair_bands(agg_figure(), {"a": [1]}, {"b": [1]}, turns=[1])


def test_spectra_draw_rotating_pairs_and_mark_frozen_ones():
    fig = agg_figure()
    ax = fig.subplots()
    theta = np.array([1.0, 0.1, 0.0, 0.0])
    draw_spectra(ax, {"p-RoPE": theta, "full": np.array([1.0, 0.1, 0.01, 0.001])},
                 channels={"p-RoPE": [0, 2, 4, 6], "full": [0, 2, 4, 6]})
    assert ax.get_yscale() == "log"
    line, crosses = ax.lines[0], ax.lines[1]
    np.testing.assert_allclose(line.get_xdata(), [0, 2])
    np.testing.assert_allclose(line.get_ydata(), [1.0, 0.1])
    np.testing.assert_allclose(crosses.get_xdata(), [4, 6])
    np.testing.assert_allclose(crosses.get_ydata(), [1e-4, 1e-4])  # a decade below 1e-3
    assert "frequency 0" in line.get_label() and "frequency 0" not in ax.lines[2].get_label()
    fig.canvas.draw()
    ticks = dict(zip(ax.get_yticks(), (t.get_text() for t in ax.get_yticklabels()),
                     strict=True))
    assert ticks[1e-4] == "0"                      # the crosses' line is labelled 0
    with pytest.raises(ValueError, match=r"spectra\['x'\] must be >= 0 with at least one"):
        draw_spectra(agg_figure().subplots(), {"x": [0.0]}, channels={"x": [0]})
    with pytest.raises(ValueError, match=r"must have the same length, got 2 and 1"):
        draw_spectra(agg_figure().subplots(), {"x": [1.0, 0.5]}, channels={"x": [0]})


def test_stretch_factors_and_accuracy_lines():
    ax = agg_figure().subplots()
    draw_stretch_factors(ax, {"PI": [4, 4, 4], "YaRN": [1, 2, 4]})
    np.testing.assert_allclose(ax.lines[1].get_ydata(), [1, 2, 4])
    assert ax.get_yscale() == "log"
    ax = agg_figure().subplots()
    draw_accuracy_by_position_bars(ax, {"causal": [1.0, 0.5]}, chance=0.25)
    np.testing.assert_allclose(ax.lines[0].get_ydata(), [1.0, 0.5])
    np.testing.assert_allclose(ax.lines[1].get_ydata(), [0.25, 0.25])
    with pytest.raises(ValueError, match=r"at least one"):
        draw_stretch_factors(ax, {})


def test_layer_patterns_colour_each_layer_by_kind():
    ax = agg_figure().subplots()
    patterns = {"A": ["RoPE", "RoPE", "NoPE"], "B": ["p-RoPE"]}
    draw_layer_patterns(ax, patterns)
    image = ax.images[0]
    rgba = image.to_rgba(image.get_array())
    assert to_hex(rgba[0, 0]) == LAYER_KINDS["RoPE"]
    assert to_hex(rgba[0, 2]) == LAYER_KINDS["NoPE"]
    assert to_hex(rgba[1, 0]) == LAYER_KINDS["p-RoPE"]
    assert image.get_array().mask[1, 1]  # row B has one layer only
    assert [t.get_text() for t in ax.get_yticklabels()] == ["A", "B"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["RoPE", "p-RoPE", "NoPE"]
    with pytest.raises(ValueError, match=r"patterns\['A'\]\[0\] must be one of .*got 'ALiBi'"):
        draw_layer_patterns(agg_figure().subplots(), {"A": ["ALiBi"]})


def test_seed_spread_draws_the_mean_and_the_range_of_the_seeds():
    fig = agg_figure()
    ax = fig.subplots()
    runs = {"a": [[1.0, 0.5], [0.8, 0.7], [0.9, 0.6]], "b": [[0.2, 0.1]]}
    draw_seed_spread(ax, [64, 128], runs, train_length=64, chance=0.1)
    mean_line = ax.containers[0].lines[0]
    np.testing.assert_allclose(mean_line.get_ydata(), [0.9, 0.6])
    (bars,) = ax.containers[0].lines[2]
    low_high = np.array([seg[:, 1] for seg in bars.get_segments()])
    np.testing.assert_allclose(low_high, [[0.8, 1.0], [0.5, 0.7]])
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "a (3 seeds)" in labels and "b (1 seed)" in labels and "training length" in labels
    with pytest.raises(ValueError, match=r"must be \(seeds, lengths\) with 2 lengths"):
        draw_seed_spread(agg_figure().subplots(), [64, 128], {"a": [0.5, 0.5]},
                         train_length=64)


def test_seed_table_shows_mean_range_and_padding():
    html = seed_table_html([64, 256], {"a": [[1.0, 0.5], [0.8, 0.7]], "b": [[0.2, 0.1]]},
                           train_length=64)
    assert "90.0%<br><small>80.0&ndash;100.0</small>" in html
    assert "60.0%<br><small>50.0&ndash;70.0</small>" in html
    assert "<td" in html and "20.0%</td>" in html and "b (1 seed)" in html
    cells = re.findall(r"<t[dh][ >][^>]*", html)
    assert len(cells) == 9 and all("padding" in cell for cell in cells)
    assert "256 tokens (4x)" in html
    with pytest.raises(ValueError, match=r"must lie in \[0, 1\]"):
        seed_table_html([64], {"a": [[1.5]]}, train_length=64)
