"""apply_rope against RoFormer's block-diagonal matrix, HF's rotate_half and Meta's complex form."""

from __future__ import annotations

import contextlib
import math
import weakref

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from reference import (
    angles,
    backend_name,
    hf_apply_rotary,
    meta_apply_rotary,
    repeat_last_row,
    rope_by_matrix,
    rope_by_pairs,
    rotation_matrix,
    thetas,
)

from ropelib import RotaryEmbedding, apply_rope, apply_rope_qk, generate_rope_embeddings, native

# Every test here runs twice: with the compiled CPU kernel and with the eager paths.
pytestmark = pytest.mark.usefixtures("backend")

F64 = torch.float64
LAYOUTS = ["interleaved", "half"]

even_dims = st.integers(1, 12).map(lambda n: 2 * n)
bases = st.floats(2.0, 1e6)
layouts = st.sampled_from(LAYOUTS)


def tables64(length: int, dim: int, base: float = 10000.0, device=None):
    return generate_rope_embeddings(length, dim, base, device, dtype=F64)


def ref_angles(length: int, dim: int, base: float = 10000.0, start: int = 0) -> torch.Tensor:
    return angles(torch.arange(start, start + length), thetas(dim, base))


# --------------------------------------------------------------------------- exactness

@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("rotary_dim", [None, 8, 2])
def test_equals_block_diagonal_matrix(layout, rotary_dim, device):
    head_dim, seq = 16, 7
    rd = rotary_dim or head_dim
    x = torch.randn(2, 3, seq, head_dim, dtype=F64, device=device)
    cos, sin = tables64(seq, rd, device=device)
    out = apply_rope(x, cos, sin, layout=layout, rotary_dim=rotary_dim)
    expected = rope_by_matrix(x.cpu(), ref_angles(seq, rd), layout)
    assert out.shape == x.shape and out.dtype == x.dtype and out.device == x.device
    torch.testing.assert_close(out.cpu(), expected, rtol=0, atol=1e-12)
    if rotary_dim is not None:  # pass-through channels are untouched, bit for bit
        assert torch.equal(out[..., rd:], x[..., rd:])


@given(dim=even_dims, seq=st.integers(1, 6), base=bases, start=st.integers(0, 5000),
       layout=layouts, seed=st.integers(0, 2**31 - 1))
def test_equals_block_diagonal_matrix_property(dim, seq, base, start, layout, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, seq, dim, dtype=F64, generator=gen)
    cos, sin = tables64(start + seq, dim, base)
    out = apply_rope(x, cos, sin, layout=layout, offset=start)
    expected = rope_by_matrix(x, ref_angles(seq, dim, base, start), layout)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize("rotary_dim", [None, 6])
def test_half_layout_equals_hf_rotate_half(rotary_dim, device):
    x = torch.randn(2, 4, 9, 12, dtype=F64, device=device)
    rd = rotary_dim or 12
    cos, sin = tables64(9, rd, device=device)
    out = apply_rope(x, cos, sin, layout="half", rotary_dim=rotary_dim)
    torch.testing.assert_close(out.cpu(), hf_apply_rotary(x.cpu(), ref_angles(9, rd)),
                               rtol=0, atol=1e-12)


def test_interleaved_layout_equals_meta_complex(device):
    x = torch.randn(2, 9, 4, 12, dtype=F64, device=device)  # Meta's (B, S, H, d)
    cos, sin = tables64(9, 12, device=device)
    out = apply_rope(x.transpose(1, 2), cos, sin, layout="interleaved").transpose(1, 2)
    torch.testing.assert_close(out.cpu(), meta_apply_rotary(x.cpu(), ref_angles(9, 12)),
                               rtol=0, atol=1e-12)


