"""Decoding after a multimodal prefill, and beam search over a KVCache (issue 33, items 11
and 12).

Every decoding step is compared with a float64 full causal forward of the same weights over
that row's (or beam's) whole history alone (tests/reference.py), with angles written out:
positions times frequencies. The positions of the decoded tokens follow Qwen2-VL's rule as
Hugging Face writes it: ``rope_deltas = max(prefill positions) + 1 - prefill length``, and
the token at cache position c sits at c + rope_deltas on every axis.
"""

from __future__ import annotations

import pytest
import torch
from reference import attention_module_reference, thetas

from ropelib import KVCache, StandardAttentionWithRoPE, axis_frequencies, mrope_positions
from ropelib.scaling import scaled_frequencies

F64 = torch.float64
D, H = 32, 4  # head_dim 8
TOL = {"rtol": 1e-5, "atol": 1e-5}
W = axis_frequencies(D // H, [2, 1, 1])  # M-RoPE over (t, h, w), 4 pairs
# two rows of 7 tokens: text, an image, text; text and an image of 6 patches
SEGMENTS = ([2, (1, 2, 2), 1], [1, (1, 2, 3)])
DYNAMIC = {"rope_type": "dynamic", "factor": 2.0}  # L0 = max_position_embeddings = 8


def build(device: torch.device | str = "cpu", **kw) -> StandardAttentionWithRoPE:
    torch.manual_seed(0)
    return StandardAttentionWithRoPE(D, H, num_kv_heads=2, layout="half", **kw).eval().to(device)


def reference_last_row(module, history: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """The float64 full causal forward over one row's tokens ``(N, D)``; its last output."""
    x = history[None]
    out, _ = attention_module_reference(module, x, x, x, angles, angles, causal=True)
    return out[0, -1]


def hf_decode_positions(prefill: torch.Tensor, steps: int) -> torch.Tensor:
    """Qwen2-VL's positions of ``steps`` decoded tokens after a ``(N, 3)`` prefill, as
    Hugging Face computes them: cache position + rope_deltas on every axis."""
    rope_deltas = int(prefill.max()) + 1 - prefill.shape[0]
    cache_positions = torch.arange(prefill.shape[0], prefill.shape[0] + steps)
    return (cache_positions + rope_deltas)[:, None].expand(-1, 3)


def test_decoding_after_a_multimodal_prefill_continues_each_rows_sequence(device):
    module = build(device, frequencies=W)
    prefill = torch.stack([mrope_positions(s) for s in SEGMENTS])  # (2, 7, 3), CPU: the refs
    assert [int(p.max()) + 1 for p in prefill] == [5, 4]  # not the cache length 7
    torch.manual_seed(1)
    x = torch.randn(2, 7 + 3, D).to(device)
    cache = KVCache()
    with torch.no_grad():
        module(x[:, :7], x[:, :7], x[:, :7], positions=prefill.to(device), kv_cache=cache,
               is_causal=True)
        for t in range(7, 10):
            xt = x[:, t:t + 1]
            out = module(xt, xt, xt, kv_cache=cache, is_causal=True)  # no positions
            for row in range(2):
                positions = torch.cat([prefill[row], hf_decode_positions(prefill[row], 3)])
                angles = positions[:t + 1].to(F64) @ W.T
                torch.testing.assert_close(out[row, 0].cpu().to(F64),
                                           reference_last_row(module, x[row, :t + 1], angles),
                                           **TOL)
    assert cache.next_position.tolist() == [5 + 3, 4 + 3]


def test_a_multi_axis_prefill_shared_by_the_batch_and_text_only_decoding(device):
    """(N, 3) positions for every row, and a text-only prefill (no positions): the next
    position is the largest + 1, and the cache length for text."""
    module = build(device, frequencies=W)
    prefill = mrope_positions(SEGMENTS[0])
    cache, text = KVCache(), KVCache()
    x = torch.randn(3, 8, D).to(device)
    with torch.no_grad():
        module(x[:, :7], x[:, :7], x[:, :7], positions=prefill.to(device), kv_cache=cache,
               is_causal=True)
        module(x[:, :7], x[:, :7], x[:, :7], kv_cache=text, is_causal=True)
        out = module(x[:, 7:], x[:, 7:], x[:, 7:], kv_cache=cache, is_causal=True)
        text_out = module(x[:, 7:], x[:, 7:], x[:, 7:], kv_cache=text, is_causal=True)
    assert cache.next_position.tolist() == [6] * 3 and text.next_position.tolist() == [8] * 3
    positions = torch.cat([prefill, hf_decode_positions(prefill, 1)])
    diagonal = torch.arange(8)[:, None].expand(-1, 3)
    for row in range(3):
        torch.testing.assert_close(out[row, 0].cpu().to(F64), reference_last_row(
            module, x[row], positions.to(F64) @ W.T), **TOL)
        torch.testing.assert_close(text_out[row, 0].cpu().to(F64), reference_last_row(
            module, x[row], diagonal.to(F64) @ W.T), **TOL)


# --------------------------------------------------------------------------- beam search

def angles_1d(length: int) -> torch.Tensor:
    return torch.arange(length, dtype=F64)[:, None] * thetas(D // H)


def angles_dynamic(length: int) -> torch.Tensor:
    """Dynamic NTK: every position with the frequencies of the current length."""
    inv_freq, _ = scaled_frequencies(D // H, config=DYNAMIC, seq_len=length,
                                     max_position_embeddings=8)
    return torch.arange(length, dtype=F64)[:, None] * inv_freq


CASES = {
    "rotated keys": ({}, None, angles_1d),
    # keys cached unrotated with their positions: past L0 = 8 every step changes the frequencies
    "dynamic NTK": ({"scaling": DYNAMIC, "max_position_embeddings": 8}, None, angles_dynamic),
    "M-RoPE after images": ({"frequencies": W}, "mrope", None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_beam_search_reorder_equals_decoding_each_beam_alone(case, device):
    kw, positions, angles_of = CASES[case]
    module = build(device, **kw)
    prefill = torch.stack([mrope_positions(s) for s in SEGMENTS]) if positions else None
    torch.manual_seed(2)
    prompts = torch.randn(2, 7, D).to(device)
    cache = KVCache()
    with torch.no_grad():
        module(prompts, prompts, prompts, positions=None if prefill is None else
               prefill.to(device), kv_cache=cache, is_causal=True)
    # expand each prompt into 3 beams, then after each step keep some beams (some twice)
    beams = [0, 0, 0, 1, 1, 1]
    cache.reorder(torch.tensor(beams, device=device))
    history = [prompts[b] for b in beams]
    prompt_of = list(beams)
    choices = [[2, 2, 0, 5, 3, 3], [1, 0, 2, 4, 4, 3], [5, 5, 5, 0, 1, 2]]
    for step, choice in enumerate(choices):
        xt = torch.randn(6, 1, D).to(device)
        with torch.no_grad():
            out = module(xt, xt, xt, kv_cache=cache, is_causal=True)
        for b in range(6):
            history[b] = torch.cat([history[b], xt[b]])
            n = history[b].shape[0]
            if positions:
                p = prefill[prompt_of[b]]
                p = torch.cat([p, hf_decode_positions(p, step + 1)])
                angles = p.to(F64) @ W.T
            else:
                angles = angles_of(n)
            torch.testing.assert_close(out[b, 0].cpu().to(F64),
                                       reference_last_row(module, history[b], angles), **TOL)
        cache.reorder(torch.tensor(choice, device=device))
        history = [history[i] for i in choice]
        prompt_of = [prompt_of[i] for i in choice]
    assert cache.length == 7 + len(choices) and cache.key.shape[0] == 6


def test_reorder_moves_keys_values_positions_and_next_positions_together(device):
    cache = KVCache(capacity=8)
    key, value = torch.randn(3, 2, 4, 8).to(device), torch.randn(3, 2, 4, 8).to(device)
    positions = torch.tensor([[0, 1, 2, 3], [5, 6, 7, 8], [9, 10, 11, 12]], device=device)
    cache.update(key, value, positions=positions,
                 next_position=torch.tensor([4, 9, 13], device=device))
    index = torch.tensor([2, 0, 2, 2], device=device)
    cache.reorder(index)
    torch.testing.assert_close(cache.key, key[index], rtol=0, atol=0)
    torch.testing.assert_close(cache.value, value[index], rtol=0, atol=0)
    assert torch.equal(cache.positions, positions[index])
    assert cache.next_position.tolist() == [13, 4, 13, 13]
    assert cache.capacity == 8 and cache.length == 4
    # the next update extends the reordered rows
    cache.update(key[:1].expand(4, -1, -1, -1)[..., :1, :], value[:1].expand(4, -1, -1, -1)[
        ..., :1, :], positions=torch.full((4, 1), 20, device=device))
    assert cache.positions[:, -1].tolist() == [20] * 4 and cache.length == 5


@pytest.mark.parametrize(("beam_idx", "message"), [
    (torch.tensor([0, 3]), r"beam_idx must hold rows of the cache, in \[0, 3\), got values "
                           r"in \[0, 3\]"),
    (torch.tensor([-1]), r"in \[0, 3\), got values in \[-1, -1\]"),
    (torch.tensor([[0, 1]]), r"beam_idx must have shape \(new_batch,\)"),
    (torch.tensor([0.0]), r"beam_idx must hold integer positions"),
])
def test_reorder_errors_name_beam_idx(beam_idx, message):
    """CPU only: the messages do not depend on the device."""
    cache = KVCache()
    cache.update(torch.randn(3, 1, 2, 8), torch.randn(3, 1, 2, 8))
    with pytest.raises((ValueError, TypeError), match=message):
        cache.reorder(beam_idx)
    with pytest.raises(ValueError, match="reorder needs a cache holding keys"):
        KVCache().reorder(torch.tensor([0]))
