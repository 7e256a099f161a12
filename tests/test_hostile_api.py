"""ropelib's GPU-era API under a hostile user (issue 43): fused q/k views, the KV-cache slot
path, backend reports, argument names, DTensor placements, torch.func under a forced
backend. One test (or a few) per item of the issue, each against an independent reference:
the float64 rotation pair by pair (tests/reference.py), PyTorch's own behaviour for the same
call, or transformers.

Every backend that runs on the CPU is checked: ``native`` (the C loop), ``eager`` and
``triton`` (Triton's interpreter), each forced with ``ROPELIB_BACKEND``.
"""

from __future__ import annotations

import pytest
import torch
from reference import angles, rope_by_pairs, thetas

from ropelib import apply_rope, apply_rope_qk, generate_rope_embeddings

F64 = torch.float64
LAYOUTS = ("interleaved", "half")
BACKENDS = ("native", "eager", "triton")


@pytest.fixture(params=BACKENDS)
def forced(request, monkeypatch) -> str:
    """Each CPU backend, forced (a call it declines fails instead of passing elsewhere)."""
    if request.param == "triton":
        pytest.importorskip("triton")
    monkeypatch.setenv("ROPELIB_BACKEND", request.param)
    return request.param


def expected(x: torch.Tensor, positions, dim: int, layout: str) -> torch.Tensor:
    """The float64 rotation of x by the angles of ``positions`` (RoFormer eq. 34)."""
    return rope_by_pairs(x, angles(torch.as_tensor(positions), thetas(dim)), layout)


def close(got: torch.Tensor, want: torch.Tensor, tol: float = 2e-6) -> None:
    torch.testing.assert_close(got.detach().to(F64), want, rtol=tol, atol=tol)


# Item 1: q and k as views of one fused projection ---------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("heads", [(4, 2), (2, 4), (8, 1)])
def test_item1_fused_gqa_views_rotate_in_place_and_into_their_own_slices(forced, layout,
                                                                         heads):
    """q (Hq heads) and k (Hk heads) as views of one ``(B, S, Hq + 2 Hk, D)`` buffer, the way
    vLLM and flash-attn hold them: rotated in place, and with out= into the slices of a
    second fused buffer. They share no element, so both calls run; every other head (v,
    the other slices) is untouched."""
    hq, hk = heads
    batch, seq, dim = 2, 6, 16
    cos, sin = generate_rope_embeddings(seq, dim)
    qkv = torch.randn(batch, seq, hq + 2 * hk, dim)
    source = qkv.clone()

    def views(buffer):
        return (buffer[:, :, :hq].transpose(1, 2), buffer[:, :, hq:hq + hk].transpose(1, 2))

    q, k = views(qkv)
    want_q, want_k = (expected(t, range(seq), dim, layout) for t in views(source))
    target = torch.zeros_like(qkv)
    q_out, k_out = views(target)
    with torch.no_grad():
        got = apply_rope_qk(q, k, cos, sin, layout=layout, out=(q_out, k_out))
    assert got[0] is q_out and got[1] is k_out
    close(q_out, want_q)
    close(k_out, want_k)
    assert torch.equal(qkv, source)  # out= leaves q and k alone
    assert not target[:, :, hq + hk:].any()  # v's slice of the destination is not written
    apply_rope_qk(q, k, cos, sin, layout=layout, inplace=True)
    close(q, want_q)
    close(k, want_k)
    assert torch.equal(qkv[:, :, hq + hk:], source[:, :, hq + hk:])  # v untouched


def test_item1_views_that_do_share_elements_are_still_refused():
    """Overlap is decided by the elements the views touch: k's heads overlapping q's by one
    head, or a destination laid over q with other strides, are refused by name."""
    cos, sin = generate_rope_embeddings(6, 16)
    qkv = torch.randn(2, 6, 8, 16)
    q, k = qkv[:, :, :4].transpose(1, 2), qkv[:, :, 3:5].transpose(1, 2)
    with pytest.raises(ValueError, match="q_out shares memory with k"):
        apply_rope_qk(q, k, cos, sin, inplace=True)
    q, k = qkv[:, :, :4].transpose(1, 2), qkv[:, :, 4:6].transpose(1, 2)
    spread = torch.empty(2, 6, 8, 16)
    q_out = spread[:, :, :4].transpose(1, 2)
    k_out = spread[:, :, 2:4].transpose(1, 2)  # inside q_out's heads
    with pytest.raises(ValueError, match="q_out shares memory with k_out"):
        apply_rope_qk(q, k, cos, sin, out=(q_out, k_out))


# Item 8: the meta device -----------------------------------------------------------------------

def test_item8_meta_tensors_take_out_and_inplace():
    """Every meta tensor reports address 0, so they cannot be told apart by memory: out= and
    in place work on meta (shape and dtype only), as out-of-place calls always did."""
    cos, sin = (t.to("meta") for t in generate_rope_embeddings(5, 16))
    q = torch.empty(2, 4, 5, 16, device="meta")
    k = torch.empty(2, 2, 5, 16, device="meta")
    out = torch.empty_like(q)
    assert apply_rope(q, cos, sin, out=out) is out
    assert apply_rope(q, cos, sin, out=q) is q
    q_rot, k_rot = apply_rope_qk(q, k, cos, sin, inplace=True)
    assert q_rot is q and k_rot is k
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    cos8, sin8 = (t.to("meta") for t in generate_rope_embeddings(5, 8))
    got = apply_rope_qk(q, k, cos8, sin8, layout="half", rotary_dim=8, out=(q_out, k_out))
    assert got[0] is q_out and got[1].shape == (2, 2, 5, 16) and got[1].device.type == "meta"


# Item 6: q contiguous, k a (batch, seq, heads, dim) view, in one Triton launch ----------------

@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("k_first", [False, True])
def test_item6_triton_merges_each_tensors_leading_dims_on_its_own(monkeypatch, layout,
                                                                  k_first):
    """Each alone is taken by the kernel; together they were declined ("cannot be merged")
    because q's (batch, heads) merge into one dim and k's do not. Each tensor's leading dims
    are now merged on its own strides, with one cut into batch and heads for both. Per-row
    positions (rows that vary along the batch) as well."""
    pytest.importorskip("triton")
    from ropelib import kernels

    monkeypatch.setenv("ROPELIB_BACKEND", "triton")
    cos, sin = generate_rope_embeddings(12, 16)
    contiguous = torch.randn(2, 4, 6, 16)
    strided = torch.randn(2, 6, 2, 16).transpose(1, 2)  # (B, H, S, D) view of (B, S, H, D)
    q, k = (strided, contiguous) if k_first else (contiguous, strided)
    rows = cos[:6], sin[:6]
    assert kernels.backend_for([q, k], [None, None], *rows, 16).NAME == "triton"
    q_rot, k_rot = apply_rope_qk(q, k, cos, sin, layout=layout)
    close(q_rot, expected(q, range(6), 16, layout))
    close(k_rot, expected(k, range(6), 16, layout))
    positions = torch.tensor([[3, 1, 4, 1, 5, 9], [2, 6, 5, 3, 5, 8]])
    q_rot, k_rot = apply_rope_qk(q, k, cos, sin, layout=layout, positions=positions)
    close(q_rot, expected(q, positions[:, None], 16, layout))
    close(k_rot, expected(k, positions[:, None], 16, layout))
