"""ropelib.viz.frequencies draws the wavelengths and similarities it is asked for."""

from __future__ import annotations

import math

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

from matplotlib.figure import Figure  # noqa: E402

from ropelib.viz.frequencies import (  # noqa: E402
    draw_distance_similarity,
    draw_wavelength_slider,
    draw_wavelengths,
)


def by_gid(fig: Figure, gid: str) -> list:
    return [artist for artist in fig.findobj() if artist.get_gid() == gid]


def test_wavelength_series_are_two_pi_base_powers_on_a_log_axis():
    fig = Figure()
    ax = fig.add_subplot()
    lines = draw_wavelengths(ax, [(10000.0, 8), (500000.0, 16)], 4096)
    assert ax.get_yscale() == "log"
    np.testing.assert_allclose(lines[0].get_ydata(),
                               [2 * math.pi * 10000.0 ** (2 * i / 8) for i in range(4)],
                               rtol=1e-13)
    np.testing.assert_array_equal(lines[1].get_xdata(), np.arange(8))
    (context,) = by_gid(fig, "context_line")
    assert list(context.get_ydata()) == [4096, 4096]
    with pytest.raises(ValueError, match="context_length"):
        draw_wavelengths(ax, [(10000.0, 8)], 0)
    with pytest.raises(ValueError, match="configs"):
        draw_wavelengths(ax, [], 4096)


@pytest.mark.parametrize("log10_base, head_dim, never", [(4.0, 128, 18), (5.69897, 128, 32),
                                                         (4.0, 64, 9), (3.0, 16, 0)])
def test_slider_frame_splits_pairs_at_the_context(log10_base, head_dim, never):
    fig = Figure()
    result = draw_wavelength_slider(fig, log10_base, head_dim)
    # independent count: 2 pi base^(2i/d) > 4096 by plain Python floats
    expected = sum(1 for i in range(head_dim // 2)
                   if 2 * math.pi * (10.0**log10_base) ** (2 * i / head_dim) > 4096)
    assert result["never_turn"] == expected == never
    assert result["fastest_turns"] == pytest.approx(4096 / (2 * math.pi))
    (slow,) = by_gid(fig, "never_turn")
    (fast,) = by_gid(fig, "turning")
    assert len(slow.get_xdata()) == never and len(fast.get_xdata()) == head_dim // 2 - never
    ax = fig.axes[0]
    top = max(np.max(slow.get_ydata(), initial=1.0), np.max(fast.get_ydata()))
    assert ax.get_ylim()[0] <= 2 * math.pi and ax.get_ylim()[1] > top   # frames fit


def test_slider_frame_rejects_values_outside_its_axes():
    with pytest.raises(ValueError, match="log10_base"):
        draw_wavelength_slider(Figure(), 7.5, 64)
    with pytest.raises(ValueError, match="head_dim"):
        draw_wavelength_slider(Figure(), 4.0, 512)


def test_similarity_curves_are_drawn_as_given():
    fig = Figure()
    ax = fig.add_subplot()
    gaps = np.arange(1, 6)
    curves = {"a": np.cos(gaps), "b": np.zeros(5)}
    lines = draw_distance_similarity(ax, gaps, curves)
    np.testing.assert_array_equal(lines[0].get_ydata(), np.cos(gaps))
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["a", "b"]
    with pytest.raises(ValueError, match="one value per gap"):
        draw_distance_similarity(ax, gaps, {"c": np.zeros(4)})


def test_similarity_marks_the_closest_pair():
    fig = Figure()
    ax = fig.add_subplot()
    gaps = np.arange(1, 800)
    draw_distance_similarity(ax, gaps, {"one": np.cos(gaps)}, closest=(710, np.cos(710)))
    (dot,) = by_gid(fig, "closest")
    assert list(dot.get_xdata()) == [710] and dot.get_ydata()[0] == pytest.approx(1.0, abs=1e-8)


def test_similarity_of_a_fast_series_draws_dots_and_its_curve_in_an_inset():
    """One frequency turns every 2 pi gaps: thousands of turns as a line fill the panel (a
    solid block), so with ``zoom`` the panel shows dots and an inset the curve itself."""
    fig = Figure()
    ax = fig.add_subplot()
    gaps = np.arange(1, 4097)
    (dots,) = draw_distance_similarity(ax, gaps, {"one": np.cos(gaps)}, zoom=40)
    assert dots.get_linestyle() == "None" and dots.get_marker() == "."
    np.testing.assert_array_equal(dots.get_ydata(), np.cos(gaps))
    (inset,) = [child for child in ax.child_axes if child.get_gid() == "zoom"]
    (curve,) = inset.get_lines()
    assert curve.get_linestyle() == "-"
    np.testing.assert_array_equal(curve.get_xdata(), np.arange(1, 41))
    np.testing.assert_array_equal(curve.get_ydata(), np.cos(np.arange(1, 41)))
    assert curve.get_color() == dots.get_color()
    for bad in (0.5, float("nan")):
        with pytest.raises(ValueError, match="zoom"):
            draw_distance_similarity(ax, gaps, {"one": np.cos(gaps)}, zoom=bad)
