"""Context extension: linear (PI), NTK, dynamic NTK, YaRN and Llama 3, against the papers."""

from __future__ import annotations

import math

import pytest
import torch
from reference import angles, attention_module_reference, thetas

from ropelib import (
    RotaryEmbedding,
    StandardAttentionWithRoPE,
    generate_rope_embeddings,
    rope_frequencies,
    scaled_frequencies,
)
from ropelib.scaling import yarn_correction_range

F64 = torch.float64


def base_from_frequencies(inv_freq: torch.Tensor, dim: int) -> float:
    """Invert theta_1 = base^(-2/dim)."""
    return float(inv_freq[1]) ** (-dim / 2)


# --------------------------------------------------------------------------- NTK

def test_ntk_base_for_factor_4_and_head_dim_128_is_about_40890():
    inv_freq, attention = scaled_frequencies(128, 10000.0, {"rope_type": "ntk", "factor": 4.0})
    assert attention == 1.0
    assert abs(base_from_frequencies(inv_freq, 128) - 40_890) < 1.0
    torch.testing.assert_close(inv_freq, thetas(128, 1e4 * 4 ** (128 / 126)), rtol=1e-12, atol=0)
    # NTK-aware: the highest frequency is kept, the lowest is stretched by exactly s
    assert float(inv_freq[0]) == 1.0
    assert math.isclose(float(inv_freq[-1]), float(thetas(128)[-1]) / 4, rel_tol=1e-12)


# --------------------------------------------------------------------------- linear (PI)

def test_linear_scaling_at_position_m_equals_default_at_m_over_s(device):
    s, n, d = 4.0, 64, 16
    cos, sin = generate_rope_embeddings(n, d, device=device, dtype=F64,
                                        scaling={"rope_type": "linear", "factor": s})
    ref = angles(torch.arange(n) / s, thetas(d))
    torch.testing.assert_close(cos.cpu(), ref.cos(), rtol=0, atol=1e-12)
    torch.testing.assert_close(sin.cpu(), ref.sin(), rtol=0, atol=1e-12)
    default_cos, _ = generate_rope_embeddings(n // 4, d, device=device, dtype=F64)
    torch.testing.assert_close(cos[::4], default_cos, rtol=0, atol=1e-12)  # m = 4j rotates like j


def test_linear_scaling_accepts_legacy_type_key():
    inv_freq = rope_frequencies(8, scaling={"type": "linear", "factor": 2.0}, dtype=F64)
    torch.testing.assert_close(inv_freq, thetas(8) / 2, rtol=1e-14, atol=0)


# --------------------------------------------------------------------------- YaRN

def yarn_reference(dim, base, factor, original, beta_fast=32.0, beta_slow=1.0):
    """YaRN (Peng et al. 2023, as in HF's _compute_yarn_parameters), from scratch."""
    def pair_turning(rotations):  # the pair index whose wavelength fits `rotations` times in L0
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(pair_turning(beta_fast)), 0)
    high = min(math.ceil(pair_turning(beta_slow)), dim - 1)
    theta = thetas(dim, base)
    inv = []
    for i in range(dim // 2):
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)  # 0: extrapolate, 1: interpolate
        inv.append(float(theta[i]) * (1 - ramp) + float(theta[i]) / factor * ramp)
    return (low, high), torch.tensor(inv, dtype=F64), 0.1 * math.log(factor) + 1.0


def test_yarn_correction_range_is_pairs_16_to_41():
    assert yarn_correction_range(128, 10000.0, 2048) == (16, 41)
    (low, high), _, _ = yarn_reference(128, 10000.0, 4.0, 2048)
    assert (low, high) == (16, 41)


def test_yarn_frequencies_and_attention_factor():
    config = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}
    inv_freq, attention = scaled_frequencies(128, 10000.0, config)
    _, expected, expected_attention = yarn_reference(128, 10000.0, 4.0, 2048)
    torch.testing.assert_close(inv_freq, expected, rtol=1e-12, atol=0)
    assert math.isclose(attention, 0.1 * math.log(4.0) + 1.0, rel_tol=1e-15)
    assert math.isclose(attention, expected_attention, rel_tol=1e-15)
    theta = thetas(128)
    torch.testing.assert_close(inv_freq[:17], theta[:17], rtol=1e-12, atol=0)  # kept
    torch.testing.assert_close(inv_freq[41:], theta[41:] / 4, rtol=1e-12, atol=0)  # interpolated
    ratio = theta[17:41] / inv_freq[17:41]
    assert ((ratio > 1) & (ratio < 4)).all() and (ratio.diff() > 0).all()  # a ramp in between


