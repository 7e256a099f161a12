"""ropelib's GPU-era API under a hostile user (issue 43): fused q/k views, the KV-cache slot
path, backend reports, argument names, DTensor placements, torch.func under a forced
backend. One test (or a few) per item of the issue, each against an independent reference:
the float64 rotation pair by pair (tests/reference.py), PyTorch's own behaviour for the same
call, or transformers.

Every backend that runs on the CPU is checked: ``native`` (the C loop), ``eager`` and
``triton`` (Triton's interpreter), each forced with ``ROPELIB_BACKEND``.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from reference import angles, rope_by_pairs, thetas
from torch.utils._python_dispatch import TorchDispatchMode

from ropelib import (
    KVCache,
    StandardAttentionWithRoPE,
    apply_rope,
    apply_rope_qk,
    generate_rope_embeddings,
)

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


class Passthrough(TorchDispatchMode):
    """A dispatch mode that watches every call: the rotation goes through its operators."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


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
    assert kernels.choose_backend([q, k], [None, None], *rows, 16)[0].NAME == "triton"
    q_rot, k_rot = apply_rope_qk(q, k, cos, sin, layout=layout)
    close(q_rot, expected(q, range(6), 16, layout))
    close(k_rot, expected(k, range(6), 16, layout))
    positions = torch.tensor([[3, 1, 4, 1, 5, 9], [2, 6, 5, 3, 5, 8]])
    q_rot, k_rot = apply_rope_qk(q, k, cos, sin, layout=layout, positions=positions)
    close(q_rot, expected(q, positions[:, None], 16, layout))
    close(k_rot, expected(k, positions[:, None], 16, layout))


# Items 2, 3 and 14: the cache slot path -------------------------------------------------------

D, H, KV, CAPACITY = 32, 4, 2, 8


def attention(**kw):
    torch.manual_seed(0)
    return StandardAttentionWithRoPE(D, H, num_kv_heads=KV, layout="half", bias=False,
                                     **kw).double().eval()


def decode_with_updates(attn, x, prefill: int):
    """The same tokens through KVCache.update (the path the slot path must equal)."""
    cache = KVCache()
    outs = [attn(x[:, :prefill], x[:, :prefill], x[:, :prefill], kv_cache=cache,
                 is_causal=True)]
    for t in range(prefill, x.shape[1]):
        step = x[:, t:t + 1]
        outs.append(attn(step, step, step, kv_cache=cache, is_causal=True))
    return torch.cat(outs, 1)


def test_item2_a_slot_past_the_capacity_is_refused_before_anything_is_written():
    """index_copy_ wrote the keys of the in-range rows and then failed on the values: the
    cache was left half-written. Now the slots are checked first, the message names
    cache_position and the capacity, and the buffers are exactly as before the call."""
    attn = attention()
    x = torch.randn(1, CAPACITY + 2, D, dtype=F64)
    cache = KVCache(capacity=CAPACITY)
    with torch.no_grad():
        attn(x[:, :6], x[:, :6], x[:, :6], kv_cache=cache, cache_position=torch.tensor(0))
        key, value = cache._key_buffer.clone(), cache._value_buffer.clone()
        for start in (6, 7, -1):  # 6: slots 6, 7, 8; 7: 7..9; -1: -1..1
            with pytest.raises(ValueError, match=r"slots must be in \[0, 8\) \(the cache's "
                                                 r"capacity\).*cache_position"):
                attn(x[:, 6:9], x[:, 6:9], x[:, 6:9], kv_cache=cache,
                     cache_position=torch.tensor(start))
            assert torch.equal(cache._key_buffer, key)
            assert torch.equal(cache._value_buffer, value)
    with pytest.raises(ValueError, match=r"slots must be in \[0, 8\)"):
        KVCache(capacity=CAPACITY).write(torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8),
                                         torch.tensor([8]))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.uint8, torch.int64])
