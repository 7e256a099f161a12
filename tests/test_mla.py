"""Chapter 13's MLA from ropelib parts, against transformers' DeepseekV3Attention."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from reference import angles, rope_by_matrix, thetas

from ropelib.book.mla import MultiHeadLatentAttention, kv_cache_bytes_per_token

transformers = pytest.importorskip("transformers")
from transformers import DeepseekV3Config  # noqa: E402
from transformers.models.deepseek_v3.modeling_deepseek_v3 import (  # noqa: E402
    DeepseekV3Attention,
    DeepseekV3RotaryEmbedding,
)

F64 = torch.float64
logging.getLogger("transformers").setLevel(logging.ERROR)

SIZES = {"kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 12}


def hf_pair(q_lora_rank, seed=0):
    config = DeepseekV3Config(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=q_lora_rank,
        rope_interleave=True, num_hidden_layers=1, intermediate_size=32,
        moe_intermediate_size=16, n_routed_experts=2, num_experts_per_tok=1, n_group=1,
        topk_group=1, vocab_size=32, rope_parameters={"rope_type": "default",
                                                      "rope_theta": 500.0}, **SIZES)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    hf = DeepseekV3Attention(config, layer_idx=0).eval()
    with torch.no_grad():
        for weight in hf.parameters():
            weight.normal_(0.0, 0.2)
    ours = MultiHeadLatentAttention(64, 4, q_lora_rank=q_lora_rank, rope_theta=500.0, **SIZES)
    ours.load_state_dict(hf.state_dict())
    return config, hf, ours


@pytest.mark.parametrize("q_lora_rank", [32, None])
def test_matches_transformers_deepseek_v3_attention(q_lora_rank):
    config, hf, ours = hf_pair(q_lora_rank)
    x = torch.randn(2, 11, 64)
    cos_sin = DeepseekV3RotaryEmbedding(config)(x, torch.arange(11)[None])
    mask = torch.full((11, 11), -math.inf).triu(1)[None, None]
    with torch.no_grad():
        expected = hf(x, cos_sin, mask)[0]
        torch.testing.assert_close(ours(x), expected, rtol=0, atol=1e-5)
        torch.testing.assert_close(ours(x, absorbed=True), expected, rtol=0, atol=1e-5)


def test_against_a_float64_reference_written_from_the_formula():
    """Head h's score: q_nope^T W_UK c + (R_m q_rope)^T (R_n k_rope), causal softmax."""
    _, _, mla = hf_pair(32, seed=1)
    mla = mla.double()
    x = torch.randn(1, 7, 64, dtype=F64)
    with torch.no_grad():
        q = mla.q_b_proj(mla.q_a_layernorm(mla.q_a_proj(x))).view(1, 7, 4, 16).transpose(1, 2)
        q_nope, q_rope = q[..., :8], q[..., 8:]
        c, k_rope = mla.kv_a_proj_with_mqa(x).split([16, 8], -1)
        c = mla.kv_a_layernorm(c)
        table = angles(torch.arange(7), thetas(8, 500.0))
        q_rope, k_rope = rope_by_matrix(q_rope, table), rope_by_matrix(k_rope, table)
        w = mla.kv_b_proj.weight.view(4, 20, 16)
        out = []
        for h in range(4):
            keys = c[0] @ w[h, :8].T                   # (7, 8)
            values = c[0] @ w[h, 8:].T                 # (7, 12)
            scores = q_nope[0, h] @ keys.T + q_rope[0, h] @ k_rope[0].T
            scores = scores / math.sqrt(16) + torch.full((7, 7), -math.inf, dtype=F64).triu(1)
            out.append(scores.softmax(-1) @ values)
        expected = mla.o_proj(torch.cat(out, -1)[None])
        torch.testing.assert_close(mla(x), expected, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(mla(x, absorbed=True), expected, rtol=1e-10, atol=1e-10)


def test_latents_and_up_projections_have_the_documented_shapes():
    _, _, mla = hf_pair(32)
    c, k_rope = mla.latents(torch.randn(3, 5, 64))
    assert c.shape == (3, 5, 16) and k_rope.shape == (3, 1, 5, 8)
    w_uk, w_uv = mla.up_projections()
    assert w_uk.shape == (4, 8, 16) and w_uv.shape == (4, 12, 16)
    with pytest.raises(ValueError, match=r"x must be \(batch, seq, hidden_size\), got \(5, 64\)"):
        mla(torch.randn(5, 64))


def test_kv_cache_bytes_per_token():
    assert kv_cache_bytes_per_token(kind="mha", num_layers=2, bytes_per_value=2, num_kv_heads=4,
                                    head_dim=8) == 2 * 2 * 4 * 8 * 2
    assert kv_cache_bytes_per_token(kind="mla", num_layers=61, bytes_per_value=2,
                                    kv_lora_rank=512, qk_rope_head_dim=64) == 61 * 576 * 2
    with pytest.raises(ValueError, match=r"kind must be 'mha', 'gqa' or 'mla', got 'mqa'"):
        kv_cache_bytes_per_token(kind="mqa", num_layers=1, bytes_per_value=2)
    with pytest.raises(ValueError, match=r"sizes for kind='gqa' give 0 values per layer"):
        kv_cache_bytes_per_token(kind="gqa", num_layers=1, bytes_per_value=2)