def test_does_not_modify_input_and_accepts_non_contiguous():
    x = torch.randn(2, 9, 4, 8)  # (B, S, H, d) viewed as (B, H, S, d): not contiguous
    before = x.clone()
    cos, sin = generate_rope_embeddings(9, 8)
    xt = x.transpose(1, 2)
    out = apply_rope(xt, cos, sin)
    assert torch.equal(x, before)
    torch.testing.assert_close(out, apply_rope(xt.contiguous(), cos, sin), rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------- properties

@given(dim=even_dims, seq=st.integers(1, 8), batch=st.integers(1, 3), base=bases,
       start=st.integers(0, 10000), layout=layouts, seed=st.integers(0, 2**31 - 1))
def test_rotation_preserves_norms(dim, seq, batch, base, start, layout, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, seq, dim, dtype=F64, generator=gen)
    cos, sin = tables64(start + seq, dim, base)
    out = apply_rope(x, cos, sin, layout=layout, offset=start)
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1), rtol=1e-12, atol=1e-12)
    # and pair by pair: each 2-D pair keeps its own length
    if layout == "interleaved":
        pairs_in, pairs_out = x.unflatten(-1, (dim // 2, 2)), out.unflatten(-1, (dim // 2, 2))
    else:
        pairs_in = torch.stack(x.chunk(2, dim=-1), dim=-1)
        pairs_out = torch.stack(out.chunk(2, dim=-1), dim=-1)
    torch.testing.assert_close(pairs_out.norm(dim=-1), pairs_in.norm(dim=-1),
                               rtol=1e-12, atol=1e-12)


@given(dim=even_dims, base=bases, m=st.integers(0, 3000), n=st.integers(0, 3000),
       shift=st.integers(0, 3000), layout=layouts, seed=st.integers(0, 2**31 - 1))
def test_score_depends_only_on_relative_position(dim, base, m, n, shift, layout, seed):
    """<R_m q, R_n k> = q^T R_{n-m} k, hence unchanged when m and n move together."""
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 1, dim, dtype=F64, generator=gen)
    cos, sin = tables64(max(m, n) + shift + 1, dim, base)

    def score(pm: int, pn: int) -> torch.Tensor:
        rq = apply_rope(q, cos, sin, layout=layout, positions=torch.tensor([pm]))
        rk = apply_rope(k, cos, sin, layout=layout, positions=torch.tensor([pn]))
        return (rq * rk).sum()

    relative = rotation_matrix((n - m) * thetas(dim, base), dim, layout)
    expected = q[0] @ relative @ k[0]
    torch.testing.assert_close(score(m, n), expected, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(score(m + shift, n + shift), expected, rtol=1e-9, atol=1e-9)


# --------------------------------------------------------------------------- positions, offset

@pytest.mark.parametrize("layout", LAYOUTS)
def test_offset_equals_slicing_the_full_result(layout, device):
    x = torch.randn(2, 3, 20, 8, device=device)
    cos, sin = generate_rope_embeddings(20, 8, device=device)
    full = apply_rope(x, cos, sin, layout=layout)
    for start, length in [(0, 5), (7, 1), (13, 7)]:
        part = apply_rope(x[..., start:start + length, :], cos, sin, layout=layout, offset=start)
        torch.testing.assert_close(part, full[..., start:start + length, :], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_positions_equal_slicing_the_full_result(layout, device):
    x = torch.randn(2, 3, 20, 8, device=device)
    cos, sin = generate_rope_embeddings(20, 8, device=device)
    full = apply_rope(x, cos, sin, layout=layout)
    tol = {"rtol": 1e-6, "atol": 1e-6}

    pos = torch.tensor([5, 2, 19, 2, 0], device=device)  # 1-D: any order, repeats allowed
    out = apply_rope(x[..., pos, :], cos, sin, layout=layout, positions=pos)
    torch.testing.assert_close(out, full[..., pos, :], **tol)

    pos2 = torch.tensor([[0, 1, 2, 3], [11, 12, 13, 14]], device=device)  # (batch, seq)
    xb = torch.stack([x[b][:, pos2[b], :] for b in range(2)])
    out = apply_rope(xb, cos, sin, layout=layout, positions=pos2)
    torch.testing.assert_close(out, torch.stack([full[b][:, pos2[b], :] for b in range(2)]), **tol)

    pos1 = pos2[1:]  # (1, seq) broadcasts over the batch
    out = apply_rope(x[..., pos1[0], :], cos, sin, layout=layout, positions=pos1)
    torch.testing.assert_close(out, full[..., pos1[0], :], **tol)


def test_per_batch_positions_with_5d_input():
    """(batch, seq) positions broadcast over every dim between batch and seq."""
    x = torch.randn(2, 3, 2, 4, 8, dtype=F64)
    cos, sin = tables64(10, 8)
    pos = torch.tensor([[0, 1, 2, 3], [6, 7, 8, 9]])
    out = apply_rope(x, cos, sin, positions=pos)
    expected = rope_by_matrix(x, angles(pos, thetas(8)), "interleaved")
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)


def test_gathered_tables_are_accepted():
    x = torch.randn(2, 3, 5, 8, dtype=F64)
    cos, sin = tables64(5, 8)
    out = apply_rope(x, cos[None, None], sin[None, None])
    torch.testing.assert_close(out, rope_by_matrix(x, ref_angles(5, 8)), rtol=0, atol=1e-12)


def test_short_table_repeat_last_reproduces_the_original_module():
    """The opt-in legacy mode pads the table by repeating its last row, as the original did."""
    x = torch.randn(1, 2, 9, 8, dtype=F64)
    cos, sin = tables64(5, 8)
    legacy = rope_by_matrix(x, repeat_last_row(ref_angles(5, 8), 9))
    torch.testing.assert_close(apply_rope(x, cos, sin, short_table="repeat_last"), legacy,
                               rtol=0, atol=1e-12)
    pos = torch.arange(9)
    torch.testing.assert_close(apply_rope(x, cos, sin, positions=pos, short_table="repeat_last"),
                               legacy, rtol=0, atol=1e-12)
    # what it destroys: positions 5..8 all rotate like position 4
    rows = apply_rope(x[..., :1, :].expand(1, 2, 9, 8), cos, sin, short_table="repeat_last")
    assert torch.equal(rows[..., 4, :], rows[..., 8, :])


# --------------------------------------------------------------------------- dtypes, precision

TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 8e-2}


@pytest.mark.parametrize("dtype", list(TOLERANCE))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_dtypes(dtype, layout, device):
    x = torch.randn(2, 3, 11, 16, device=device).to(dtype)
    table_dtype = F64 if dtype == F64 else torch.float32  # float64 math wants float64 tables
    cos, sin = generate_rope_embeddings(11, 16, device=device, dtype=table_dtype)
    out = apply_rope(x, cos, sin, layout=layout)
    assert out.dtype == dtype and out.device == x.device and out.shape == x.shape
    expected = rope_by_matrix(x.cpu().to(F64), ref_angles(11, 16), layout)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.cpu().to(F64), expected, rtol=tol, atol=tol)


