"""Qwen2-VL / Qwen3-VL / Qwen3.5 ``rope_parameters`` (with ``mrope_section``) as they are,
against transformers' own rotary embeddings (issue 33, item 4).

Each config is built here from scratch (no download) with a small head. transformers deals
the pairs of its (possibly scaled) inv_freq out to the axes t, h, w: in chunks (Qwen2-VL) or
in turn (Qwen3-VL, Qwen3.5, whose configs say ``mrope_interleaved``), and multiplies cos and
sin by the rope type's attention factor (YaRN). ropelib builds the same frequency matrix
from the same dict. transformers computes in float32, ropelib in float64: the rows agree to
float32 rounding of angles below 20 rad.
"""

from __future__ import annotations

import logging

import pytest
import torch
from reference import attention_module_reference

from ropelib import (
    KVCache,
    RotaryEmbedding,
    StandardAttentionWithRoPE,
    axis_frequencies,
    mrope_positions,
)

transformers = pytest.importorskip("transformers")
from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig  # noqa: E402
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding  # noqa: E402
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig  # noqa: E402
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding  # noqa: E402
from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig  # noqa: E402
from transformers.models.qwen3_vl.modeling_qwen3_vl import (  # noqa: E402
    Qwen3VLTextRotaryEmbedding,
)

logging.getLogger("transformers").setLevel(logging.ERROR)

F64 = torch.float64
HEAD_DIM, HEADS = 32, 2
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
TYPES = {"default": {"rope_type": "default"}, "linear": {"rope_type": "linear", "factor": 2.0},
         "yarn": YARN}
# frequencies that change with the length max(position ids) + 1, trained length 64
# (transformers reads dynamic NTK's from max_position_embeddings, LongRoPE's from its key)
LENGTH_DEPENDENT = {
    "dynamic": ({"rope_type": "dynamic", "factor": 2.0}, 64),
    "longrope": ({"rope_type": "longrope", "short_factor": [1.0 + i / 64 for i in range(16)],
                  "long_factor": [2.0 + i / 8 for i in range(16)],
                  "original_max_position_embeddings": 64}, 256),
}
MODELS = {
    "qwen2-vl": (Qwen2VLTextConfig, Qwen2VLRotaryEmbedding, {"mrope_section": [4, 6, 6]}, {}),
    "qwen3-vl": (Qwen3VLTextConfig, Qwen3VLTextRotaryEmbedding,
                 {"mrope_section": [6, 5, 5], "mrope_interleaved": True}, {}),
    # Qwen3.5: M-RoPE on the first quarter of a 64-dim head
    "qwen3.5 partial": (Qwen3_5TextConfig, Qwen3_5TextRotaryEmbedding,
                        {"mrope_section": [3, 3, 2], "mrope_interleaved": True,
                         "partial_rotary_factor": 0.25}, {"head_dim": 64}),
}
# text, a 1 x 4 x 6 patch grid merged 2 x 2 into 6 tokens, text: 11 tokens, max position 6
POSITIONS = mrope_positions([3, (1, 4, 6), 2], spatial_merge_size=2)


def hf_rotary(model: str, kind: str):
    config_cls, rotary_cls, mrope, extra = MODELS[model]
    head_dim = extra.get("head_dim", HEAD_DIM)
    rope, length = LENGTH_DEPENDENT[kind] if kind in LENGTH_DEPENDENT else (TYPES[kind], 256)
    params = {**rope, **mrope, "rope_theta": 1e4}
    config = config_cls(hidden_size=HEADS * head_dim, num_attention_heads=HEADS,
                        head_dim=head_dim, max_position_embeddings=length, rope_parameters=params)
    return config, rotary_cls(config)


def hf_rows(rotary, positions: torch.Tensor):
    """transformers' cos and sin ``(N, pairs)`` for ``(N, 3)`` positions (its position ids
    are ``(3, batch, N)``; its rows repeat the pairs for the half layout)."""
    cos, sin = rotary(torch.zeros(1), positions.T[:, None])
    pairs = cos.shape[-1] // 2
    return cos[0, :, :pairs].to(F64), sin[0, :, :pairs].to(F64)


@pytest.mark.parametrize("kind", list(TYPES))
@pytest.mark.parametrize("model", list(MODELS))
def test_rotary_rows_equal_transformers(model, kind, device):
    config, hf = hf_rotary(model, kind)
    ours = RotaryEmbedding(config.head_dim, scaling=config.rope_parameters).to(device)
    assert ours.num_axes == 3
    expected_cos, expected_sin = hf_rows(hf, POSITIONS)
    cos, sin = ours(positions=POSITIONS.to(device))
    assert cos.device == device
    torch.testing.assert_close(cos.cpu().to(F64), expected_cos, rtol=0, atol=2e-6)
    torch.testing.assert_close(sin.cpu().to(F64), expected_sin, rtol=0, atol=2e-6)
    # text tokens (the diagonal) and the 1D tables: 1D RoPE of the same spectrum
    diagonal = torch.arange(11)[:, None].expand(-1, 3)
    torch.testing.assert_close(ours(11)[0].cpu().to(F64), hf_rows(hf, diagonal)[0], rtol=0,
                               atol=2e-6)


