"""Frequencies, cos/sin tables and RotaryEmbedding's cache."""

from __future__ import annotations

import pytest
import torch
from reference import angles, rope_by_matrix, thetas

from ropelib import RotaryEmbedding, apply_rope, generate_rope_embeddings, rope_frequencies

F64 = torch.float64


@pytest.mark.parametrize("dim,base", [(2, 10000.0), (64, 10000.0), (128, 500000.0), (10, 7.5)])
def test_rope_frequencies(dim, base):
    inv_freq = rope_frequencies(dim, base)
    assert inv_freq.shape == (dim // 2,) and inv_freq.dtype == torch.float32
    torch.testing.assert_close(inv_freq, thetas(dim, base).float(), rtol=1e-6, atol=0)
    torch.testing.assert_close(rope_frequencies(dim, base, dtype=F64), thetas(dim, base),
                               rtol=1e-14, atol=0)
    assert float(inv_freq[0]) == 1.0  # theta_0 = base^0


def test_generate_rope_embeddings_documented_call(device):
    cos, sin = generate_rope_embeddings(1024, 64, device=device)
    assert cos.shape == sin.shape == (1024, 32)
    assert cos.dtype == sin.dtype == torch.float32
    assert cos.device.type == device.type and sin.device.type == device.type
    ref = angles(torch.arange(1024), thetas(64))
    torch.testing.assert_close(cos.cpu().to(F64), ref.cos(), rtol=0, atol=1e-7)
    torch.testing.assert_close(sin.cpu().to(F64), ref.sin(), rtol=0, atol=1e-7)


def test_generate_rope_embeddings_float64_base_and_positions():
    cos, sin = generate_rope_embeddings(5, 8, 500.0, dtype=F64)
    ref = angles(torch.arange(5), thetas(8, 500.0))
    torch.testing.assert_close(cos, ref.cos(), rtol=0, atol=1e-14)
    torch.testing.assert_close(sin, ref.sin(), rtol=0, atol=1e-14)

    pos = torch.tensor([3, 100, 7])
    cos, sin = generate_rope_embeddings(3, 8, positions=pos, dtype=F64)
    ref = angles(pos, thetas(8))
    torch.testing.assert_close(cos, ref.cos(), rtol=0, atol=1e-14)
    torch.testing.assert_close(sin, ref.sin(), rtol=0, atol=1e-14)

    fpos = torch.tensor([0.5, 2.25])  # fractional positions are allowed here
    cos, _ = generate_rope_embeddings(2, 8, positions=fpos, dtype=F64)
    torch.testing.assert_close(cos, angles(fpos, thetas(8)).cos(), rtol=0, atol=1e-14)


@pytest.mark.parametrize("pos", [[-4], [-7, -1], [-3, 2]])
def test_negative_positions_give_the_rotation_by_a_negative_angle(pos):
    pos = torch.tensor(pos)
    cos, sin = generate_rope_embeddings(len(pos), 8, positions=pos, dtype=F64)
    ref = angles(pos, thetas(8))
    torch.testing.assert_close(cos, ref.cos(), rtol=0, atol=1e-14)
    torch.testing.assert_close(sin, ref.sin(), rtol=0, atol=1e-14)


def test_zero_length_table():
    cos, sin = generate_rope_embeddings(0, 8)
    assert cos.shape == sin.shape == (0, 4)


# --------------------------------------------------------------------------- RotaryEmbedding

def test_rotary_embedding_tables_match_reference(device):
    rot = RotaryEmbedding(16, base=1000.0, max_position_embeddings=32, device=device)
    assert rot.inv_freq.device.type == device.type
    torch.testing.assert_close(rot.inv_freq.cpu().to(F64), thetas(16, 1000.0), rtol=1e-6, atol=0)
    cos, sin = rot(10)
    assert cos.shape == (10, 8) and cos.device.type == device.type
    ref = angles(torch.arange(10), thetas(16, 1000.0))
    torch.testing.assert_close(cos.cpu().to(F64), ref.cos(), rtol=0, atol=1e-7)
    torch.testing.assert_close(sin.cpu().to(F64), ref.sin(), rtol=0, atol=1e-7)


def test_rotary_embedding_positions(device):
    rot = RotaryEmbedding(8, max_position_embeddings=4, device=device)
    pos = torch.tensor([[0, 9, 3], [2, 2, 40]], device=device)
    cos, sin = rot(positions=pos)
    assert cos.shape == (2, 3, 4)
    ref = angles(pos.cpu(), thetas(8))
    torch.testing.assert_close(cos.cpu().to(F64), ref.cos(), rtol=0, atol=1e-7)
    torch.testing.assert_close(sin.cpu().to(F64), ref.sin(), rtol=0, atol=1e-7)


def test_rotary_embedding_cache_grows_and_is_reused():
    rot = RotaryEmbedding(8, max_position_embeddings=16)
    assert rot.cached_len == 16
    cache = rot.cos_cached
    cos, _ = rot(10)
    assert rot.cos_cached is cache, "a shorter request must not recompute the cache"
    assert cos.data_ptr() == cache.data_ptr(), "a shorter request returns a view of the cache"
    rot(16)
    assert rot.cos_cached is cache

    rot(40)  # grows (at least to the request)
    assert rot.cached_len >= 40
    grown = rot.cos_cached
    assert grown is not cache
    for n in (1, 17, 40):  # shorter requests reuse the grown cache and never shrink it
        rot(n)
        assert rot.cos_cached is grown and rot.cached_len >= 40
    rot(positions=torch.tensor([3, 39]))
    assert rot.cos_cached is grown

    ref = angles(torch.arange(rot.cached_len), thetas(8))
    torch.testing.assert_close(rot.cos_cached.to(F64), ref.cos(), rtol=0, atol=1e-7)
    torch.testing.assert_close(rot.sin_cached.to(F64), ref.sin(), rtol=0, atol=1e-7)


def test_rotary_embedding_growth_is_amortised():
    """Growing one position at a time rebuilds the cache only O(log n) times."""
    rot = RotaryEmbedding(8, max_position_embeddings=4)
    rebuilds, last = 0, rot.cos_cached
    for n in range(1, 200):
        rot(n)
        if rot.cos_cached is not last:
            rebuilds, last = rebuilds + 1, rot.cos_cached
    assert rebuilds <= 7


def test_rotary_embedding_buffers_are_not_in_state_dict():
    rot = RotaryEmbedding(8)
    assert dict(rot.state_dict()) == {}


def test_rotary_embedding_tables_drive_apply_rope():
    rot = RotaryEmbedding(8, max_position_embeddings=4)
    x = torch.randn(2, 7, 8)
    cos, sin = rot.tables(7)  # may be longer than 7: apply_rope picks its rows
    expected = rope_by_matrix(x, angles(torch.arange(7), thetas(8)))
    torch.testing.assert_close(apply_rope(x, cos, sin).to(F64), expected, rtol=0, atol=1e-6)
