"""apply_rope: rotate channel pairs of q or k by the angles m * theta_i.

For position m and pair i, with (a, b) the two channels of the pair,

    a' = a cos(m theta_i) - b sin(m theta_i)
    b' = a sin(m theta_i) + b cos(m theta_i),

which is multiplication by the block-diagonal matrix R_{Theta,m} of RoFormer eq. (15). The
layout says which channels pair up: ``"interleaved"`` pairs (2i, 2i+1) (RoFormer, GPT-J,
Meta's Llama), ``"half"`` pairs (i, i + d/2) (GPT-NeoX, Hugging Face Llama).

A call goes down these layers once and never calls back into a layer above it:

    rotation      apply_rope, apply_rope_qk, apply_rope_qk_to_cache (the public entries)
    distributed   (DTensor calls only) the DTensors' arguments as plain tensors
    plans         (the device route only) the plan of a call's signature
    kernels       the operators ropelib::rotate, ... and their fakes; the backend's choice
    native | triton_rope | eager    the backends
    _checks       the checks, and ``watcher``: who watches a call (every layer asks it)

``apply_rope`` here checks the arguments and selects the table rows of x's positions (a
view, or a gather for ``positions``; multi-axis positions with ``axes`` are handed on, for
the kernel to read the rows itself). What happens next is decided by one answer,
``watcher``'s: an eager call nobody watches goes straight to the backend
(``kernels.run_backend``), through one autograd node (``_EagerRotation``) when it records
autograd; a call under a compiler, tracer, dispatch mode or with DTensors goes through the
operator ``ropelib::rotate``, which they see as one node; under a ``torch.func`` transform
or forward-mode AD the rotation is PyTorch operations (``eager.rotate_composite``). The
gradient of a rotation is the rotation by the opposite angle, so the autograd formula
registered here for that operator is the same operator with ``inverse=True`` (sin read as
-sin). On the device route each public function first looks its call's signature up in
``ropelib.plans``: a call seen before checks only its addresses and launches the Triton
kernel as the first call prepared it. Nothing is cached on the caller's tensors: every call
works from the tensors it is given.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Literal

import torch

from . import distributed, eager, kernels, plans
from ._checks import (
    FLOAT_DTYPES,
    LAYOUTS,
    as_int,
    broadcasts,
    check_float_tensor,
    check_int_tensor,
    check_layout,
    traced_nonnegative,
    tracing,
    watcher,
)

Layout = Literal["interleaved", "half"]
SHORT_TABLE_MODES = ("raise", "repeat_last")


def apply_rope(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, layout: Layout = "interleaved",
    positions: torch.Tensor | None = None, offset: int = 0, rotary_dim: int | None = None,
    short_table: Literal["raise", "repeat_last"] = "raise", out: torch.Tensor | None = None,
    axes: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rotate x by R_{Theta,m}, where m is each row's position.

    Args:
        x: ``(..., seq, head_dim)``, e.g. ``(batch, heads, seq, head_dim)``; floating point.
        cos, sin: tables ``(table_len, rotary_dim // 2)`` from ``generate_rope_embeddings``
            or ``RotaryEmbedding``, both of one float dtype (cast to ``x.dtype`` here); or rows
            already gathered, with as many dims as x and broadcastable to
            ``(..., seq, rotary_dim // 2)``.
        layout: ``"interleaved"`` (pairs (2i, 2i+1)) or ``"half"`` (pairs (i, i + d/2)).
        positions: integer positions ``(seq,)`` or ``(batch, seq)`` (one row per batch entry,
            e.g. for left-padded batches); default ``offset .. offset + seq - 1``. With
            ``axes``: multi-axis coordinates ``(seq, k)`` or ``(batch, seq, k)``.
        offset: first position when ``positions`` is not given (KV-cache decoding); an int,
            a NumPy integer or a 0-d integer tensor (on a GPU it is not read back: the step
            can be captured in a CUDA graph). On a GPU the values of positions and offsets
            are checked on the device (a device-side assert at the next synchronization), on
            the CPU before anything runs (a ValueError).
        rotary_dim: rotate only the first ``rotary_dim`` channels (even, <= head_dim) and pass
            the rest through unchanged, as GPT-NeoX and GPT-J do. Default: head_dim.
        short_table: ``"raise"`` (default): a table shorter than the positions is an error.
            ``"repeat_last"`` reuses the last row for positions past the table, the behaviour
            of the module ropelib grew from; it silently destroys relative positions there.
        out: optional destination with x's shape, dtype and device, e.g. a buffer you own or
            ``x`` itself (in place); it may not share memory with cos or sin, nor elements
            with x unless it is x. Not differentiable: use it under ``torch.no_grad()`` or
            for tensors that do not require grad.
        axes: multi-axis RoPE whose pairs each follow one axis (M-RoPE, Qwen2-VL; Wang et
            al. 2024): integer ``(rotary_dim // 2,)``, the coordinate each pair turns with
            (``RotaryEmbedding.pair_axes``, ``ropelib.multiaxis.axis_of_pairs``). Pair i of a token at
            coordinates p then reads row ``p[axes[i]]`` of the 2-D tables, which hold the
            diagonal's angles m * theta_i. On the CPU the compiled loop reads those rows
            itself, a tile of tokens at a time reused across heads, instead of gathering
            ``(seq, rotary_dim // 2)`` rows first.

    Returns:
        A new tensor with the shape and dtype of x, or ``out``. On a GPU the new tensor
        takes x's memory layout where x is dense with contiguous channels (as PyTorch's
        elementwise operations do: a ``(batch, seq, heads, dim)`` view stays one, which
        attention reads without a copy); on the CPU it is contiguous.
    """
    key = None
    if _on_device(x):
        given = _caller_tensors(cos, sin, positions, offset, axes)
        key, plan = _signature((x,), (out,), given, (layout, rotary_dim, short_table),
                               positions, offset)
        if plan is not None and plan.kernel is not None:
            return _run_plan(plan, (x,), (out,), given)[0]
    watched = watcher(x, cos, sin, positions, offset, axes, written=(out,))
    if watched == "dispatcher" and not type(x) is type(cos) is type(sin) is torch.Tensor:
        cos, sin, positions, axes = distributed.plain_arguments((x,), cos, sin, positions, axes)
    rd, offset = _check_arguments(x, cos, sin, layout, offset, rotary_dim, short_table)
    if out is not None:
        _check_out(out, x, cos, sin)
    cos, sin, coordinates, axes, pending = _rows(x, cos, sin, positions, offset, rd,
                                                 short_table, axes, watched)
    if key is not None:
        plan = plans.make(key, [x], [out], cos, sin, layout, rd, coordinates, axes, pending,
                          given)
        if plan is not None and plan.kernel is not None:
            return _run_plan(plan, (x,), (out,), given)[0]
    if type(x) is not torch.Tensor:  # a DTensor x gets the rows as replicated DTensors
        coordinates, pending = kernels.resolve_pending(x, cos, coordinates, axes, pending), None
        cos, sin, coordinates, axes = distributed.replicated_arguments(x, cos, sin, coordinates,
                                                                       axes)
    if watched == "transform":
        kernels.check_forced_under_transform(x)
        coordinates = kernels.resolve_pending(x, cos, coordinates, axes, pending)
        rotated = eager.rotate_composite(x, cos, sin, layout, rd, coordinates, axes)
        return rotated if out is None else out.copy_(rotated)
    if out is None:
        if watched is None:
            if not (torch.is_grad_enabled() and (x.requires_grad or cos.requires_grad
                                                 or sin.requires_grad)):
                return kernels.run_backend([x], [None], cos, sin, layout, rd, False,
                                           coordinates, axes, pending)[0]
            if _eager_training_step(cos, sin, x):
                return _eager_rotation(x, None, cos, sin, layout, rd, False, coordinates,
                                       axes, pending)
        return kernels.rotate(x, cos, sin, layout, rd, False, coordinates, axes, pending)
    kernels.rotate_out(x, cos, sin, layout, rd, out, coordinates, axes, pending)
    return out


