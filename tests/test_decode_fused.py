"""The decode step fused with the cache (issue 44, item 4): ``apply_rope_qk_to_cache``
rotates q, rotates k straight into its cache slots and copies v into its slots (one launch
of the Triton kernel on a GPU, the C loop on the CPU), and the attention module's
``cache_position`` step takes it.

Checked against the float64 rotation and against the unfused step (rotation, then
``KVCache.write``), for every rope type a ``cache_position`` step supports, GQA and left
padding, on the CPU's backends and through Triton's interpreter (``ROPELIB_BACKEND=triton``,
also on the route of CUDA tensors, whose slot and positions are read in the kernel). A step
refused for its slot or positions writes nothing.
"""

from __future__ import annotations

import pytest
import torch
from reference import angles, attention_module_reference, rope_by_pairs, thetas
from test_one_launch import Recorder, device_route  # noqa: F401 (a fixture)

from ropelib import (
    KVCache,
    StandardAttentionWithRoPE,
    _checks,
    apply_rope,
    apply_rope_qk_to_cache,
    rotation,
)
from ropelib.scaling import scaled_frequencies
from ropelib.tables import generate_rope_embeddings

pytest.importorskip("triton")
triton_rope = pytest.importorskip("ropelib.triton_rope")
interpreter = pytest.importorskip("triton.runtime.interpreter")

F64 = torch.float64
D, H, KV = 32, 4, 2  # head_dim 8, GQA
CAPACITY = 12
# every rope type a cache_position step takes (none whose frequencies depend on the length)
CONFIGS = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 2.0},
    "ntk": {"rope_type": "ntk", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8},
    "llama3": {"rope_type": "llama3", "factor": 4.0, "original_max_position_embeddings": 8},
    "proportional": {"rope_type": "proportional", "partial_rotary_factor": 0.5,
                     "factor": 2.0},
}
BACKENDS = ["native", "eager", "triton"]


def step_inputs(dtype=torch.float32):
    q, k, v = (torch.randn(2, h, 3, 16).to(dtype) for h in (4, 2, 2))
    caches = [torch.randn(2, 2, 10, 16).to(dtype) for _ in range(2)]
    return q, k, v, caches


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("given", [False, True], ids=["at the slots", "positions"])
def test_q_rotated_k_into_its_slots_v_copied(monkeypatch, backend, layout, given):
    """q equals the float64 rotation at its positions, slots 4..6 of the key cache hold k
    rotated there, those of the value cache hold v exactly, and every other slot is as it
    was."""
    monkeypatch.setenv("ROPELIB_BACKEND", backend)
    q, k, v, (keys, values) = step_inputs()
    before_keys, before_values = keys.clone(), values.clone()
    cos, sin = generate_rope_embeddings(16, 16)
    positions = torch.tensor([[4, 5, 6], [0, 1, 2]]) if given else None
    q_rot = apply_rope_qk_to_cache(q, k, v, cos, sin, keys, values, torch.tensor(4),
                                   layout=layout, positions=positions)
    at = (positions if given else torch.arange(4, 7).expand(2, 3))[:, None]
    table = angles(at, thetas(16))
    tol = {"rtol": 2e-6, "atol": 2e-6}
    torch.testing.assert_close(q_rot.to(F64), rope_by_pairs(q, table, layout), **tol)
    torch.testing.assert_close(keys[:, :, 4:7].to(F64), rope_by_pairs(k, table, layout), **tol)
    assert torch.equal(values[:, :, 4:7], v)
    outside = torch.ones(10, dtype=torch.bool)
    outside[4:7] = False
    assert torch.equal(keys[:, :, outside], before_keys[:, :, outside])
    assert torch.equal(values[:, :, outside], before_values[:, :, outside])


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_the_device_route_reads_the_slot_in_the_kernel(device_route, layout):  # noqa: F811
    """On the route of CUDA tensors the slot and the positions stay on the device: one
    launch (SLOTTED, rows at slot + s), no other operation than allocating q's output, and
    through the interpreter the caches hold what the host route writes."""
    q, k, v, (keys, values) = step_inputs()
    cos, sin = generate_rope_embeddings(16, 16)
    fused = [t.clone() for t in (keys, values)]
    q_rot = apply_rope_qk_to_cache(q, k, v, cos, sin, *fused, torch.tensor(4), layout=layout)
    table = angles(torch.arange(4, 7), thetas(16))
    torch.testing.assert_close(q_rot.to(F64), rope_by_pairs(q, table, layout), rtol=2e-6,
                               atol=2e-6)
    torch.testing.assert_close(fused[0][:, :, 4:7].to(F64), rope_by_pairs(k, table, layout),
                               rtol=2e-6, atol=2e-6)
    assert torch.equal(fused[1][:, :, 4:7], v) and torch.equal(fused[0][:, :, :4],
                                                               keys[:, :, :4])
    launches = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_checks, "is_in_torch_dispatch_mode", lambda: False)
        patch.setattr(triton_rope, "_launch",
                      lambda x, launch, tensors: launches.append(launch))
        with Recorder() as recorder:
            apply_rope_qk_to_cache(q, k, v, cos, sin, keys, values, torch.tensor(4),
                                   layout=layout)
    assert len(launches) == 1 and recorder.device_work() == []
    assert recorder.allocations() == 1
    constexprs = dict(launches[0].constexprs)
    assert constexprs["STEP"] and constexprs["BLOCK_D"] == 16  # BLOCK_D > 0: the cache step


