"""ropelib.book.layer: the decoder layer computes a Llama layer, and its parts are that layer.

The reference is Hugging Face Llama's eager attention in float64 (tests/reference.py), with
RMSNorm and the SwiGLU MLP written out from their formulas.
"""

from __future__ import annotations

import pytest
import torch
from reference import angles, hf_llama_attention, thetas

from ropelib import generate_rope_embeddings
from ropelib.book.layer import PARTS, DecoderLayer

F64 = torch.float64


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def reference_layer(layer: DecoderLayer, x: torch.Tensor) -> torch.Tensor:
    """The causal layer in float64: h = x + attn(norm(x)), out = h + mlp(norm(h))."""
    hidden, d = x.shape[-1], layer.head_dim
    H, Hkv = layer.num_heads, layer.num_kv_heads
    w_qkv = layer.qkv.weight.to(F64)
    w = {"q_proj.weight": w_qkv[:H * d], "k_proj.weight": w_qkv[H * d:(H + Hkv) * d],
         "v_proj.weight": w_qkv[(H + Hkv) * d:], "o_proj.weight": layer.o.weight.to(F64)}
    eps = torch.finfo(F64).eps  # nn.RMSNorm's default eps is the input dtype's
    normed = rms_norm(x.to(F64), layer.attn_norm.weight.to(F64), eps)
    table = angles(torch.arange(x.shape[1]), thetas(d))
    h = x.to(F64) + hf_llama_attention(normed, w, H, Hkv, table)
    gate, up = (rms_norm(h, layer.mlp_norm.weight.to(F64), eps) @ layer.gate_up.weight.to(F64).T
                ).chunk(2, dim=-1)
    mlp = (gate * torch.sigmoid(gate) * up) @ layer.down.weight.to(F64).T
    assert mlp.shape[-1] == hidden
    return h + mlp


def make_layer(**kwargs) -> DecoderLayer:
    torch.manual_seed(0)
    layer = DecoderLayer(32, 4, 2, 48, dtype=F64, **kwargs)
    for p in layer.parameters():
        p.copy_(torch.randn_like(p) * 0.3 + (1.0 if p.ndim == 1 else 0.0))
    return layer


def test_forward_is_a_llama_layer():
    layer = make_layer()
    x = torch.randn(2, 10, 32, dtype=F64)
    cos, sin = generate_rope_embeddings(10, layer.head_dim, dtype=F64)
    out, (k, v) = layer(x, cos, sin)
    torch.testing.assert_close(out, reference_layer(layer, x), rtol=1e-10, atol=1e-10)
    assert k.shape == v.shape == (2, 2, 10, 8)
    assert not any(p.requires_grad for p in layer.parameters())


def test_decoding_step_with_past_equals_the_full_forward():
    layer = make_layer()
    x = torch.randn(1, 9, 32, dtype=F64)
    cos, sin = generate_rope_embeddings(9, layer.head_dim, dtype=F64)
    full, _ = layer(x, cos, sin)
    _, past = layer(x[:, :8], cos, sin)
    step, (k, _) = layer(x[:, 8:], cos, sin, past)
    torch.testing.assert_close(step, full[:, 8:], rtol=1e-12, atol=1e-12)
    assert k.shape[-2] == 9


def test_parts_repeat_the_layer_and_rope_rotates_q_and_k_in_one_call():
    layer = make_layer()
    x = torch.randn(1, 6, 32, dtype=F64)
    cos, sin = generate_rope_embeddings(6, layer.head_dim, dtype=F64)
    parts = layer.parts(x, cos, sin)
    assert list(parts) == [*PARTS, "hf_rotate_half (q, k)", "whole layer"]
    out, _ = parts["whole layer"]()
    torch.testing.assert_close(out, layer(x, cos, sin)[0], rtol=0, atol=0)
    # Hugging Face's formula gives the q and k that the layer's single in-place call made
    qkv = layer.qkv(layer.attn_norm(x))
    layer._rope(qkv, cos, sin, 0)
    hf_q, hf_k = parts["hf_rotate_half (q, k)"]()
    torch.testing.assert_close(hf_q, layer._heads(qkv, 0, 4), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(hf_k, layer._heads(qkv, 4, 2), rtol=1e-12, atol=1e-12)


def test_parts_of_a_decoding_step_run():
    layer = make_layer()
    x = torch.randn(1, 5, 32, dtype=F64)
    cos, sin = generate_rope_embeddings(5, layer.head_dim, dtype=F64)
    _, past = layer(x[:, :4], cos, sin)
    parts = layer.parts(x[:, 4:], cos, sin, past)
    assert list(parts) == [*PARTS[:3], "KV cache append", *PARTS[3:], "hf_rotate_half (q, k)",
                           "whole layer"]
    k_all, v_all = parts["KV cache append"]()
    assert k_all.shape == v_all.shape == (1, 2, 5, 8)
    out, _ = parts["whole layer"]()
    torch.testing.assert_close(out, layer(x, cos, sin)[0][:, 4:], rtol=1e-12, atol=1e-12)
    for fn in parts.values():
        fn()


@pytest.mark.parametrize(("args", "match"), [
    ((30, 4, 2, 48), "even head_dim"), ((32, 4, 3, 48), "divide"), ((32, 0, 1, 48), "num_heads"),
])
def test_bad_sizes_are_refused(args, match):
    with pytest.raises(ValueError, match=match):
        DecoderLayer(*args)


def test_a_step_must_be_one_position():
    layer = make_layer()
    x = torch.randn(1, 4, 32, dtype=F64)
    cos, sin = generate_rope_embeddings(8, layer.head_dim, dtype=F64)
    _, past = layer(x, cos, sin)
    with pytest.raises(ValueError, match="one position"):
        layer(x[:, :2], cos, sin, past)
