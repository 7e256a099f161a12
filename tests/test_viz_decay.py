"""ropelib.viz.decay draws the walk, the bound and the scores it is asked for."""

from __future__ import annotations

import cmath

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

from matplotlib.figure import Figure  # noqa: E402

from ropelib.viz.decay import (  # noqa: E402
    draw_base_bounds,
    draw_decay_bound,
    draw_phasor_walk,
    draw_score_curves,
    draw_score_spread,
)


def by_gid(fig: Figure, gid: str) -> list:
    return [artist for artist in fig.findobj() if artist.get_gid() == gid]


def walk_reference(distance: float, head_dim: int, base: float) -> list[complex]:
    """S_0 .. S_{d/2} with plain Python complex arithmetic."""
    total, walk = 0j, [0j]
    for k in range(head_dim // 2):
        total += cmath.exp(1j * distance * base ** (-2.0 * k / head_dim))
        walk.append(total)
    return walk


@pytest.mark.parametrize("distance, head_dim, base", [(0, 128, 10000.0), (40, 128, 10000.0),
                                                      (250, 64, 500000.0), (7.5, 16, 100.0)])
def test_walk_panel_draws_the_partial_sums_and_the_marked_bound(distance, head_dim, base):
    fig = Figure()
    result = draw_phasor_walk(fig, distance, head_dim, base)
    ref = walk_reference(distance, head_dim, base)
    (points,) = by_gid(fig, "walk_points")
    np.testing.assert_allclose(points.get_xdata(), [z.real for z in ref], atol=1e-10)
    np.testing.assert_allclose(points.get_ydata(), [z.imag for z in ref], atol=1e-10)
    expected_bound = sum(abs(z) for z in ref[1:]) / (head_dim // 2)
    assert result["bound"] == pytest.approx(expected_bound, rel=1e-12)
    assert result["end"] == pytest.approx(abs(ref[-1]), rel=1e-12)
    (marker,) = by_gid(fig, "current_bound")
    assert list(marker.get_xdata()) == [distance]
    assert marker.get_ydata()[0] == pytest.approx(expected_bound)
    plane, curve = fig.axes[:2]
    x0, x1 = plane.get_xlim()
    y0, y1 = plane.get_ylim()
    assert x0 <= min(z.real for z in ref) and max(z.real for z in ref) <= x1
    assert y0 <= min(z.imag for z in ref) and max(z.imag for z in ref) <= y1
    assert curve.get_xlim() == (0.0, 256.0) and curve.get_ylim()[1] >= (head_dim // 2 + 1) / 2


@pytest.mark.parametrize("head_dim, base", [(16, 1000.0), (128, 10000.0), (256, 1e6)])
def test_walk_box_is_the_same_for_every_distance_and_holds_every_walk(head_dim, base):
    limits = set()
    for distance in (0, 3, 77, 256):
        fig = Figure()
        draw_phasor_walk(fig, distance, head_dim, base)
        plane = fig.axes[0]
        limits.add((plane.get_xlim(), plane.get_ylim()))
    assert len(limits) == 1
    (x0, x1), (y0, y1) = limits.pop()
    for distance in range(0, 257, 5):
        ref = walk_reference(distance, head_dim, base)
        assert x0 <= min(z.real for z in ref) and max(z.real for z in ref) <= x1
        assert y0 <= min(z.imag for z in ref) and max(z.imag for z in ref) <= y1


def test_walk_rejects_distances_outside_the_curve():
    with pytest.raises(ValueError, match="distance"):
        draw_phasor_walk(Figure(), 300, 128)


def test_bound_curve_starts_at_the_mean_of_one_to_d_half():
    fig = Figure()
    ax = fig.add_subplot()
    line = draw_decay_bound(ax, np.arange(0, 11), 128)
    assert line.get_ydata()[0] == pytest.approx(np.mean(np.arange(1, 65)))  # 32.5


def test_score_curves_marks_and_errors():
    fig = Figure()
    ax = fig.add_subplot()
    x = np.arange(0, 51)
    toy = np.cos(x) + np.cos(0.3 * x) + np.cos(0.05 * x)
    (line,) = draw_score_curves(ax, x, {"toy": toy}, marks=(0, 20))
    np.testing.assert_array_equal(line.get_ydata(), toy)
    dots = [ln for ln in ax.get_lines() if ln.get_marker() == "o"]
    assert [d.get_ydata()[0] for d in dots] == pytest.approx([3.0, toy[20]])
    with pytest.raises(ValueError, match="marks"):
        draw_score_curves(ax, x, {"toy": toy}, marks=(0.5,))
    with pytest.raises(ValueError, match="one value per distance"):
        draw_score_curves(ax, x, {"toy": toy[:-1]})


def test_spread_band_spans_mean_plus_minus_std():
    fig = Figure()
    ax = fig.add_subplot()
    x = np.arange(5.0)
    line = draw_score_spread(ax, x, np.zeros(5), np.full(5, 2.0))
    np.testing.assert_array_equal(line.get_ydata(), np.zeros(5))
    (band,) = by_gid(fig, "spread_band")
    ys = np.concatenate([p.vertices[:, 1] for p in band.get_paths()])
    assert ys.min() == pytest.approx(-2.0) and ys.max() == pytest.approx(2.0)


def test_base_bounds_on_log_axes_with_models():
    fig = Figure()
    ax = fig.add_subplot()
    line = draw_base_bounds(ax, [1024, 2048], [4e3, 1e4], {"model": (4096, 1e4)})
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    np.testing.assert_array_equal(line.get_ydata(), [4e3, 1e4])
    assert "model" in [t.get_text() for t in ax.get_legend().get_texts()]


def test_base_bounds_draw_other_searches_at_the_same_context_lengths():
    fig = Figure()
    ax = fig.add_subplot()
    draw_base_bounds(ax, [1024, 2048], [4e3, 1e4], others={"paper": [4.3e3, 1.6e4]})
    (other,) = by_gid(fig, "other_bound")
    np.testing.assert_array_equal(other.get_xdata(), [1024, 2048])
    np.testing.assert_array_equal(other.get_ydata(), [4.3e3, 1.6e4])
    assert other.get_linestyle() == "None" and other.get_label() == "paper"
    with pytest.raises(ValueError, match=r"others\['paper'\] must have one value"):
        draw_base_bounds(ax, [1024, 2048], [4e3, 1e4], others={"paper": [1.0]})
