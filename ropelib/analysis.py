"""Pure functions behind the book's figures (float64 NumPy in, NumPy out)."""

from __future__ import annotations

import numpy as np

from ._checks import check_even_positive
from .scaling import default_frequencies


def decay_upper_bound(distance, head_dim: int, base: float = 10000.0) -> np.ndarray:
    """RoFormer's long-term-decay quantity (section 3.4.3).

    With S_j = sum_{k < j} exp(i * distance * theta_k), the bound on the relative score is
    proportional to (1 / (d/2)) * sum_{j=1}^{d/2} |S_j|. At distance 0 every term is 1, so the
    value is (d/2 + 1) / 2 (32.5 for d = 128).

    Args:
        distance: relative distance(s) m - n, scalar or array.
        head_dim: d (even).
        base: RoPE base.

    Returns:
        Array of the shape of ``distance``.
    """
    check_even_positive("head_dim", head_dim)
    theta = default_frequencies(head_dim, base).numpy()
    distance = np.asarray(distance, dtype=np.float64)
    phases = np.exp(1j * distance[..., None] * theta)
    partial_sums = np.cumsum(phases, axis=-1)
    return np.abs(partial_sums).mean(axis=-1)