@pytest.mark.parametrize("model", ["qwen2-vl", "qwen3-vl"])
def test_a_default_config_is_the_matrix_of_axis_frequencies(model):
    config, _ = hf_rotary(model, "default")
    params = config.rope_parameters
    order = "interleaved" if params.get("mrope_interleaved") else "chunked"
    expected = axis_frequencies(HEAD_DIM, params["mrope_section"], base=1e4, order=order)
    torch.testing.assert_close(RotaryEmbedding(HEAD_DIM, scaling=params).frequencies, expected,
                               rtol=0, atol=0)


def hf_angles(rotary, positions: torch.Tensor) -> torch.Tensor:
    """Angles ``(N, pairs)`` in float64 from transformers' inv_freq, each pair reading the
    axis transformers' own recomposition gives it (fed the axis numbers as 'frequencies')."""
    pairs = rotary.inv_freq.shape[0]
    axis_ids = torch.arange(3, dtype=torch.float32)[:, None, None].expand(3, 1, pairs).clone()
    axis = rotary.recomposition_frequencies(axis_ids)[0, :pairs].long()
    return positions[:, axis].to(F64) * rotary.inv_freq.to(F64)


@pytest.mark.parametrize("model", list(MODELS))
def test_attention_module_with_a_yarn_mrope_config_equals_the_float64_reference(model, device):
    config, hf = hf_rotary(model, "yarn")
    torch.manual_seed(0)
    module = StandardAttentionWithRoPE(HEADS * config.head_dim, HEADS, layout="half",
                                       scaling=config.rope_parameters).eval().to(device)
    x = torch.randn(2, POSITIONS.shape[0], HEADS * config.head_dim).to(device)
    with torch.no_grad():
        out = module(x, x, x, positions=POSITIONS.to(device), is_causal=True).cpu()
    angles = hf_angles(hf, POSITIONS)
    expected, _ = attention_module_reference(module, x, x, x, angles, angles, causal=True,
                                             scale=hf.attention_scaling)
    torch.testing.assert_close(out.to(F64), expected, rtol=1e-5, atol=1e-5)
    assert hf.attention_scaling > 1.1  # YaRN's factor is really there


def test_mrope_config_errors_name_the_key():
    with pytest.raises(ValueError, match=r"mrope_section'\]=\[4, 6, 5\] must sum to the 16 "
                                         r"rotated pairs"):
        RotaryEmbedding(HEAD_DIM, scaling={"rope_type": "default", "mrope_section": [4, 6, 5]})
    with pytest.raises(ValueError, match=r"mrope_section'\] must be a list of positive ints"):
        RotaryEmbedding(HEAD_DIM, scaling={"rope_type": "default", "mrope_section": [4, 0, 12]})
    with pytest.raises(ValueError, match=r"mrope_interleaved'\] must be a bool"):
        RotaryEmbedding(HEAD_DIM, scaling={"rope_type": "default", "mrope_section": [4, 6, 6],
                                           "mrope_interleaved": "yes"})


