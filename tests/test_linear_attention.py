"""linear_attention: the O(N) forms against the quadratic form, RoPE on the numerator."""

from __future__ import annotations

import importlib

import pytest
import torch
from reference import angles, quadratic_linear_attention, rope_by_matrix, thetas

from ropelib import generate_rope_embeddings, linear_attention

F64 = torch.float64
# the module (ropelib.linear_attention is also the name of the function ropelib exports)
linear_attention_module = importlib.import_module("ropelib.linear_attention")


def qkv(shape, v_dim, device):
    *lead, n, d = shape
    q = torch.randn(*lead, n, d, dtype=F64, device=device)
    k = torch.randn(*lead, n, d, dtype=F64, device=device)
    v = torch.randn(*lead, n, v_dim, dtype=F64, device=device)
    return q, k, v


def matrix_rotation(positions, dim, layout):
    table = angles(positions, thetas(dim))
    return lambda t: rope_by_matrix(t, table, layout)


# (batch, heads, seq, dim) with heads != dim and heads == dim, 3-D and 2-D inputs
SHAPES = [(2, 3, 10, 8), (1, 8, 9, 8), (4, 13, 6), (11, 4)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
def test_equals_quadratic_form(shape, causal, device):
    q, k, v = qkv(shape, 5, device)
    out = linear_attention(q, k, v, causal=causal, chunk_size=4)
    expected = quadratic_linear_attention(q.cpu(), k.cpu(), v.cpu(), causal=causal)
    assert out.shape == v.shape and out.dtype == F64
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("causal", [False, True])
def test_with_rope_equals_quadratic_form(layout, causal, device):
    q, k, v = qkv((2, 3, 12, 8), 4, device)
    cos, sin = generate_rope_embeddings(12, 8, device=device, dtype=F64)
    out = linear_attention(q, k, v, rope=(cos, sin), layout=layout, causal=causal, chunk_size=5)
    rotate = matrix_rotation(torch.arange(12), 8, layout)
    expected = quadratic_linear_attention(q.cpu(), k.cpu(), v.cpu(), rotate=rotate, causal=causal)
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-10, atol=1e-10)
    plain = linear_attention(q, k, v, causal=causal)
    assert not torch.allclose(out, plain)  # the rotation does something


@pytest.mark.parametrize("causal", [False, True])
def test_per_batch_positions_follow_the_blocks(causal, device):
    """positions (batch, seq) are sliced block by block: each batch entry is rotated by its
    own positions, as in the quadratic form."""
    q, k, v = qkv((2, 3, 11, 8), 4, device)
    positions = torch.stack([torch.arange(11), torch.arange(11).flip(0) * 2 + 5]).to(device)
    cos, sin = generate_rope_embeddings(40, 8, device=device, dtype=F64)
    out = linear_attention(q, k, v, rope=(cos, sin), positions=positions, causal=causal,
                           chunk_size=4)
    for b in range(2):
        rotate = matrix_rotation(positions[b].cpu(), 8, "interleaved")
        expected = quadratic_linear_attention(q[b].cpu(), k[b].cpu(), v[b].cpu(), rotate=rotate,
                                              causal=causal)
        torch.testing.assert_close(out[b].cpu(), expected, rtol=1e-10, atol=1e-10)


CAUSAL_CASES = [(13, None, c) for c in (1, 2, 3, 7, 13, 64)] + [(23, 8, c) for c in (1, 3, 5)]


@pytest.mark.parametrize(("n", "stream_tokens", "chunk_size"), CAUSAL_CASES)
def test_causal_chunks_and_feature_blocks_agree(n, stream_tokens, chunk_size, monkeypatch, device):
    """Any chunk size, including ones that divide neither N nor the block of features (made
    about 8 tokens for N = 23, several blocks), gives the quadratic result."""
    if stream_tokens is not None:
        monkeypatch.setattr(linear_attention_module, "STREAM_TOKENS", stream_tokens)
    q, k, v = qkv((2, 3, n, 6), 3, device)
    cos, sin = generate_rope_embeddings(n, 6, device=device, dtype=F64)
    out = linear_attention(q, k, v, rope=(cos, sin), causal=True, chunk_size=chunk_size)
    rotate = matrix_rotation(torch.arange(n), 6, "interleaved")
    expected = quadratic_linear_attention(q.cpu(), k.cpu(), v.cpu(), rotate=rotate, causal=True)
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-10, atol=1e-10)


def test_causal_prefix_does_not_see_the_future(device):
    q, k, v = qkv((1, 2, 9, 4), 4, device)
    out = linear_attention(q, k, v, causal=True, chunk_size=4)
    v2 = v.clone()
    v2[..., 6:, :] += 100.0
    k2 = k.clone()
    k2[..., 6:, :] -= 3.0
    out2 = linear_attention(q, k2, v2, causal=True, chunk_size=4)
    torch.testing.assert_close(out2[..., :6, :], out[..., :6, :], rtol=1e-12, atol=1e-12)
    assert not torch.allclose(out2[..., 6:, :], out[..., 6:, :])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_rope_output_unchanged_by_shifting_all_positions(causal, layout, device):
    q, k, v = qkv((2, 2, 7, 8), 3, device)
    cos, sin = generate_rope_embeddings(1000, 8, device=device, dtype=F64)
    base = torch.arange(7, device=device)
    outs = [linear_attention(q, k, v, rope=(cos, sin), layout=layout, causal=causal,
                             positions=base + shift, chunk_size=3) for shift in (0, 1, 500, 990)]
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], rtol=1e-9, atol=1e-9)
    # while shifting only the queries' positions relative to the keys would change it
    scrambled = linear_attention(q, k, v, rope=(cos, sin), layout=layout, causal=causal,
                                 positions=base * 3, chunk_size=3)
    assert not torch.allclose(scrambled, outs[0])


@pytest.mark.parametrize("causal", [False, True])
def test_custom_feature_map_and_gradients(causal, device):
    q, k, v = qkv((1, 1, 6, 4), 2, device)
    q.requires_grad_()

    def feature_map(t):
        return torch.nn.functional.softplus(t) + 0.1

    out = linear_attention(q, k, v, feature_map=feature_map, causal=causal, chunk_size=4)
    expected = quadratic_linear_attention(q.detach().cpu(), k.cpu(), v.cpu(), causal=causal,
                                          feature_map=feature_map)
    torch.testing.assert_close(out.detach().cpu(), expected, rtol=1e-10, atol=1e-10)

    def f(q, k, v):
        return linear_attention(q, k, v, causal=causal, chunk_size=4, rope=(cos, sin))

    cos, sin = generate_rope_embeddings(6, 4, device=device, dtype=F64)

    assert torch.autograd.gradcheck(f, (q, k.requires_grad_(), v.requires_grad_()), fast_mode=True)
