"""Decoding stays exact when the frequencies change (issue 24, section 3).

Dynamic NTK and LongRoPE change every frequency once the sequence is longer than the trained length, and
again at every step after that. Keys cached with the old frequencies would make step-by-step
decoding differ from the full forward (Hugging Face's issue 25104). Here, at every decode
step, the module's output must equal what an independent float64 causal forward over the
tokens so far (tests/reference.py: projections, RoFormer's rotation matrices, plain softmax)
gives at its last position, to about 1e-12, for every rope type ropelib knows, across the
switch, in both layouts, with GQA.
"""

from __future__ import annotations

import pytest
import torch
from reference import angles, attention_module_reference

from ropelib import KVCache, StandardAttentionWithRoPE
from ropelib.scaling import ROPE_TYPES, depends_on_length, scaled_frequencies

F64 = torch.float64
D, H = 32, 4  # head_dim 8
L0 = 8  # the trained length of every config: decoding crosses it
CONFIGS = {  # one config per rope type; a new rope type must add its own here
    "default": None,
    "linear": {"rope_type": "linear", "factor": 2.0},
    "ntk": {"rope_type": "ntk", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": L0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": L0},
    "llama3": {"rope_type": "llama3", "factor": 4.0, "original_max_position_embeddings": L0},
    "longrope": {"rope_type": "longrope", "factor": 4.0, "original_max_position_embeddings": L0,
                 "short_factor": [1.0, 1.1, 1.3, 1.6], "long_factor": [1.0, 2.0, 5.0, 11.0]},
    "proportional": {"rope_type": "proportional", "partial_rotary_factor": 0.5, "factor": 2.0},
}


def test_every_rope_type_is_covered():
    assert set(CONFIGS) == set(ROPE_TYPES)
    assert depends_on_length(CONFIGS["dynamic"]) and depends_on_length(CONFIGS["longrope"])
    assert not any(depends_on_length(CONFIGS[k])
                   for k in ("default", "linear", "yarn", "proportional"))


def full_forward_last(module, x: torch.Tensor, positions: torch.Tensor, length: int,
                      config) -> torch.Tensor:
    """The float64 reference's output at the last position of a causal forward over x, with
    the frequencies (and attention factor) of a sequence of ``length`` tokens."""
    inv_freq, factor = scaled_frequencies(module.rotary_dim, 10000.0, config, seq_len=length)
    table = angles(positions, inv_freq)
    out, _ = attention_module_reference(module, x, x, x, table, table, causal=True,
                                        scale=factor)
    return out[:, -1]


@pytest.mark.parametrize("num_kv_heads", [2])
@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("kind", list(CONFIGS))
def test_each_decode_step_equals_the_full_forward(kind, layout, num_kv_heads, device):
    config = CONFIGS[kind]
    torch.manual_seed(0)
    module = StandardAttentionWithRoPE(D, H, num_kv_heads=num_kv_heads, layout=layout,
                                       scaling=config, max_position_embeddings=4
                                       ).double().eval().to(device)  # float64 weights, tables
    n, prefill = 2 * L0 + 3, 5
    if depends_on_length(config):  # the frequencies do change across the decode
        before, _ = scaled_frequencies(8, 10000.0, config, seq_len=prefill)
        after, _ = scaled_frequencies(8, 10000.0, config, seq_len=n)
        assert (before - after).abs().max() > 1e-3
    x = torch.randn(2, n, D, dtype=F64).to(device)
    cache = KVCache()
    with torch.no_grad():
        module(x[:, :prefill], x[:, :prefill], x[:, :prefill], is_causal=True, kv_cache=cache)
        for t in range(prefill, n):
            xt = x[:, t:t + 1]
            step = module(xt, xt, xt, is_causal=True, kv_cache=cache)[:, 0]
            assert step.device == device
            want = full_forward_last(module, x[:, :t + 1], torch.arange(t + 1), t + 1, config)
            torch.testing.assert_close(step.cpu(), want, rtol=1e-12, atol=1e-12,
                                       msg=f"step {t}")
        full = module(x, x, x, is_causal=True)
    torch.testing.assert_close(step, full[:, -1], rtol=1e-12, atol=1e-12)
    assert (cache.positions is not None) == depends_on_length(config)


