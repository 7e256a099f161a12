"""ropelib.viz.extension draws the frequencies it computes and the results it is given."""

from __future__ import annotations

import math

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ropelib.viz.extension import (
    METHOD_STYLES,
    accuracy_table_html,
    draw_accuracy_by_length,
    draw_accuracy_by_position,
    draw_accuracy_panels,
    draw_decoding_gap,
    draw_frequency_scaling,
    draw_training_losses,
    extension_frequencies,
)


def agg_figure() -> Figure:
    fig = Figure()
    FigureCanvasAgg(fig)
    return fig


def test_frequencies_follow_the_methods_definitions_at_their_ends():
    """PI divides every theta_i by s; NTK keeps theta_0 and divides the last by s; YaRN and
    Llama 3 keep the fastest pairs and interpolate the slowest like PI; dynamic NTK at
    length s L0 with config factor f is NTK with factor f s - (f - 1)."""
    s, dim, base, L0 = 8.0, 64, 10000.0, 2048
    f = extension_frequencies(s, dim=dim, base=base, original_len=L0, dynamic_factor=2.0)
    assert list(f) == list(METHOD_STYLES)
    theta = np.array([base ** (-2 * i / dim) for i in range(dim // 2)])
    np.testing.assert_allclose(f["original"], theta, rtol=1e-15)
    np.testing.assert_allclose(f["PI (linear)"], theta / s, rtol=1e-15)
    assert f["NTK-aware"][0] == 1.0
    assert f["NTK-aware"][-1] == pytest.approx(theta[-1] / s, rel=1e-12)
    grown = 2.0 * s - 1.0
    dynamic = (base * grown ** (dim / (dim - 2))) ** (-np.arange(0, dim, 2) / dim)
    np.testing.assert_allclose(f["dynamic NTK"], dynamic, rtol=1e-12)
    for label in ("YaRN", "Llama 3"):
        assert f[label][0] == theta[0]
        assert f[label][-1] == pytest.approx(theta[-1] / s, rel=1e-12)


def test_frequency_figure_draws_wavelengths_and_ratios_on_fixed_axes():
    fig = agg_figure()
    freqs = draw_frequency_scaling(fig, 4.0, dim=32, original_len=512, max_factor=16.0)
    left, right = fig.axes
    labels = list(METHOD_STYLES)
    assert [line.get_label() for line in left.get_lines()[: len(labels)]] == labels
    for line, label in zip(left.get_lines(), labels, strict=False):
        np.testing.assert_allclose(line.get_ydata(), 2 * math.pi / freqs[label], rtol=1e-12)
    for line, label in zip(right.get_lines(), labels, strict=False):
        np.testing.assert_allclose(line.get_ydata(), freqs[label] / freqs["original"],
                                   rtol=1e-12)
    horizontal = [line.get_ydata()[0] for line in left.get_lines()[len(labels):]]
    assert horizontal == [512, 2048.0]                     # L0 and s L0
    assert left.get_yscale() == right.get_yscale() == "log"
    assert right.get_ylim() == pytest.approx((1 / 48, 1.5))    # dynamic factor 2 x 16
    other = agg_figure()
    draw_frequency_scaling(other, 16.0, dim=32, original_len=512, max_factor=16.0)
    assert other.axes[0].get_ylim() == left.get_ylim()     # slider frames share axes
    fig.canvas.draw()


def test_frequency_figure_refuses_a_factor_outside_the_slider():
    with pytest.raises(ValueError, match=r"factor must be in \[1, max_factor=8.0\], got 9"):
        draw_frequency_scaling(agg_figure(), 9, max_factor=8.0)
    with pytest.raises(ValueError, match="factor must be a number >= 1, got 0.5"):
        extension_frequencies(0.5)


def test_accuracy_plot_draws_each_model_against_length():
    fig = agg_figure()
    ax = fig.add_subplot()
    acc = {"rope": [1.0, 0.9, 0.5, 0.3], "pi": [1.0, 0.4, float("nan"), 0.1]}
    lines = draw_accuracy_by_length(ax, [64, 128, 256, 512], acc, train_length=64,
                                    chance=1 / 16, colors={"pi": "tab:green"})
    assert [line.get_label() for line in lines] == ["rope", "pi"]
    assert lines[1].get_color() == "tab:green"
    np.testing.assert_array_equal(lines[0].get_xdata(), [64, 128, 256, 512])
    np.testing.assert_array_equal(lines[1].get_ydata(), acc["pi"])
    assert ax.get_xscale() == "log"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["64", "128", "256", "512"]
    assert "chance" in [t.get_text() for t in ax.get_legend().get_texts()]
    fig.canvas.draw()


def test_accuracy_plot_checks_its_data():
    ax = agg_figure().add_subplot()
    with pytest.raises(ValueError, match=r"accuracies\['a'\] has 2 values but there are 3"):
        draw_accuracy_by_length(ax, [1, 2, 4], {"a": [0.5, 0.5]}, train_length=1)
    with pytest.raises(ValueError, match=r"must lie in \[0, 1\]"):
        draw_accuracy_by_length(ax, [1, 2], {"a": [0.5, 1.5]}, train_length=1)
    with pytest.raises(ValueError, match="lengths must be"):
        draw_accuracy_by_length(ax, [0, 2], {"a": [0.5, 0.5]}, train_length=1)


def test_loss_curves_are_running_means():
    ax = agg_figure().add_subplot()
    losses = {"a": [4.0, 2.0, 1.0, 0.5, 0.25]}
    (line,) = draw_training_losses(ax, losses, smooth=2)
    np.testing.assert_allclose(line.get_ydata(), [3.0, 1.5, 0.75, 0.375])
    np.testing.assert_array_equal(line.get_xdata(), [2, 3, 4, 5])
    assert ax.get_yscale() == "log"
    with pytest.raises(ValueError, match="at least smooth=10 positive"):
        draw_training_losses(ax, losses)


def test_accuracy_table_lists_percentages_per_length():
    html = accuracy_table_html([64, 128], {"RoPE": [1.0, 0.5], "PI & FT": [float("nan"), 0.25]},
                               train_length=64)
    assert "<th>N = 64 (1x)</th><th>N = 128 (2x)</th>" in html
    assert "<tr><td>RoPE</td><td>100.0</td><td>50.0</td></tr>" in html
    assert "<tr><td>PI &amp; FT</td><td>&ndash;</td><td>25.0</td></tr>" in html
    with pytest.raises(ValueError, match=r"accuracies\['a'\] has 1 values but there are 2"):
        accuracy_table_html([64, 128], {"a": [1.0]}, train_length=64)


def test_accuracy_by_position_averages_each_bin_and_skips_missing_targets():
    ax = agg_figure().add_subplot()
    right = np.array([[np.nan, 1, 1, 0, 0, 0], [np.nan, 1, 0, 0, 1, 1]])
    drawn = draw_accuracy_by_position(ax, {"a": right}, train_length=2, bin_size=2)
    np.testing.assert_allclose(drawn["a"], [1.0, 0.25, 0.5])
    (line,) = ax.get_lines()[:1]
    np.testing.assert_allclose(line.get_xdata(), [0.5, 2.5, 4.5])
    late = draw_accuracy_by_position(ax, {"a": right}, train_length=2, bin_size=3, start=2)
    np.testing.assert_allclose(late["a"], [0.5, 1 / 3])
    with pytest.raises(ValueError, match="bin_size must be a positive int dividing seq=6"):
        draw_accuracy_by_position(ax, {"a": right}, train_length=2, bin_size=4)


def test_decoding_gap_draws_each_curve_with_zeros_at_the_floor():
    fig = agg_figure()
    ax = fig.subplots()
    drawn = draw_decoding_gap(ax, {"dynamic": [0.0, 0.0, 1e-5, 2e-4], "plain": [0.0] * 4},
                              train_length=2, floor=1e-16)
    np.testing.assert_array_equal(drawn["dynamic"], [1e-16, 1e-16, 1e-5, 2e-4])
    np.testing.assert_array_equal(drawn["plain"], [1e-16] * 4)
    assert [line.get_label() for line in ax.get_lines()[:2]] == ["dynamic", "plain"]
    assert ax.get_yscale() == "log"
    assert ax.get_lines()[2].get_xdata()[0] == 2      # the trained context
    fig.canvas.draw()


@pytest.mark.parametrize("gaps", [{}, {"a": [-1.0]}, {"a": [math.nan]}, {"a": []}])
def test_decoding_gap_refuses_bad_curves(gaps):
    with pytest.raises(ValueError, match="gaps"):
        draw_decoding_gap(agg_figure().subplots(), gaps, train_length=2)


def test_accuracy_panels_share_colours_and_one_legend():
    fig = agg_figure()
    left = {"rope": [1.0, 0.5], "nope": [0.2, 0.1]}
    right = {"rope": [1.0, 0.5], "rope + pi": [1.0, 0.9]}
    axes = draw_accuracy_panels(fig, [64, 128], [("as trained", left), ("extended", right)],
                                train_length=64, chance=0.1)
    assert [ax.get_title() for ax in axes] == ["as trained", "extended"]
    assert all(ax.get_legend() is None for ax in axes)
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["rope", "nope", "chance",
                                                          "rope + pi"]
    rope = [line for ax in axes for line in ax.get_lines() if line.get_label() == "rope"]
    assert len(rope) == 2 and rope[0].get_color() == rope[1].get_color()
    fig.canvas.draw()
    with pytest.raises(ValueError, match="at least one"):
        draw_accuracy_panels(agg_figure(), [64], [], train_length=64)