def hf_scaled_rows(rotary, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' rows for ``(N, 3)`` positions in float64: its forward picks the
    frequencies of the length max(positions) + 1, then the angles are taken in float64
    (``hf_angles``) and scaled by its attention factor."""
    rotary(torch.zeros(1), positions.T[:, None])
    angles = hf_angles(rotary, positions)
    return angles.cos() * rotary.attention_scaling, angles.sin() * rotary.attention_scaling


@pytest.mark.parametrize("text", [10, 90], ids=["within", "past the trained length"])
@pytest.mark.parametrize("kind", list(LENGTH_DEPENDENT))
@pytest.mark.parametrize("model", ["qwen2-vl", "qwen3-vl"])
def test_length_dependent_mrope_rows_equal_transformers(model, kind, text, device):
    config, hf = hf_rotary(model, kind)
    positions = mrope_positions([3, (1, 4, 6), text], spatial_merge_size=2)
    ours = RotaryEmbedding(config.head_dim, scaling=config.rope_parameters,
                           max_position_embeddings=config.max_position_embeddings).to(device)
    expected_cos, expected_sin = hf_scaled_rows(hf, positions)
    cos, sin = ours(positions=positions.to(device))
    torch.testing.assert_close(cos.cpu().to(F64), expected_cos, rtol=0, atol=1e-6)
    torch.testing.assert_close(sin.cpu().to(F64), expected_sin, rtol=0, atol=1e-6)
    # the frequencies did change past the trained length (and not within it)
    unscaled = hf_angles(hf_rotary(model, "default")[1], positions)
    change = (hf_angles(hf, positions) - unscaled).abs().max()
    assert (change > 1.0) if positions.max() >= 64 else (change < 1.0)


@pytest.mark.parametrize("kind", list(LENGTH_DEPENDENT))
def test_length_dependent_mrope_decode_equals_the_full_forward(kind, device):
    """Prefill text + an image + text, then decode one token at a time (each at its row's
    next position) past the trained length: every step equals the full causal forward over
    the tokens so far, whose output is transformers' rows of that length applied in
    float64."""
    config, _ = hf_rotary("qwen2-vl", kind)
    torch.manual_seed(0)
    module = StandardAttentionWithRoPE(
        HEADS * HEAD_DIM, HEADS, num_kv_heads=1, layout="half", scaling=config.rope_parameters,
        max_position_embeddings=config.max_position_embeddings).eval().to(device)
    positions = mrope_positions([3, (1, 4, 6), 64], spatial_merge_size=2)  # max position 69
    x = torch.randn(2, positions.shape[0], HEADS * HEAD_DIM).to(device)
    prefill, cache = 40, KVCache()
    with torch.no_grad():
        out = module(x[:, :prefill], x[:, :prefill], x[:, :prefill], is_causal=True,
                     positions=positions[:prefill].to(device), kv_cache=cache)
        for t in range(prefill, positions.shape[0] + 1):
            full = module(x[:, :t], x[:, :t], x[:, :t], is_causal=True,
                          positions=positions[:t].to(device))
            torch.testing.assert_close(out, full[:, -out.shape[1]:], rtol=1e-5, atol=1e-5)
            if t < positions.shape[0]:
                out = module(x[:, t:t + 1], x[:, t:t + 1], x[:, t:t + 1], kv_cache=cache)
    assert cache.positions.shape == (2, positions.shape[0], 3)
    _, hf = hf_rotary("qwen2-vl", kind)
    angles = hf_angles(hf, positions) if hf(torch.zeros(1), positions.T[:, None]) else None
    expected, _ = attention_module_reference(module, x, x, x, angles, angles, causal=True,
                                             scale=hf.attention_scaling)
    torch.testing.assert_close(full.cpu().to(F64), expected, rtol=1e-5, atol=1e-5)


def test_length_dependent_mrope_refuses_a_trace():
    config, _ = hf_rotary("qwen2-vl", "dynamic")
    module = StandardAttentionWithRoPE(HEADS * HEAD_DIM, HEADS, scaling=config.rope_parameters,
                                       max_position_embeddings=64).eval().requires_grad_(False)
    x = torch.randn(1, POSITIONS.shape[0], HEADS * HEAD_DIM)
    with pytest.raises(ValueError, match=r"depend on the length max\(positions\) \+ 1"):
        torch.jit.trace(lambda x, p: module(x, x, x, positions=p), (x, POSITIONS))


def test_a_cache_keeps_one_kind_of_positions():
    cache = KVCache()
    key = torch.zeros(2, 1, 3, 4)
    cache.update(key, key, positions=torch.zeros(2, 3, 3, dtype=torch.int64))
    assert cache.positions.shape == (2, 3, 3)
    with pytest.raises(ValueError, match=r"holds keys with 3 coordinates each; got positions "
                                         r"of shape \(3,\)"):
        cache.update(key, key, positions=torch.arange(3))
    # a 1D module decoding a multi-axis module's cache: refused as another layer's cache
    config, _ = hf_rotary("qwen2-vl", "dynamic")
    mrope = StandardAttentionWithRoPE(HEADS * HEAD_DIM, HEADS, scaling=config.rope_parameters,
                                      max_position_embeddings=64)
    plain = StandardAttentionWithRoPE(HEADS * HEAD_DIM, HEADS, scaling={"rope_type": "dynamic",
                                                                        "factor": 2.0},
                                      max_position_embeddings=64)
    x, shared = torch.randn(1, 2, HEADS * HEAD_DIM), KVCache()
    with torch.no_grad():
        mrope(x, x, x, kv_cache=shared)
        with pytest.raises(ValueError, match=r"this KVCache holds the keys of another layer"):
            plain(x[:, :1], x[:, :1], x[:, :1], kv_cache=shared)
    assert shared.length == 2
    with pytest.raises(ValueError, match=r"multi-axis positions must have shape \(batch, new, "
                                         r"k\) = \(2, 3, k\)"):
        KVCache().update(key, key, positions=torch.zeros(2, 4, 3, dtype=torch.int64))
