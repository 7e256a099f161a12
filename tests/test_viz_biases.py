"""ropelib.viz.biases draws what it is given (read back from the matplotlib artists)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("matplotlib")
from matplotlib.figure import Figure  # noqa: E402

from ropelib.viz.biases import (  # noqa: E402
    draw_bias_heatmaps,
    draw_score_terms_vs_shift,
    draw_sinusoidal_table,
    wavelength_label,
)


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


def test_sinusoidal_table_shows_the_table_and_each_pair_wavelength():
    positions, d = 50, 6
    omega = 10000.0 ** (-np.arange(0, d, 2) / d)
    angles = np.arange(positions)[:, None] * omega
    table = np.stack([np.sin(angles), np.cos(angles)], axis=-1).reshape(positions, d)
    wavelengths = 2 * np.pi / omega  # 2 pi * 10000^(2i/6): 6.28, 135.35, 2916.36
    fig = Figure()
    ax = draw_sinusoidal_table(fig, torch.from_numpy(table), wavelengths)
    image = ax.images[0]
    np.testing.assert_array_equal(image.get_array(), table)
    assert image.get_clim() == (-1.0, 1.0)
    (top,) = ax.child_axes
    assert [t.get_text() for t in top.get_xticklabels()] == ["6.3", "135", "2,916"]
    np.testing.assert_array_equal(top.get_xticks(), [0.5, 2.5, 4.5])  # between sin and cos
    assert ax.get_ylabel() == "position m"
    assert len(fig.axes) == 2  # the heatmap and its colour bar
    fig.canvas.draw()


def test_wavelength_label():
    assert [wavelength_label(w) for w in (6.2832, 9.96, 10.0, 62.83, 19869.2)] == [
        "6.3", "10.0", "10", "63", "19,869"]


def test_sinusoidal_table_errors():
    fig = Figure()
    with pytest.raises(ValueError, match="even number of channels"):
        draw_sinusoidal_table(fig, np.ones((4, 3)), [1.0])
    with pytest.raises(ValueError, match="one entry per channel pair \\(2\\)"):
        draw_sinusoidal_table(fig, np.ones((4, 4)), [1.0])
    with pytest.raises(ValueError, match="positive and finite"):
        draw_sinusoidal_table(fig, np.ones((4, 4)), [1.0, 0.0])
    with pytest.raises(ValueError, match="table must be a 2-D"):
        draw_sinusoidal_table(fig, np.ones(4), [1.0, 2.0])
