"""ropelib.analysis: RoFormer's long-term-decay quantity."""

from __future__ import annotations

import cmath

import numpy as np
import pytest

from ropelib.analysis import decay_upper_bound


def decay_reference(distance: float, head_dim: int, base: float = 10000.0) -> float:
    """(1 / (d/2)) * sum_{j=1}^{d/2} |sum_{k<j} exp(i * distance * theta_k)|, with plain loops."""
    half = head_dim // 2
    total = 0.0
    for j in range(1, half + 1):
        s = sum(cmath.exp(1j * distance * base ** (-2.0 * k / head_dim)) for k in range(j))
        total += abs(s)
    return total / half


def test_decay_bound_at_distance_zero_is_exactly_32_5():
    assert decay_upper_bound(0, 128) == 32.5
    assert decay_upper_bound(0, 64) == 16.5  # (d/2 + 1) / 2


@pytest.mark.parametrize("head_dim,base", [(128, 10000.0), (16, 10000.0), (64, 500000.0)])
def test_decay_bound_matches_loop_reference(head_dim, base):
    distances = np.array([0.0, 1.0, 7.0, 50.0, 1234.0, -30.0])
    values = decay_upper_bound(distances, head_dim, base)
    assert values.shape == distances.shape
    expected = [decay_reference(float(r), head_dim, base) for r in distances]
    np.testing.assert_allclose(values, expected, rtol=1e-10, atol=1e-12)


def test_decay_bound_shape_symmetry_and_decay():
    grid = np.arange(0, 2001).reshape(3, 667)
    values = decay_upper_bound(grid, 128)
    assert values.shape == (3, 667)
    assert np.all(values <= 32.5 + 1e-12)  # |S_j| <= j (triangle inequality)
    np.testing.assert_allclose(decay_upper_bound(-grid, 128), values, rtol=1e-12, atol=1e-12)
    flat = values.ravel()
    assert flat[1000:].max() < 0.5 * flat[0]  # the long-term decay the paper plots
