"""The rotation R_{Theta,m} written out as a matrix, for chapters that reason with it.

RoFormer's eq. (15): a (d, d) block-diagonal matrix whose block i rotates the channels
(2i, 2i+1) (the interleaved layout) by the angle m * theta_i, theta_i = base^(-2i/d).
``apply_rope`` never builds it; the chapters use it as the explicit reference.
"""

from __future__ import annotations

import math

import torch


def rotary_matrix(position: float, dim: int, base: float = 10000.0) -> torch.Tensor:
    """R_{Theta,position}, shape ``(dim, dim)``, float64, interleaved pairs.

    ``rotary_matrix(m, d) @ x`` rotates a vector ``x`` of shape ``(d,)`` at position m;
    ``rotary_matrix(m, d).T @ rotary_matrix(n, d)`` equals ``rotary_matrix(n - m, d)``.
    """
    if isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0 or dim % 2:
        raise ValueError(f"dim must be a positive even int (the head size), got {dim!r}")
    if not math.isfinite(position):
        raise ValueError(f"position must be a finite number, got {position!r}")
    if not base > 0 or not math.isfinite(base):
        raise ValueError(f"base must be a finite number > 0, got {base!r}")
    R = torch.zeros(dim, dim, dtype=torch.float64)
    for i in range(dim // 2):
        angle = position * base ** (-2 * i / dim)
        c, s = math.cos(angle), math.sin(angle)
        R[2 * i, 2 * i], R[2 * i, 2 * i + 1] = c, -s
        R[2 * i + 1, 2 * i], R[2 * i + 1, 2 * i + 1] = s, c
    return R