def test_a_refused_step_writes_nothing():
    """A slot past the capacity, a negative position or one past the table: a ValueError
    that names it, and both caches as they were."""
    q, k, v, (keys, values) = step_inputs()
    before = keys.clone(), values.clone()
    cos, sin = generate_rope_embeddings(16, 16)
    with pytest.raises(ValueError, match="cache_position 8 and 3 new tokens must fit"):
        apply_rope_qk_to_cache(q, k, v, cos, sin, keys, values, torch.tensor(8))
    with pytest.raises(ValueError, match="cache_position -1"):
        apply_rope_qk_to_cache(q, k, v, cos, sin, keys, values, torch.tensor(-1))
    with pytest.raises(ValueError, match="positions must be >= 0"):
        apply_rope_qk_to_cache(q, k, v, cos, sin, keys, values, torch.tensor(2),
                               positions=torch.tensor([0, -1, 2]))
    with pytest.raises(ValueError, match="positions go up to 16"):
        apply_rope_qk_to_cache(q, k, v, cos, sin, keys, values, torch.tensor(2),
                               positions=torch.tensor([0, 16, 2]))
    with pytest.raises(ValueError, match="value_cache must be"):
        apply_rope_qk_to_cache(q, k, v, cos, sin, keys, values[..., :8], torch.tensor(2))
    assert torch.equal(keys, before[0]) and torch.equal(values, before[1])


def test_the_kernel_refuses_a_slot_past_the_capacity(device_route, monkeypatch):  # noqa: F811
    """On the device the slot's range is a device-side assertion in the kernel (here the
    interpreter's, with assertions on), which names cache_position and the capacity."""
    monkeypatch.setattr(interpreter.interpreter_builder, "options",
                        interpreter.InterpreterOptions(debug=True, sanitize_overflow=False))
    q, k, v, (keys, values) = step_inputs()
    cos, sin = generate_rope_embeddings(16, 16)
    with pytest.raises(interpreter.InterpreterError,
                       match="cache_position \\+ row must be in \\[0, capacity\\)"):
        apply_rope_qk_to_cache(q, k, v, cos, sin, keys, values, torch.tensor(8))


def module(config, dtype=F64, **kw):
    torch.manual_seed(0)
    return StandardAttentionWithRoPE(D, H, num_kv_heads=KV, bias=False, scaling=config,
                                     max_position_embeddings=8, **kw).eval().to(dtype)


