"""The two pair layouts: one fixed channel permutation apart, for activations and weights."""

from __future__ import annotations

import pytest
import torch
from reference import (
    angles,
    attention_module_reference,
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
from ropelib.layouts import convert_attention_state_dict

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


def _block_permutation(heads: int, head_dim: int, rotary_dim: int | None = None) -> torch.Tensor:
    """diag(P, ..., P): the explicit matrix that lists each head's channels in the half order."""
    P = torch.zeros(head_dim, head_dim, dtype=F64)
    P[range(head_dim), half_from_interleaved_perm(head_dim, rotary_dim)] = 1.0
    return torch.block_diag(*[P] * heads)


@pytest.mark.parametrize("rotary_dim", [None, 4])
def test_attention_state_dict_reorders_weights_and_biases_per_head(rotary_dim):
    """q per query head, k per KV head, biases with their rows; every other entry untouched."""
    heads, kv_heads, head_dim, dim = 4, 2, 8, 20
    prefix = "model.layers.3.self_attn."
    sd = {prefix + "q_proj.weight": torch.randn(heads * head_dim, dim, dtype=F64),
          prefix + "q_proj.bias": torch.randn(heads * head_dim, dtype=F64),
          prefix + "k_proj.weight": torch.randn(kv_heads * head_dim, dim, dtype=F64),
          prefix + "k_proj.bias": torch.randn(kv_heads * head_dim, dtype=F64),
          prefix + "v_proj.weight": torch.randn(kv_heads * head_dim, dim, dtype=F64),
          prefix + "v_proj.bias": torch.randn(kv_heads * head_dim, dtype=F64),
          prefix + "o_proj.weight": torch.randn(dim, heads * head_dim, dtype=F64),
          "model.norm.weight": torch.randn(dim, dtype=F64)}
    half = convert_attention_state_dict(sd, heads, kv_heads, src="interleaved", dst="half",
                                        rotary_dim=rotary_dim)
    assert list(half) == list(sd)
    for name, n in (("q_proj", heads), ("k_proj", kv_heads)):
        P = _block_permutation(n, head_dim, rotary_dim)
        assert torch.equal(half[prefix + name + ".weight"], P @ sd[prefix + name + ".weight"])
        assert torch.equal(half[prefix + name + ".bias"], P @ sd[prefix + name + ".bias"])
    for name in ("v_proj.weight", "v_proj.bias", "o_proj.weight"):
        assert half[prefix + name] is sd[prefix + name]
    assert half["model.norm.weight"] is sd["model.norm.weight"]
    back = convert_attention_state_dict(half, heads, kv_heads, src="half", dst="interleaved",
                                        rotary_dim=rotary_dim)
    assert all(torch.equal(back[k], sd[k]) for k in sd)


def test_converted_biased_attention_computes_the_same_in_the_other_layout():
    """A layer with q/k/v biases (Qwen-style), half layout -> interleaved: same output, each
    equal to the float64 reference of its own layout; converting the weights alone is wrong."""
    dim, heads, kv_heads, n = 32, 4, 2, 9
    half = StandardAttentionWithRoPE(dim, heads, num_kv_heads=kv_heads, layout="half",
                                     dtype=F64).eval()
    with torch.no_grad():
        for proj in (half.q_proj, half.k_proj):
            proj.bias.normal_()                     # biases large enough to matter
    x = torch.randn(2, n, dim, dtype=F64)
    tables = generate_rope_embeddings(n, dim // heads, dtype=F64)
    table = angles(torch.arange(n), thetas(dim // heads))

    interleaved = StandardAttentionWithRoPE(dim, heads, num_kv_heads=kv_heads,
                                            layout="interleaved", dtype=F64).eval()
    interleaved.load_state_dict(convert_attention_state_dict(
        half.state_dict(), heads, kv_heads, src="half", dst="interleaved"))
    with torch.no_grad():
        out_half = half(x, x, x, tables, is_causal=True)
        out_int = interleaved(x, x, x, tables, is_causal=True)
    for module, out in ((half, out_half), (interleaved, out_int)):
        expected, _ = attention_module_reference(module, x, x, x, table, table, causal=True)
        torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(out_int, out_half, rtol=1e-10, atol=1e-10)

    weights_only = dict(half.state_dict())
    for name, n_heads in (("q_proj.weight", heads), ("k_proj.weight", kv_heads)):
        weights_only[name] = convert_qk_weight(weights_only[name], n_heads, src="half",
                                               dst="interleaved")
    interleaved.load_state_dict(weights_only)
    with torch.no_grad():
        wrong = interleaved(x, x, x, tables, is_causal=True)
    assert (wrong - out_half).abs().max() > 1e-2


def test_attention_state_dict_errors():
    with pytest.raises(TypeError, match="state_dict must be a mapping"):
        convert_attention_state_dict([torch.zeros(4, 4)], 1, src="half", dst="interleaved")
    with pytest.raises(ValueError, match="no entry ending in"):
        convert_attention_state_dict({"v_proj.weight": torch.zeros(4, 4)}, 1, src="half",
                                     dst="interleaved")
    with pytest.raises(ValueError, match="not divisible by num_heads=3"):
        convert_attention_state_dict({"q_proj.weight": torch.zeros(8, 4)}, 3, src="half",
                                     dst="interleaved")
    with pytest.raises(ValueError, match="layout"):
        convert_attention_state_dict({"q_proj.weight": torch.zeros(8, 4)}, 1, src="half",
                                     dst="complex")