def bf16_ulp(t: torch.Tensor) -> torch.Tensor:
    """Spacing of bfloat16 numbers at |t| (8 significant bits): 2^(floor(log2|t|) - 7)."""
    return torch.exp2(torch.floor(torch.log2(t.abs().clamp_min(2.0 ** -100))) - 7)


def pair_radius(x: torch.Tensor, layout: str) -> torch.Tensor:
    """|(a, b)| of the pair every channel belongs to, same shape as x (rotation keeps it)."""
    if layout == "interleaved":
        return x.unflatten(-1, (x.shape[-1] // 2, 2)).norm(dim=-1).repeat_interleave(2, dim=-1)
    r = torch.stack(x.chunk(2, dim=-1), dim=-1).norm(dim=-1)
    return torch.cat([r, r], dim=-1)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_bfloat16_at_position_60000_is_rounding_accurate(layout, device):
    start, seq, dim = 59_995, 10, 64
    x = torch.randn(2, 4, seq, dim, device=device).to(torch.bfloat16)
    cos, sin = generate_rope_embeddings(start + seq, dim, device=device)
    out = apply_rope(x, cos, sin, layout=layout, offset=start)
    x64 = x.cpu().to(F64)
    exact = rope_by_matrix(x64, ref_angles(seq, dim, start=start), layout)
    err = (out.cpu().to(F64) - exact).abs()
    # Each output channel lies on its pair's circle of radius r; rounding it to bf16 costs up
    # to half a bf16 ulp at r. Allow 2 ulps (cos/sin are rounded to bf16 before use too).
    assert (err <= 2 * bf16_ulp(pair_radius(x64, layout))).all()
    rounding = (exact.to(torch.bfloat16).to(F64) - exact).abs()  # the best bf16 output can do
    assert err.max() <= 3 * rounding.max()

    # The test can fail: angles computed in bfloat16 are far off at this position.
    pos_bf16 = torch.arange(start, start + seq).to(torch.bfloat16)
    bad_angles = (pos_bf16[:, None] * thetas(dim).to(torch.bfloat16)).to(F64)
    wrong = rope_by_matrix(x.cpu().to(F64), bad_angles, layout)
    assert (wrong - exact).abs().max() > 0.1


def test_rotary_embedding_tables_at_60000_are_float32_accurate():
    rot = RotaryEmbedding(64, max_position_embeddings=8)
    cos, sin = rot(positions=torch.tensor([60_000, 59_999]))
    ref = angles(torch.tensor([60_000, 59_999]), thetas(64))
    assert cos.dtype == torch.float32
    torch.testing.assert_close(cos.to(F64), ref.cos(), rtol=0, atol=1e-7)
    torch.testing.assert_close(sin.to(F64), ref.sin(), rtol=0, atol=1e-7)


def test_autocast_does_not_lower_angle_precision(device):
    pos = torch.tensor([60_000, 12_345, 257])
    ref = angles(pos, thetas(64))
    x = torch.randn(1, 2, 3, 64, device=device)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        cos, sin = generate_rope_embeddings(60_001, 64, device=device)
        rot = RotaryEmbedding(64, max_position_embeddings=4, device=device)
        rcos, rsin = rot(positions=pos.to(device))
        out = apply_rope(x, cos, sin, positions=pos.to(device))
    for c, s in ((cos[pos.to(device)], sin[pos.to(device)]), (rcos, rsin)):
        assert c.dtype == torch.float32
        torch.testing.assert_close(c.cpu().to(F64), ref.cos(), rtol=0, atol=1e-7)
        torch.testing.assert_close(s.cpu().to(F64), ref.sin(), rtol=0, atol=1e-7)
    assert out.dtype == torch.float32
    expected = rope_by_matrix(x.cpu().to(F64), ref, "interleaved")
    torch.testing.assert_close(out.cpu().to(F64), expected, rtol=0, atol=1e-5)


# --------------------------------------------------------------------------- gradients

@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("rotary_dim", [None, 4])
def test_gradcheck_wrt_x_cos_sin(layout, rotary_dim, device):
    rd = rotary_dim or 6
    x = torch.randn(2, 3, 6, dtype=F64, device=device, requires_grad=True)
    cos, sin = (t.clone().requires_grad_() for t in tables64(5, rd, device=device))

    def f(x, cos, sin):
        return apply_rope(x, cos, sin, layout=layout, rotary_dim=rotary_dim, offset=2)

    assert torch.autograd.gradcheck(f, (x, cos, sin))
    assert torch.autograd.gradgradcheck(f, (x, cos, sin))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("positions", [None, [[4, 0, 2], [1, 3, 3]]])
def test_gradcheck_of_q_and_k_with_trainable_tables(layout, positions, device):
    """apply_rope_qk with q, k, cos and sin all recording autograd: the operator's one
    gradient formula (the inverse rotation for q and k, the tables' grads of q's and k's
    pairs summed) against finite differences, also twice (double backward)."""
    q = torch.randn(2, 3, 3, 8, dtype=F64, device=device, requires_grad=True)
    k = torch.randn(2, 1, 3, 8, dtype=F64, device=device, requires_grad=True)
    cos, sin = (t.clone().requires_grad_() for t in tables64(5, 8, device=device))
    where = {} if positions is None else {"positions": torch.tensor(positions, device=device)}

    def f(q, k, cos, sin):
        return apply_rope_qk(q, k, cos, sin, layout=layout, **where)

    assert torch.autograd.gradcheck(f, (q, k, cos, sin))
    assert torch.autograd.gradgradcheck(f, (q, k, cos, sin))


def test_gradcheck_with_per_batch_positions_and_gathered_tables(device):
    x = torch.randn(2, 2, 3, 4, dtype=F64, device=device, requires_grad=True)
    cos, sin = (t.clone().requires_grad_() for t in tables64(6, 4, device=device))
    pos = torch.tensor([[0, 1, 2], [3, 5, 4]], device=device)

    def by_positions(x, cos, sin):
        return apply_rope(x, cos, sin, layout="half", positions=pos)

    def gathered(x, cos, sin):  # (1, 1, seq, d/2) rows: the gradient is summed over broadcasts
        return apply_rope(x, cos[None, None, 1:4], sin[None, None, 1:4])

    for f in (by_positions, gathered):
        assert torch.autograd.gradcheck(f, (x, cos, sin))
        assert torch.autograd.gradgradcheck(f, (x, cos, sin))


def test_gradient_is_the_inverse_rotation():
    x = torch.randn(3, 8, dtype=F64, requires_grad=True)
    g = torch.randn(3, 8, dtype=F64)
    cos, sin = tables64(3, 8)
    apply_rope(x, cos, sin).backward(g)
    ref = ref_angles(3, 8)
    expected = torch.stack([rotation_matrix(ref[m], 8).T @ g[m] for m in range(3)])
    torch.testing.assert_close(x.grad, expected, rtol=0, atol=1e-12)
    assert math.isclose(float(x.grad.norm()), float(g.norm()), rel_tol=1e-12)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("rotary_dim", [None, 4])
def test_gradients_with_constant_tables(layout, rotary_dim, device):
    """The usual training step: only x requires grad, the 2-D tables are constants (the
    kernel's memoized calls on CPU). Checked against finite differences, twice differentiated,
    and against the float64 inverse rotation for gradients of other strides, first call and
    memoized call alike."""
    rd = rotary_dim or 6
    x = torch.randn(2, 3, 6, dtype=F64, device=device, requires_grad=True)
    cos, sin = tables64(5, rd, device=device)

    def f(x):
        return apply_rope(x, cos, sin, layout=layout, rotary_dim=rotary_dim, offset=2)

    assert torch.autograd.gradcheck(f, (x,))
    assert torch.autograd.gradgradcheck(f, (x,))
    contiguous = torch.randn(2, 3, 6, dtype=F64, device=device)
    transposed = torch.randn(3, 2, 6, dtype=F64, device=device).transpose(0, 1)
    no_channel_stride = torch.randn(2, 3, 1, dtype=F64, device=device).expand(2, 3, 6)
    for g in (contiguous, transposed, transposed, no_channel_stride):
        x.grad = None
        f(x).backward(g)
        expected = rope_by_pairs(g[..., :rd], -ref_angles(3, rd, start=2), layout)
        expected = torch.cat((expected, g[..., rd:].cpu()), -1)
        torch.testing.assert_close(x.grad.cpu(), expected, rtol=0, atol=1e-12)


def test_editing_a_table_before_backward_raises():
    """The backward rotates by the tables of the forward: a table changed in between is an
    error, not a silently wrong gradient."""
    x = torch.randn(2, 4, 8, requires_grad=True)
    cos, sin = generate_rope_embeddings(4, 8)
    y = apply_rope(x, cos, sin)
    sin.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_backward_keeps_x_only_when_the_tables_need_it():
    """The input of the rotation (q or k before RoPE) is not held for the backward unless
    the grads of cos/sin need it: no extra activation memory in a usual training step."""
    cos, sin = generate_rope_embeddings(6, 8)
    leaf = torch.randn(2, 6, 8, requires_grad=True)
    for tables_need_grad in (False, True):
        cos_, sin_ = cos.clone().requires_grad_(tables_need_grad), sin.clone()
        x = leaf * 2.0  # an intermediate that only the rotation could keep alive
        alive = weakref.ref(x)
        y = apply_rope(x, cos_, sin_, layout="half")
        del x
        assert (alive() is not None) == tables_need_grad
        y.sum().backward()
        expected = 2.0 * rope_by_pairs(torch.ones(2, 6, 8, dtype=F64), -ref_angles(6, 8), "half")
        torch.testing.assert_close(leaf.grad.to(F64), expected, rtol=1e-6, atol=1e-6)
        leaf.grad = None


# --------------------------------------------------------------------------- fast paths

# Shapes of a few MiB: many sequences, long sequences, bfloat16, partial rotation.
BIG_CASES = {
    "many_sequences": ((2, 64, 64, 64), torch.float32, None, 0),
    "long_sequence": ((1, 1, 2048, 128), torch.float32, None, 100),
    "bf16": ((1, 2, 1100, 128), torch.bfloat16, None, 7),
    "partial_rotary": ((1, 2, 1100, 128), torch.float32, 64, 3),
}


@pytest.mark.parametrize("case", list(BIG_CASES))
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("where", ["new", "out", "in_place"])
def test_large_inputs_all_output_modes(case, layout, where, device):
    shape, dtype, rotary_dim, start = BIG_CASES[case]
    seq, rd = shape[-2], rotary_dim or shape[-1]
    x = torch.randn(shape, device=device).to(dtype)
    expected = rope_by_pairs(x, ref_angles(seq, rd, start=start), layout)
    cos, sin = generate_rope_embeddings(start + seq, rd, device=device)
    kw = {"layout": layout, "rotary_dim": rotary_dim, "offset": start}
    if where == "new":
        result = apply_rope(x, cos, sin, **kw)
    elif where == "out":
        buffer = torch.full_like(x, float("nan"))
        result = apply_rope(x, cos, sin, out=buffer, **kw)
        assert result is buffer
    else:
        original = x.clone()
        result = apply_rope(x, cos, sin, out=x, **kw)
        assert result is x
        x = original
    assert result.dtype == dtype and result.shape == x.shape
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(result.cpu().to(F64), expected, rtol=tol, atol=tol)
    if rotary_dim is not None:
        assert torch.equal(result[..., rd:], x[..., rd:])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_small_out_and_in_place(dtype, layout, device):
    x = torch.randn(2, 3, 5, 8, device=device).to(dtype)
    cos, sin = generate_rope_embeddings(5, 8, device=device)
    expected = rope_by_matrix(x.cpu().to(F64), ref_angles(5, 8), layout)
    tol = TOLERANCE[dtype] if dtype != F64 else 1e-7  # float32 tables
    buffer = torch.empty_like(x)
    assert apply_rope(x, cos, sin, layout=layout, out=buffer) is buffer
    torch.testing.assert_close(buffer.cpu().to(F64), expected, rtol=tol, atol=tol)
    y = x.clone()
    with torch.no_grad():
        assert apply_rope(y, cos, sin, layout=layout, out=y) is y
    torch.testing.assert_close(y.cpu().to(F64), expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_strided_inputs_that_cannot_be_viewed_as_complex(layout):
    big = torch.randn(2, 5, 9, dtype=F64)
    x = big[..., 1:]  # odd storage offset and odd row stride
    cos, sin = tables64(5, 8)
    out = apply_rope(x, cos, sin, layout=layout)
    assert out.is_contiguous()
    torch.testing.assert_close(out, rope_by_matrix(x, ref_angles(5, 8), layout), rtol=0, atol=1e-12)
    expanded = torch.randn(1, 5, 8, dtype=F64).expand(3, 5, 8)  # stride 0 over the batch
    out = apply_rope(expanded, cos, sin, layout=layout)
    torch.testing.assert_close(out, rope_by_matrix(expanded, ref_angles(5, 8), layout),
                               rtol=0, atol=1e-12)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_backward_with_an_expanded_gradient(layout):
    """out.sum() sends back a stride-0 gradient of ones; it must be rotated back correctly."""
    x = torch.randn(4, 6, dtype=F64, requires_grad=True)
    cos, sin = tables64(4, 6)
    apply_rope(x, cos, sin, layout=layout).sum().backward()
    ref = ref_angles(4, 6)
    expected = torch.stack([rotation_matrix(ref[m], 6, layout).T @ torch.ones(6, dtype=F64)
                            for m in range(4)])
    torch.testing.assert_close(x.grad, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_memoized_tables_follow_the_tables(layout, dtype):
    """apply_rope memoizes prepared tables on cos: editing a table in place, or pairing cos
    with another sin, must give the same result as fresh tables."""
    x = torch.randn(2, 3, 8, 16).to(dtype)
    cos, sin = generate_rope_embeddings(8, 16)
    apply_rope(x, cos, sin, layout=layout)
    new_cos, new_sin = generate_rope_embeddings(8, 16, base=500.0)
    cos.copy_(new_cos)
    sin.copy_(new_sin)
    expected = apply_rope(x, new_cos.clone(), new_sin.clone(), layout=layout)
    torch.testing.assert_close(apply_rope(x, cos, sin, layout=layout), expected, rtol=0, atol=0)
    other_sin = -sin
    expected = apply_rope(x, cos.clone(), other_sin.clone(), layout=layout)
    torch.testing.assert_close(apply_rope(x, cos, other_sin, layout=layout), expected,
                               rtol=0, atol=0)
    assert not torch.equal(expected, apply_rope(x, cos, sin, layout=layout))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_repeated_calls_check_what_can_change(layout):
    """Calls like an earlier one (decoding): everything that may differ from the earlier call
    is still checked: the first position, grad mode, the kernel switch."""
    x = torch.randn(2, 3, 1, 8)
    cos, sin = tables64(6, 8)
    cos32, sin32 = cos.float(), sin.float()
    for offset in range(6):  # decoding: one position at a time
        result = apply_rope(x, cos32, sin32, layout=layout, offset=offset)
        expected = rope_by_pairs(x.to(F64), ref_angles(1, 8, start=offset), layout)
        torch.testing.assert_close(result.to(F64), expected, rtol=1e-6, atol=1e-6)
    view = torch.randn(2, 1, 3, 8).transpose(1, 2)  # x's shape, other strides
    torch.testing.assert_close(apply_rope(view, cos32, sin32, layout=layout, offset=4).to(F64),
                               rope_by_pairs(view.to(F64), ref_angles(1, 8, start=4), layout),
                               rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="positions 6..6 need 7"):
        apply_rope(x, cos32, sin32, layout=layout, offset=6)
    with pytest.raises(ValueError, match="offset must be a non-negative int, got -1"):
        apply_rope(x, cos32, sin32, layout=layout, offset=-1)
    last = apply_rope(x, cos32, sin32, layout=layout, offset=9, short_table="repeat_last")
    torch.testing.assert_close(last, apply_rope(x, cos32, sin32, layout=layout, offset=5))
    xg = x.clone().requires_grad_()
    y = apply_rope(xg, cos32, sin32, layout=layout, offset=2)
    assert y.requires_grad
    y.sum().backward()
    assert xg.grad is not None
    previous = native.set_enabled(False)
    try:
        assert backend_name(x, 8) != "native"
        eager = apply_rope(x, cos32, sin32, layout=layout, offset=3)
    finally:
        native.set_enabled(previous)
    torch.testing.assert_close(eager, apply_rope(x, cos32, sin32, layout=layout, offset=3))


@pytest.mark.parametrize("route", ["eager training node", "operator", "torch.func"])
@pytest.mark.parametrize("records", ["q", "k"])
def test_qk_only_the_tensor_that_records_gives_an_output_that_does(route, records):
    """apply_rope_qk with only q (or only k) recording autograd: the other output records
    nothing, as apply_rope of that tensor alone does, and the gradient of the one that
    records is apply_rope's. Routes: the eager training node, the registered operator (under
    a dispatch mode), the composite under a torch.func transform."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from ropelib import apply_rope_qk

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    cos, sin = generate_rope_embeddings(6, 8)
    q, k = torch.randn(2, 4, 6, 8), torch.randn(2, 2, 6, 8)
    leaf = (q if records == "q" else k).requires_grad_()
    grad = torch.randn_like(leaf)

    def rotate(q, k):
        return apply_rope_qk(q, k, cos, sin, layout="half")

    if route == "torch.func":
        def loss(t):
            q_rot, k_rot = rotate(t, k) if records == "q" else rotate(q, t)
            other = k_rot if records == "q" else q_rot
            assert not other.requires_grad
            return ((q_rot if records == "q" else k_rot) * grad).sum()
        got = torch.func.grad(loss)(leaf.detach())
    else:
        with Passthrough() if route == "operator" else contextlib.nullcontext():
            q_rot, k_rot = rotate(q, k)
        rotated, other = (q_rot, k_rot) if records == "q" else (k_rot, q_rot)
        assert not other.requires_grad and other.grad_fn is None
        got, = torch.autograd.grad(rotated, leaf, grad)
    alone = leaf.detach().requires_grad_()
    expected, = torch.autograd.grad(apply_rope(alone, cos, sin, layout="half"), alone, grad)
    torch.testing.assert_close(got, expected)