def test_yarn_attention_factor_multiplies_the_tables(device):
    config = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}
    _, inv, factor = yarn_reference(128, 10000.0, 4.0, 2048)
    ref = angles(torch.arange(300), inv)
    cos, sin = generate_rope_embeddings(300, 128, device=device, dtype=F64, scaling=config)
    torch.testing.assert_close(cos.cpu(), factor * ref.cos(), rtol=0, atol=1e-12)
    torch.testing.assert_close(sin.cpu(), factor * ref.sin(), rtol=0, atol=1e-12)
    rot = RotaryEmbedding(128, scaling=config, max_position_embeddings=16, device=device)
    rcos, rsin = rot(300)
    torch.testing.assert_close(rcos.cpu().to(F64), factor * ref.cos(), rtol=0, atol=1e-6)
    torch.testing.assert_close(rsin.cpu().to(F64), factor * ref.sin(), rtol=0, atol=1e-6)


# --------------------------------------------------------------------------- Llama 3.1

def llama3_reference(freqs, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                     old_context_len=8192):
    """Meta's apply_scaling from llama-models (Llama 3.1), written out as a loop."""
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    new_freqs = []
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            new_freqs.append(freq)
        elif wavelen > low_freq_wavelen:
            new_freqs.append(freq / factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            new_freqs.append((1 - smooth) * freq / factor + smooth * freq)
    return torch.tensor(new_freqs, dtype=F64)


def test_llama3_scaling_matches_meta_rule():
    config = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    theta = thetas(128, 500000.0)
    inv_freq, attention = scaled_frequencies(128, 500000.0, config)
    expected = llama3_reference(theta)
    torch.testing.assert_close(inv_freq, expected, rtol=1e-12, atol=0)
    assert attention == 1.0
    ratio = theta / expected  # all three bands occur for Llama 3.1's numbers
    assert (ratio == 1).any() and (ratio == 8).any() and ((ratio > 1) & (ratio < 8)).any()
    # the defaults for the two factors are Llama 3.1's (1 and 4)
    short = {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}
    torch.testing.assert_close(scaled_frequencies(128, 500000.0, short)[0], expected,
                               rtol=1e-12, atol=0)


# --------------------------------------------------------------------------- dynamic NTK

def dynamic_reference(dim, base, factor, original, seq_len):
    """HF's dynamic NTK: base * (s L / L0 - (s - 1))^(d / (d - 2)) once L > L0."""
    if seq_len <= original:
        return thetas(dim, base)
    return thetas(dim, base * (factor * seq_len / original - (factor - 1)) ** (dim / (dim - 2)))


DYNAMIC = {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 64}


@pytest.mark.parametrize("seq_len", [None, 10, 64, 65, 200])
def test_dynamic_frequencies(seq_len):
    inv_freq, _ = scaled_frequencies(16, 10000.0, DYNAMIC, seq_len=seq_len)
    expected = dynamic_reference(16, 10000.0, 2.0, 64, seq_len or 0)
    torch.testing.assert_close(inv_freq, expected, rtol=1e-12, atol=0)
    if seq_len is not None and seq_len > 64:
        assert (inv_freq[1:] < thetas(16)[1:]).all()


def test_dynamic_tables_use_the_sequence_length():
    cos, _ = generate_rope_embeddings(40, 16, scaling=DYNAMIC, dtype=F64)
    torch.testing.assert_close(cos, angles(torch.arange(40), thetas(16)).cos(), rtol=0, atol=1e-12)
    cos, _ = generate_rope_embeddings(200, 16, scaling=DYNAMIC, dtype=F64)
    expected = angles(torch.arange(200), dynamic_reference(16, 1e4, 2.0, 64, 200)).cos()
    torch.testing.assert_close(cos, expected, rtol=0, atol=1e-12)


def test_dynamic_rotary_embedding_keeps_original_frequencies_below_trained_length(device):
    rot = RotaryEmbedding(16, scaling=DYNAMIC, max_position_embeddings=8, device=device)

    def check(n, seq_len_for_freqs):
        cos, sin = rot(n)
        ref = angles(torch.arange(n), dynamic_reference(16, 1e4, 2.0, 64, seq_len_for_freqs))
        torch.testing.assert_close(cos.cpu().to(F64), ref.cos(), rtol=0, atol=1e-6)
        torch.testing.assert_close(sin.cpu().to(F64), ref.sin(), rtol=0, atol=1e-6)

    check(30, 30)  # below the trained length: plain RoPE
    check(64, 64)
    check(100, 100)  # beyond: NTK for the current length
    check(80, 100)  # a shorter but still long request keeps the largest length's frequencies
    check(150, 150)
    check(20, 20)  # back below the trained length: the original frequencies again
    assert rot.cached_len >= 20


def test_attention_module_with_linear_scaling():
    s = 2.0
    attn = StandardAttentionWithRoPE(16, 2, bias=False, scaling={"rope_type": "linear", "factor": s})
    x = torch.randn(2, 6, 16)
    out = attn(x, x, x)
    a = angles(torch.arange(6) / s, thetas(8))
    expected, _ = attention_module_reference(attn, x, x, x, a, a)
    torch.testing.assert_close(out.to(F64), expected, rtol=1e-5, atol=1e-5)