def test_item2_slots_of_every_integer_dtype(dtype):
    """The docstring says "an integer tensor": int32, int16 and uint8 slots failed with
    "Expected a long tensor for index". They write what int64 slots write."""
    attn = attention()
    x = torch.randn(2, 6, D, dtype=F64)
    with torch.no_grad():
        want = decode_with_updates(attn, x, 3)
        cache = KVCache(capacity=CAPACITY)
        outs = [attn(x[:, :3], x[:, :3], x[:, :3], kv_cache=cache,
                     cache_position=torch.tensor(0, dtype=dtype))]
        for t in range(3, 6):
            step = x[:, t:t + 1]
            outs.append(attn(step, step, step, kv_cache=cache,
                             cache_position=torch.tensor(t, dtype=dtype)))
    torch.testing.assert_close(torch.cat(outs, 1), want, rtol=1e-12, atol=1e-12)
    with pytest.raises(TypeError, match="slots must hold integer positions, got dtype "
                                        "torch.float32"):
        KVCache(capacity=4).write(torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8),
                                  torch.tensor([0.0]))
    with pytest.raises(TypeError, match="cache_position must hold integer positions"):
        attn(x[:, :1], x[:, :1], x[:, :1], kv_cache=KVCache(capacity=4),
             cache_position=torch.tensor(0.0))


def test_item2_prefill_in_inference_mode_then_decode_under_no_grad():
    """Buffers made under inference_mode are inference tensors; a write outside it failed
    ("Inplace update to inference tensor outside InferenceMode"). They are copied once
    into ordinary tensors, as update() does, and the steps equal decoding with updates."""
    attn = attention()
    x = torch.randn(2, 6, D, dtype=F64)
    with torch.no_grad():
        want = decode_with_updates(attn, x, 3)
    cache = KVCache(capacity=CAPACITY)
    with torch.inference_mode():
        outs = [attn(x[:, :3], x[:, :3], x[:, :3], kv_cache=cache,
                     cache_position=torch.tensor(0)).clone()]
    with torch.no_grad():
        for t in range(3, 6):
            step = x[:, t:t + 1]
            outs.append(attn(step, step, step, kv_cache=cache,
                             cache_position=torch.tensor(t)))
    assert not cache._key_buffer.is_inference()
    torch.testing.assert_close(torch.cat(outs, 1), want, rtol=1e-12, atol=1e-12)


