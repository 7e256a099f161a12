"""KVCache: preallocated buffers that grow by doubling, checked against a float64 full forward."""

from __future__ import annotations

import math

import pytest
import torch
from reference import angles, attention_module_reference, rope_by_matrix, thetas
from torch.utils._python_dispatch import TorchDispatchMode

from ropelib import KVCache, StandardAttentionWithRoPE, generate_rope_embeddings

F64 = torch.float64
D, H = 32, 4  # head_dim 8


class CountWrites(TorchDispatchMode):
    """Counts the elements that copy_ and cat write (the cost of moving a cache around)."""

    def __init__(self) -> None:
        super().__init__()
        self.elements = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in (torch.ops.aten.copy_.default, torch.ops.aten.cat.default):
            self.elements += out.numel()
        return out


def decode(module, x, cache, prefill, tables=None):
    """The prefill in one call, then one token per call; the outputs concatenated."""
    steps = [module(x[:, :prefill], x[:, :prefill], x[:, :prefill], tables, kv_cache=cache,
                    is_causal=True)]
    for t in range(prefill, x.shape[1]):
        xt = x[:, t:t + 1]
        steps.append(module(xt, xt, xt, tables, kv_cache=cache, is_causal=True))
    return torch.cat(steps, dim=1)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("capacity", [None, 1, 64])
