"""The two pair layouts: one fixed channel permutation apart, for activations and weights."""

from __future__ import annotations

import pytest
import torch
from reference import (
    angles,
    half_from_interleaved_perm,
    hf_llama_attention,
    hf_permute,
    meta_llama_attention,
    thetas,
)

from ropelib import (
    StandardAttentionWithRoPE,
    apply_rope,
    convert_activations,
    convert_meta_attention_state_dict,
    convert_qk_weight,
    generate_rope_embeddings,
)

F64 = torch.float64


@pytest.mark.parametrize("dim,rotary_dim", [(8, None), (12, 4), (6, 6)])
def test_activation_permutation_is_the_documented_one(dim, rotary_dim):
    x = torch.arange(dim, dtype=F64).expand(2, dim)
    perm = half_from_interleaved_perm(dim, rotary_dim)
    half = convert_activations(x, src="interleaved", dst="half", rotary_dim=rotary_dim)
    assert half[0].tolist() == [float(p) for p in perm]
    back = convert_activations(half, src="half", dst="interleaved", rotary_dim=rotary_dim)
    assert torch.equal(back, x)
    assert torch.equal(convert_activations(x, src="half", dst="half"), x)


@pytest.mark.parametrize("rotary_dim", [None, 8])
def test_layouts_agree_after_the_permutation(rotary_dim, device):
    head_dim = 12
    rd = rotary_dim or head_dim
    x = torch.randn(2, 3, 9, head_dim, dtype=F64, device=device)
    cos, sin = generate_rope_embeddings(9, rd, device=device, dtype=F64)
    perm = torch.tensor(half_from_interleaved_perm(head_dim, rotary_dim), device=device)

    rotated_interleaved = apply_rope(x, cos, sin, layout="interleaved", rotary_dim=rotary_dim)
    rotated_half = apply_rope(x[..., perm], cos, sin, layout="half", rotary_dim=rotary_dim)
    torch.testing.assert_close(rotated_half, rotated_interleaved[..., perm], rtol=0, atol=1e-12)
    # and through the library's own converter, both ways
    conv = convert_activations(x, src="interleaved", dst="half", rotary_dim=rotary_dim)
    torch.testing.assert_close(
        convert_activations(apply_rope(conv, cos, sin, layout="half", rotary_dim=rotary_dim),
                            src="half", dst="interleaved", rotary_dim=rotary_dim),
        rotated_interleaved, rtol=0, atol=1e-12)


def test_convert_qk_weight_matches_hf_conversion_script_with_gqa():
    num_heads, num_kv_heads, head_dim, dim = 4, 2, 6, 16
    wq = torch.randn(num_heads * head_dim, dim)
    wk = torch.randn(num_kv_heads * head_dim, dim)
    hq = convert_qk_weight(wq, num_heads, src="interleaved", dst="half")
    hk = convert_qk_weight(wk, num_kv_heads, src="interleaved", dst="half")
    assert torch.equal(hq, hf_permute(wq, num_heads))
    assert torch.equal(hk, hf_permute(wk, num_kv_heads))
    # the inverse conversion, and biases (1-D) follow the same rows
    assert torch.equal(convert_qk_weight(hq, num_heads, src="half", dst="interleaved"), wq)
    bias = torch.randn(num_kv_heads * head_dim)
    assert torch.equal(convert_qk_weight(bias, num_kv_heads, src="interleaved", dst="half"),
                       hf_permute(bias[:, None], num_kv_heads)[:, 0])


def test_converted_projection_gives_the_same_scores():
    """q = W x rotated in one layout and W' x rotated in the other: same q.k scores."""
    heads, head_dim, dim, n = 2, 8, 10, 5
    wq, wk = torch.randn(heads * head_dim, dim, dtype=F64), torch.randn(heads * head_dim, dim, dtype=F64)
    x = torch.randn(n, dim, dtype=F64)
    cos, sin = generate_rope_embeddings(n, head_dim, dtype=F64)

    def scores(wq, wk, layout):
        q = (x @ wq.T).view(n, heads, head_dim).transpose(0, 1)
        k = (x @ wk.T).view(n, heads, head_dim).transpose(0, 1)
        q, k = apply_rope(q, cos, sin, layout=layout), apply_rope(k, cos, sin, layout=layout)
        return q @ k.transpose(-2, -1)

    meta = scores(wq, wk, "interleaved")
    hf = scores(hf_permute(wq, heads), hf_permute(wk, heads), "half")
    torch.testing.assert_close(hf, meta, rtol=1e-12, atol=1e-12)
    converted = scores(convert_qk_weight(wq, heads, src="interleaved", dst="half"),
                       convert_qk_weight(wk, heads, src="interleaved", dst="half"), "half")
    torch.testing.assert_close(converted, meta, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
def test_meta_state_dict_loads_into_both_layouts(num_kv_heads, device):
    """Meta checkpoint -> interleaved module and -> HF-layout module: same output as Meta's code."""
    dim, num_heads, n = 32, 4, 7
    head_dim = dim // num_heads
    sd = {"wq": torch.randn(dim, dim, dtype=F64) / dim ** 0.5,
          "wk": torch.randn(num_kv_heads * head_dim, dim, dtype=F64) / dim ** 0.5,
          "wv": torch.randn(num_kv_heads * head_dim, dim, dtype=F64) / dim ** 0.5,
          "wo": torch.randn(dim, dim, dtype=F64) / dim ** 0.5}
    x = torch.randn(2, n, dim, dtype=F64)
    table = angles(torch.arange(n), thetas(head_dim))
    expected = meta_llama_attention(x, sd, num_heads, num_kv_heads, table, causal=True)

    outs = {}
    for layout in ("interleaved", "half"):
        module = StandardAttentionWithRoPE(dim, num_heads, num_kv_heads=num_kv_heads, bias=False,
                                           layout=layout, dtype=F64, device=device).eval()
        module.load_state_dict(convert_meta_attention_state_dict(
            sd, num_heads, num_kv_heads, layout=layout))
        xd = x.to(device)
        tables = generate_rope_embeddings(n, head_dim, device=device, dtype=F64)
        outs[layout] = module(xd, xd, xd, rope_embeddings=tables, is_causal=True)
        torch.testing.assert_close(outs[layout].cpu(), expected, rtol=1e-10, atol=1e-10)
        # the built-in RotaryEmbedding holds float32 tables: float32-accurate rotation
        builtin = module(xd, xd, xd, is_causal=True)
        torch.testing.assert_close(builtin.cpu(), expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(outs["half"], outs["interleaved"], rtol=1e-10, atol=1e-10)

    # the HF-layout weights are exactly what HF's conversion script produces, and HF's
    # attention with them gives the same output again
    hf_sd = convert_meta_attention_state_dict({f"{k}.weight": v for k, v in sd.items()},
                                              num_heads, num_kv_heads, layout="half")
    assert torch.equal(hf_sd["q_proj.weight"], hf_permute(sd["wq"], num_heads))
    assert torch.equal(hf_sd["k_proj.weight"], hf_permute(sd["wk"], num_kv_heads))
    assert torch.equal(hf_sd["v_proj.weight"], sd["wv"]) and torch.equal(hf_sd["o_proj.weight"], sd["wo"])
    hf_out = hf_llama_attention(x, hf_sd, num_heads, num_kv_heads, table, causal=True)
    torch.testing.assert_close(hf_out, expected, rtol=1e-10, atol=1e-10)