def apply_rope_qk(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *,
    layout: Layout = "interleaved", positions: torch.Tensor | None = None, offset: int = 0,
    rotary_dim: int | None = None, short_table: Literal["raise", "repeat_last"] = "raise",
    out: tuple[torch.Tensor, torch.Tensor] | None = None, inplace: bool = False,
    axes: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate a query and a key at the same positions: ``(apply_rope(q, ...), apply_rope(k,
    ...))``, in one kernel launch on a GPU (the table rows read once for both).

    Args:
        q: ``(..., heads_q, seq, head_dim)``, e.g. ``(batch, heads_q, seq, head_dim)``.
        k: ``(..., heads_k, seq, head_dim)``: q's shape but for the heads (GQA, MQA), q's
            dtype and device.
        cos, sin, layout, positions, offset, rotary_dim, short_table, axes: as for
            ``apply_rope``; gathered rows must broadcast to both.
        out: optional destinations ``(q_out, k_out)``, each as ``apply_rope``'s ``out``.
        inplace: rotate q and k in place (``out=(q, k)``).

    Returns:
        ``(q_rotated, k_rotated)``: new tensors (laid out as ``apply_rope``'s), or the
        destinations.
    """
    if not isinstance(inplace, bool):
        raise TypeError(f"inplace must be a bool, got {type(inplace).__name__}")
    given = _caller_tensors(cos, sin, positions, offset, axes)
    if out is None:
        outs = (q, k) if inplace else (None, None)
    else:
        outs = None if inplace else out  # both given: refused below
    key, plan = _signature((q, k), outs, given, (layout, rotary_dim, short_table), positions,
                           offset)
    if plan is not None and plan.kernel is not None:
        q_rot, k_rot = _run_plan(plan, (q, k), outs, given)
        return q_rot, k_rot
    watched = watcher(q, k, cos, sin, positions, offset, axes,
                      written=out if type(out) in (tuple, list) else (out,))
    if watched == "dispatcher" and not type(q) is type(k) is type(cos) is type(sin) is (
            torch.Tensor):
        cos, sin, positions, axes = distributed.plain_arguments((q, k), cos, sin, positions, axes)
    rd, offset = _check_arguments(q, cos, sin, layout, offset, rotary_dim, short_table, "q")
    check_float_tensor("k", k)
    if (k.ndim != q.ndim or q.ndim < 3 or k.shape[:-3] != q.shape[:-3]
            or k.shape[-2:] != q.shape[-2:] or k.dtype != q.dtype or k.device != q.device):
        raise ValueError(f"k must have q's shape but for the heads dim (-3), q's dtype and "
                         f"device: q is {tuple(q.shape)} {q.dtype} on {q.device}, got k "
                         f"{tuple(k.shape)} {k.dtype} on {k.device}")
    if cos.ndim > 2 and cos.shape[-3] not in (1, k.shape[-3]):
        raise ValueError(f"gathered cos/sin {tuple(cos.shape)} have a heads dim of "
                         f"{cos.shape[-3]}, which k's {k.shape[-3]} heads cannot share; pass "
                         "rows broadcast over the heads (size 1 there)")
    if inplace:
        if out is not None:
            raise ValueError("pass either out=(q_out, k_out) or inplace=True, not both")
        out = (q, k)
    if out is not None:
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise TypeError(f"out must be a pair (q_out, k_out), got {type(out).__name__}")
        for name, t, x_name in (("q_out", out[0], "q"), ("k_out", out[1], "k")):
            _check_out(t, q if x_name == "q" else k, cos, sin, name, x_name, inplace)
    cos, sin, coordinates, axes, pending = _rows(q, cos, sin, positions, offset, rd,
                                                 short_table, axes, watched)
    if key is not None:
        plan = plans.make(key, [q, k], list(outs), cos, sin, layout, rd, coordinates, axes,
                          pending, given)
        if plan is not None and plan.kernel is not None:
            q_rot, k_rot = _run_plan(plan, (q, k), outs, given)
            return q_rot, k_rot
    if type(q) is not torch.Tensor:
        coordinates, pending = kernels.resolve_pending(q, cos, coordinates, axes, pending), None
        cos, sin, coordinates, axes = distributed.replicated_arguments(q, cos, sin, coordinates,
                                                                       axes)
    if watched == "transform":
        kernels.check_forced_under_transform(q)
        coordinates = kernels.resolve_pending(q, cos, coordinates, axes, pending)
        rotated = [eager.rotate_composite(t, cos, sin, layout, rd, coordinates, axes)
                   for t in (q, k)]
        if out is None:
            return rotated[0], rotated[1]
        return out[0].copy_(rotated[0]), out[1].copy_(rotated[1])
    if out is None:
        if watched is None and _eager_training_step(cos, sin, q, k):
            return _eager_rotation(q, k, cos, sin, layout, rd, False, coordinates, axes,
                                   pending)
        return kernels.rotate_qk(q, k, cos, sin, layout, rd, False, coordinates, axes, pending)
    kernels.rotate_qk_out(q, k, cos, sin, layout, rd, out[0], out[1], coordinates, axes,
                          pending)
    return out[0], out[1]


def apply_rope_qk_to_cache(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
    key_cache: torch.Tensor, value_cache: torch.Tensor, cache_position: torch.Tensor, *,
    layout: Layout = "interleaved", positions: torch.Tensor | None = None,
    rotary_dim: int | None = None, short_table: Literal["raise", "repeat_last"] = "raise",
) -> torch.Tensor:
    """One decode step's RoPE and KV-cache write: q rotated, k rotated straight into its
    cache slots ``cache_position + 0 .. n - 1`` and v copied into the same slots.

    On a GPU in eager mode this is one launch of the Triton kernel: the rotated key never
    makes a round trip through memory, and ``cache_position`` and the positions are read on
    the device (their range asserted there), so the step can be captured in a CUDA graph.
    On the CPU the compiled loop rotates k straight into its slots and v is copied (one pass
    over each); compiled or traced, or under autograd, the rotation is followed by
    ``index_copy_`` into the caches.

    Args:
        q: ``(..., heads_q, n, head_dim)``.
        k, v: ``(..., heads_k, n, head_dim)``: q's shape but for the heads, q's dtype and
            device.
        cos, sin, layout, rotary_dim, short_table: as for ``apply_rope`` (gathered rows
            broadcast to q and k).
        key_cache, value_cache: ``(..., heads_k, capacity, head_dim)``, k's dtype and device.
        cache_position: the slot of the first new token, a 0-d integer tensor.
        positions: ``(n,)`` or ``(batch, n)``; default (2-D tables) the slots
            ``cache_position + 0 .. n - 1``.

    Returns:
        q rotated, a new tensor (laid out as ``apply_rope``'s); the caches are written in
        place.

    Raises:
        ValueError: before anything is written, for arguments of the wrong shape, dtype or
            device, caches of two capacities or sharing memory, and (where they are on the
            host) slots outside the capacity or positions outside the table.
    """
    slots_are_positions = positions is None and isinstance(cos, torch.Tensor) and cos.ndim == 2
    given = (cos, sin, cache_position if slots_are_positions else positions, None,
             cache_position)
    key, plan = _signature((q, k, v), (None, key_cache, value_cache), given,
                           (layout, rotary_dim, short_table))
    if plan is not None and plan.kernel is not None:
        return _run_plan(plan, (q, k, v), (None, key_cache, value_cache), given)[0]
    rd, _ = _check_arguments(q, cos, sin, layout, 0, rotary_dim, short_table)
    for name, t in (("k", k), ("v", v)):
        check_float_tensor(name, t)
        if (t.ndim != q.ndim or q.ndim < 3 or t.shape[:-3] != q.shape[:-3]
                or t.shape[-2:] != q.shape[-2:] or t.dtype != q.dtype or t.device != q.device):
            raise ValueError(f"{name} must have q's shape but for the heads dim (-3), q's dtype "
                             f"and device: q is {tuple(q.shape)} {q.dtype} on {q.device}, got "
                             f"{name} {tuple(t.shape)} {t.dtype} on {t.device}")
    if v.shape != k.shape:
        raise ValueError(f"v must have k's shape {tuple(k.shape)}, got {tuple(v.shape)}")
    for name, cache in (("key_cache", key_cache), ("value_cache", value_cache)):
        if not isinstance(cache, torch.Tensor) or cache.ndim != k.ndim or (
                cache.shape[:-2] != k.shape[:-2] or cache.shape[-1] != k.shape[-1]
                or cache.dtype != k.dtype or cache.device != k.device):
            seen = (f"{tuple(cache.shape)} {cache.dtype} on {cache.device}"
                    if isinstance(cache, torch.Tensor) else type(cache).__name__)
            raise ValueError(f"{name} must be (..., heads_k, capacity, head_dim) = "
                             f"{tuple(k.shape[:-2])} + (capacity, {k.shape[-1]}) in k's dtype "
                             f"{k.dtype} on {k.device}, got {seen}")
    if key_cache.shape[-2] != value_cache.shape[-2]:
        raise ValueError(f"key_cache and value_cache must have one capacity (dim -2): "
                         f"key_cache has {key_cache.shape[-2]} slots, value_cache "
                         f"{value_cache.shape[-2]}")
    _check_caches_apart(key_cache, value_cache)
    slot = check_int_tensor("cache_position", cache_position)
    if slot.numel() != 1:
        raise ValueError(f"cache_position must be a single slot (a 0-d integer tensor), got "
                         f"shape {tuple(slot.shape)}")
    slot = slot.reshape(())
    start = slot  # read here where it lives on the host, else checked on the device
    if not (tracing() or _on_device(slot)):
        start, n, capacity = int(slot), k.shape[-2], key_cache.shape[-2]
        if not 0 <= start <= capacity - n:
            raise ValueError(f"cache_position {start} and {n} new tokens must fit the KV "
                             f"cache's {capacity} slots: cache_position in [0, {capacity - n}]")
    offset = start if positions is None and cos.ndim == 2 else 0  # the slots are the positions
    cos, sin, coordinates, _, pending = _rows(q, cos, sin, positions, offset, rd, short_table,
                                              None, "dispatcher")
    if key is not None:
        plan = plans.make(key, [q, k, v], [None, key_cache, value_cache], cos, sin, layout, rd,
                          coordinates, None, pending, given, slot)
        if plan is not None and plan.kernel is not None:
            return _run_plan(plan, (q, k, v), (None, key_cache, value_cache), given)[0]
    return kernels.rotate_qk_cache(q, k, v, cos, sin, layout, rd, key_cache, value_cache, slot,
                                   coordinates, pending)


def _caller_tensors(cos: object, sin: object, positions: object, offset: object, axes: object
                    ) -> tuple:
    """(cos, sin, the coordinates, axes) as the caller gave them, for ``plans``: the
    coordinates are the positions, or a 0-d offset tensor (None for an int offset)."""
    return cos, sin, positions if positions is not None else (
        offset if isinstance(offset, torch.Tensor) else None), axes


def _signature(xs: tuple, outs: object, given: tuple, options: tuple,
               positions: object = None, offset: object = 0
               ) -> tuple[tuple | None, plans.Plan | None]:
    """``plans.signature`` (key, plan) of a call on the device route (``_on_device``) with
    x's ``xs``,
    their destinations ``outs`` (None: new), the caller's tensors ``given``
    (``_caller_tensors``, with a cache step's slot) and options, with whether every
    destination is its x (``plans.in_place``). (None, None) for a call that takes the full
    path: x
    not a plain tensor, on the host or recording autograd, ``outs`` not one per x, anybody
    watching the call (``watcher``), an offset with positions or an int offset
    other than 0 (its rows are a slice that depends on the value)."""
    if (type(xs[0]) is not torch.Tensor or not _on_device(xs[0])
            or (torch.is_grad_enabled() and xs[0].requires_grad)
            or not (type(outs) in (tuple, list) and len(outs) == len(xs))
            or watcher(*xs, *given, written=outs) is not None):
        return None, None
    if not ((type(offset) is int and offset == 0)
            or (isinstance(offset, torch.Tensor) and positions is None)):
        return None, None
    in_place = all(map(operator.is_, xs, outs))  # plans.in_place, without a call
    return plans.signature((*xs, *outs, *given), (*options, in_place))


def _run_plan(plan: plans.Plan, xs: tuple, outs: Sequence[torch.Tensor | None],
              given: tuple) -> list[torch.Tensor]:
    """A call on its ``plan``: what depends on addresses checked (destinations given that
    meet what the rotation reads or writes, two caches sharing memory: exactly, where their
    spans meet, ``plans.apart``), one launch, the given destinations' version counters
    bumped as by any in-place write. ``given``: ``_caller_tensors`` (and a cache step's
    slot). Returns the destinations."""
    cos, sin, coordinates, axes = given[:4]
    slot = given[4] if len(given) > 4 else None
    written = outs[1:] if slot is not None else outs if outs[0] is not None else ()
    if written:
        if not plans.apart(plan, plans.checked(xs, outs, cos, sin, plan.in_place)) or (
                written[0].is_inference() or written[-1].is_inference()):  # one or two
            if slot is not None:
                _check_caches_apart(outs[1], outs[2])
            else:
                kernels.check_out_memory(xs, outs, cos, sin, kernels.OUT_NAMES[len(xs)])
    done = plans.run(plan, xs, outs, cos, sin, coordinates, axes, slot)
    if written:
        torch.autograd.graph.increment_version(written)
    return done


def _check_caches_apart(key_cache: torch.Tensor, value_cache: torch.Tensor) -> None:
    if kernels.share_memory(key_cache, value_cache):
        raise ValueError("key_cache shares memory with value_cache: the step would write v "
                         "over k (or k over v) in the slots they share; pass two separate "
                         "caches")


def _rows(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
          positions: torch.Tensor | None, offset: int, rd: int, short_table: str,
          axes: object, watched: str | None
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None,
                     kernels.UncheckedRange | None]:
    """(cos, sin, coordinates, axes, pending) for the operator: the rows of x's positions (a
    view or a gather), or with ``axes`` the 2-D tables and the checked multi-axis coordinates,
    which the kernel reads the rows through. On a device in eager mode, positions and a 0-d
    offset tensor go on as coordinates whose range is still ``pending`` (checked where the
    rotation runs, in the Triton kernel's one launch: no operation of their own).
    ``watched``: ``watcher``'s answer (None: no compiler or tracer records the call)."""
    traced = watched is not None and tracing()
    if axes is None and positions is None and type(offset) is int and (
            cos.ndim == 2 or not offset):  # the rows of x's own positions
        if cos.ndim == 2:
            cos, sin = _select_rows(cos, sin, x, None, offset, short_table, traced)
        return cos, sin, None, None, None
    deferred = not traced and _on_device(x)
    if axes is not None:
        if cos.ndim != 2:
            raise ValueError(f"axes selects rows of 2-D tables (table_len, {rd // 2}); cos/sin "
                             f"given here are already gathered (shape {tuple(cos.shape)})")
        coordinates, axes = _check_axes(positions, axes, x, rd, offset, cos, short_table,
                                        deferred)
        return cos, sin, coordinates, axes, _pending(cos, short_table, deferred, False)
    if cos.ndim == 2:
        if positions is None and isinstance(offset, torch.Tensor):  # an offset on the device
            if deferred:
                return (cos, sin, offset.reshape((1,) * x.ndim), None,
                        _pending(cos, short_table, True, True))
            positions, offset = offset + torch.arange(x.shape[-2], device=offset.device), 0
        if positions is not None and deferred:
            return (cos, sin, _device_coordinates(positions, x, offset, cos), None,
                    _pending(cos, short_table, True, False))
        cos, sin = _select_rows(cos, sin, x, positions, offset, short_table, traced)
    elif positions is not None or _given(offset):
        raise ValueError("positions/offset select rows of a 2-D table; cos/sin given here "
                         f"are already gathered (shape {tuple(cos.shape)})")
    return cos, sin, None, None, None


def _on_device(x: torch.Tensor) -> bool:
    """Whether x's values live off the host, where reading one would wait for the device:
    then positions are not read but handed on (``_rows``)."""
    return x.device.type != "cpu"


def _pending(cos: torch.Tensor, short_table: str, deferred: bool, step: bool
             ) -> kernels.UncheckedRange | None:
    """What deferred coordinates leave to the rotation (``kernels.UncheckedRange``); None when
    they were checked here."""
    if not deferred:
        return None
    return kernels.UNCHECKED_RANGES[short_table == "repeat_last" and cos.shape[0] > 0, step]


def _check_arguments(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str,
                     offset: object, rotary_dim: int | None, short_table: str,
                     name: str = "x") -> tuple[int, int]:
    """Checks everything but ``out`` and ``positions`` (``name``: what the caller calls x);
    returns (rotary_dim, offset as int)."""
    if layout not in LAYOUTS:
        check_layout(layout)
    if short_table not in SHORT_TABLE_MODES:
        raise ValueError(f"short_table must be one of {SHORT_TABLE_MODES}, got {short_table!r}")
    for t_name, t in ((name, x), ("cos", cos), ("sin", sin)):
        if not isinstance(t, torch.Tensor) or t.dtype not in FLOAT_DTYPES:
            check_float_tensor(t_name, t)
    if x.ndim < 2:
        raise ValueError(f"{name} must have shape (..., seq, head_dim), got {tuple(x.shape)}")
    head_dim = int(x.shape[-1])  # a traced size under torch.jit.trace
    rd = head_dim if rotary_dim is None else as_int(rotary_dim)
    if rd is None or rd <= 0 or rd % 2 or rd > head_dim:
        what = f"head_dim ({name}.shape[-1])" if rotary_dim is None else "rotary_dim"
        raise ValueError(f"{what} must be a positive even number <= head_dim={head_dim}, "
                         f"got {head_dim if rotary_dim is None else rotary_dim!r}")
    if cos.shape != sin.shape:
        raise ValueError(f"cos and sin must have the same shape, got {tuple(cos.shape)} and "
                         f"{tuple(sin.shape)}")
    if cos.dtype != sin.dtype:
        raise ValueError(f"cos and sin must have the same dtype, got {cos.dtype} and "
                         f"{sin.dtype}; convert one, e.g. sin.to(cos.dtype)")
    if cos.ndim < 2 or cos.shape[-1] != rd // 2:
        hint = "" if cos.ndim < 2 else _table_width_hint(int(cos.shape[-1]), head_dim,
                                                         rotary_dim is None)
        raise ValueError(f"cos/sin must have shape (table_len, {rd // 2}) (rotary_dim // 2 = "
                         f"{rd} // 2), got {tuple(cos.shape)}{hint}")
    if sin.device != cos.device:
        raise ValueError(f"cos is on {cos.device} but sin is on {sin.device}; "
                         f"keep both tables on x's device ({x.device})")
    if cos.device != x.device:
        raise ValueError(f"cos/sin are on {cos.device} but {name} is on {x.device}; "
                         f"move them with cos.to({name}.device)")
    if cos.ndim > 2:
        expected = x.shape[:-1] + (rd // 2,)
        if cos.ndim != x.ndim or not broadcasts(cos.shape, expected):
            raise ValueError(f"gathered cos/sin must have {x.ndim} dims and broadcast to "
                             f"{tuple(expected)}, got {tuple(cos.shape)}; pass the 2-D table "
                             "with positions= instead")
    return rd, offset if type(offset) is int and offset >= 0 else check_offset(offset)


def check_offset(offset: object) -> int | torch.Tensor:
    """offset as an int: a Python or NumPy integer, or a 0-d integer tensor (not a bool); a
    0-d integer tensor on a GPU stays a tensor (reading it would wait for the device), and
    is checked there."""
    if type(offset) is int and offset >= 0:
        return offset
    if isinstance(offset, torch.Tensor) and _on_device(offset):
        if offset.ndim or offset.is_floating_point() or offset.is_complex() or (
                offset.dtype == torch.bool):
            raise ValueError(f"offset must be a non-negative int or a 0-d integer tensor, got "
                             f"a tensor of shape {tuple(offset.shape)} and dtype {offset.dtype}")
        return offset.long()  # its rows' range is checked where they are used (_rows)
    if isinstance(offset, torch.SymInt):  # a symbolic length under torch.compile / export
        torch._check(offset >= 0, lambda: "offset must be a non-negative int")
        return offset
    value = as_int(offset)
    if value is None or value < 0:
        raise ValueError(f"offset must be a non-negative int, got {offset!r}")
    return value


def _table_width_hint(width: int, head_dim: int, default_dim: bool) -> str:
    """What to do with tables ``width`` columns wide that do not fit: a partial rotation,
    or transformers' tables (``cat(freqs, freqs)``, as wide as the channels they rotate)."""
    hints = []
    if default_dim and 2 * width <= head_dim:
        hints.append(f"for a partial rotation pass rotary_dim={2 * width}")
    if width <= head_dim and width % 2 == 0:
        partial = f", rotary_dim={width}" if width < head_dim else ""
        hints.append(f"tables {width} wide may be transformers' (cat(freqs, freqs), as wide "
                     f"as the channels they rotate): pass cos[..., :{width // 2}] and "
                     f"sin[..., :{width // 2}] with layout='half'{partial}, or call "
                     "ropelib.hf.apply_rotary_pos_emb(q, k, cos, sin), which takes them as "
                     "they are")
    return "".join(f"; {hint}" for hint in hints)


def _check_out(out: object, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               name: str = "out", x_name: str = "x", inplace: bool = False) -> None:
    """``out`` (called ``name``; ``q_out``/``k_out`` of ``apply_rope_qk``, which are q and k
    themselves with ``inplace``) as a destination of x (``x_name``)."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(out).__name__}")
    dtensor = distributed.dtensor_class()
    if dtensor is not None and isinstance(out, dtensor) != isinstance(x, dtensor):
        kinds = ("a DTensor", "a plain torch.Tensor")
        seen, wanted = kinds if isinstance(out, dtensor) else kinds[::-1]
        raise TypeError(f"{name} is {seen} but {x_name} is {wanted}; pass {name} of "
                        f"{x_name}'s kind, e.g. torch.empty_like({x_name}) (a DTensor of "
                        f"{x_name}'s placements)")
    if out.shape != x.shape or out.dtype != x.dtype or out.device != x.device:
        raise ValueError(f"{name} must match {x_name}: shape {tuple(x.shape)}, dtype {x.dtype}, "
                         f"device {x.device}; got shape {tuple(out.shape)}, dtype {out.dtype}, "
                         f"device {out.device}")
    if torch.is_grad_enabled() and (x.requires_grad or cos.requires_grad or sin.requires_grad
                                    or out.requires_grad):
        if inplace:
            raise ValueError("apply_rope_qk(..., inplace=True) is not differentiable (the "
                             "rotation overwrites q and k); call it under torch.no_grad() or "
                             "drop inplace=True to get gradients")
        call = "apply_rope(..., out=...)" if name == "out" else "apply_rope_qk(..., out=...)"
        raise ValueError(f"{call} is not differentiable; call it under torch.no_grad() or "
                         "drop out= to get gradients")
    strides = out.stride()
    if 0 in strides and any(st == 0 and n > 1 for n, st in zip(out.shape, strides, strict=True)):
        raise ValueError(f"{name} has elements that share memory (stride 0 in a dim of size "
                         f"> 1, strides {strides}, e.g. from expand); pass a buffer made with "
                         f"torch.empty_like({x_name})")


def _select_rows(cos: torch.Tensor, sin: torch.Tensor, x: torch.Tensor,
                 positions: torch.Tensor | None, offset: int, short_table: str, traced: bool
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of the (table_len, d/2) tables for x's positions, shaped to broadcast against x:
    a slice (no copy) for ``offset .. offset + seq - 1``, else a gather. ``traced``: a
    compiler or tracer records the call."""
    seq_len, table_len = x.shape[-2], cos.shape[0]
    if positions is None:
        needed = offset + seq_len
        if not traced and not offset and needed == table_len:
            return cos, sin  # a graph keeps the slice: it runs again with other lengths
        if needed <= table_len:
            return cos[offset:needed], sin[offset:needed]
        if short_table == "raise" or table_len == 0:
            raise ValueError(
                f"cos has {table_len} rows but positions {offset}..{needed - 1} need "
                f"{needed} (seq_len={seq_len}, offset={offset}); generate a longer table, "
                f"e.g. generate_rope_embeddings({needed}, head_dim)")
        index = torch.arange(offset, needed, device=cos.device).clamp_max(table_len - 1)
        return cos[index], sin[index]
    index = _check_positions(positions, x, offset, table_len, short_table).to(cos.device)
    if short_table == "repeat_last":
        index = index.clamp_max(table_len - 1)
    if positions.ndim == 2:
        index = index.reshape(index.shape[:1] + (1,) * (x.ndim - 3) + index.shape[1:])
    return cos[index], sin[index]


def _check_axes(positions: torch.Tensor | None, axes: object, x: torch.Tensor, rd: int,
                offset: int, cos: torch.Tensor, short_table: str, deferred: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Multi-axis positions and the axis of each pair, checked, as int64 on the tables'
    device: positions shaped ``(1 or batch, 1, ..., seq, k)`` to broadcast against x's rows
    (clamped to the table for ``short_table="repeat_last"``), axes ``(rd // 2,)``.
    ``deferred``: the values of positions and axes are neither checked nor clamped here
    (``kernels.UncheckedRange``: the rotation does it), only their shapes."""
    axes = check_int_tensor("axes", axes)
    if axes.shape != (rd // 2,):
        raise ValueError(f"axes must have shape ({rd // 2},) (one axis per rotated pair, "
                         f"rotary_dim // 2), got {tuple(axes.shape)}")
    seq_len, table_len = x.shape[-2], cos.shape[0]
    if positions is None:
        raise ValueError(f"axes needs multi-axis positions of shape ({seq_len}, k) or (batch, "
                         f"{seq_len}, k)")
    positions = check_int_tensor("positions", positions)
    batched = positions.ndim == 3 and x.ndim >= 3 and positions.shape[0] in (1, x.shape[0])
    if not (positions.ndim == 2 or batched) or positions.shape[-2] != seq_len or (
            positions.shape[-1] < 1):
        raise ValueError(f"positions with axes must have shape (seq_len, k) = ({seq_len}, k) "
                         f"or (batch, seq_len, k) = "
                         f"({x.shape[0] if x.ndim >= 3 else 'batch'}, {seq_len}, k), got "
                         f"{tuple(positions.shape)}")
    if _given(offset):
        raise ValueError(f"pass either positions or offset, not both (offset={offset}); "
                         "add the offset to positions instead")
    k = positions.shape[-1]
    if tracing() or (_on_device(positions) and not deferred):  # no data-dependent branch
        torch._assert_async(((axes >= 0) & (axes < k)).all(), "axes must be in [0, k)")
        positions = traced_nonnegative(positions)
        if short_table == "raise":
            torch._assert_async((positions < table_len).all(),
                                "positions must be < the cos/sin table length")
    elif not deferred:
        bounds = [*torch.aminmax(axes)]
        if positions.numel():
            bounds += [t.to(axes.device) for t in torch.aminmax(positions)]
        bounds = torch.stack(bounds).tolist()  # one read of the device, not four
        low, high = bounds[:2]
        if low < 0 or high >= k:
            raise ValueError(f"axes must be in [0, {k}) (k = positions.shape[-1] coordinates), "
                             f"got values in [{low}, {high}]")
        if positions.numel():
            low, high = bounds[2:]
            if low < 0:
                raise ValueError(f"positions must be >= 0, got min {low}")
            if high >= table_len and (short_table == "raise" or not table_len):
                raise ValueError(f"positions go up to {high} but the cos/sin table has only "
                                 f"{table_len} rows (positions 0..{table_len - 1}); generate "
                                 f"a longer table, e.g. RotaryEmbedding.tables({high + 1})")
    if short_table == "repeat_last" and not deferred:
        positions = positions.clamp_max(table_len - 1)
    lead = (1,) * (x.ndim - positions.ndim) if positions.ndim == 2 else (
        positions.shape[:1] + (1,) * (x.ndim - 3))
    positions = positions.reshape(lead + positions.shape[-2:])
    return positions.to(cos.device), axes.to(cos.device)


def _given(offset: int | torch.Tensor) -> bool:
    """Whether an offset was given (a tensor always counts: its value lives on a device)."""
    return isinstance(offset, torch.Tensor) or offset != 0


def _device_coordinates(positions: torch.Tensor, x: torch.Tensor, offset: int,
                        cos: torch.Tensor) -> torch.Tensor:
    """Positions ``(seq,)`` or ``(batch, seq)`` of x on a GPU as the operator's coordinates
    ``(1 or batch, 1, ..., seq, 1)``, which the kernel reads the table rows through (no
    gather, nothing read back to the host, their range still pending: ``_rows``)."""
    positions = _check_positions(positions, x, offset, cos.shape[0], "raise", deferred=True)
    if positions.device != cos.device:
        positions = positions.to(cos.device)
    lead = (1,) * (x.ndim - 2) if positions.ndim == 1 else (
        positions.shape[:1] + (1,) * (x.ndim - 3))
    return positions.reshape(lead + positions.shape[-1:] + (1,))


def _check_positions(positions: torch.Tensor, x: torch.Tensor, offset: int, table_len: int,
                     short_table: str, deferred: bool = False) -> torch.Tensor:
    """positions as int64 (uint8 would index as a mask), after checking them: on the host
    when they are there, else with assertions on their device (no wait for it), or with
    ``deferred`` (eager, on a device) only their shape (the rotation checks the values)."""
    positions = check_int_tensor("positions", positions)
    seq_len = x.shape[-2]
    ok_shape = positions.ndim == 1 or (positions.ndim == 2 and x.ndim >= 3
                                       and positions.shape[0] in (1, x.shape[0]))
    if not ok_shape or positions.shape[-1] != seq_len:
        raise ValueError(
            f"positions must have shape (seq_len,) = ({seq_len},) or (batch, seq_len) = "
            f"({x.shape[0] if x.ndim >= 3 else 'batch'}, {seq_len}), got {tuple(positions.shape)}")
    if _given(offset):
        raise ValueError(f"pass either positions or offset, not both (offset={offset}); "
                         "add the offset to positions instead")
    if deferred:
        return positions
    if tracing() or _on_device(positions):  # no data-dependent branch, no wait
        if torch.jit.is_tracing():  # its graph drops _assert_async: an operator checks
            positions = traced_nonnegative(positions)
        within = positions >= 0
        if short_table == "raise":
            within &= positions < table_len
        torch._assert_async(within.all(), "positions must be >= 0 and < the cos/sin table "
                            "length (rows 0 .. table_len - 1)")
        return positions
    if positions.numel() == 0:
        return positions
    low, high = torch.stack(torch.aminmax(positions)).tolist()  # one read of the device
    if low < 0:
        raise ValueError(f"positions must be >= 0, got min {low}")
    if high >= table_len and short_table == "raise":
        raise ValueError(f"positions go up to {high} but the cos/sin table has only {table_len} "
                         f"rows (positions 0..{table_len - 1}); generate a longer table, "
                         f"e.g. generate_rope_embeddings({high + 1}, head_dim)")
    return positions


def _setup_backward(ctx, inputs: tuple, output: torch.Tensor) -> None:
    """Saves what the backward of ``ropelib::rotate`` needs: cos and sin, and x only when the
    grads of cos or sin need it, so the rotation adds no activation memory in the usual
    training step. ``inputs``: the operator's."""
    x, cos, sin, layout, rotary_dim, inverse, positions, axes = inputs[:8]
    tables_need_grad = ctx.needs_input_grad[1] or ctx.needs_input_grad[2]
    ctx.save_for_backward(x if tables_need_grad else None, cos, sin, positions, axes)
    ctx.layout, ctx.rotary_dim, ctx.inverse = layout, rotary_dim, inverse


def _backward(ctx, grad: torch.Tensor) -> tuple:
    """y = R_Theta x, so dL/dx = R_Theta^T g = R_{-Theta} g: the same operator, inverted
    (differentiable again, for double backward; the kernel reads sin as -sin, so no negated
    table is made); the grads of cos and sin from ``_table_grads``."""
    x, cos, sin, positions, axes = ctx.saved_tensors
    layout, rd, inverse = ctx.layout, ctx.rotary_dim, ctx.inverse
    grad_x = grad_cos = grad_sin = None
    if ctx.needs_input_grad[0]:
        grad_x = kernels.rotate(_channels_contiguous(grad), cos, sin, layout, rd, not inverse,
                                positions, axes)
    if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
        grad_cos, grad_sin = _table_grads(ctx, x, grad, cos, sin, positions, axes)
    return grad_x, grad_cos, grad_sin, None, None, None, None, None


def _channels_contiguous(grad: torch.Tensor) -> torch.Tensor:
    """A gradient with its channels at stride 1, as the kernels read them (the grad of a sum
    arrives expanded, with stride 0 everywhere)."""
    return grad if grad.stride(-1) == 1 else grad.contiguous()


def _table_grads(ctx, x: torch.Tensor, grad: torch.Tensor, cos: torch.Tensor,
                 sin: torch.Tensor, positions: torch.Tensor | None,
                 axes: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The grads of cos and sin from the pairs of x and g, summed over the dims the rows
    broadcast over (and, with positions, into the table rows they came from)."""
    layout, rd, inverse = ctx.layout, ctx.rotary_dim, ctx.inverse
    a, b = eager.pairs(x[..., :rd], layout)
    ga, gb = eager.pairs(grad[..., :rd], layout)
    grad_cos = ga * a + gb * b
    grad_sin = (ga * b - gb * a) if inverse else (gb * a - ga * b)
    if positions is None:
        return grad_cos.sum_to_size(cos.shape), grad_sin.sum_to_size(sin.shape)
    index = positions.index_select(-1, axes) if axes is not None else positions.expand(
        *positions.shape[:-1], rd // 2)
    flat = index.reshape(-1, index.shape[-1])
    return tuple(
        torch.zeros_like(table).scatter_add_(
            0, flat, g.sum_to_size(index.shape).reshape(flat.shape).to(table.dtype))
        for table, g in ((cos, grad_cos), (sin, grad_sin)))


def _setup_qk_backward(ctx, inputs: tuple, output: tuple | torch.Tensor) -> None:
    """``_setup_backward`` for ``ropelib::rotate_qk``, and for ``_EagerRotation`` (whose k
    is None for one tensor): q and k are saved only when the grads of the tables need them;
    with constant tables, the rotation of a q or k that records no autograd records none
    either (as ``apply_rope`` of it alone)."""
    q, k, cos, sin, layout, rotary_dim, inverse, positions, axes = inputs[:9]
    tables_need_grad = ctx.needs_input_grad[2] or ctx.needs_input_grad[3]
    ctx.save_for_backward(q if tables_need_grad else None, k if tables_need_grad else None,
                          cos, sin, positions, axes)
    if not tables_need_grad and k is not None:  # an output whose input records nothing
        ctx.mark_non_differentiable(*(rotated for rotated, needs in zip(
            output, ctx.needs_input_grad[:2], strict=True) if not needs))
    ctx.layout, ctx.rotary_dim, ctx.inverse = layout, rotary_dim, inverse
    ctx.pending = inputs[9] if len(inputs) > 9 else None


def _qk_backward(ctx, grad_q: torch.Tensor, grad_k: torch.Tensor | None = None) -> tuple:
    """``_backward`` of q and k together: one inverted ``rotate_qk`` for both grads (one
    inverted ``rotate`` when ``_EagerRotation`` rotated q alone: no ``grad_k``; its tables
    are constants), and the table grads of q's and k's pairs summed."""
    q, k, cos, sin, positions, axes = ctx.saved_tensors
    layout, rd, inverse = ctx.layout, ctx.rotary_dim, ctx.inverse
    grads = [None] * 9
    if grad_k is None:
        if ctx.needs_input_grad[0]:
            grads[0] = kernels.rotate(_channels_contiguous(grad_q), cos, sin, layout, rd,
                                      not inverse, positions, axes, ctx.pending)
    elif ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
        grads[0], grads[1] = kernels.rotate_qk(
            _channels_contiguous(grad_q), _channels_contiguous(grad_k), cos, sin, layout, rd,
            not inverse, positions, axes, ctx.pending)
    if ctx.needs_input_grad[2] or ctx.needs_input_grad[3]:
        from_q = _table_grads(ctx, q, grad_q, cos, sin, positions, axes)
        from_k = _table_grads(ctx, k, grad_k, cos, sin, positions, axes)
        grads[2], grads[3] = from_q[0] + from_k[0], from_q[1] + from_k[1]
    return tuple(grads)


torch.library.register_autograd("ropelib::rotate_qk", _qk_backward,
                                setup_context=_setup_qk_backward)


torch.library.register_autograd("ropelib::rotate", _backward, setup_context=_setup_backward)


def _eager_training_step(cos: torch.Tensor, sin: torch.Tensor, x: torch.Tensor,
                         k: torch.Tensor | None = None) -> bool:
    """The usual training step of a call nobody watches (``watcher``): x (or q or k)
    records autograd and the tables are constants."""
    return (torch.is_grad_enabled() and (x.requires_grad or k is not None and k.requires_grad)
            and not (cos.requires_grad or sin.requires_grad))


class _EagerRotation(torch.autograd.Function):
    """``ropelib::rotate_qk`` with its registered formula (``_setup_qk_backward``,
    ``_qk_backward``) as one autograd node that runs the implementation directly, without
    the operator's dispatcher and generated autograd layers (about 100 us per
    forward+backward at small shapes, more than the rotation): a query and a key rotated in
    one launch each way, or, with k None, one tensor (``ropelib::rotate``). Only for eager
    calls (``_eager_training_step``): compiled, exported and traced code sees the operator
    itself. Its coordinates may still be ``pending`` (``kernels.UncheckedRange``): on a GPU, the
    kernel's launch each way checks them (no operation of their own, as in a call without
    autograd)."""

    @staticmethod
    def forward(q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                layout: str, rotary_dim: int, inverse: bool, positions: torch.Tensor | None,
                axes: torch.Tensor | None, pending: kernels.UncheckedRange | None
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if k is None:
            return kernels.run_backend([q], [None], cos, sin, layout, rotary_dim, inverse,
                                       positions, axes, pending)[0]
        q_out, k_out = kernels.run_backend([q, k], [None, None], cos, sin, layout, rotary_dim,
                                           inverse, positions, axes, pending)
        return q_out, k_out

    setup_context = staticmethod(_setup_qk_backward)

    @staticmethod
    def backward(ctx, grad_q: torch.Tensor, grad_k: torch.Tensor | None = None) -> tuple:
        return *_qk_backward(ctx, grad_q, grad_k), None


# The node's ``apply`` without the Python layer of ``Function.apply``: that layer binds
# default arguments with ``inspect.signature`` on every call (about 30 us, as much as the
# rotation of a (1, 8, 512, 64) float32 tensor), unwraps torch.func wrappers left over
# from a finished transform and hands calls under a transform to ``custom_function_call``.
# None of it applies to an eager training step (``_eager_training_step``): every argument
# is given, no transform is active and no tensor is a wrapper.
_eager_rotation = super(torch.autograd.Function, _EagerRotation).apply