def test_token_by_token_decoding_equals_the_float64_full_forward(layout, num_kv_heads, capacity,
                                                                 device):
    module = StandardAttentionWithRoPE(D, H, num_kv_heads=num_kv_heads, layout=layout,
                                       dtype=F64, device=device).eval()
    n, prefill = 13, 3
    x = torch.randn(2, n, D, dtype=F64, device=device)
    tables = generate_rope_embeddings(n, D // H, device=device, dtype=F64)
    cache = KVCache(capacity)
    with torch.no_grad():
        stepped = decode(module, x, cache, prefill, tables)
        full = module(x, x, x, tables, is_causal=True)
    table = angles(torch.arange(n), thetas(D // H))
    expected, _ = attention_module_reference(module, x, x, x, table, table, causal=True)
    torch.testing.assert_close(stepped.cpu(), expected, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(stepped, full, rtol=1e-10, atol=1e-10)
    assert cache.length == n
    assert cache.key.shape == cache.value.shape == (2, num_kv_heads, n, D // H)


def test_cached_keys_are_the_rotated_keys_of_every_position():
    module = StandardAttentionWithRoPE(D, H, num_kv_heads=2, dtype=F64, bias=False).eval()
    n = 9
    x = torch.randn(1, n, D, dtype=F64)
    cache = KVCache()
    with torch.no_grad():
        decode(module, x, cache, 2)
    k = (x @ module.k_proj.weight.T).view(1, n, 2, D // H).transpose(1, 2)
    table = angles(torch.arange(n), thetas(D // H))
    torch.testing.assert_close(cache.key, rope_by_matrix(k, table), rtol=1e-6, atol=1e-6)
    v = (x @ module.v_proj.weight.T).view(1, n, 2, D // H).transpose(1, 2)
    torch.testing.assert_close(cache.value, v, rtol=1e-12, atol=1e-12)


def test_capacity_grows_by_doubling_and_always_covers_the_length():
    cache = KVCache()
    assert (cache.length, cache.capacity, cache.key, cache.value) == (0, 0, None, None)
    capacities = []
    cache.update(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))
    for _ in range(40):
        cache.update(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4))
        capacities.append(cache.capacity)
        assert cache.length <= cache.capacity
    assert cache.length == 43
    growths = [(a, b) for a, b in zip([3] + capacities, capacities, strict=False) if b != a]
    assert all(b >= 2 * a for a, b in growths)
    assert [b for _, b in growths] == [6, 12, 24, 48]  # 3 doubled while it does not fit
    # a chunk longer than twice the capacity gets exactly what it needs
    cache.update(torch.zeros(1, 2, 100, 4), torch.zeros(1, 2, 100, 4))
    assert cache.capacity == cache.length == 143


def test_a_reserved_capacity_never_grows_and_reuses_one_buffer():
    cache = KVCache(capacity=32)
    cache.update(torch.randn(2, 1, 4, 8), torch.randn(2, 1, 4, 8))
    buffer = cache.key.untyped_storage().data_ptr()
    for _ in range(28):
        key, value = cache.update(torch.randn(2, 1, 1, 8), torch.randn(2, 1, 1, 8))
        assert key.untyped_storage().data_ptr() == buffer
        assert cache.capacity == 32
    assert cache.length == 32
    cache.update(torch.randn(2, 1, 1, 8), torch.randn(2, 1, 1, 8))
    assert cache.capacity == 64
    assert cache.key.untyped_storage().data_ptr() != buffer


def test_buffers_are_reused_between_growths():
    cache = KVCache()
    storages, keys = [], []
    for _ in range(100):
        key, _ = cache.update(torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4))
        keys.append(key)  # keeps every buffer alive, so no address is handed out twice
        storages.append(key.untyped_storage().data_ptr())
    distinct = list(dict.fromkeys(storages))
    assert len(distinct) == 1 + math.ceil(math.log2(100))  # capacities 1, 2, 4, ..., 128


@pytest.mark.parametrize("capacity", [None, 200])
def test_a_decode_writes_a_linear_number_of_positions(capacity):
    """Each position is written once, plus growth copies of fewer than n positions in all:
    under 3n positions per tensor, where appending with torch.cat writes n (n + 1) / 2."""
    n, per_position = 96, 2 * 8  # kv_heads * head_dim, batch 1
    tokens = torch.randn(n, 1, 2, 1, 8)
    cache, concatenated = KVCache(capacity), None
    with CountWrites() as ours:
        for token in tokens:
            cache.update(token, token)
    with CountWrites() as cat:  # the append it replaces, counted the same way
        for token in tokens:
            concatenated = token if concatenated is None else torch.cat([concatenated, token], -2)
    assert torch.equal(cache.key, concatenated)
    positions_written = ours.elements / (2 * per_position)  # keys and values
    assert n <= positions_written < 3 * n
    if capacity is not None:
        assert positions_written == n
    assert cat.elements / per_position == n * (n + 1) / 2 - 1  # the first token is not copied
    assert positions_written < cat.elements / per_position / 10


def test_views_returned_earlier_keep_their_values():
    cache = KVCache()
    first = torch.randn(1, 1, 2, 4)
    key, _ = cache.update(first, first.clone())
    snapshot = key.clone()
    for _ in range(10):
        cache.update(torch.randn(1, 1, 1, 4), torch.randn(1, 1, 1, 4))
    assert torch.equal(key, snapshot)
    assert torch.equal(cache.key[..., :2, :], first)
    cache.reset()
    assert (cache.length, cache.capacity, cache.key) == (0, 0, None)
    cache.update(torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4))
    assert torch.equal(key, snapshot)


def test_the_cache_never_writes_into_the_callers_tensors():
    cache = KVCache()
    key, value = torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4)
    kept = key.clone(), value.clone()
    cache.update(key, value)
    cache.update(torch.randn(1, 1, 1, 4), torch.randn(1, 1, 1, 4))
    assert torch.equal(key, kept[0]) and torch.equal(value, kept[1])
    assert cache.key.untyped_storage().data_ptr() != key.untyped_storage().data_ptr()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, F64])
def test_dtype_and_device_are_those_of_the_keys(dtype, device):
    cache = KVCache()
    for length in (3, 1, 1, 5):
        key = torch.randn(2, 2, length, 8, device=device).to(dtype)
        key_out, value_out = cache.update(key, key + 1)
        assert key_out.dtype == value_out.dtype == dtype
        assert key_out.device == value_out.device == key.device
        assert torch.equal(key_out[..., -length:, :], key)
        assert torch.equal(value_out[..., -length:, :], key + 1)


def test_the_module_in_bfloat16_decodes_like_its_full_forward():
    module = StandardAttentionWithRoPE(D, H, num_kv_heads=1, dtype=torch.bfloat16).eval()
    x = torch.randn(1, 10, D, dtype=torch.bfloat16)
    cache = KVCache()
    with torch.no_grad():
        stepped = decode(module, x, cache, 4)
        full = module(x, x, x, is_causal=True)
    assert cache.key.dtype == torch.bfloat16
    torch.testing.assert_close(stepped, full, rtol=3e-2, atol=3e-2)


def test_gradients_flow_through_a_cache_like_through_the_full_forward():
    module = StandardAttentionWithRoPE(D, H, num_kv_heads=2, dtype=F64).train()
    x = torch.randn(1, 7, D, dtype=F64, requires_grad=True)
    tables = generate_rope_embeddings(7, D // H, dtype=F64)
    decode(module, x, KVCache(), 3, tables).square().sum().backward()
    stepped_grads = [x.grad.clone()] + [p.grad.clone() for p in module.parameters()]
    x.grad = None
    module.zero_grad()
    module(x, x, x, tables, is_causal=True).square().sum().backward()
    full_grads = [x.grad] + [p.grad for p in module.parameters()]
    for a, b in zip(stepped_grads, full_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_decoding_without_grad_after_a_prefill_with_grad():
    cache = KVCache()
    key = torch.randn(1, 1, 3, 4, requires_grad=True)
    cache.update(key, key * 2)
    with torch.no_grad():
        out, _ = cache.update(torch.ones(1, 1, 1, 4), torch.ones(1, 1, 1, 4))
    assert not out.requires_grad
    torch.testing.assert_close(out[..., :3, :], key.detach())
    assert cache.length == 4


def test_a_cache_filled_in_inference_mode_takes_updates_outside_it():
    cache = KVCache(capacity=8)
    with torch.inference_mode():
        cache.update(torch.randn(1, 1, 2, 4), torch.randn(1, 1, 2, 4))
    new = torch.randn(1, 1, 1, 4)
    key, _ = cache.update(new, new)
    assert torch.equal(key[..., -1:, :], new)
    assert cache.length == 3


ERRORS = {  # name: (KVCache args, first update, second update, exception, message)
    "capacity zero": ((0,), None, None, ValueError, r"capacity must be a positive int or None, got 0"),
    "capacity float": ((8.0,), None, None, ValueError, r"capacity must be a positive int"),
    "capacity bool": ((True,), None, None, ValueError, r"capacity must be a positive int"),
    "not a tensor": ((), ([1.0], torch.zeros(1, 1, 1, 4)), None, TypeError,
                     r"key must be a torch.Tensor, got list"),
    "3-d keys": ((), (torch.zeros(1, 1, 4), torch.zeros(1, 1, 4)), None, ValueError,
                 r"key must have shape \(batch, kv_heads, new, head_dim\), got \(1, 1, 4\)"),
    "value length": ((), (torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 3, 4)), None, ValueError,
                     r"key and value must share \(batch, kv_heads, new\), got \(1, 1, 2, 4\) "
                     r"and \(1, 1, 3, 4\)"),
    "other heads": ((), (torch.zeros(2, 2, 3, 8),) * 2, (torch.zeros(2, 1, 1, 8),) * 2, ValueError,
                    r"new keys of shape \(2, 1, 1, 8\) do not extend the cached keys of shape "
                    r"\(2, 2, 3, 8\) \(expected \(2, 2, new, 8\)\)"),
    "other head_dim": ((), (torch.zeros(2, 2, 3, 8),) * 2,
                       (torch.zeros(2, 2, 1, 8), torch.zeros(2, 2, 1, 6)), ValueError,
                       r"new values of shape \(2, 2, 1, 6\) do not extend the cached values"),
    "other dtype": ((), (torch.zeros(1, 1, 3, 4),) * 2, (torch.zeros(1, 1, 1, 4, dtype=F64),) * 2,
                    ValueError, r"new keys are torch.float64 on cpu but the cached keys are "
                    r"torch.float32 on cpu"),
    "other device": ((), (torch.zeros(1, 1, 3, 4),) * 2,
                     (torch.zeros(1, 1, 1, 4, device="meta"),) * 2, ValueError,
                     r"new keys are torch.float32 on meta but the cached keys are torch.float32 "
                     r"on cpu"),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_errors_name_the_argument(case):
    args, first, second, exc, pattern = ERRORS[case]
    with pytest.raises(exc, match=pattern):
        cache = KVCache(*args)
        cache.update(*first)
        cache.update(*second)
    if second is not None:  # a refused update leaves the cache as it was
        assert cache.length == first[0].shape[-2]


class ConcatCache:
    """A cache of the caller's own: only ``length`` and ``update``, as chapter 9 writes one."""

    def __init__(self) -> None:
        self.key = self.value = None

    @property
    def length(self) -> int:
        return 0 if self.key is None else self.key.shape[-2]

    def update(self, key, value):
        if self.key is not None:
            key, value = torch.cat([self.key, key], -2), torch.cat([self.value, value], -2)
        self.key, self.value = key, value
        return key, value


def test_a_cache_of_the_callers_own_with_length_and_update_decodes_like_the_full_forward():
    module = StandardAttentionWithRoPE(D, H, num_kv_heads=2).double().eval()  # float64 tables
    x = torch.randn(2, 9, D, dtype=F64)
    with torch.no_grad():
        stepped = decode(module, x, ConcatCache(), 3)
    table = angles(torch.arange(9), thetas(D // H))
    expected, _ = attention_module_reference(module, x, x, x, table, table, causal=True)
    torch.testing.assert_close(stepped, expected, rtol=1e-10, atol=1e-10)
