"""StandardAttentionWithRoPE: SDPA path, explicit path, references, masks, KV cache, GQA."""

from __future__ import annotations

import pytest
import torch
from reference import (
    angles,
    attention_module_reference,
    device_side_error,
    hf_llama_attention,
    lower_right_causal,
    thetas,
)

from ropelib import KVCache, StandardAttentionWithRoPE, causal_mask, generate_rope_embeddings

F64 = torch.float64
D, H = 32, 4  # head_dim 8


def module64(device, **kw) -> StandardAttentionWithRoPE:
    kw = {"bias": True, **kw}
    return StandardAttentionWithRoPE(D, H, dtype=F64, device=device, **kw).eval()


def ref_angles(length: int, dim: int = D // H, start: int = 0) -> torch.Tensor:
    return angles(torch.arange(start, start + length), thetas(dim))


def run_both_paths(module, *args, **kw):
    """(SDPA-path output, explicit-path output, explicit-path weights)."""
    fast = module(*args, return_attn=False, **kw)
    slow, weights = module(*args, return_attn=True, **kw)
    return fast, slow, weights


def random_bool_mask(shape, device):
    mask = torch.rand(shape, device=device) > 0.4
    mask[..., 0] = True  # every row may attend somewhere (empty rows are tested separately)
    return mask


def random_float_mask(shape, device):
    mask = torch.randn(shape, dtype=F64, device=device)
    mask = mask.masked_fill(torch.rand(shape, device=device) > 0.6, float("-inf"))
    mask[..., -1] = 0.5
    return mask


MASK_CASES = {  # name: (Nq, Nk, mask kind, is_causal)
    "self": (6, 6, None, False),
    "bool": (6, 6, "bool", False),
    "float": (6, 6, "float", False),
    "causal": (6, 6, None, True),
    "causal+bool": (6, 6, "bool", True),
    "causal+float": (6, 6, "float", True),
    "cross_short_query": (3, 7, None, False),
    "cross_long_query": (7, 4, "bool", False),
    "causal_lower_right": (3, 7, None, True),
    "causal_lower_right+float": (3, 7, "float", True),
}


@pytest.mark.parametrize("case", list(MASK_CASES))
@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
def test_sdpa_path_equals_explicit_path_and_reference(case, num_kv_heads, device):
    nq, nk, kind, causal = MASK_CASES[case]
    layout = "half" if num_kv_heads == 2 else "interleaved"
    module = module64(device, num_kv_heads=num_kv_heads, layout=layout)
    query = torch.randn(2, nq, D, dtype=F64, device=device)
    key = torch.randn(2, nk, D, dtype=F64, device=device)
    value = torch.randn(2, nk, D, dtype=F64, device=device)
    mask = None
    if kind == "bool":
        mask = random_bool_mask((2, 1, nq, nk), device)
    elif kind == "float":
        mask = random_float_mask((2, H, nq, nk), device)
    if causal:  # the test's own mask must leave each row something under causality
        if mask is not None and mask.dtype == torch.bool:
            mask[..., -1] = True
    tables = generate_rope_embeddings(max(nq, nk), D // H, device=device, dtype=F64)
    fast, slow, weights = run_both_paths(module, query, key, value, tables, mask, is_causal=causal)
    expected, expected_weights = attention_module_reference(
        module, query, key, value, ref_angles(nq), ref_angles(nk), mask, causal)
    assert fast.shape == (2, nq, D) and weights.shape == (2, H, nq, nk)
    torch.testing.assert_close(fast, slow, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(fast.cpu(), expected, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(weights.cpu(), expected_weights, rtol=1e-10, atol=1e-10)
    if causal:  # nothing above the lower-right diagonal
        assert (weights.cpu()[..., ~lower_right_causal(nq, nk)] == 0).all()


def test_builtin_rotary_equals_reference_and_passed_tables(device):
    module = module64(device, num_kv_heads=2)
    x = torch.randn(2, 9, D, dtype=F64, device=device)
    out = module(x, x, x, is_causal=True)  # its own RotaryEmbedding (float32 tables)
    expected, _ = attention_module_reference(module, x, x, x, ref_angles(9), ref_angles(9),
                                             causal=True)
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-6, atol=1e-6)


def test_equals_hf_llama_attention(device):
    """layout="half", bias=False: an HF Llama attention's weights load 1:1 and give its output."""
    num_kv_heads = 2
    hd = D // H
    hf_weights = {"q_proj.weight": torch.randn(D, D) / D ** 0.5,
                  "k_proj.weight": torch.randn(num_kv_heads * hd, D) / D ** 0.5,
                  "v_proj.weight": torch.randn(num_kv_heads * hd, D) / D ** 0.5,
                  "o_proj.weight": torch.randn(D, D) / D ** 0.5}
    x = torch.randn(2, 10, D)
    expected = hf_llama_attention(x, hf_weights, H, num_kv_heads, ref_angles(10), causal=True)

    module = StandardAttentionWithRoPE(D, H, num_kv_heads=num_kv_heads, bias=False, layout="half",
                                       device=device).eval()
    module.load_state_dict(hf_weights)  # strict: exactly these four keys
    xd = x.to(device)
    for return_attn in (False, True):
        out = module(xd, xd, xd, is_causal=True, return_attn=return_attn)
        out = out[0] if return_attn else out
        torch.testing.assert_close(out.cpu().to(F64), expected, rtol=1e-5, atol=1e-5)

    module64_ = module.to(F64)
    tables = generate_rope_embeddings(10, hd, device=device, dtype=F64)
    out = module64_(xd.to(F64), xd.to(F64), xd.to(F64), rope_embeddings=tables, is_causal=True)
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-10, atol=1e-10)


def test_original_quick_start(device):
    """The original module's example: shapes, and weights are a softmax (before dropout)."""
    embed_dim, num_heads, B, N = 64, 4, 2, 16
    attn = StandardAttentionWithRoPE(embed_dim, num_heads, dropout=0.1).to(device)
    x = torch.randn(B, N, embed_dim, device=device)
    cos, sin = generate_rope_embeddings(N, embed_dim // num_heads, device=device)
    out, weights = attn(x, x, x, rope_embeddings=(cos, sin), return_attn=True)
    assert out.shape == (B, N, embed_dim) and weights.shape == (B, num_heads, N, N)
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, num_heads, N, device=device))
    assert attn.layout == "interleaved"


def test_original_additive_causal_mask_equals_is_causal(device):
    module = module64(device)
    x = torch.randn(2, 7, D, dtype=F64, device=device)
    additive = torch.full((7, 7), float("-inf"), dtype=F64, device=device).triu(1)[None, None]
    expected, _ = attention_module_reference(module, x, x, x, ref_angles(7), ref_angles(7),
                                             causal=True)
    for kw in ({"attn_mask": additive}, {"is_causal": True}, {"attn_mask": causal_mask(7, 7, device)}):
        fast, slow, _ = run_both_paths(module, x, x, x, **kw)
        torch.testing.assert_close(fast.cpu(), expected, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(slow, fast, rtol=1e-10, atol=1e-10)


def test_causal_mask_helper():
    assert torch.equal(causal_mask(3, 7), lower_right_causal(3, 7))
    assert torch.equal(causal_mask(5, 5), lower_right_causal(5, 5))


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("num_kv_heads", [4, 1])
@pytest.mark.parametrize("pass_tables", [False, True])
def test_kv_cache_decoding_equals_full_causal_forward(layout, num_kv_heads, pass_tables, device):
    module = module64(device, num_kv_heads=num_kv_heads, layout=layout, rotary_dim=6,
                      max_position_embeddings=4)
    n = 11
    x = torch.randn(2, n, D, dtype=F64, device=device)
    tables = generate_rope_embeddings(n, 6, device=device, dtype=F64) if pass_tables else None
    full = module(x, x, x, tables, is_causal=True)

    cache = KVCache()
    steps = [module(x[:, :4], x[:, :4], x[:, :4], tables, kv_cache=cache, is_causal=True)]
    assert cache.length == 4
    for t in range(4, n):  # one token at a time, alternating the two paths
        xt = x[:, t:t + 1]
        if t % 2:
            out = module(xt, xt, xt, tables, kv_cache=cache, is_causal=True)
        else:
            out, weights = module(xt, xt, xt, tables, kv_cache=cache, return_attn=True)
            assert weights.shape == (2, H, 1, t + 1)
        steps.append(out)
        assert cache.length == t + 1
    assert cache.key.shape == (2, num_kv_heads, n, D // H)
    tol = 1e-10 if pass_tables else 1e-6  # the built-in tables are float32
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=tol, atol=tol)
    expected, _ = attention_module_reference(module, x, x, x, ref_angles(n, 6), ref_angles(n, 6),
                                             causal=True)
    torch.testing.assert_close(full.cpu(), expected, rtol=tol, atol=tol)
    cache.reset()
    assert cache.length == 0


@pytest.mark.parametrize("return_attn", [False, True])
def test_left_padded_batch_with_per_row_positions(return_attn, device):
    """Per-batch positions + a boolean padding mask = running each row unpadded on its own."""
    module = module64(device, bias=False, num_kv_heads=2)
    n, pad = 6, 2
    x = torch.randn(2, n, D, dtype=F64, device=device)
    pad_mask = torch.ones(2, n, dtype=torch.bool, device=device)
    pad_mask[1, :pad] = False
    positions = (torch.arange(n, device=device) - (~pad_mask).sum(1, keepdim=True)).clamp_min(0)
    out = module(x, x, x, attn_mask=pad_mask[:, None, None, :], is_causal=True,
                 positions=positions, return_attn=return_attn)
    out = out[0] if return_attn else out
    alone = module(x[1:, pad:], x[1:, pad:], x[1:, pad:], is_causal=True)
    torch.testing.assert_close(out[1:, pad:], alone, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(out[:1], module(x[:1], x[:1], x[:1], is_causal=True),
                               rtol=1e-10, atol=1e-10)
    # a padding query under causality may attend to nothing: zeros, not NaN
    assert torch.equal(out[1, :pad], torch.zeros(pad, D, dtype=F64, device=device))


def test_query_and_key_positions(device):
    module = module64(device)
    q_in = torch.randn(1, 3, D, dtype=F64, device=device)
    kv_in = torch.randn(1, 5, D, dtype=F64, device=device)
    qpos = torch.tensor([7, 8, 9], device=device)
    kpos = torch.tensor([0, 2, 4, 6, 8], device=device)
    tables = generate_rope_embeddings(10, D // H, device=device, dtype=F64)
    out = module(q_in, kv_in, kv_in, tables, positions=qpos, key_positions=kpos)
    expected, _ = attention_module_reference(module, q_in, kv_in, kv_in, angles(qpos.cpu(), thetas(8)),
                                             angles(kpos.cpu(), thetas(8)))
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-10, atol=1e-10)
    # offset shifts both: attention scores only see relative positions, so nothing changes
    shifted = module(q_in, kv_in, kv_in, offset=100)
    torch.testing.assert_close(shifted, module(q_in, kv_in, kv_in), rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- masks

def original_nan_mask(pad_mask: torch.Tensor) -> torch.Tensor:
    """The original module's padding recipe: 0 * -inf = NaN at every kept position."""
    return (~pad_mask).unsqueeze(1).unsqueeze(2) * float("-inf")


@pytest.mark.parametrize("return_attn", [False, True])
def test_nan_mask_is_refused_with_the_right_recipe(return_attn, device):
    module = module64(device)
    x = torch.randn(2, 5, D, dtype=F64, device=device)
    pad_mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool, device=device)
    bad = original_nan_mask(pad_mask)
    assert torch.isnan(bad).any()
    if device.type == "cpu":  # on a GPU the check is a device-side assert: see the next test
        with pytest.raises(ValueError, match=r"NaN[\s\S]*pad_mask\[:, None, None, :\]"):
            module(x, x, x, attn_mask=bad, return_attn=return_attn)
        with pytest.raises(ValueError, match=r"masked_fill\(~pad_mask, float\('-inf'\)\)"):
            module(x, x, x, attn_mask=bad, return_attn=return_attn)

    # both recipes the message shows work and agree with the reference
    expected, _ = attention_module_reference(module, x, x, x, ref_angles(5), ref_angles(5),
                                             pad_mask[:, None, None, :])
    as_bool = pad_mask[:, None, None, :]
    as_float = torch.zeros(pad_mask.shape, device=device).masked_fill(
        ~pad_mask, float("-inf"))[:, None, None, :]
    for mask in (as_bool, as_float):
        out = module(x, x, x, attn_mask=mask, return_attn=return_attn)
        out = out[0] if return_attn else out
        torch.testing.assert_close(out.cpu(), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a device-side assert needs a GPU")
def test_nan_mask_on_cuda_is_a_device_side_error():
    """On a GPU the mask's values are not read on the host: a NaN mask fails an assertion on
    the device, which the next synchronization raises (in a subprocess: the assert ends its
    CUDA context), and the message names the recipe."""
    stderr = device_side_error(
        "from ropelib import StandardAttentionWithRoPE\n"
        "m = StandardAttentionWithRoPE(16, 2, device='cuda')\n"
        "x = torch.randn(1, 3, 16, device='cuda')\n"
        "pad = torch.tensor([[True, True, False]], device='cuda')\n"
        "m(x, x, x, attn_mask=(~pad)[:, None, None, :] * float('-inf'))")
    assert "device-side assert" in stderr or "NaN" in stderr


@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("return_attn", [False, True])
def test_row_allowed_nothing_gives_zeros_and_finite_gradients(kind, return_attn, device):
    module = module64(device, bias=False)
    q_in = torch.randn(2, 4, D, dtype=F64, device=device, requires_grad=True)
    kv_in = torch.randn(2, 5, D, dtype=F64, device=device, requires_grad=True)
    allowed = torch.ones(2, H, 4, 5, dtype=torch.bool, device=device)
    allowed[0, :, 1] = False  # query 1 of batch 0: nothing, in every head
    allowed[1, 2, 3] = False  # query 3 of batch 1: nothing, in head 2 only
    mask = allowed if kind == "bool" else torch.zeros(allowed.shape, dtype=F64, device=device
                                                      ).masked_fill(~allowed, float("-inf"))
    out = module(q_in, kv_in, kv_in, attn_mask=mask, return_attn=return_attn)
    out, weights = out if return_attn else (out, None)
    assert torch.isfinite(out).all()
    assert torch.equal(out[0, 1], torch.zeros(D, dtype=F64, device=device))
    expected, expected_weights = attention_module_reference(
        module, q_in, kv_in, kv_in, ref_angles(4), ref_angles(5), allowed)
    torch.testing.assert_close(out.detach().cpu(), expected, rtol=1e-6, atol=1e-6)
    if weights is not None:
        assert torch.equal(weights[0, :, 1], torch.zeros(H, 5, dtype=F64, device=device))
        assert torch.equal(weights[1, 2, 3], torch.zeros(5, dtype=F64, device=device))
        torch.testing.assert_close(weights.detach().cpu(), expected_weights, rtol=1e-6, atol=1e-6)
    out.sum().backward()
    grads = [q_in.grad, kv_in.grad] + [p.grad for p in module.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert torch.equal(q_in.grad[0, 1], torch.zeros(D, dtype=F64, device=device))


def test_boolean_mask_broadcast_shapes(device):
    module = module64(device)
    x = torch.randn(2, 5, D, dtype=F64, device=device)
    keys_allowed = torch.tensor([True, True, False, True, False], device=device)
    expected, _ = attention_module_reference(module, x, x, x, ref_angles(5), ref_angles(5),
                                             keys_allowed.expand(2, H, 5, 5))
    for mask in (keys_allowed, keys_allowed[None], keys_allowed[None, None, None]):
        fast, slow, _ = run_both_paths(module, x, x, x, attn_mask=mask)
        torch.testing.assert_close(fast.cpu(), expected, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(slow, fast, rtol=1e-10, atol=1e-10)


# --------------------------------------------------------------------------- dropout, dtypes

def test_dropout_is_off_in_eval_and_on_in_training(device):
    module = module64(device, dropout=0.5)
    x = torch.randn(2, 6, D, dtype=F64, device=device)
    expected, _ = attention_module_reference(module, x, x, x, ref_angles(6), ref_angles(6),
                                             causal=True)
    fast, slow, weights = run_both_paths(module, x, x, x, is_causal=True)
    torch.testing.assert_close(fast.cpu(), expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(slow, fast, rtol=1e-10, atol=1e-10)

    module.train()
    trained_fast = module(x, x, x, is_causal=True)
    trained_slow, trained_weights = module(x, x, x, is_causal=True, return_attn=True)
    assert not torch.allclose(trained_fast, fast) and not torch.allclose(trained_slow, slow)
    torch.testing.assert_close(trained_weights, weights)  # weights are returned before dropout


ATTN_TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 1e-1}


@pytest.mark.parametrize("dtype", list(ATTN_TOLERANCE))
def test_low_precision_modules(dtype, device):
    module = StandardAttentionWithRoPE(D, H, num_kv_heads=2).to(device=device, dtype=dtype).eval()
    x = torch.randn(2, 7, D, device=device).to(dtype)
    expected, _ = attention_module_reference(module, x, x, x, ref_angles(7), ref_angles(7),
                                             causal=True)
    fast, slow, weights = run_both_paths(module, x, x, x, is_causal=True)
    tol = ATTN_TOLERANCE[dtype]
    for out in (fast, slow):
        assert out.dtype == dtype and out.device.type == device.type
        torch.testing.assert_close(out.cpu().to(F64), expected, rtol=tol, atol=tol)
    assert weights.dtype == dtype


def test_gradcheck_through_the_module(device):
    module = StandardAttentionWithRoPE(8, 2, num_kv_heads=1, dtype=F64, device=device).eval()
    q_in = torch.randn(1, 3, 8, dtype=F64, device=device, requires_grad=True)
    kv_in = torch.randn(1, 4, 8, dtype=F64, device=device, requires_grad=True)
    for return_attn in (False, True):
        def f(q, kv, return_attn=return_attn):
            out = module(q, kv, kv, is_causal=True, return_attn=return_attn)
            return out[0] if return_attn else out
        assert torch.autograd.gradcheck(f, (q_in, kv_in), fast_mode=True)


def test_rope_false_has_no_position_information(device):
    module = module64(device, rope=False)
    assert module.rotary is None
    x = torch.randn(1, 5, D, dtype=F64, device=device)
    expected, _ = attention_module_reference(module, x, x, x, None, None)
    torch.testing.assert_close(module(x, x, x).cpu(), expected, rtol=1e-10, atol=1e-10)
    # without positions, reversing the keys/values does not change anything
    rev = x.flip(1)
    torch.testing.assert_close(module(x, rev, rev), module(x, x, x), rtol=1e-10, atol=1e-10)
