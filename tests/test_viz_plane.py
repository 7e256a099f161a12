"""ropelib.viz.plane: the 2D RoPE figure draws what the formulas say."""

from __future__ import annotations

import math
import re
from functools import partial

import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
pytest.importorskip("ipywidgets")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Arc  # noqa: E402
from matplotlib.text import Annotation  # noqa: E402

from ropelib import apply_rope  # noqa: E402
from ropelib.viz import live_slider, scrubber  # noqa: E402
from ropelib.viz.plane import DEFAULT_K, DEFAULT_Q, draw_rotation_plane, plane_state  # noqa: E402

CASES = [  # theta, m, n, q, k
    (0.5, 5, 2, DEFAULT_Q, DEFAULT_K),
    (1.0, 0, 7, (0.3, -1.2), (2.0, 0.5)),
    (0.1, 40, 3, (-1.0, -1.0), (0.2, 0.9)),
    (2.9, 3, 3, (0.0, 1.5), (-0.7, 0.1)),
    (0.0, 9, 1, (1.0, 0.0), (0.0, 1.0)),
]


def rotate(v, angle: float) -> np.ndarray:
    """(v1 cos a - v2 sin a, v1 sin a + v2 cos a), written out by hand."""
    c, s = math.cos(angle), math.sin(angle)
    return np.array([v[0] * c - v[1] * s, v[0] * s + v[1] * c])


def relative_score(theta: float, m: float, n: float, q, k) -> float:
    """q^T R_{n-m} k with an explicit 2x2 matrix."""
    a = (n - m) * theta
    matrix = np.array([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]])
    return float(np.asarray(q) @ matrix @ np.asarray(k))


def by_gid(fig: Figure, gid: str) -> list:
    return [artist for artist in fig.findobj() if artist.get_gid() == gid]


@pytest.mark.parametrize("theta, m, n, q, k", CASES)
def test_state_matches_independent_math(theta, m, n, q, k):
    state = plane_state(theta, m, n, q, k)
    np.testing.assert_allclose(state.q_rot, rotate(q, m * theta), rtol=0, atol=1e-12)
    np.testing.assert_allclose(state.k_rot, rotate(k, n * theta), rtol=0, atol=1e-12)
    assert state.dot == pytest.approx(relative_score(theta, m, n, q, k), abs=1e-12)
    z = complex(*q) * complex(*k).conjugate() * complex(math.cos((m - n) * theta),
                                                        math.sin((m - n) * theta))
    assert state.dot == pytest.approx(z.real, abs=1e-12)
    assert state.dot == pytest.approx(math.hypot(*q) * math.hypot(*k) * math.cos(state.angle),
                                      abs=1e-12)
    assert -math.pi < state.angle <= math.pi