def decode(attn, x, positions=None, mask=None):
    """A prefill of 4 tokens at cache_position 0, then one token per step: outputs and the
    cache's buffers."""
    cache = KVCache(capacity=CAPACITY)
    outs = []
    with torch.no_grad():
        for start, end in [(0, 4)] + [(t, t + 1) for t in range(4, x.shape[1])]:
            kw = {} if positions is None else {"positions": positions[:, start:end]}
            xt = x[:, start:end]
            outs.append(attn(xt, xt, xt, kv_cache=cache, attn_mask=mask,
                             cache_position=torch.tensor(start), **kw))
    return torch.cat(outs, 1), cache


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("kind", list(CONFIGS))
def test_each_fused_module_step_equals_the_unfused_step_and_float64(monkeypatch, kind, layout):
    """Every step of the module with its fused step equals the unfused step (rotation, then
    KVCache.write) to float64 rounding, caches included, and the last output equals the
    independent float64 causal forward (projections, RoFormer's rotation, plain softmax)."""
    attn = module(CONFIGS[kind], layout=layout)
    x = torch.randn(2, 9, D, dtype=F64)
    fused, cache = decode(attn, x)
    with monkeypatch.context() as patch:
        patch.setattr(StandardAttentionWithRoPE, "_rotate_into_cache",
                      lambda *args: None)
        unfused, reference = decode(attn, x)
    torch.testing.assert_close(fused, unfused, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(cache.key, reference.key, rtol=1e-12, atol=1e-12)
    assert torch.equal(cache._value_buffer, reference._value_buffer)
    inv_freq, factor = scaled_frequencies(attn.rotary_dim, 10000.0, CONFIGS[kind], seq_len=9)
    table = angles(torch.arange(9), inv_freq)
    want, _ = attention_module_reference(attn, x, x, x, table, table, causal=True,
                                         scale=factor)
    torch.testing.assert_close(fused, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("backend", BACKENDS)
def test_left_padded_rows_decode_like_each_row_alone(monkeypatch, backend):
    """Rows padded on the left, at their own positions, with a padding mask over the slots:
    row 1 (2 pads) decodes like itself alone, on every CPU backend and the interpreter."""
    monkeypatch.setenv("ROPELIB_BACKEND", backend)
    dtype = F64 if backend != "triton" else torch.float32
    attn = module(None, dtype=dtype, layout="half")
    x = torch.randn(2, 7, D, dtype=dtype)
    pad = torch.tensor([[True] * 7, [False, False] + [True] * 5])
    mask = torch.zeros(2, 1, 1, CAPACITY, dtype=torch.bool)
    mask[..., :7] = pad[:, None, None, :]
    positions = (pad.long().cumsum(-1) - 1).clamp_min(0)
    out, _ = decode(attn, x, positions, mask)
    with torch.no_grad():
        alone = attn(x[1:, 2:], x[1:, 2:], x[1:, 2:], is_causal=True)
    tol = 1e-12 if dtype == F64 else 2e-5
    torch.testing.assert_close(out[1, 2:], alone[0], rtol=tol, atol=tol)


def test_the_module_step_is_one_launch_on_the_device_route(device_route, monkeypatch):  # noqa: F811
    """The module's cache_position step on the route of CUDA tensors: RoPE and the cache
    write are one launch (no index_copy_, no float64 rows, no gather)."""
    attn = module(None, dtype=torch.float32, layout="half")
    x = torch.randn(2, 1, D)
    cache = KVCache(capacity=CAPACITY)
    with torch.no_grad():
        attn(x, x, x, kv_cache=cache, cache_position=torch.tensor(0))  # buffers made
        launches = []
        monkeypatch.setattr(_checks, "is_in_torch_dispatch_mode", lambda: False)
        monkeypatch.setattr(triton_rope, "_launch",
                            lambda x, launch, tensors: launches.append(launch))
        with Recorder() as recorder:
            attn(x, x, x, kv_cache=cache, cache_position=torch.tensor(3))
    names = [op.overloadpacket.__name__ for op in recorder.ops]
    assert len(launches) == 1 and dict(launches[0].constexprs)["BLOCK_D"] > 0  # the cache step
    assert not {"index_copy_", "index_copy", "cos", "sin", "index"} & set(names)
    assert all(op.overloadpacket.__name__ != "_to_copy" for op in recorder.ops)
    assert rotation._on_device(x)  # the route taken was the device's


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("smaller", ["value_cache", "key_cache"])
@pytest.mark.parametrize("start", [6, 7], ids=["v one token short", "two tokens short"])
def test_caches_of_different_capacities_are_refused_before_any_write(monkeypatch, backend,
                                                                     smaller, start):
    """Slots that fit one cache but not the other: a ValueError naming both caches and their
    capacities, and neither cache written (not k into its slots and then a short v)."""
    monkeypatch.setenv("ROPELIB_BACKEND", backend)
    q, k, v, _ = step_inputs()
    big, small = torch.randn(2, 2, 10, 16), torch.randn(2, 2, 8, 16)
    keys, values = (small, big) if smaller == "key_cache" else (big, small)
    before = keys.clone(), values.clone()
    cos, sin = generate_rope_embeddings(16, 16)
    with pytest.raises(ValueError, match=r"key_cache and value_cache must have one capacity"
                                         r".*key_cache has \d+ slots, value_cache \d+"):
        apply_rope_qk_to_cache(q, k, v, cos, sin, keys, values, torch.tensor(start))
    assert torch.equal(keys, before[0]) and torch.equal(values, before[1])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("overlap", ["same tensor", "overlapping views"])
def test_caches_sharing_memory_are_refused(monkeypatch, backend, overlap):
    """A key cache that is (or overlaps) the value cache would end with v in k's slots: refused
    as an out= that overlaps its input is, naming both caches, before anything is written."""
    monkeypatch.setenv("ROPELIB_BACKEND", backend)
    q, k, v, _ = step_inputs()
    storage = torch.randn(2, 2, 14, 16)
    if overlap == "same tensor":
        keys = values = storage[..., :10, :]
    else:
        keys, values = storage[..., :10, :], storage[..., 4:, :]
    before = storage.clone()
    cos, sin = generate_rope_embeddings(16, 16)
    with pytest.raises(ValueError, match="key_cache shares memory with value_cache"):
        apply_rope_qk_to_cache(q, k, v, cos, sin, keys, values, torch.tensor(2))
    assert torch.equal(storage, before)


def test_caches_in_one_buffer_apart_are_taken(monkeypatch):
    """Keys and values as two halves of one buffer share no element: accepted, each written
    where it belongs."""
    q, k, v, _ = step_inputs()
    storage = torch.zeros(2, 2, 2, 10, 16)
    keys, values = storage[:, :, 0], storage[:, :, 1]
    cos, sin = generate_rope_embeddings(16, 16)
    apply_rope_qk_to_cache(q, k, v, cos, sin, keys, values, torch.tensor(2))
    assert torch.equal(values[..., 2:5, :], v)
    assert torch.equal(keys[..., 2:5, :], apply_rope(k, cos, sin, offset=2))