def test_item2_steps_under_autograd_backpropagate_through_every_step():
    """Under autograd the write makes new buffers instead of writing into the ones an
    earlier step's backward reads (which failed with "modified by an inplace operation"):
    the gradients of several slot steps equal those of the same steps through update()."""
    x = torch.randn(2, 6, D, dtype=F64)

    def loss(use_slots: bool):
        attn = attention().train()
        if not use_slots:
            return decode_with_updates(attn, x, 3).square().sum(), attn
        cache = KVCache(capacity=CAPACITY)
        outs = [attn(x[:, :3], x[:, :3], x[:, :3], kv_cache=cache,
                     cache_position=torch.tensor(0))]
        for t in range(3, 6):
            step = x[:, t:t + 1]
            outs.append(attn(step, step, step, kv_cache=cache, cache_position=torch.tensor(t)))
        return torch.cat(outs, 1).square().sum(), attn

    for use_slots in (True, False):
        value, attn = loss(use_slots)
        value.backward()
        grads = [p.grad.clone() for p in attn.parameters()]
        if use_slots:
            slot_value, slot_grads = value.detach(), grads
    torch.testing.assert_close(slot_value, value.detach(), rtol=1e-12, atol=1e-12)
    for got, want in zip(slot_grads, grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_item3_offset_and_key_positions_of_a_slot_step_are_used():
    """offset= and key_positions= were dropped without a word. offset sets the positions of
    the new tokens (offset + 0 .. N - 1) wherever they sit in the cache; key_positions
    rotate the keys. Reference: the same tokens through update() at those positions."""
    attn = attention()
    x = torch.randn(1, 4, D, dtype=F64)
    with torch.no_grad():
        updates = KVCache()
        want = attn(x, x, x, kv_cache=updates, offset=5, is_causal=True)
        slots = KVCache(capacity=CAPACITY)
        got = attn(x, x, x, kv_cache=slots, cache_position=torch.tensor(0), offset=5)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        key_positions = torch.tensor([9, 2, 7, 4])
        positions = torch.tensor([1, 3, 5, 8])
        mask = torch.ones(4, 4, dtype=torch.bool).tril()
        want = attn(x, x, x, positions=positions, key_positions=key_positions,
                    attn_mask=mask)
        padded = torch.zeros(1, 1, 4, CAPACITY, dtype=torch.bool)
        padded[..., :4] = True  # the slots' own causal mask does the rest
        got = attn(x, x, x, kv_cache=KVCache(capacity=CAPACITY), positions=positions,
                   key_positions=key_positions, cache_position=torch.tensor(0),
                   attn_mask=padded)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        with pytest.raises(ValueError, match="pass either positions or offset"):
            attn(x, x, x, kv_cache=KVCache(capacity=CAPACITY), positions=positions, offset=2,
                 cache_position=torch.tensor(0))


def test_item3_a_mask_as_wide_as_the_tokens_so_far_names_attn_mask_and_the_capacity():
    attn = attention()
    x = torch.randn(2, 3, D, dtype=F64)
    cache = KVCache(capacity=CAPACITY)
    with torch.no_grad(), pytest.raises(ValueError, match=r"attn_mask of a cache_position step "
                                                          r"must broadcast to \(batch, heads, "
                                                          r"new, capacity\) = \(2, 4, 3, 8\).*"
                                                          r"got \(2, 1, 1, 3\)"):
        attn(x, x, x, kv_cache=cache, cache_position=torch.tensor(0),
             attn_mask=torch.ones(2, 1, 1, 3, dtype=torch.bool))
    assert cache._key_buffer is None  # refused before anything was written


def test_item14_one_cache_shared_by_two_layers_is_refused():
    """The second layer's keys were appended to the first's and both attended to them. The
    cache knows the module that first wrote it; reset() frees it; a copy belongs to none."""
    import copy
    import pickle

    first, second = attention(), attention()
    x = torch.randn(1, 3, D, dtype=F64)
    for cache, kw in ((KVCache(), {}), (KVCache(capacity=CAPACITY),
                                        {"cache_position": torch.tensor(0)})):
        with torch.no_grad():
            first(x, x, x, kv_cache=cache, **kw)
            length = cache.length
            with pytest.raises(ValueError, match="this KVCache holds the keys of another "
                                                 "layer.*give every layer its own cache"):
                second(x, x, x, kv_cache=cache, **kw)
            assert cache.length == length
            for twin in (copy.deepcopy(cache), pickle.loads(pickle.dumps(cache))):
                second(x[:, :1], x[:, :1], x[:, :1], kv_cache=twin,
                       **({"cache_position": torch.tensor(3)} if kw else {}))
            cache.reset()
            second(x, x, x, kv_cache=cache, **kw)


# Item 9: apply_rope_qk's errors name q, k, q_out, k_out and inplace ----------------------------

QK_ERRORS = {
    "k_out of q's shape": (
        lambda q, k, c, s: apply_rope_qk(q, k, c, s, out=(torch.empty_like(q),
                                                          torch.empty_like(q))),
        ValueError, r"k_out must match k: shape \(2, 2, 5, 16\).*got shape \(2, 4, 5, 16\)"),
    "q_out of k's dtype": (
        lambda q, k, c, s: apply_rope_qk(q, k, c, s, out=(q.double(), torch.empty_like(k))),
        ValueError, r"q_out must match q: .*dtype torch.float32.*got .*dtype torch.float64"),
    "q_out not a tensor": (
        lambda q, k, c, s: apply_rope_qk(q, k, c, s, out=([0.0], k)), TypeError,
        r"q_out must be a torch.Tensor, got list"),
    "k_out expanded": (
        lambda q, k, c, s: apply_rope_qk(q, k, c, s, out=(torch.empty_like(q),
                                                          torch.empty(1, 2, 5, 16).expand(
                                                              2, 2, 5, 16))),
        ValueError, r"k_out has elements that share memory .*torch.empty_like\(k\)"),
    "integer q": (
        lambda q, k, c, s: apply_rope_qk(q.long(), k, c, s), TypeError,
        r"q must be a floating-point tensor, got dtype torch.int64; convert it first, e.g. "
        r"q.float\(\)"),
    "integer k": (
        lambda q, k, c, s: apply_rope_qk(q, k.long(), c, s), TypeError,
        r"k must be a floating-point tensor"),
    "q of one dim": (
        lambda q, k, c, s: apply_rope_qk(q[0, 0, 0], k, c, s), ValueError,
        r"q must have shape \(..., seq, head_dim\)"),
    "tables on another device": (
        lambda q, k, c, s: apply_rope_qk(q, k, c.to("meta"), s.to("meta")), ValueError,
        r"cos/sin are on meta but q is on cpu; move them with cos.to\(q.device\)"),
    "inplace under autograd": (
        lambda q, k, c, s: apply_rope_qk(q.requires_grad_(), k, c, s, inplace=True),
        ValueError, r"apply_rope_qk\(..., inplace=True\) is not differentiable .*drop "
        r"inplace=True"),
    "out= under autograd": (
        lambda q, k, c, s: apply_rope_qk(q, k.requires_grad_(), c, s,
                                         out=(torch.empty_like(q), torch.empty_like(k))),
        ValueError, r"apply_rope_qk\(..., out=...\) is not differentiable; .*drop out="),
}


@pytest.mark.parametrize("case", QK_ERRORS, ids=list(QK_ERRORS))
def test_item9_apply_rope_qk_errors_name_its_own_arguments(case):
    call, error, match = QK_ERRORS[case]
    q, k = torch.randn(2, 4, 5, 16), torch.randn(2, 2, 5, 16)
    with pytest.raises(error, match=match):
        call(q, k, *generate_rope_embeddings(5, 16))


# Item 16 (the first thing a transformers user meets): the hint for tables of another width ------

def test_item16_transformers_tables_get_the_right_hint():
    """transformers' tables (cat(freqs, freqs), head_dim wide) were refused with "for a
    partial rotation pass rotary_dim=32" for a head of 16, advice that was refused in turn.
    The hint now says what these tables are and what to pass; following it works."""
    q = torch.randn(2, 4, 5, 16)
    cos, sin = generate_rope_embeddings(5, 16)
    hf_cos, hf_sin = (torch.cat((t, t), -1)[None, None] for t in (cos, sin))  # (1, 1, 5, 16)
    with pytest.raises(ValueError, match=r"cat\(freqs, freqs\).*pass cos\[..., :8\] and "
                                         r"sin\[..., :8\] with layout='half', or call "
                                         r"ropelib.hf.apply_rotary_pos_emb") as refused:
        apply_rope(q, hf_cos, hf_sin, layout="half")
    assert "rotary_dim=32" not in str(refused.value)
    close(apply_rope(q, hf_cos[..., :8], hf_sin[..., :8], layout="half"),
          expected(q, range(5), 16, "half"))
    # a partial rotation's transformers tables (rotary_dim 4 of 16, 4 wide): ropelib's tables
    # of 4 pairs would rotate 8 channels, transformers' of that width 4; both hints are given
    cos4, sin4 = generate_rope_embeddings(5, 4)
    wide = torch.cat((cos4, cos4), -1), torch.cat((sin4, sin4), -1)
    with pytest.raises(ValueError, match=r"pass rotary_dim=8; .*pass cos\[..., :2\] and "
                                         r"sin\[..., :2\] with layout='half', rotary_dim=4"):
        apply_rope(q, *wide, layout="half")
    close(apply_rope(q, wide[0][..., :2], wide[1][..., :2], layout="half", rotary_dim=4),
          rope_by_pairs(q, angles(torch.arange(5), thetas(4)), "half"))


# Item 7: eager half layout in bfloat16/float16 computes in float32 and rounds once ---------------

def within_one_rounding(got: torch.Tensor, x: torch.Tensor, want: torch.Tensor,
                        layout: str) -> bool:
    """Whether got (x's dtype) is within one unit in the last place of the float64 result,
    eps * |want| (1 to 2 ulp: Triton's interpreter truncates), plus what float32
    arithmetic may lose to cancellation, 2^-21 of the pair's magnitude |a| + |b|. Three
    roundings in bfloat16 lose eps * (|a| + |b|), far more."""
    x = x.to(F64).abs()
    half = x.shape[-1] // 2
    partner = x.roll(half, -1) if layout == "half" else x.unflatten(-1, (half, 2)).flip(
        -1).flatten(-2)
    bound = torch.finfo(got.dtype).eps * want.abs() + 2 ** -21 * (x + partner)
    return bool(((got.to(F64) - want).abs() <= bound).all())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_item7_half_precision_is_within_one_rounding_on_every_backend(forced, dtype, layout):
    """The eager half layout multiplied and added in bfloat16/float16 (three roundings):
    4.3 and 5.1 ulp from float64, where native and Triton were within 1. Every backend now
    computes in float32 and rounds once, in place too."""
    if forced == "native" and dtype == torch.float16:
        pytest.skip("the C loop takes float32, float64 and bfloat16 (float16 goes to eager)")
    x = (torch.randn(2, 4, 64, 64) * 4).to(dtype)
    cos, sin = generate_rope_embeddings(64, 64)
    want = expected(x.to(F64), range(64), 64, layout)
    assert within_one_rounding(apply_rope(x, cos, sin, layout=layout), x, want, layout)
    y = x.clone()
    apply_rope(y, cos, sin, layout=layout, out=y)
    assert within_one_rounding(y, x, want, layout)


# Item 5: tables wider than rotary_dim // 2 with positions, straight to the operators ----------

@pytest.mark.parametrize("layout", LAYOUTS)
def test_item5_tables_wider_than_the_rotated_pairs(forced, layout):
    """The operators take tables with more than rotary_dim // 2 columns (the checks ask for
    at least that many) and read the first ones. With positions the C loop stepped the
    rows by rotary_dim // 2 instead of the table's row (5.9 off), eager failed in a
    broadcast. Reference: the float64 rotation of the positions' angles."""
    from ropelib import kernels

    x = torch.randn(2, 3, 5, 16)
    cos, sin = generate_rope_embeddings(12, 8)  # 4 pairs, then 3 columns of junk
    wide = [torch.cat((t, torch.full((12, 3), 7.0)), -1) for t in (cos, sin)]  # (12, 7)
    positions = torch.tensor([[4, 3, 11, 1, 0], [9, 2, 6, 5, 7]])
    coordinates = positions[:, None, :, None]  # (batch, 1, seq, 1)
    want = rope_by_pairs(x, angles(positions[:, None], thetas(8)), layout)
    got = torch.ops.ropelib.rotate(x, *wide, layout, 8, False, coordinates, None)
    close(got, want)
    k = torch.randn(2, 1, 5, 16)
    q_rot, k_rot = kernels.rotate_each([x, k], [None, None], *wide, layout, 8, False, coordinates)
    close(q_rot, want)
    close(k_rot, rope_by_pairs(k, angles(positions[:, None], thetas(8)), layout))
    rows = [t[positions[:, None]] for t in wide]  # gathered wide rows (2, 1, 5, 7)
    close(torch.ops.ropelib.rotate(x, *rows, layout, 8, False, None, None), want)


# Item 15: the smaller findings ---------------------------------------------------------------

def test_item15_apply_rope_qk_converts_the_tables_once(monkeypatch):
    """On the CPU the C loop takes float32 tables: float64 tables (as generate_rope_embeddings
    makes them with dtype=float64) were converted once for q and again for k. Both
    rotations now read one converted pair; the results are the float64 formula's."""
    from ropelib import native

    monkeypatch.setenv("ROPELIB_BACKEND", "native")
    seen = []
    rotate = native.rotate

    def spy(x, cos, sin, *args, **kwargs):
        seen.append((cos.data_ptr(), sin.data_ptr()))
        return rotate(x, cos, sin, *args, **kwargs)

    monkeypatch.setattr(native, "rotate", spy)
    cos, sin = generate_rope_embeddings(5, 16, dtype=F64)
    q, k = torch.randn(2, 4, 5, 16), torch.randn(2, 2, 5, 16)
    q_rot, k_rot = apply_rope_qk(q, k, cos, sin, layout="half")
    assert len(seen) == 2 and seen[0] == seen[1]
    close(q_rot, expected(q, range(5), 16, "half"))
    close(k_rot, expected(k, range(5), 16, "half"))


# Item 4: backend_status tells what the next call does, for every device and setting ------------

SETTINGS = [  # (ROPELIB_BACKEND, compiled loop enabled, device, dtype)
    (None, True, "cpu", torch.float32), (None, True, "cpu", torch.float16),
    (None, False, "cpu", torch.float32), (None, True, "meta", torch.float32),
    ("native", True, "cpu", torch.float32), ("native", False, "cpu", torch.float32),
    ("native", True, "cpu", torch.float16), ("eager", True, "cpu", torch.bfloat16),
    ("triton", True, "cpu", torch.float32), ("triton", True, "cpu", torch.float64),
    ("fast", True, "cpu", torch.float32),
]


@pytest.mark.parametrize("setting", SETTINGS, ids=[str(s) for s in SETTINGS])
def test_item4_backend_status_says_what_a_call_does(setting, monkeypatch):
    """With ROPELIB_BACKEND=native and the loop unavailable, or an unknown backend, every
    call raised while backend_status reported eager; native_status reported native under
    ROPELIB_BACKEND=eager. The status is compared with what a call does: which backend's
    run() is entered (seen by a spy on each), or that it raises."""
    pytest.importorskip("triton")
    from ropelib import backend_status, eager, native, native_status, triton_rope

    forced, enabled, device, dtype = setting
    if forced:
        monkeypatch.setenv("ROPELIB_BACKEND", forced)
    else:
        monkeypatch.delenv("ROPELIB_BACKEND", raising=False)
    monkeypatch.setattr(native, "_enabled", enabled)
    ran = []
    for name, module in (("native", native), ("eager", eager), ("triton", triton_rope)):
        monkeypatch.setattr(module, "run", lambda *a, _n=name, _r=module.run, **kw: (
            ran.append(_n), _r(*a, **kw))[1])
    x = torch.randn(1, 2, 5, 8).to(device=device, dtype=dtype)
    cos, sin = (t.to(device) for t in generate_rope_embeddings(5, 8))
    try:
        apply_rope(x, cos, sin)
        did = ran[0]
    except ValueError as error:
        assert "ROPELIB_BACKEND" in str(error)
        did = None
    status = backend_status(device, dtype)
    assert status.backend == did, status
    if did is None:
        assert "raises" in status.reason
    if device == "cpu" and dtype == torch.float32:  # native_status speaks of a usual call
        assert native_status().path == did, native_status()


REFUSED_DTYPES = [torch.int64, torch.bool, torch.complex64, torch.float8_e4m3fn,
                  torch.float8_e5m2]


@pytest.mark.parametrize("dtype", REFUSED_DTYPES, ids=str)
@pytest.mark.parametrize("forced", [None, "eager"])
def test_a_dtype_every_call_refuses_is_reported_and_refused_by_name(dtype, forced,
                                                                    monkeypatch):
    """backend_status said eager for dtypes every call refuses (int64, bool, complex64) or
    crashes on inside PyTorch (float8: an addcmul NotImplementedError naming no argument).
    Now it says None and why, and the call refuses such an x, q or table by name."""
    from ropelib import backend_status

    if forced:
        monkeypatch.setenv("ROPELIB_BACKEND", forced)
    else:
        monkeypatch.delenv("ROPELIB_BACKEND", raising=False)
    status = backend_status("cpu", dtype)
    assert status.backend is None and str(dtype) in status.reason, status
    assert "raises" in status.reason
    x = torch.zeros(1, 2, 5, 8).to(dtype)
    cos, sin = generate_rope_embeddings(5, 8)
    with pytest.raises(TypeError, match=rf"x must be a floating-point tensor.*, got dtype {dtype}"):
        apply_rope(x, cos, sin)
    with pytest.raises(TypeError, match=rf"q must be a floating-point tensor.*, got dtype {dtype}"):
        apply_rope_qk(x, x, cos, sin)
    with pytest.raises(TypeError, match=rf"cos must be a floating-point tensor.*, got dtype {dtype}"):
        apply_rope(torch.zeros(1, 2, 5, 8), cos.to(dtype), sin.to(dtype))


def test_item4_a_device_this_build_cannot_use_is_reported_not_raised(monkeypatch):
    """backend_status("cuda") on a CPU-only build raised an AssertionError."""
    from ropelib import backend_status

    monkeypatch.delenv("ROPELIB_BACKEND", raising=False)
    if torch.cuda.is_available():
        assert backend_status("cuda").backend == "triton"
    else:
        status = backend_status("cuda")
        assert status.backend is None and "torch.cuda.is_available() is False" in status.reason


# Item 11: torch.func under a forced backend ----------------------------------------------------

@pytest.mark.parametrize("forced_name, dtype", [("native", torch.float16),
                                                ("triton", torch.float64)])
def test_item11_under_torch_func_the_rotation_is_pytorch_operations(monkeypatch, forced_name,
                                                                    dtype):
    """Under ROPELIB_BACKEND=native (float16) or triton (float64) the plain call raises
    naming the backend; under vmap and jvp the rotation is PyTorch operations, which
    ROPELIB_BACKEND does not govern (``backend_status`` says so): they run, and their
    numbers are the float64 formula's."""
    if forced_name == "triton":
        pytest.importorskip("triton")
    monkeypatch.setenv("ROPELIB_BACKEND", forced_name)
    x = torch.randn(3, 2, 5, 8).to(dtype)
    cos, sin = generate_rope_embeddings(5, 8)
    with pytest.raises(ValueError, match=f"ROPELIB_BACKEND={forced_name} cannot rotate this "
                                         "call: the "):
        apply_rope(x, cos, sin)
    want, tol = expected(x, range(5), 8, "interleaved"), 4e-3 if dtype == torch.float16 else 2e-6
    close(torch.func.vmap(lambda t: apply_rope(t, cos, sin))(x), want, tol)
    close(torch.func.vmap(lambda t: apply_rope_qk(t, t, cos, sin)[0])(x), want, tol)
    primal, tangent = torch.func.jvp(lambda t: apply_rope(t, cos, sin), (x,),
                                     (torch.ones_like(x),))
    close(primal, want, tol)
    close(tangent, expected(torch.ones_like(x), range(5), 8, "interleaved"), tol)
    y = x.float()
    batched = torch.func.vmap(lambda t: apply_rope(t, cos, sin))(y)
    close(batched, expected(y, range(5), 8, "interleaved"))


def test_item15_no_write_into_an_inference_tensor_outside_inference_mode(forced):
    """PyTorch refuses in-place updates to inference tensors outside inference mode; the C
    loop (and Triton) wrote into them anyway. Every backend refuses, with the name of the
    destination, and leaves it as it was; inside inference mode the write is made."""
    cos, sin = generate_rope_embeddings(5, 16)
    with torch.inference_mode():
        x = torch.randn(2, 4, 5, 16)
        k = torch.randn(2, 2, 5, 16)
    with pytest.raises(RuntimeError, match="Inplace update to inference tensor"):
        x.mul_(1.0)  # PyTorch's own rule
    source = x.clone()
    with pytest.raises(ValueError, match=r"out is an inference tensor .*outside inference "
                                         r"mode"):
        apply_rope(x, cos, sin, out=x)
    with pytest.raises(ValueError, match=r"q_out is an inference tensor"):
        apply_rope_qk(x, k, cos, sin, inplace=True)
    with pytest.raises(ValueError, match=r"out is an inference tensor"), Passthrough():
        apply_rope(torch.randn(2, 4, 5, 16), cos, sin, layout="half", out=x)  # the operator
    assert torch.equal(x, source)
    with torch.inference_mode():
        apply_rope(x, cos, sin, out=x, layout="half")
    close(x, expected(source, range(5), 16, "half"))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_item15_a_coordinate_outside_the_table_in_a_direct_operator_call(forced, layout):
    """A direct operator call with a coordinate outside the table gave NaN rows (Triton), a
    ValueError (native) or an IndexError (eager). On the CPU every backend now refuses it
    with one ValueError naming the range; the backends themselves (what runs on a GPU,
    where nothing is read back) turn its rows to NaN and read nothing."""
    from ropelib import eager, kernels

    x = torch.randn(3, 2, 5, 16)
    cos, sin = generate_rope_embeddings(40, 16)
    positions = torch.randint(0, 40, (3, 5))
    coordinates = positions[:, None, :, None].clone()
    coordinates[1, 0, 2, 0] = 40
    coordinates[2, 0, 0, 0] = -1
    refusal = (r"positions must be in \[0, 40\) \(the table's rows\) and axes in \[0, 1\) "
               r"\(the coordinates\), got positions in \[-1, 40\]")
    with pytest.raises(ValueError, match=refusal):
        torch.ops.ropelib.rotate(x, cos, sin, layout, 16, False, coordinates, None)
    with pytest.raises(ValueError, match=refusal):
        kernels.rotate(x, cos, sin, layout, 16, False, coordinates, None)
    out = torch.zeros_like(x)
    for route in (contextlib.nullcontext(), Passthrough()):  # the backend, the operator
        with pytest.raises(ValueError, match=refusal), route:
            kernels.rotate_each([x], [out], cos, sin, layout, 16, False, coordinates, None)
    if forced == "eager":  # the eager backend's own behaviour, as the Triton kernel's
        poisoned = eager.run([x], [None], cos, sin, layout, 16, False, coordinates, None)[0]
        assert poisoned[1, :, 2].isnan().all() and poisoned[2, :, 0].isnan().all()
        poisoned[1, :, 2] = poisoned[2, :, 0] = 0
        want = expected(x, positions[:, None], 16, layout)
        want[1, :, 2] = want[2, :, 0] = 0
        close(poisoned, want)