def test_chunked_decoding_with_per_row_positions_across_the_switch(device):
    """Chunks of 3 tokens with per-row positions (the second row starts later, as after left
    padding): each chunk's last token equals the reference forward over that row's tokens."""
    config = CONFIGS["dynamic"]
    torch.manual_seed(0)
    module = StandardAttentionWithRoPE(D, H, num_kv_heads=2, layout="half", scaling=config
                                       ).double().eval().to(device)
    n = 2 * L0 + 2
    x = torch.randn(2, n, D, dtype=F64).to(device)
    positions = torch.stack([torch.arange(n), torch.arange(n) + 1])  # on the CPU, for the ref
    cache = KVCache()
    with torch.no_grad():
        for start in range(0, n, 3):
            chunk = slice(start, start + 3)
            xt = x[:, chunk]
            out = module(xt, xt, xt, is_causal=True, positions=positions[:, chunk].to(device),
                         kv_cache=cache).cpu()
            end = min(start + 3, n)
            length = int(positions[:, :end].max()) + 1  # the module's length: the largest + 1
            for row in range(2):
                want = full_forward_last(module, x[row:row + 1, :end], positions[row, :end],
                                         length, config)
                torch.testing.assert_close(out[row, -1], want[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(cache.positions.cpu(), positions)


def test_unrotated_keys_are_cached_with_their_positions(device):
    """For a length-dependent rope type the cache holds the keys as projected (unrotated),
    and their positions; the values as always."""
    torch.manual_seed(0)
    module = StandardAttentionWithRoPE(D, H, num_kv_heads=2, scaling=CONFIGS["dynamic"],
                                       bias=False, dtype=F64).eval().to(device)
    x = torch.randn(1, 11, D, dtype=F64).to(device)
    cache = KVCache()
    with torch.no_grad():
        module(x[:, :4], x[:, :4], x[:, :4], is_causal=True, kv_cache=cache)
        for t in range(4, 11):
            module(x[:, t:t + 1], x[:, t:t + 1], x[:, t:t + 1], is_causal=True, kv_cache=cache)
    k = (x @ module.k_proj.weight.T).view(1, 11, 2, D // H).transpose(1, 2)
    torch.testing.assert_close(cache.key, k, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(cache.positions, torch.arange(11, device=device)[None])


def test_a_cache_of_rotated_keys_is_refused_by_a_length_dependent_module():
    """CPU only, as the next test: the refusal reads the cache's state, not the device."""
    torch.manual_seed(0)
    plain = StandardAttentionWithRoPE(D, H)
    dynamic = StandardAttentionWithRoPE(D, H, scaling=CONFIGS["dynamic"])
    x = torch.randn(1, 3, D)
    cache = KVCache()
    with torch.no_grad():
        plain(x, x, x, kv_cache=cache)
        with pytest.raises(ValueError, match="this KVCache holds the keys of another layer"):
            dynamic(x, x, x, kv_cache=cache)  # a cache serves one layer (issue 43 item 14)
        key = torch.zeros(1, H, 1, D // H)
        with pytest.raises(ValueError, match="this cache holds keys without their positions"):
            cache.update(key, key, positions=torch.tensor([3]))
    assert cache.length == 3


def test_cache_positions_errors_name_the_argument():
    cache = KVCache()
    key = torch.zeros(2, 1, 3, 4)
    with pytest.raises(ValueError, match=r"positions must have shape \(new,\) = \(3,\) or "
                                         r"\(batch, new\) = \(2, 3\) \(multi-axis: \(batch, new, k\)\), "
                                         r"got \(2, 2\)"):
        cache.update(key, key, positions=torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(TypeError, match="positions must hold integer positions"):
        cache.update(key, key, positions=torch.zeros(3))
    cache.update(key, key, positions=torch.arange(3))
    with pytest.raises(ValueError, match="this cache holds keys with their positions"):
        cache.update(key[..., :1, :], key[..., :1, :])
    assert cache.length == 3
    torch.testing.assert_close(cache.positions, torch.arange(3).expand(2, 3))


@pytest.mark.parametrize("axes", [1, 3], ids=["1D", "M-RoPE"])
def test_a_refused_step_leaves_the_cache_as_it_was(axes):
    """A length-dependent module caches its keys before it rotates them; a step whose
    positions are refused (negative) must not have kept its keys: the cache keeps its length
    and next positions, and the next good step equals the float64 forward over the tokens
    before it (M-RoPE on the diagonal is 1D RoPE). CPU only: the refusal reads the values."""
    config = CONFIGS["dynamic"]
    if axes == 3:
        config = {**config, "mrope_section": [2, 1, 1]}
    torch.manual_seed(0)
    module = StandardAttentionWithRoPE(D, H, num_kv_heads=2, scaling=config,
                                       max_position_embeddings=L0).double().eval()
    x = torch.randn(1, 2 * L0, D, dtype=F64)
    cache = KVCache()
    shape = (1, 1, 3) if axes == 3 else (1, 1)
    with torch.no_grad():
        module(x[:, :L0], x[:, :L0], x[:, :L0], is_causal=True, kv_cache=cache)
        for name in ("positions", "key_positions"):
            bad = {"positions": torch.full(shape, L0), name: torch.full(shape, -3)}
            with pytest.raises(ValueError, match=rf"{name} must be >= 0, got min -3"):
                module(x[:, L0:L0 + 1], x[:, L0:L0 + 1], x[:, L0:L0 + 1], kv_cache=cache,
                       **bad)
            assert cache.length == L0
        step = module(x[:, L0:L0 + 1], x[:, L0:L0 + 1], x[:, L0:L0 + 1], kv_cache=cache)
    want = full_forward_last(module, x[:, :L0 + 1], torch.arange(L0 + 1), L0 + 1, config)
    torch.testing.assert_close(step[:, 0], want, rtol=1e-12, atol=1e-12)
    assert cache.length == L0 + 1
