"""A decode step that a CUDA graph can hold (issue 35): ``forward(..., cache_position=)``
writes the new keys at slots given on the device (``KVCache.write``) and attends over the
whole reserved cache with a mask. On the CPU: every step equals decoding with ``KVCache``
updates (and the full causal forward); on a GPU: captured once with ``torch.cuda.graph``,
every replay with new tokens, positions and slot equals the eager step, and
``torch.compile(mode="reduce-overhead")`` of the step too.
"""

from __future__ import annotations

import pytest
import torch
from reference import attention_module_reference

from ropelib import KVCache, StandardAttentionWithRoPE, axis_frequencies

D, H, KV = 32, 4, 2
CAPACITY = 16


def module(device, **kw):
    torch.manual_seed(0)
    return StandardAttentionWithRoPE(D, H, num_kv_heads=KV, layout="half", bias=False,
                                     device=device, **kw).eval()


@pytest.mark.parametrize("prefill", [1, 5])
def test_steps_at_cache_slots_equal_decoding_with_updates(device, prefill):
    """A prefill then single-token steps at cache_position equal the same tokens through
    KVCache.update and the full causal forward over all of them."""
    attn = module(device)
    x = torch.randn(2, prefill + 6, D, device=device, dtype=torch.float64)
    attn = attn.double()
    with torch.no_grad():
        full = attn(x, x, x, is_causal=True)
        slots, updates = KVCache(capacity=CAPACITY), KVCache()
        outs = [attn(x[:, :prefill], x[:, :prefill], x[:, :prefill], kv_cache=slots,
                     cache_position=torch.tensor(0, device=device))]
        reference = [attn(x[:, :prefill], x[:, :prefill], x[:, :prefill], kv_cache=updates,
                          is_causal=True)]
        for t in range(prefill, x.shape[1]):
            step = x[:, t:t + 1]
            outs.append(attn(step, step, step, kv_cache=slots,
                             cache_position=torch.tensor(t, device=device)))
            reference.append(attn(step, step, step, kv_cache=updates, is_causal=True))
    torch.testing.assert_close(torch.cat(outs, 1), torch.cat(reference, 1), rtol=1e-12,
                               atol=1e-12)
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-12, atol=1e-12)


def test_left_padded_rows_at_their_own_positions(device):
    """Rows padded on the left: a padding mask over the slots and each row's own positions
    (as Hugging Face's generate builds them) give each row's output of decoding it alone."""
    attn = module(device).double()
    x = torch.randn(2, 7, D, device=device, dtype=torch.float64)
    pad = torch.tensor([[True] * 7, [False, False] + [True] * 5], device=device)
    with torch.no_grad():
        cache = KVCache(capacity=CAPACITY)
        mask = torch.zeros(2, 1, 1, CAPACITY, dtype=torch.bool, device=device)
        mask[..., :7] = pad[:, None, None, :]
        positions = (pad.long().cumsum(-1) - 1).clamp_min(0)
        out = attn(x[:, :6], x[:, :6], x[:, :6], kv_cache=cache, attn_mask=mask,
                   positions=positions[:, :6], cache_position=torch.tensor(0, device=device))
        last = attn(x[:, 6:], x[:, 6:], x[:, 6:], kv_cache=cache, attn_mask=mask,
                    positions=positions[:, 6:], cache_position=torch.tensor(6, device=device))
        alone = attn(x[1:, 2:], x[1:, 2:], x[1:, 2:], is_causal=True)
    torch.testing.assert_close(torch.cat([out, last], 1)[1, 2:], alone[0], rtol=1e-12,
                               atol=1e-12)
    torch.testing.assert_close(torch.cat([out, last], 1)[0],
                               attn(x[:1], x[:1], x[:1], is_causal=True)[0], rtol=1e-12,
                               atol=1e-12)


