"""Multi-head attention with RoPE on q and k, a KV cache, GQA/MQA and an SDPA fast path."""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ._checks import (
    as_int,
    broadcasts,
    check_count,
    check_float_tensor,
    check_int_tensor,
    check_layout,
    traced_nonnegative,
    tracing,
)
from .masks import prepare_mask
from .multiaxis import hf_positions_hint
from .rotation import (
    SHORT_TABLE_MODES,
    apply_rope,
    apply_rope_qk,
    apply_rope_qk_to_cache,
    check_offset,
)
from .scaling import layer_parameters, rotated_dim
from .tables import RotaryEmbedding


class KVCache:
    """Keys and values of the tokens seen so far, each ``(batch, kv_heads, length, head_dim)``.

    Pass one instance to successive ``forward`` calls of one layer; each call appends its new
    keys and values and attends over all of them. The cache remembers the module that first
    wrote it and refuses another (two layers sharing a cache would mix their keys); ``reset``
    frees it for any module. The next token's position (``offset``)
    defaults to ``length``.

    ``StandardAttentionWithRoPE`` caches its keys rotated, except when its rope type's
    frequencies depend on the sequence length (``ropelib.scaling.depends_on_length``, e.g.
    dynamic NTK): keys rotated while the sequence was shorter would keep the old
    frequencies, and decoding would drift from the full forward. Such keys are cached
    unrotated with their positions (``positions``), and every call rotates all of them with
    the frequencies of the current length, so each decoding step equals the full causal
    forward over the tokens so far, in any dtype (one rounding, as there). Multi-axis keys
    (M-RoPE with such a rope type) are kept with their k coordinates. The cost: one
    rotation of the cached keys per step (a pass like a copy of them) for those rope types
    only. Re-rotating cached keys by the angle difference, R(a') = R(a' - a) R(a), would
    cost nothing between switches, but dynamic NTK switches at every step past the trained
    length, and in bfloat16 each re-rotation adds a rounding (and drops angle changes below
    half an ulp), so the error would grow with every step.

    The keys and values live in preallocated buffers ``(batch, kv_heads, capacity, head_dim)``;
    ``key`` and ``value`` are views of their first ``length`` positions. An update writes only
    its new positions. When they do not fit, the buffers grow to at least twice their capacity,
    so decoding n tokens one at a time copies fewer than 2n cached positions in all (appending
    with ``torch.cat`` copies the whole cache at every step, about n^2 / 2 positions). While
    autograd records (keys that require grad, with grad enabled) an update concatenates
    instead: a write into the buffer would invalidate the views saved for the backward.

    Beam search: ``reorder(beam_idx)`` keeps the rows ``beam_idx`` (in that order, a row
    more than once to expand a batch into beams), keys, values, positions and next positions
    together, as Hugging Face's ``reorder_cache``.

    Multi-axis RoPE (a module built with ``frequencies=``): after a prefill with positions
    (Qwen2-VL's (t, h, w)), the next token's position is not the cache length but each row's
    largest coordinate + 1 (Qwen2-VL's rule, Hugging Face's ``rope_deltas``). The module
    records it per row (``next_position``), and decoding without ``positions`` continues
    from there, on the diagonal.

    Args:
        capacity: positions to reserve at the first update (default: that update's length).
            Reserve the longest sequence you will decode and the buffers never grow.
    """

    def __init__(self, capacity: int | None = None) -> None:
        self._reserve = 0 if capacity is None else check_count("capacity", capacity,
                                                                extra=" or None")
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None
        # positions as (batch, 1, capacity, 1) int64 (multi-axis: (batch, 1, capacity, k)),
        # to grow along dim -2 like the keys
        self._position_buffer: torch.Tensor | None = None
        self._axes: int | None = None  # k of multi-axis positions; None for 1D ones
        self._inference = False  # whether eager code made the buffers in inference mode
        self._length = 0
        self._next_position: torch.Tensor | None = None
        self._written = False  # filled by write() (slots given on the device)
        self._owner: weakref.ref | None = None  # the module whose keys this cache holds

    def __getstate__(self) -> dict:
        """A copy (pickle, deepcopy) belongs to no module until one writes it."""
        return {**self.__dict__, "_owner": None}

    def _claim(self, module: nn.Module) -> None:
        """Records the module that first writes this cache and refuses any other: a cache
        holds one layer's keys and values, and a second layer's would be appended to them
        (or written over them) without a word. Eager only (a compiled graph does not
        trace this bookkeeping)."""
        if tracing():
            return
        owner = None if self._owner is None else self._owner()
        if owner is None:
            self._owner = weakref.ref(module)
        elif owner is not module:
            raise ValueError(f"this KVCache holds the keys of another layer (a "
                             f"{type(owner).__name__} at {id(owner):#x}, not this "
                             f"{type(module).__name__} at {id(module):#x}); give every layer "
                             "its own cache, e.g. caches = [KVCache() for _ in layers], or "
                             "call reset() to start over")

    @property
    def next_position(self) -> torch.Tensor | None:
        """Each row's next position ``(batch,)`` int64, recorded by a multi-axis module (its
        largest coordinate so far + 1, on every axis); None otherwise (the next position is
        then ``length``)."""
        return self._next_position

    @property
    def length(self) -> int:
        """Positions cached so far."""
        return self._length

    @property
    def capacity(self) -> int:
        """Positions the buffers hold before they must grow (0 before the first update)."""
        return 0 if self._key_buffer is None else self._key_buffer.shape[-2]

    @property
    def key(self) -> torch.Tensor | None:
        """Cached keys ``(batch, kv_heads, length, head_dim)`` (a view of the buffer), or None."""
        return None if self._key_buffer is None else self._key_buffer[..., :self._length, :]

    @property
    def value(self) -> torch.Tensor | None:
        """Cached values ``(batch, kv_heads, length, head_dim)`` (a view of the buffer), or None."""
        return None if self._value_buffer is None else self._value_buffer[..., :self._length, :]

    @property
    def positions(self) -> torch.Tensor | None:
        """Positions of the cached keys ``(batch, length)`` (multi-axis: ``(batch, length,
        k)``), int64, when the updates gave them (unrotated keys), else None."""
        buffer = self._position_buffer
        if buffer is None:
            return None
        return buffer[:, 0, :self._length] if self._axes else buffer[:, 0, :self._length, 0]

    def _check(self, key: torch.Tensor, value: torch.Tensor, positions: torch.Tensor | None
               ) -> torch.Tensor | None:
        """Checks an update; returns its positions as ``(batch, 1, new, 1)`` int64, or None."""
        for name, new, cached in (("key", key, self.key), ("value", value, self.value)):
            if not isinstance(new, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(new).__name__}")
            if new.ndim != 4:
                raise ValueError(f"{name} must have shape (batch, kv_heads, new, head_dim), got "
                                 f"{tuple(new.shape)}")
            if cached is None:
                continue
            if new.shape[:2] != cached.shape[:2] or new.shape[-1] != cached.shape[-1]:
                raise ValueError(f"new {name}s of shape {tuple(new.shape)} do not extend the cached "
                                 f"{name}s of shape {tuple(cached.shape)} (expected "
                                 f"({cached.shape[0]}, {cached.shape[1]}, new, "
                                 f"{cached.shape[-1]}))")
            if new.dtype != cached.dtype or new.device != cached.device:
                raise ValueError(f"new {name}s are {new.dtype} on {new.device} but the cached "
                                 f"{name}s are {cached.dtype} on {cached.device}; convert them "
                                 f"with .to(dtype={cached.dtype}, device='{cached.device}')")
        if key.shape[:3] != value.shape[:3]:
            raise ValueError(f"key and value must share (batch, kv_heads, new), got "
                             f"{tuple(key.shape)} and {tuple(value.shape)}")
        if self._key_buffer is not None and (positions is None) != (
                self._position_buffer is None):
            held = "with" if positions is None else "without"
            raise ValueError(f"this cache holds keys {held} their positions; pass positions= "
                             f"with every update or with none (call reset() to start over)")
        if positions is None:
            return None
        positions = check_int_tensor("positions", positions)
        batch, new = key.shape[0], key.shape[-2]
        axes = positions.shape[-1] if positions.ndim == 3 else None
        if axes is not None:  # multi-axis: (batch or 1, new, k)
            if positions.shape[:2] not in ((1, new), (batch, new)):
                raise ValueError(f"multi-axis positions must have shape (batch, new, k) = "
                                 f"({batch}, {new}, k) or (1, {new}, k), got "
                                 f"{tuple(positions.shape)}")
        elif not (positions.ndim == 1 or (positions.ndim == 2 and positions.shape[0] in (
                1, batch))) or positions.shape[-1] != new:
            raise ValueError(f"positions must have shape (new,) = ({new},) or (batch, new) = "
                             f"({batch}, {new}) (multi-axis: (batch, new, k)), got "
                             f"{tuple(positions.shape)}")
        if self._position_buffer is not None and axes != self._axes:
            held = f"{self._axes} coordinates" if self._axes else "1D positions"
            raise ValueError(f"this cache holds keys with {held} each; got positions of shape "
                             f"{tuple(positions.shape)} (a module's own when none were "
                             "passed: a cache serves one layer, 1D or multi-axis; call "
                             "reset() to start over)")
        self._axes = axes
        if axes is not None:
            return positions.to(key.device).expand(batch, new, axes)[:, None]
        return positions.to(key.device).expand(batch, new)[:, None, :, None]

    def _writable(self, end: int) -> bool:
        """Whether positions up to ``end`` can be written into the current buffers in place."""
        buffer = self._key_buffer
        if buffer is None or end > buffer.shape[-2] or (buffer.requires_grad
                                                        or self._value_buffer.requires_grad):
            return False
        if tracing():  # a graph cannot ask about inference mode: buffers made there move once
            return not self._inference
        return not (buffer.is_inference() and not torch.is_inference_mode_enabled())

    def _buffers(self, new: tuple) -> tuple:
        """(new, cached, buffer) for keys, values and, when given, positions."""
        cached = (self.key, self.value, None if self._position_buffer is None
                  else self._position_buffer[..., :self._length, :])
        buffers = (self._key_buffer, self._value_buffer, self._position_buffer)
        return tuple(t for t in zip(new, cached, buffers, strict=True) if t[0] is not None)

    def _set(self, buffers: list) -> None:
        self._key_buffer, self._value_buffer = buffers[:2]
        self._position_buffer = buffers[2] if len(buffers) == 3 else None
        self._inference = not tracing() and torch.is_inference_mode_enabled()

    def _grow(self, end: int, new: tuple) -> None:
        """New buffers for at least ``end`` positions, holding the cached ones."""
        capacity = max(end, 2 * self.capacity, self._reserve)
        buffers = []
        for fresh, cached, _ in self._buffers(new):
            buffer = fresh.new_empty(fresh.shape[:2] + (capacity, fresh.shape[-1]))
            if cached is not None:
                buffer[..., :self._length, :].copy_(cached)
            buffers.append(buffer)
        self._set(buffers)

    def update(self, key: torch.Tensor, value: torch.Tensor, *,
               positions: torch.Tensor | None = None,
               next_position: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``(batch, kv_heads, new, head_dim)`` keys and values; return the full cache,
        ``(batch, kv_heads, length, head_dim)`` each (views of the buffers).

        ``positions``: the new keys' positions ``(new,)`` or ``(batch, new)`` (multi-axis:
        ``(batch, new, k)`` or ``(1, new, k)``), kept beside them (see ``positions``); give
        them with every update of a cache or with none.
        ``next_position``: each row's next position after this update, ``(batch,)`` integer
        (see ``next_position``); kept until an update gives another."""
        if self._written:
            raise ValueError("this cache was filled by write(); a cache takes update() or "
                             "write(), not both (call reset() to start over)")
        new = (key, value, self._check(key, value, positions))
        if next_position is not None:
            next_position = check_int_tensor("next_position", next_position)
            if next_position.shape != key.shape[:1]:
                raise ValueError(f"next_position must have shape (batch,) = ({key.shape[0]},), "
                                 f"got {tuple(next_position.shape)}")
            self._next_position = next_position.to(key.device)
        start, end = self._length, self._length + key.shape[-2]
        tensors = (key, value, self._key_buffer, self._value_buffer)
        if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
            self._set([fresh if cached is None else torch.cat([cached, fresh], dim=-2)
                       for fresh, cached, _ in self._buffers(new)])
        elif end > start or self._key_buffer is None:
            if not self._writable(end):
                self._grow(end, new)
            for fresh, _, buffer in self._buffers(new):
                buffer[..., start:end, :].copy_(fresh)
        self._length = end
        return self.key, self.value

    def write(self, key: torch.Tensor, value: torch.Tensor, slots: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``(batch, kv_heads, new, head_dim)`` keys and values at the cache slots
        ``slots`` ``(new,)`` (a tensor of any integer dtype, on their device) of buffers of
        the reserved capacity; return the whole buffers, ``(batch, kv_heads, capacity,
        head_dim)`` each.

        Nothing here depends on a number the host reads per step, so a decode step that
        writes this way can be captured once in a CUDA graph and replayed (see
        ``StandardAttentionWithRoPE.forward``'s ``cache_position``). The buffers start at
        zero; slots not written yet are hidden by the caller's mask. A cache takes either
        ``update`` or ``write``, not both; ``length`` stays 0 (the slots are the caller's).

        A slot outside ``[0, capacity)`` is refused before anything is written: a ValueError
        on the CPU, a device-side assertion on a GPU (nothing read back). Buffers made under
        ``torch.inference_mode()`` are copied once into ordinary tensors when a write comes
        outside it (as ``update`` does). While autograd records (keys or values that
        require grad, with grad enabled) the write makes new buffers (``index_copy``, a
        copy of the cache per step) instead of writing into the ones an earlier step's
        backward still reads, so a backward through several steps is right."""
        slots = check_int_tensor("slots", slots)
        if slots.ndim != 1 or not isinstance(key, torch.Tensor) or key.ndim != 4 or (
                slots.shape[0] != key.shape[-2]):
            new = key.shape[-2] if isinstance(key, torch.Tensor) and key.ndim == 4 else "new"
            raise ValueError(f"slots must have shape (new,) = ({new},), one per new key, got "
                             f"{tuple(slots.shape)}")
        _check_slots(slots, self._slot_capacity())
        return self._write(key, value, slots)

    def _slot_capacity(self) -> int:
        """The capacity ``write`` fills; refuses a cache without one, or filled by update."""
        if self._key_buffer is None and not self._reserve:
            raise ValueError("write needs buffers of a reserved size: make the cache "
                             "with KVCache(capacity=N), N the longest sequence")
        if self._key_buffer is not None and not self._written:
            raise ValueError("this cache was filled by update(); a cache takes update() or "
                             "write(), not both (call reset() to start over)")
        return self.capacity or self._reserve

    def _write(self, key: torch.Tensor, value: torch.Tensor, slots: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """``write`` after its checks of ``slots`` (int64, in range)."""
        if self._key_buffer is None:
            self._check(key, value, None)
            self._set([torch.zeros(t.shape[:2] + (self._reserve, t.shape[-1]), dtype=t.dtype,
                                   device=t.device) for t in (key, value)])
            self._written = True
        for new, buffer in ((key, self._key_buffer), (value, self._value_buffer)):
            if new.shape[:2] + new.shape[-1:] != buffer.shape[:2] + buffer.shape[-1:] or (
                    new.dtype != buffer.dtype or new.device != buffer.device):
                raise ValueError(f"keys/values of shape {tuple(new.shape)} ({new.dtype}, "
                                 f"{new.device}) do not fit the buffers {tuple(buffer.shape)} "
                                 f"({buffer.dtype}, {buffer.device})")
        slots = slots.to(key.device)
        buffers = (self._key_buffer, self._value_buffer)
        if torch.is_grad_enabled() and any(t.requires_grad for t in (key, value, *buffers)):
            self._set([buffer.index_copy(2, slots, new)
                       for new, buffer in zip((key, value), buffers, strict=True)])
            return self._key_buffer, self._value_buffer
        if not self._writable(self.capacity):  # made in inference mode, or by autograd
            self._set([buffer.clone() for buffer in buffers])
        for new, buffer in ((key, self._key_buffer), (value, self._value_buffer)):
            buffer.index_copy_(2, slots, new)
        return self._key_buffer, self._value_buffer

    def _step_buffers(self, key: torch.Tensor, value: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The buffers a ``write`` of these keys and values writes into in place, made at the
        first call as ``write`` makes them (by a write of no slot), for a step that writes
        them itself (``apply_rope_qk_to_cache``); None where ``write`` would not write in
        place: while autograd records, or for buffers made in inference mode outside it."""
        if torch.is_grad_enabled() and (key.requires_grad or value.requires_grad):
            return None
        if self._key_buffer is None:
            self._write(key[..., :0, :], value[..., :0, :],
                        torch.empty(0, dtype=torch.int64, device=key.device))
        if not self._written or not self._writable(self.capacity):
            return None
        return self._key_buffer, self._value_buffer

    def reorder(self, beam_idx: torch.Tensor) -> None:
        """Keep the rows ``beam_idx`` ``(new_batch,)`` of the cache, in that order: row r of
        the new cache is row ``beam_idx[r]`` of the old one, keys, values, positions and next
        positions alike (Hugging Face's ``reorder_cache`` for beam search). A row may be
        taken several times (expanding a batch into beams) or not at all. The buffers keep
        their capacity; views returned earlier keep the old rows."""
        if self._key_buffer is None:
            raise ValueError("reorder needs a cache holding keys; this one is empty (reorder "
                             "after the first update)")
        beam_idx = check_int_tensor("beam_idx", beam_idx)
        batch = self._key_buffer.shape[0]
        if beam_idx.ndim != 1 or beam_idx.numel() == 0:
            raise ValueError(f"beam_idx must have shape (new_batch,) with new_batch >= 1, got "
                             f"{tuple(beam_idx.shape)}")
        if not tracing():
            low, high = (int(v) for v in torch.aminmax(beam_idx))
            if low < 0 or high >= batch:
                raise ValueError(f"beam_idx must hold rows of the cache, in [0, {batch}), got "
                                 f"values in [{low}, {high}]")
        index = beam_idx.to(self._key_buffer.device)
        length = self.capacity if self._written else self._length  # write() fills any slot
        buffers = []
        for buffer in (self._key_buffer, self._value_buffer, self._position_buffer):
            if buffer is None:
                continue
            rows = buffer[..., :length, :].index_select(0, index)
            fresh = rows.new_empty((index.shape[0],) + tuple(buffer.shape[1:]))
            if rows.requires_grad and torch.is_grad_enabled():
                fresh = rows  # autograd records: no writes into a buffer (see update)
            else:
                fresh[..., :length, :].copy_(rows)
            buffers.append(fresh)
        self._set(buffers)
        if self._next_position is not None:
            self._next_position = self._next_position.index_select(0, index)

    def reset(self) -> None:
        """Forget the cached positions and drop the buffers (views returned earlier stay valid)."""
        self._key_buffer = self._value_buffer = self._position_buffer = None
        self._inference = False
        self._length = 0
        self._next_position = None
        self._written = False
        self._axes = None
        self._owner = None


def _on_host(slots: torch.Tensor) -> bool:
    """Whether the values of slots can be read here: on the CPU, in eager mode."""
    return not tracing() and slots.device.type == "cpu"


def _check_slots(slots: torch.Tensor, capacity: int) -> None:
    """Refuses slots outside ``[0, capacity)`` before a write: with a ValueError where they
    are on the CPU, else with an assertion on their device (nothing read back, so a CUDA
    graph can hold the step)."""
    if not _on_host(slots):
        torch._assert_async(((slots >= 0) & (slots < capacity)).all(),
                            "KVCache.write: slots (cache_position + 0 .. N - 1) must be in "
                            "[0, capacity)")
        return
    if not slots.numel():
        return
    low, high = torch.stack(torch.aminmax(slots)).tolist()
    if low < 0 or high >= capacity:
        raise ValueError(f"slots must be in [0, {capacity}) (the cache's capacity), got "
                         f"{low}..{high}; a cache_position step writes its N new tokens at "
                         f"slots cache_position + 0 .. N - 1, so cache_position must be in "
                         f"[0, capacity - N]. Nothing was written (make the cache with a "
                         f"larger KVCache(capacity=...))")


class StandardAttentionWithRoPE(nn.Module):
    """Multi-head attention whose q and k are rotated by RoPE (RoFormer).

    Inputs and output are ``(batch, seq, embed_dim)``. ``forward(query, key, value,
    rope_embeddings=None, attn_mask=None, return_attn=False)`` keeps the interface of the
    module ropelib grew from; everything else is keyword-only.

    Args:
        embed_dim: model width D.
        num_heads: query heads H; head_dim = D / H must be even.
        dropout: dropout on the attention weights (training only).
        num_kv_heads: key/value heads (GQA; 1 is MQA). Default: num_heads.
        bias: bias in the four projections (Hugging Face Llama: False).
        o_proj_bias: bias in the output projection; default ``bias``. Qwen2 and Qwen2-VL
            have q, k and v biases and none in ``o_proj``: ``bias=True, o_proj_bias=False``
            loads their attention's state dict strictly.
        layout: ``"interleaved"`` (RoFormer, Meta Llama) or ``"half"`` (Hugging Face Llama).
        rotary_dim: rotate only the first rotary_dim channels of each head. A
            ``partial_rotary_factor`` p in ``scaling`` sets it as transformers does (int(p *
            head_dim), or head_dim for ``"proportional"``); a different rotary_dim is an error.
        base, scaling, max_position_embeddings: the built-in ``RotaryEmbedding``, used when
            ``rope_embeddings`` is not passed. ``base`` defaults to the config's
            ``rope_theta``, else 10000; with ``frequencies`` neither base nor scaling is
            passed (the frequencies hold them).
        layer_type: the key of ``scaling`` to use when it holds one rope config per layer type
            (e.g. ``"sliding_attention"``).
        frequencies: multi-axis RoPE (``ropelib.multiaxis``): a ``(rotary_dim // 2, k)``
            frequency matrix, e.g. ``axis_frequencies(128, [16, 24, 24])`` for Qwen2-VL's
            M-RoPE; ``forward`` then takes ``positions`` of shape ``(Nq, k)`` or ``(B, Nq, k)``,
            for every k (1 included), like ``RotaryEmbedding(frequencies=...)``. A
            ``scaling`` config with ``mrope_section`` (Qwen2-VL / Qwen3-VL ``rope_parameters``
            as they are, also with any rope type of transformers) does the same; with dynamic
            NTK or LongRoPE a ``KVCache`` then holds the keys unrotated with their positions
            (see ``KVCache``).
        rope: False builds attention without any position information (a baseline).
        short_table: what to do with a table shorter than the positions (see ``apply_rope``).

    Submodules ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj`` (``nn.Linear``) and, unless
    ``rope=False``, ``rotary`` (``RotaryEmbedding``).
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, *,
                 num_kv_heads: int | None = None, bias: bool = True, layout: str = "interleaved",
                 rotary_dim: int | None = None, base: float | None = None,
                 scaling: Mapping | None = None, max_position_embeddings: int | None = None,
                 rope: bool = True, short_table: str = "raise",
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None,
                 layer_type: str | None = None, frequencies: torch.Tensor | None = None,
                 o_proj_bias: bool | None = None):
        super().__init__()
        embed_dim = check_count("embed_dim", embed_dim)
        num_heads = check_count("num_heads", num_heads)
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim={embed_dim} is not divisible by num_heads={num_heads}")
        num_kv_heads = num_heads if num_kv_heads is None else check_count("num_kv_heads",
                                                                          num_kv_heads)
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads} is not divisible by "
                             f"num_kv_heads={num_kv_heads}")
        head_dim = embed_dim // num_heads
        if head_dim % 2:
            raise ValueError(f"head_dim = embed_dim / num_heads = {embed_dim} / {num_heads} = "
                             f"{head_dim} must be even (RoPE rotates channel pairs)")
        scaling = layer_parameters(scaling, layer_type) if rope else None
        rd = head_dim if rotary_dim is None else as_int(rotary_dim)
        table_dim = head_dim  # the dim RotaryEmbedding is built for
        if isinstance(scaling, Mapping) and scaling.get("partial_rotary_factor") is not None:
            partial = rotated_dim(head_dim, scaling)
            if rotary_dim is not None and rd != partial:
                raise ValueError(f"rotary_dim={rotary_dim!r} differs from the {partial} channels "
                                 "that scaling['partial_rotary_factor']="
                                 f"{scaling['partial_rotary_factor']!r} rotates in a head of "
                                 f"{head_dim}; pass only one of them")
            rd = partial
        else:
            table_dim = rd
        if rd is None or rd <= 0 or rd % 2 or rd > head_dim:
            raise ValueError(f"rotary_dim must be a positive even int <= head_dim={head_dim}, "
                             f"got {rotary_dim!r}")
        rotary_dim = rd
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        check_layout(layout)
        if short_table not in SHORT_TABLE_MODES:
            raise ValueError(f"short_table must be one of {SHORT_TABLE_MODES}, "
                             f"got {short_table!r}")
        self.embed_dim, self.num_heads, self.num_kv_heads = embed_dim, num_heads, num_kv_heads
        self.head_dim, self.rotary_dim, self.layout = head_dim, rotary_dim, layout
        self.dropout, self.short_table = dropout, short_table
        kw = {"device": device, "dtype": dtype}
        self.q_proj = nn.Linear(embed_dim, num_heads * head_dim, bias=bias, **kw)
        self.k_proj = nn.Linear(embed_dim, num_kv_heads * head_dim, bias=bias, **kw)
        self.v_proj = nn.Linear(embed_dim, num_kv_heads * head_dim, bias=bias, **kw)
        if o_proj_bias is not None and not isinstance(o_proj_bias, bool):
            raise TypeError(f"o_proj_bias must be a bool or None, got "
                            f"{type(o_proj_bias).__name__}")
        self.o_proj = nn.Linear(num_heads * head_dim, embed_dim,
                                bias=bias if o_proj_bias is None else o_proj_bias, **kw)
        if frequencies is not None and not rope:
            raise ValueError("frequencies (multi-axis RoPE) need rope=True")
        self.rotary = RotaryEmbedding(table_dim, base, scaling=scaling, device=device,
                                      max_position_embeddings=max_position_embeddings,
                                      frequencies=frequencies) if rope else None

    def _split_heads(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        batch, seq, _ = x.shape
        return x.view(batch, seq, heads, self.head_dim).transpose(1, 2)

    def _check_inputs(self, query, key, value) -> None:
        for name, t in (("query", query), ("key", key), ("value", value)):
            check_float_tensor(name, t)
            if t.ndim != 3 or t.shape[-1] != self.embed_dim:
                raise ValueError(f"{name} must have shape (batch, seq, embed_dim={self.embed_dim}),"
                                 f" got {tuple(t.shape)}")
        if not query.shape[0] == key.shape[0] == value.shape[0]:
            raise ValueError(f"query, key and value must share the batch size, got "
                             f"{query.shape[0]}, {key.shape[0]}, {value.shape[0]}")
        if key.shape[1] != value.shape[1]:
            raise ValueError(f"key and value must have the same length, got {key.shape[1]} "
                             f"and {value.shape[1]}")

    def _rotate(self, q, k, rope_embeddings, positions, key_positions, offset, end):
        """q at ``positions`` (default offset + 0..Nq-1) and k at ``key_positions`` (default
        offset + 0..Nk-1), rotated. ``end``: offset + the new tokens, the least length the
        module's tables cover and, with the largest position + 1, the length whose
        frequencies a length-dependent rope type uses.

        One rule for the module's own RoPE: given positions (1D or multi-axis) rotate with
        rows computed on the device from float64 frequencies under a compiler or tracer and
        off the CPU (``_rotate_traced``, ``_rotate_axes``), so nothing is read back; eager
        on the CPU, where reading the largest position costs nothing, the tables grow to
        it and the rows are gathered (cheaper there than computing them). Rope types whose
        frequencies depend on the length read it on every device, as transformers does."""
        if rope_embeddings is not None:
            if not isinstance(rope_embeddings, (tuple, list)) or len(rope_embeddings) != 2:
                raise ValueError("rope_embeddings must be a (cos, sin) pair, e.g. from "
                                 "generate_rope_embeddings(seq_len, head_dim)")
            cos, sin = rope_embeddings
        elif self.rotary is None:
            return q, k
        elif self.rotary.frequencies is not None and (positions is not None
                                                      or key_positions is not None):
            return self._rotate_axes(q, k, positions, key_positions, offset)
        elif self._tables_cover(positions, key_positions, end, q):
            cos, sin = self.rotary.cos_cached, self.rotary.sin_cached  # a slice of them, below
        elif tracing() or (q.device.type != "cpu" and not self.rotary.dynamic and (
                positions is not None or key_positions is not None)):
            # no host read of the positions: under a compiler, and on a GPU (no wait for it,
            # and a CUDA graph can hold the step)
            return self._rotate_traced(q, k, positions, key_positions, offset, end)
        else:
            ends = [end] + [int(p.max()) + 1 for p in (positions, key_positions)
                            if p is not None and p.numel()]
            cos, sin = self.rotary.tables(max(ends), q.device)
        kw = {"layout": self.layout, "rotary_dim": self.rotary_dim,
              "short_table": self.short_table}
        if (key_positions is positions and q.shape[-2] == k.shape[-2]
                and q.shape[:-3] == k.shape[:-3]):  # one launch for both on a GPU
            return apply_rope_qk(q, k, cos, sin, positions=positions,
                                 offset=offset if positions is None else 0, **kw)
        q = apply_rope(q, cos, sin, positions=positions,
                       offset=offset if positions is None else 0, **kw)
        k = apply_rope(k, cos, sin, positions=key_positions,
                       offset=offset if key_positions is None else 0, **kw)
        return q, k

    def _tables_cover(self, positions, key_positions, end, q) -> bool:
        """Whether a graph of ``torch.compile`` or ``torch.export`` may slice the module's
        cached tables for the positions ``offset .. end - 1`` (none given): fixed
        frequencies, and tables on q's device known at trace time to cover ``end`` (no
        guard is added on a symbolic length; ``torch.jit.trace``, which records no guard,
        computes its rows). The rows are then a view of the tables instead of an arange,
        float64 angles, cos, sin and a cast in the graph at every call."""
        if not torch.compiler.is_compiling() or positions is not None or (
                key_positions is not None or self.rotary.dynamic):
            return False
        cached = self.rotary.cos_cached
        return cached.device == q.device and statically_known_true(end <= cached.shape[0])

    def _rotate_traced(self, q, k, positions, key_positions, offset, end):
        """``_rotate`` without reading the positions on the host (under a compiler or
        tracer, and on a GPU): the tables cannot grow to the largest position, so the rows
        of every position are computed on the device (``RotaryEmbedding.traced_rows``, in
        float64 like the tables), with the frequencies of length ``end``. A
        length-dependent rope type would use a longer length for a position at or past
        ``end`` in eager mode; the graph asserts there is none. q and k at the same
        positions share their rows and rotate in one launch."""
        shared = (key_positions is positions and q.shape[-2] == k.shape[-2]
                  and q.shape[:-3] == k.shape[:-3])
        rows = []
        for x, pos in ((q, positions),) if shared else ((q, positions), (k, key_positions)):
            if pos is None:
                pos = torch.arange(offset, offset + x.shape[-2], device=x.device)
            else:
                pos = traced_nonnegative(pos)
                if self.rotary.dynamic:
                    torch._assert_async((pos < end).all(), "compiled or traced, a rope type "
                                        "whose frequencies depend on the length takes only "
                                        "positions < offset + seq")
            cos, sin = self.rotary.traced_rows(pos.to(x.device), end)
            # (seq,) or (batch, seq) positions: rows (1 or batch, 1 head, seq, rotary_dim / 2)
            rows.append(tuple(t.reshape((-1, 1) + tuple(t.shape[-2:])) for t in (cos, sin)))
        return self._apply_rows(q, k, rows)

    def _axis_positions(self, name: str, p, x: torch.Tensor, offset: int) -> torch.Tensor:
        """Checked multi-axis positions of ``x`` ``(B, H, N, d)``: ``(N, k)`` or ``(B or 1,
        N, k)``, on x's device (where the rows must be, also while the tables are still on
        the meta device); None is the diagonal from ``offset``."""
        seq, axes = x.shape[-2], self.rotary.num_axes
        if p is None:
            return (offset + torch.arange(seq, device=x.device))[:, None].expand(seq, axes)
        if not isinstance(p, torch.Tensor) or p.ndim not in (2, 3) or p.shape[-2] != seq or (
                p.ndim == 3 and p.shape[0] not in (1, x.shape[0])) or p.shape[-1] != axes:
            seen = f"{tuple(p.shape)}" + (f" (k = {p.shape[-1]})" if p.ndim >= 2 else "")
            hint = "; add the axis: positions[..., None]" if axes == 1 and p.ndim < 2 else ""
            raise ValueError(f"{name} must have shape ({seq}, {axes}) or (batch, {seq}, "
                             f"{axes}) for multi-axis RoPE: k = {axes} coordinates per token, "
                             f"the columns of frequencies (also when k = 1); got {seen}"
                             f"{hint}{hf_positions_hint(axes)}")
        return p.to(x.device)

    def _rotate_axes(self, q, k, positions, key_positions, offset):
        """Multi-axis positions ``(N, k)`` or ``(B, N, k)``: each token's rows gathered (or
        computed) by ``self.rotary``; missing positions are the diagonal from ``offset``."""
        if key_positions is None and positions is not None and k.shape[-2] == q.shape[-2]:
            key_positions = positions
        checked = [self._axis_positions(name, p, x, offset) for name, x, p in (
            ("positions", q, positions), ("key_positions", k, key_positions))]
        kw = {"layout": self.layout, "rotary_dim": self.rotary_dim}
        if self.rotary.pair_axes is not None and not tracing() and (
                q.device.type == "cpu" or self.rotary.dynamic):
            # one table for q and k: of the length max(positions) + 1 over both, whose
            # spectrum a length-dependent rope type uses (apply_rope checks the rest)
            high = max(int(p.max()) if p.numel() else -1 for p in checked)
            cos, sin = self.rotary.tables(high + 1, q.device)
            return tuple(apply_rope(x, cos, sin, positions=p, axes=self.rotary.pair_axes, **kw)
                         for x, p in zip((q, k), checked, strict=True))
        # rows from self.rotary: computed where the module is off the CPU and under a
        # compiler (nothing read back), and wherever pairs turn with several axes
        rows = []
        for p in checked[:1] if checked[0] is checked[1] else checked:
            cos, sin = self.rotary(positions=p)
            rows.append(tuple(t[None, None] if p.ndim == 2 else t[:, None] for t in (cos, sin)))
        return self._apply_rows(q, k, rows)

    def _apply_rows(self, q, k, rows: list) -> tuple[torch.Tensor, torch.Tensor]:
        """q and k rotated by their ``(cos, sin)`` rows: ``rows`` holds one pair when they
        share them (one launch for both on a GPU), else q's then k's."""
        kw = {"layout": self.layout, "rotary_dim": self.rotary_dim}
        if len(rows) == 1:
            return apply_rope_qk(q, k, *rows[0], **kw)
        return apply_rope(q, *rows[0], **kw), apply_rope(k, *rows[1], **kw)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                rope_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
                attn_mask: torch.Tensor | None = None, return_attn: bool = False, *,
                is_causal: bool = False, positions: torch.Tensor | None = None,
                key_positions: torch.Tensor | None = None, offset: int | None = None,
                kv_cache: KVCache | None = None, cache_position: torch.Tensor | None = None):
        """Attend from query ``(B, Nq, D)`` to key/value ``(B, Nk, D)``.

        Args:
            rope_embeddings: ``(cos, sin)`` tables ``(>= positions, rotary_dim // 2)``; default:
                the module's own ``RotaryEmbedding``.
            attn_mask: boolean (True = may attend) or float (added to the scores), broadcastable
                to ``(B, H, Nq, Nk)`` (Nk includes cached keys).
            return_attn: also return the softmax weights ``(B, H, Nq, Nk)`` (before dropout);
                this takes the explicit path instead of ``scaled_dot_product_attention``.
            is_causal: causal mask, lower-right aligned when Nq < Nk.
            positions: query positions ``(Nq,)`` or ``(B, Nq)``; default offset + 0..Nq-1.
                With multi-axis ``frequencies`` of k columns: ``(Nq, k)`` or ``(B, Nq, k)``,
                k = 1 included (a wrong k is an error), default the diagonal (offset +
                0..Nq-1 on every axis: text); with a ``KVCache`` and no ``offset``, the
                diagonal from each row's ``kv_cache.next_position`` (its largest coordinate
                so far + 1, as Qwen2-VL decodes after an image).
            key_positions: key positions; default ``positions`` when Nk == Nq, else
                offset + 0..Nk-1.
            offset: first position; default the cache length (0 without a cache).
            kv_cache: a ``KVCache`` to append to and attend over. Each step equals the full
                causal forward over the tokens so far, also when the rope type's frequencies
                change with the length (dynamic NTK): then the keys are cached unrotated and
                all of them are rotated at every call, one extra pass over the cached keys
                (see ``KVCache``).
            cache_position: a step at cache slots given on the device: a 0-d integer tensor,
                the slot of the first new token in ``kv_cache`` (made with a ``capacity``);
                the new keys and values go to the slots ``cache_position + 0 .. N - 1``
                (``KVCache.write``, or one launch with the rotation on a GPU; slots past the
                capacity are refused: a ValueError on the CPU before anything is written, a
                device-side assertion on a GPU), each query attends to the slots up to its
                own (and to what ``attn_mask``, which must broadcast to ``(B, H, N,
                capacity)``, e.g. ``(B, 1, 1, capacity)``, allows, e.g. left padding), and
                ``positions`` default to the slots, or to ``offset + 0 .. N - 1`` when
                ``offset`` is given (``(N, 1)`` for one-axis frequencies); ``key_positions``
                default to ``positions``. As many
                new keys as queries, 1D RoPE (or k = 1) whose frequencies do not depend on
                the length. Nothing in such a step reads a value on the host, so on a GPU
                it can be captured in a CUDA graph and replayed with new tokens, positions
                and ``cache_position`` (see the README).

        Returns:
            ``out`` ``(B, Nq, D)``, or ``(out, attn_weights)`` if ``return_attn``. A query row
            that may attend to nothing gets zeros (no NaN).
        """
        self._check_inputs(query, key, value)
        if isinstance(kv_cache, KVCache):
            kv_cache._claim(self)
        if cache_position is not None:
            return self._step_at(query, key, value, rope_embeddings, attn_mask, return_attn,
                                 positions, key_positions, offset, kv_cache, cache_position)
        # a multi-axis module records each row's next position in a KVCache
        axes = (rope_embeddings is None and self.rotary is not None
                and self.rotary.frequencies is not None and hasattr(kv_cache, "next_position"))
        if axes and offset is None and positions is None and kv_cache.next_position is not None:
            # continue each row's sequence
            positions = self._diagonal(kv_cache.next_position, query.shape[1])
        if offset is None:
            offset = kv_cache.length if kv_cache is not None else 0
        q = self._split_heads(self.q_proj(query), self.num_heads)
        k = self._split_heads(self.k_proj(key), self.num_kv_heads)
        v = self._split_heads(self.v_proj(value), self.num_kv_heads)
        positions, key_positions = (None if p is None else check_int_tensor(name, p) for name, p
                                    in (("positions", positions), ("key_positions", key_positions)))
        if key_positions is None and positions is not None and k.shape[-2] == q.shape[-2]:
            key_positions = positions
        end = offset + max(q.shape[-2], k.shape[-2])
        if axes and self.rotary.dynamic:  # unrotated keys with their (t, h, w) positions
            positions = self._axis_positions("positions", positions, q, offset)
            key_positions = self._axis_positions("key_positions", key_positions, k, offset)
            self._refuse_negative(positions, key_positions)
            following = self._next_position(kv_cache, key_positions, offset, k)
            k, v = kv_cache.update(k, v, positions=key_positions if key_positions.ndim == 3
                                   else key_positions[None], next_position=following)
            q, k = self._rotate(q, k, rope_embeddings, positions, kv_cache.positions, offset, end)
        elif axes:
            q, k = self._rotate(q, k, rope_embeddings, positions, key_positions, offset, end)
            k, v = kv_cache.update(k, v, next_position=self._next_position(
                kv_cache, key_positions, offset, k))
        elif kv_cache is not None and self._caches_unrotated(kv_cache, rope_embeddings):
            if key_positions is None:
                key_positions = torch.arange(offset, offset + k.shape[-2], device=k.device)
            self._refuse_negative(positions, key_positions)
            k, v = kv_cache.update(k, v, positions=key_positions)
            q, k = self._rotate(q, k, rope_embeddings, positions, kv_cache.positions, offset, end)
        else:
            q, k = self._rotate(q, k, rope_embeddings, positions, key_positions, offset, end)
            if kv_cache is not None:
                k, v = kv_cache.update(k, v)
        return self._attend(q, k, v, attn_mask, is_causal, return_attn)

    def _step_at(self, query, key, value, rope_embeddings, attn_mask, return_attn, positions,
                 key_positions, offset, kv_cache, cache_position):
        """``forward`` with ``cache_position``: the step a CUDA graph can hold."""
        if key.shape[1] != query.shape[1]:
            raise ValueError(f"cache_position steps take as many new keys as queries (the "
                             f"new tokens), got {query.shape[1]} queries and {key.shape[1]} "
                             "keys")
        if not isinstance(kv_cache, KVCache):
            raise ValueError("cache_position needs a kv_cache made with a capacity, e.g. "
                             "KVCache(capacity=4096)")
        if rope_embeddings is None and self.rotary is not None and (
                self.rotary.dynamic or self.rotary.num_axes > 1):
            raise ValueError("cache_position steps take 1D RoPE whose frequencies do not "
                             "depend on the length; decode this module with offset= or "
                             "positions= instead")
        cache_position = check_int_tensor("cache_position", cache_position)
        if cache_position.numel() != 1:
            raise ValueError(f"cache_position must be a single slot (a 0-d integer tensor), "
                             f"got shape {tuple(cache_position.shape)}")
        if offset is not None and positions is not None:
            raise ValueError(f"pass either positions or offset, not both (offset={offset}); "
                             "add the offset to positions instead")
        capacity = kv_cache._slot_capacity()
        if attn_mask is not None:
            self._check_step_mask(attn_mask, query.shape[0], query.shape[1], capacity)
        n = query.shape[1]
        steps = torch.arange(n, device=query.device)
        slots = cache_position.reshape(()).to(query.device) + steps
        if _on_host(slots):
            _check_slots(slots, capacity)  # before anything is written (or rotated)
        q = self._split_heads(self.q_proj(query), self.num_heads)
        k = self._split_heads(self.k_proj(key), self.num_kv_heads)
        v = self._split_heads(self.v_proj(value), self.num_kv_heads)
        derived = positions is None
        if derived and offset is not None:
            start = check_offset(offset)
            positions = steps + (start.to(q.device) if isinstance(start, torch.Tensor)
                                 else start)
        fused = None if key_positions is not None else self._rotate_into_cache(
            q, k, v, rope_embeddings, positions, kv_cache, cache_position)
        if fused is not None:  # on a device its one launch asserted the slots itself
            q, k, v = fused
        else:
            if not _on_host(slots):
                _check_slots(slots, capacity)
            if positions is None:
                positions = slots
            if derived:  # one coordinate each for one-axis frequencies (k = 1)
                one_axis = rope_embeddings is None and self.rotary is not None and (
                    self.rotary.frequencies is not None)
                positions = positions[:, None] if one_axis else positions
            positions = check_int_tensor("positions", positions)
            key_positions = positions if key_positions is None else check_int_tensor(
                "key_positions", key_positions)
            q, k = self._rotate(q, k, rope_embeddings, positions, key_positions, 0, n)
            k, v = kv_cache._write(k, v, slots)
        visible = torch.arange(k.shape[-2], device=q.device) <= slots[:, None]  # (n, capacity)
        if attn_mask is None:
            mask = visible
        elif attn_mask.dtype == torch.bool:
            mask = attn_mask & visible
        else:
            mask = attn_mask.masked_fill(~visible, float("-inf"))
        # each query sees its own slot at least, unless attn_mask hides it
        return self._attend(q, k, v, mask, False, return_attn, every_row_sees=attn_mask is None)

    def _rotate_into_cache(self, q, k, v, rope_embeddings, positions, kv_cache,
                           cache_position):
        """A ``cache_position`` step's rotation and cache write in one pass
        (``apply_rope_qk_to_cache``: on a GPU one launch, which rotates k straight into its
        slots): ``(q rotated, key buffer, value buffer)``, or None where the step takes the
        rotation then ``KVCache.write`` (under a compiler or autograd, without RoPE, for
        multi-axis frequencies). The rows: the module's tables, which cover the cache's
        capacity, read at the slots; for given positions, gathered from tables grown to
        them on the CPU, computed on the device elsewhere (``RotaryEmbedding.traced_rows``:
        any position, nothing read back)."""
        own = rope_embeddings is None
        if tracing() or (own and (self.rotary is None or self.rotary.frequencies is not None)):
            return None
        buffers = kv_cache._step_buffers(k, v)
        if buffers is None:
            return None
        if positions is not None:
            positions = check_int_tensor("positions", positions)
        if not own:
            cos, sin = rope_embeddings
        elif positions is None:
            cos, sin = self.rotary.tables(buffers[0].shape[-2], q.device)
        elif q.device.type == "cpu":
            self._refuse_negative(positions, positions)
            cos, sin = self.rotary.tables(int(positions.max()) + 1 if positions.numel() else 0,
                                          q.device)
        else:
            cos, sin = self.rotary.traced_rows(traced_nonnegative(positions.to(q.device)), None)
            cos, sin = (t.reshape((-1, 1) + tuple(t.shape[-2:])) for t in (cos, sin))
            positions = None
        q = apply_rope_qk_to_cache(q, k, v, cos, sin, *buffers, cache_position,
                                   layout=self.layout, positions=positions,
                                   rotary_dim=self.rotary_dim, short_table=self.short_table)
        return (q, *buffers)

    def _check_step_mask(self, attn_mask, batch: int, new: int, capacity: int) -> None:
        """A ``cache_position`` step's mask has one column per cache slot: it must broadcast
        to ``(batch, heads, new, capacity)``."""
        if not isinstance(attn_mask, torch.Tensor):
            raise TypeError(f"attn_mask must be a torch.Tensor, got {type(attn_mask).__name__}")
        expected = (batch, self.num_heads, new, capacity)
        if attn_mask.ndim > 4 or not broadcasts(attn_mask.shape, expected):
            raise ValueError(f"attn_mask of a cache_position step must broadcast to (batch, "
                             f"heads, new, capacity) = {expected}: one column per slot of the "
                             f"cache's capacity ({capacity}), written or not (slots past "
                             f"cache_position are hidden anyway), e.g. (batch, 1, 1, "
                             f"{capacity}); got {tuple(attn_mask.shape)}")

    def _attend(self, q, k, v, attn_mask, is_causal: bool, return_attn: bool,
                every_row_sees: bool = False):
        """Attention of rotated q ``(B, H, Nq, d)`` over k, v ``(B, kv_heads, Nk, d)``, merged
        and projected; ``(out, weights)`` with ``return_attn``. ``every_row_sees``: a mask made
        here that leaves each query a key, taken as it is (no rows to find empty and zero,
        four operations on the device)."""
        batch, q_len, k_len = q.shape[0], q.shape[-2], k.shape[-2]
        p = self.dropout if self.training else 0.0
        gqa = self.num_kv_heads != self.num_heads
        if is_causal and attn_mask is None and q_len == k_len and not return_attn:
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True,
                                                 enable_gqa=gqa)
            return self._merge_heads(out)
        mask, empty = (attn_mask, None) if every_row_sees else prepare_mask(
            attn_mask, (batch, self.num_heads, q_len, k_len), is_causal, q.dtype, q.device)
        if return_attn:
            out, weights = self._explicit(q, k, v, mask, empty, p)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p,
                                                 enable_gqa=gqa)
        if empty is not None:
            out = out.masked_fill(empty, 0.0)
        out = self._merge_heads(out)
        return (out, weights) if return_attn else out

    def _diagonal(self, start: torch.Tensor, seq: int) -> torch.Tensor:
        """Multi-axis positions ``(batch, seq, k)``: row b at ``start[b] + 0 .. seq - 1`` on
        every axis (text after what the cache holds)."""
        steps = torch.arange(seq, device=start.device)
        return (start[:, None] + steps)[..., None].expand(-1, -1, self.rotary.num_axes)

    @staticmethod
    def _next_position(kv_cache: KVCache, key_positions: torch.Tensor | None, offset: int,
                       k: torch.Tensor) -> torch.Tensor:
        """Each row's next position ``(batch,)`` after caching keys ``k`` at multi-axis
        ``key_positions`` ``(Nk, k)`` / ``(B, Nk, k)`` (None: the diagonal from ``offset``):
        the largest coordinate so far + 1 (Qwen2-VL's rule)."""
        batch, seq = k.shape[0], k.shape[-2]
        if key_positions is None:
            following = torch.full((batch,), offset + seq, dtype=torch.int64, device=k.device)
        elif key_positions.numel() == 0:
            following = torch.zeros(batch, dtype=torch.int64, device=k.device)
        else:
            following = key_positions.to(k.device).flatten(-2).amax(-1).expand(batch) + 1
        previous = kv_cache.next_position
        return following if previous is None else torch.maximum(previous, following)

    @staticmethod
    def _refuse_negative(positions: torch.Tensor | None, key_positions: torch.Tensor) -> None:
        """Refuses negative positions before a ``KVCache`` keeps unrotated keys, so a refused
        step leaves the cache as it was. Eager only (the rope types that cache unrotated
        keys read the largest position anyway); a graph asserts them where it rotates."""
        if tracing():
            return
        for name, p in (("positions", positions), ("key_positions", key_positions)):
            if p is not None and p.numel() and int(p.min()) < 0:
                raise ValueError(f"{name} must be >= 0, got min {int(p.min())}")

    def _caches_unrotated(self, kv_cache: KVCache, rope_embeddings) -> bool:
        """Whether keys go into ``kv_cache`` unrotated, with their positions, to be rotated
        at every call with the current frequencies: when the module's own frequencies
        depend on the length (see ``KVCache``), or the cache already holds such keys."""
        builtin_length_dependent = (rope_embeddings is None and self.rotary is not None
                                    and self.rotary.dynamic)
        # a cache object of the caller's own (length, update) has no positions: rotated keys
        return builtin_length_dependent or getattr(kv_cache, "positions", None) is not None

    def _explicit(self, q, k, v, mask, empty, p):
        groups = self.num_heads // self.num_kv_heads
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = (scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool
                      else scores + mask)
        # softmax in float32 at least (float64 stays float64, so gradcheck holds there)
        softmax_dtype = torch.promote_types(q.dtype, torch.float32)
        weights = torch.softmax(scores, dim=-1, dtype=softmax_dtype).to(q.dtype)
        if empty is not None:
            weights = weights.masked_fill(empty, 0.0)
        return F.dropout(weights, p=p, training=p > 0) @ v, weights

    def _merge_heads(self, out: torch.Tensor) -> torch.Tensor:
        batch, _, seq, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, self.num_heads * self.head_dim))
