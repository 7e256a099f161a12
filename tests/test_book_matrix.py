"""ropelib.book.rotary_matrix against RoFormer's block-diagonal matrix built from 2x2 blocks,
and against apply_rope applied to the unit vectors."""

from __future__ import annotations

import math

import pytest
import torch

from ropelib import apply_rope, generate_rope_embeddings
from ropelib.book.matrix import rotary_matrix


def _block(angle: float) -> torch.Tensor:
    return torch.tensor([[math.cos(angle), -math.sin(angle)],
                         [math.sin(angle), math.cos(angle)]], dtype=torch.float64)


@pytest.mark.parametrize("position", [0, 1, 7, -3, 2.5])
def test_rotary_matrix_is_the_block_diagonal_of_2x2_rotations(position):
    d, base = 8, 500.0
    expected = torch.block_diag(*[_block(position * base ** (-2 * i / d)) for i in range(d // 2)])
    assert torch.allclose(rotary_matrix(position, d, base), expected, rtol=0, atol=1e-15)


def test_rotary_matrix_equals_apply_rope_on_the_unit_vectors():
    d, m = 16, 11
    cos, sin = generate_rope_embeddings(m + 1, d, dtype=torch.float64)
    eye = torch.eye(d, dtype=torch.float64)
    columns = apply_rope(eye[:, None], cos[m:m + 1], sin[m:m + 1], layout="interleaved")[:, 0]
    assert torch.allclose(rotary_matrix(m, d), columns.T, rtol=0, atol=1e-14)


def test_relative_property():
    d = 6
    assert torch.allclose(rotary_matrix(3, d).T @ rotary_matrix(10, d), rotary_matrix(7, d),
                          rtol=0, atol=1e-13)


@pytest.mark.parametrize("dim", [0, 3, -2, 4.0, True])
def test_bad_dim_is_named(dim):
    with pytest.raises(ValueError, match="dim must be a positive even int"):
        rotary_matrix(1, dim)


def test_bad_position_and_base_are_named():
    with pytest.raises(ValueError, match="position must be a finite number"):
        rotary_matrix(float("nan"), 4)
    with pytest.raises(ValueError, match="base must be a finite number > 0"):
        rotary_matrix(1, 4, base=0.0)