@pytest.mark.parametrize("theta, m, n, q, k", CASES)
def test_rotation_agrees_with_apply_rope(theta, m, n, q, k):
    state = plane_state(theta, m, n, q, k)
    for vec, pos, drawn in ((q, m, state.q_rot), (k, n, state.k_rot)):
        table = torch.tensor([[pos * theta]], dtype=torch.float64)
        x = torch.tensor([vec], dtype=torch.float64)
        expected = apply_rope(x, torch.cos(table), torch.sin(table))[0].numpy()
        np.testing.assert_allclose(drawn, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("theta, m, n, q, k", CASES)
def test_drawn_arrows_end_at_rotated_coordinates(theta, m, n, q, k):
    fig = Figure()
    draw_rotation_plane(fig, theta, m, n, q=q, k=k)
    ends = {}
    for gid in ("q", "k", "q_rot", "k_rot"):
        (arrow,) = by_gid(fig, gid)
        assert isinstance(arrow, Annotation)
        assert arrow.xyann == pytest.approx((0.0, 0.0))  # every arrow starts at the origin
        ends[gid] = np.array(arrow.xy)
    np.testing.assert_allclose(ends["q"], q, atol=1e-12)
    np.testing.assert_allclose(ends["k"], k, atol=1e-12)
    np.testing.assert_allclose(ends["q_rot"], rotate(q, m * theta), atol=1e-12)
    np.testing.assert_allclose(ends["k_rot"], rotate(k, n * theta), atol=1e-12)


@pytest.mark.parametrize("theta, m, n, q, k", CASES)
def test_annotated_numbers_and_marks(theta, m, n, q, k):
    fig = Figure()
    draw_rotation_plane(fig, theta, m, n, q=q, k=k)
    expected = relative_score(theta, m, n, q, k)
    (text,) = by_gid(fig, "dot_text")
    shown = float(re.search(r"= (-?\d+\.\d+)$", text.get_text()).group(1))
    assert shown == pytest.approx(expected, abs=5e-4)
    (marker,) = by_gid(fig, "current_score")
    assert marker.get_xdata()[0] == m - n
    assert marker.get_ydata()[0] == pytest.approx(expected, abs=1e-12)
    (arc,) = by_gid(fig, "angle_arc")
    assert isinstance(arc, Arc)
    span = math.radians(arc.theta2 - arc.theta1)
    assert span == pytest.approx(abs(plane_state(theta, m, n, q, k).angle), abs=1e-9)


def test_score_curve_is_the_function_of_the_gap():
    fig = Figure()
    theta, q, k = 0.7, (0.9, -0.4), (0.3, 1.1)
    draw_rotation_plane(fig, theta, 4, 1, q=q, k=k, max_gap=6)
    (curve,) = by_gid(fig, "score_curve")
    gaps, values = curve.get_xdata(), curve.get_ydata()
    np.testing.assert_array_equal(gaps, np.arange(-6, 7))
    for gap, value in zip(gaps, values, strict=True):
        # the same value whatever m and n realize the gap
        assert value == pytest.approx(relative_score(theta, 10 + gap, 10, q, k), abs=1e-12)
        assert value == pytest.approx(plane_state(theta, gap, 0, q, k).dot, abs=1e-12)


@pytest.mark.parametrize("theta, m, n, q, k", CASES)
def test_current_gap_marker_lies_inside_the_score_panel(theta, m, n, q, k):
    fig = Figure()
    draw_rotation_plane(fig, theta, m, n, q=q, k=k)
    (marker,) = by_gid(fig, "current_score")
    low, high = fig.axes[1].get_xlim()
    assert low < marker.get_xdata()[0] < high
    bottom, top = fig.axes[1].get_ylim()
    assert bottom < marker.get_ydata()[0] < top


def test_score_panel_widens_only_for_a_gap_beyond_max_gap():
    fig = Figure()
    draw_rotation_plane(fig, 0.5, 12, 0, max_gap=12)  # at the edge: unchanged
    assert fig.axes[1].get_xlim() == (-12.5, 12.5)
    fig = Figure()
    draw_rotation_plane(fig, 0.5, 0, 20, max_gap=12)  # beyond: widened to 20
    assert fig.axes[1].get_xlim() == (-20.5, 20.5)
    (curve,) = by_gid(fig, "score_curve")
    np.testing.assert_array_equal(curve.get_xdata(), np.arange(-20, 21))


def test_dot_is_fixed_along_a_fixed_gap():
    dots = [plane_state(0.5, m, m - 3).dot for m in range(3, 40)]
    assert max(dots) - min(dots) < 1e-12
    assert plane_state(0.5, 4, 0).dot != pytest.approx(dots[0], abs=1e-3)


def test_scrubber_renders_every_frame():
    values = [3, 4, 5, 6]
    html = scrubber(lambda fig, m: draw_rotation_plane(fig, 0.5, m, m - 3), "m", values,
                    alt="q and k turning together", figsize=(4.0, 2.0)).data
    assert html.count("data:image/png;base64") == len(values)
    html = scrubber(partial(draw_rotation_plane, q=(1.0, 0.0), k=(0.0, 1.0)), "theta",
                    [0.0, 1.0, 2.0], fixed={"m": 2, "n": 1}, alt="theta sweeps",
                    figsize=(4.0, 2.0)).data
    assert html.count("data:image/png;base64") == 3


def test_live_slider_redraws_without_error():
    box = live_slider(partial(draw_rotation_plane, q=(1.0, 0.5)), figsize=(4.0, 2.0),
                      theta=(0.0, 3.1, 0.05, 0.5), m=(0, 12, 1, 5), n=(0, 12, 1, 2))
    controls = {c.description: c for c in box.children[0].children}
    assert set(controls) == {"theta", "m", "n"}
    controls["m"].value = 9
    controls["theta"].value = 1.25
    controls["n"].value = 0


@pytest.mark.parametrize("kwargs, match", [
    ({"q": (1.0, 2.0, 3.0)}, r"q must have shape \(2,\)"),
    ({"k": (1.0, float("nan"))}, "k must be finite"),
    ({"theta": float("inf")}, "theta must be finite"),
    ({"max_gap": 0}, "max_gap must be a positive int"),
])
def test_bad_arguments_raise_value_error(kwargs, match):
    args = {"theta": 0.5, "m": 1, "n": 0, **kwargs}
    with pytest.raises(ValueError, match=match):
        draw_rotation_plane(Figure(), **args)


def test_zero_vector_draws_a_flat_score():
    fig = Figure()
    state = draw_rotation_plane(fig, 0.5, 3, 1, q=(0.0, 0.0))
    assert state.dot == 0.0
    (curve,) = by_gid(fig, "score_curve")
    assert np.all(curve.get_ydata() == 0.0)
    assert fig.axes[1].get_ylim()[1] > 0


def test_non_number_raises_type_error():
    with pytest.raises(TypeError, match="m must be a real number"):
        plane_state(0.5, "3", 0)
    with pytest.raises(TypeError, match="q must be a 2-vector"):
        plane_state(0.5, 3, 0, q="ab")