@pytest.mark.parametrize("multi_axis", [False, True], ids=["1D", "M-RoPE"])
def test_no_value_is_read_back_off_the_cpu(multi_axis):
    """Off the CPU the module reads no tensor value on the host (which would wait for a GPU,
    and break a CUDA graph's capture): prefill and decode with per-row positions, a KVCache
    and a cache_position step run on the meta device, which holds no values at all (a host
    read there raises). Multi-axis positions are M-RoPE's (t, h, w)."""
    frequencies = axis_frequencies(D // H, [2, 1, 1]) if multi_axis else None
    attn = module("meta", frequencies=frequencies)
    x = torch.empty(2, 5, D, device="meta")
    shape = (2, 5, 3) if multi_axis else (2, 5)
    positions = torch.empty(shape, dtype=torch.int64, device="meta")
    cache = KVCache()
    with torch.no_grad():
        assert attn(x, x, x, positions=positions, is_causal=True).device.type == "meta"
        cos, _ = attn.rotary(positions=positions)
        assert cos.shape == (2, 5, D // H // 2) and cos.device.type == "meta"
        attn(x, x, x, positions=positions, is_causal=True, kv_cache=cache)
        attn(x[:, :1], x[:, :1], x[:, :1], positions=positions[:, :1], kv_cache=cache)
        assert cache.length == 6
        if not multi_axis:
            attn(x[:, :1], x[:, :1], x[:, :1], positions=positions[:, :1],
                 kv_cache=KVCache(capacity=CAPACITY),
                 cache_position=torch.empty((), dtype=torch.int64, device="meta"))


@pytest.mark.parametrize("multi_axis", [False, True], ids=["1D", "M-RoPE"])
def test_positions_on_the_host_rotate_where_the_module_is(multi_axis):
    """Positions made on the host (``mrope_positions`` makes CPU tensors) for a module on an
    accelerator: the rows are made where q is and the module's tables stay on its device.
    The meta device stands in for the accelerator; before the fix an M-RoPE module built its
    tables on the CPU and refused the call (cos/sin on cpu, x on meta), and every call after."""
    frequencies = axis_frequencies(D // H, [2, 1, 1]) if multi_axis else None
    attn = module("meta", frequencies=frequencies)
    x = torch.empty(2, 5, D, device="meta")
    positions = torch.arange(5)[:, None].expand(5, 3) if multi_axis else torch.arange(5)
    with torch.no_grad():
        for _ in range(2):
            assert attn(x, x, x, positions=positions, is_causal=True).device.type == "meta"
            assert attn(x, x, x, positions=positions, kv_cache=KVCache()).device.type == "meta"
    assert attn.rotary.cos_cached.device.type == "meta"


def test_one_axis_frequencies_step_at_their_slots():
    """A module with one-axis frequencies (``axis_frequencies(8, [4])``, k = 1) takes
    cache_position steps without positions: each token sits at its slot, and every step
    equals the float64 causal forward with angles slot * W."""
    W = axis_frequencies(D // H, [4])
    attn = module("cpu", frequencies=W).double()
    x = torch.randn(2, 6, D, dtype=torch.float64)
    cache = KVCache(capacity=CAPACITY)
    with torch.no_grad():
        for t in range(6):
            xt = x[:, t:t + 1]
            out = attn(xt, xt, xt, kv_cache=cache, cache_position=torch.tensor(t))
            angles = torch.arange(t + 1, dtype=torch.float64)[:, None] @ W.T
            want, _ = attention_module_reference(attn, x[:, :t + 1], x[:, :t + 1],
                                                 x[:, :t + 1], angles, angles, causal=True)
            torch.testing.assert_close(out[:, 0], want[:, -1], rtol=1e-12, atol=1e-12)


def test_cache_position_errors():
    attn = module("cpu")
    x = torch.randn(1, 1, D)
    at = torch.tensor(0)
    with pytest.raises(ValueError, match="needs a kv_cache made with a capacity"):
        attn(x, x, x, cache_position=at)
    with pytest.raises(ValueError, match="write needs buffers of a reserved size"):
        attn(x, x, x, kv_cache=KVCache(), cache_position=at)
    with pytest.raises(ValueError, match="cache_position must be a single slot"):
        attn(x, x, x, kv_cache=KVCache(capacity=4), cache_position=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="as many new keys as queries"):
        attn(x, torch.randn(1, 2, D), torch.randn(1, 2, D), kv_cache=KVCache(capacity=4),
             cache_position=at)
    cache = KVCache(capacity=4)
    attn(x, x, x, kv_cache=cache, cache_position=at)
    with pytest.raises(ValueError, match="takes update\\(\\) or write\\(\\), not both"):
        attn(x, x, x, kv_cache=cache)
    dynamic = StandardAttentionWithRoPE(D, H, scaling={"rope_type": "dynamic", "factor": 2.0},
                                        max_position_embeddings=8)
    with pytest.raises(ValueError, match="frequencies do not depend on the length"):
        dynamic(x, x, x, kv_cache=KVCache(capacity=4), cache_position=at)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("how", ["cuda_graph", "cuda_reduce_overhead"])
def test_decode_step_captured_and_replayed(how):
    """Capture one decode step (rotation at per-row positions, cache write, attention over
    the cache) and replay it for new tokens, positions and slots: each replay equals the
    eager step on the same state."""
    attn = module("cuda", dtype=torch.bfloat16)
    batch = 4
    x = torch.randn(batch, 1, D, device="cuda", dtype=torch.bfloat16)
    positions = torch.zeros(batch, 1, dtype=torch.int64, device="cuda")
    slot = torch.zeros((), dtype=torch.int64, device="cuda")
    cache, eager_cache = KVCache(capacity=CAPACITY), KVCache(capacity=CAPACITY)

    def step(kv_cache):
        return attn(x, x, x, kv_cache=kv_cache, positions=positions, cache_position=slot)

    with torch.no_grad():
        if how == "cuda_graph":
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                step(cache)  # warm up (allocates the buffers)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = step(cache)
            run = graph.replay
        else:  # the cache's buffers are made by an eager step, outside the graph's memory
            step(cache)
            compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
            run = None
        step(eager_cache)
        for t in range(1, 6):
            x.copy_(torch.randn_like(x))
            positions.copy_(torch.randint(0, 100, (batch, 1), device="cuda"))
            slot.fill_(t)
            if run is not None:
                run()
                result = out.clone()
            else:
                result = compiled(cache).clone()
            expected = step(eager_cache)
            torch.testing.assert_close(result, expected, rtol=2e-2, atol=2e-2)
