"""apply_rope, apply_rope_qk, apply_rope_qk_to_cache: the public functions of the rotation.

For position m and pair i with channels (a, b): a' = a cos(m theta_i) - b sin(m theta_i),
b' = a sin(m theta_i) + b cos(m theta_i), the block-diagonal R_{Theta,m} of RoFormer eq. (15).
``"interleaved"`` pairs channels (2i, 2i+1) (RoFormer, GPT-J, Meta's Llama), ``"half"``
(i, i + d/2) (GPT-NeoX, Hugging Face Llama).

The top layer: rotation (here) -> distributed -> kernels -> native | triton_rope | eager ->
_checks. ``_rotate`` checks a call, selects its rows (``_rows``) and takes the route
``watcher`` answers. On a device a call's signature keys a ``Plan`` in ``_plans``: the first
call checks everything and keeps the launch; a later one checks only its addresses.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Sequence
from types import ModuleType
from typing import Literal, NamedTuple

import torch

from . import distributed, eager, kernels
from ._checks import (
    FLOAT_DTYPES,
    LAYOUTS,
    as_int,
    broadcasts,
    check_float_tensor,
    check_int_tensor,
    check_layout,
    new_output,
    traced_nonnegative,
    tracing,
    watcher,
)

Layout = Literal["interleaved", "half"]
SHORT_TABLE_MODES = ("raise", "repeat_last")
MAX_PLANS = 512  # signatures kept; the dict is emptied when full (a plan is cheap to remake)
_OPTION_TYPES = (str, int, bool, type(None))
Tensor = torch.Tensor


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
            e.g. left-padded batches); default ``offset .. offset + seq - 1``. With ``axes``:
            multi-axis coordinates ``(seq, k)`` or ``(batch, seq, k)``.
        offset: first position without ``positions`` (KV-cache decoding): an int, a NumPy
            integer or a 0-d integer tensor (on a GPU not read back, so the step can be
            captured in a CUDA graph). Positions and offsets are checked on the device on a
            GPU (a device-side assert at the next synchronization), else before anything
            runs (a ValueError).
        rotary_dim: rotate only the first ``rotary_dim`` channels (even, <= head_dim), pass
            the rest through, as GPT-NeoX and GPT-J do. Default: head_dim.
        short_table: ``"raise"`` (default): a table shorter than the positions is an error;
            ``"repeat_last"`` reuses its last row past its end (the behaviour of the module
            ropelib grew from; it silently destroys relative positions there).
        out: destination with x's shape, dtype and device (a buffer, or ``x`` itself: in
            place); it may not share memory with cos or sin, nor elements with x unless it
            is x (checked where the tensors have addresses: not inside a ``torch.compile`` or
            ``torch.export`` graph, which copies the rotation into ``out``, as PyTorch's own
            ``out=`` operations are not checked there). Not differentiable: use it under
            ``torch.no_grad()`` or without grads.
        axes: multi-axis RoPE (M-RoPE, Qwen2-VL; Wang et al. 2024): integer ``(rotary_dim //
            2,)``, the coordinate each pair turns with (``RotaryEmbedding.pair_axes``,
            ``ropelib.multiaxis.axis_of_pairs``): pair i of a token at coordinates p reads
            row ``p[axes[i]]`` of the 2-D tables.

    Returns:
        A new tensor with x's shape and dtype, or ``out``: on a GPU in x's memory layout
        where x is dense with contiguous channels (a ``(batch, seq, heads, dim)`` view stays
        one, as with PyTorch's elementwise operations), on the CPU contiguous.
    """
    return _rotate((x,), (out,), cos, sin, layout, positions, offset, rotary_dim, short_table,
                   axes)[0]


def apply_rope_qk(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *,
    layout: Layout = "interleaved", positions: torch.Tensor | None = None, offset: int = 0,
    rotary_dim: int | None = None, short_table: Literal["raise", "repeat_last"] = "raise",
    out: tuple[torch.Tensor, torch.Tensor] | None = None, inplace: bool = False,
    axes: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(apply_rope(q, ...), apply_rope(k, ...))`` at the same positions, in one kernel
    launch on a GPU (the table rows read once for both).

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
    if inplace and out is not None:
        raise ValueError("pass either out=(q_out, k_out) or inplace=True, not both")
    if out is not None and not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise TypeError(f"out must be a pair (q_out, k_out), got {type(out).__name__}")
    outs = (q, k) if inplace else (None, None) if out is None else tuple(out)
    q_rot, k_rot = _rotate((q, k), outs, cos, sin, layout, positions, offset, rotary_dim,
                           short_table, axes, inplace)
    return q_rot, k_rot


def apply_rope_qk_to_cache(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
    key_cache: torch.Tensor, value_cache: torch.Tensor, cache_position: torch.Tensor, *,
    layout: Layout = "interleaved", positions: torch.Tensor | None = None,
    rotary_dim: int | None = None, short_table: Literal["raise", "repeat_last"] = "raise",
) -> torch.Tensor:
    """One decode step's RoPE and KV-cache write: q rotated, k rotated straight into its
    cache slots ``cache_position + 0 .. n - 1`` and v copied into the same slots: one
    Triton launch on a GPU in eager mode (slot and positions read and range-checked on the
    device: the step can be captured in a CUDA graph), the compiled loop into the slots on
    the CPU, the rotation then ``index_copy_`` when compiled, traced or under autograd.

    Args:
        q: ``(..., heads_q, n, head_dim)``.
        k, v: ``(..., heads_k, n, head_dim)``: q's shape but for the heads, q's dtype and
            device.
        cos, sin, layout, rotary_dim, short_table: as for ``apply_rope`` (gathered rows
            broadcast to q and k).
        key_cache, value_cache: ``(..., heads_k, capacity, head_dim)``, k's dtype and device.
        cache_position: the slot of the first new token, a 0-d integer tensor.
        positions: ``(n,)`` or ``(batch, n)``; default (2-D tables) the slots.

    Returns:
        q rotated, a new tensor (laid out as ``apply_rope``'s); the caches written in place.

    Raises:
        ValueError: before anything is written: arguments of the wrong shape, dtype or
            device, caches of two capacities or sharing memory, and (where on the host)
            slots outside the capacity or positions outside the table.
    """
    xs, outs = (q, k, v), (None, key_cache, value_cache)
    slots_are_positions = positions is None and isinstance(cos, torch.Tensor) and cos.ndim == 2
    given = (cos, sin, cache_position if slots_are_positions else positions, None,
             cache_position)
    key = plan = None
    if type(q) is torch.Tensor and _on_device(q):
        key, plan = _signature(xs, outs, given, (layout, rotary_dim, short_table))
        if plan is not None and plan.kernel is not None:
            return _run_plan(plan, xs, outs, given)[0]
    rd, _ = _check_arguments(q, cos, sin, layout, 0, rotary_dim, short_table)
    for name, t in (("k", k), ("v", v)):
        _check_like_q(name, t, q)
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
    if key is not None and plan is None:
        plan = _make_plan(key, xs, outs, cos, sin, layout, rd, coordinates, None, pending,
                          given, slot)
        if plan is not None and plan.kernel is not None:
            return _run_plan(plan, xs, outs, given)[0]
    return kernels.rotate_qk_cache(q, k, v, cos, sin, layout, rd, key_cache, value_cache, slot,
                                   coordinates, pending)


def _rotate(xs: tuple, outs: tuple, cos: torch.Tensor, sin: torch.Tensor, layout: str,
            positions: torch.Tensor | None, offset: object, rotary_dim: int | None,
            short_table: str, axes: torch.Tensor | None, inplace: bool = False
            ) -> Sequence[torch.Tensor]:
    """The one path of ``apply_rope`` (xs ``(x,)``) and ``apply_rope_qk`` (``(q, k)``), outs
    one per x (None: new). Returns the rotated tensors."""
    x = xs[0]
    given = (cos, sin, positions if positions is not None else (
        offset if isinstance(offset, torch.Tensor) else None), axes)
    key = plan = None
    if type(x) is torch.Tensor and _on_device(x):
        key, plan = _signature(xs, outs, given, (layout, rotary_dim, short_table), positions,
                               offset)
        if plan is not None and plan.kernel is not None:
            return _run_plan(plan, xs, outs, given)
    watched = watcher(*xs, cos, sin, positions, offset, axes, written=outs)
    if watched == "dispatcher" and not all(type(t) is torch.Tensor for t in (*xs, cos, sin)):
        cos, sin, positions, axes = distributed.plain_arguments(xs, cos, sin, positions, axes)
    rd, offset = _check_arguments(x, cos, sin, layout, offset, rotary_dim, short_table,
                                  "x" if len(xs) == 1 else "q")
    if len(xs) == 2:
        k = xs[1]
        _check_like_q("k", k, x)
        if cos.ndim > 2 and cos.shape[-3] not in (1, k.shape[-3]):
            raise ValueError(f"gathered cos/sin {tuple(cos.shape)} have a heads dim of "
                             f"{cos.shape[-3]}, which k's {k.shape[-3]} heads cannot share; "
                             "pass rows broadcast over the heads (size 1 there)")
    if outs[0] is not None:
        for (name, x_name), t, out in zip(kernels.OUT_NAMES[len(xs)], xs, outs, strict=True):
            _check_out(out, t, cos, sin, name, x_name, inplace)
    cos, sin, coordinates, axes, pending = _rows(x, cos, sin, positions, offset, rd,
                                                 short_table, axes, watched)
    if key is not None and plan is None:
        plan = _make_plan(key, xs, outs, cos, sin, layout, rd, coordinates, axes, pending,
                          given)
        if plan is not None and plan.kernel is not None:
            return _run_plan(plan, xs, outs, given)
    if type(x) is not torch.Tensor:  # a DTensor x gets the rows as replicated DTensors
        coordinates, pending = kernels.resolve_pending(x, cos, coordinates, axes, pending), None
        cos, sin, coordinates, axes = distributed.replicated_arguments(x, cos, sin, coordinates,
                                                                       axes)
    if watched == "transform":
        coordinates = kernels.resolve_pending(x, cos, coordinates, axes, pending)
        rotated = [eager.rotate_composite(t, cos, sin, layout, rd, coordinates, axes)
                   for t in xs]
        return rotated if outs[0] is None else [
            o.copy_(r) for o, r in zip(outs, rotated, strict=True)]
    if outs[0] is None and watched is None and torch.is_grad_enabled() and (
            x.requires_grad or xs[-1].requires_grad or cos.requires_grad or sin.requires_grad):
        if not (cos.requires_grad or sin.requires_grad):  # an eager training step
            rotated = kernels.eager_rotation(x, xs[1] if len(xs) == 2 else None, cos, sin,
                                             layout, rd, False, coordinates, axes, pending)
            return (rotated,) if len(xs) == 1 else rotated
    elif outs[0] is None and watched is None:
        return kernels.run_backend(xs, outs, cos, sin, layout, rd, False, coordinates, axes,
                                   pending)
    return kernels.rotate_each(xs, outs, cos, sin, layout, rd, False, coordinates, axes,
                               pending)


class Plan(NamedTuple):
    """A signature's backend with a ``prepare`` and its ``launch`` (kernel None: the full
    path); ``extents``: the bytes each tensor of ``_kept_apart`` spans; ``in_place``."""

    kernel: ModuleType | None
    launch: object = None
    extents: tuple[int, ...] = ()
    in_place: bool = False


_plans: dict[tuple, Plan] = {}


def _signature(xs: tuple, outs: tuple, given: tuple, options: tuple, positions: object = None,
               offset: object = 0) -> tuple[tuple | None, Plan | None]:
    """(key, its plan or None) of a device call (``given``: cos, sin, coordinates, axes,
    slot); (None, None) where no plan serves: watched, autograd, an int offset but 0."""
    grad = torch.is_grad_enabled()
    if ((grad and xs[0].requires_grad) or watcher(*xs, *given, written=outs) is not None
            or not ((type(offset) is int and offset == 0)
                    or (isinstance(offset, torch.Tensor) and positions is None))):
        return None, None
    for option in options:
        if type(option) not in _OPTION_TYPES:
            return None, None
    key = [os.environ.get("ROPELIB_BACKEND"), *options, all(map(operator.is_, xs, outs))]
    for t in (*xs, *outs, *given):  # one pass: each tensor checked and keyed
        if t is None:
            key.append(None)
        elif type(t) is torch.Tensor and not (grad and t.requires_grad):
            key.append((t.shape, t.stride(), t.dtype, t.device, t.is_neg()))
        else:
            return None, None
    key = tuple(key)
    return key, _plans.get(key)


def _make_plan(key: tuple, xs: tuple, outs: tuple, cos: Tensor, sin: Tensor, layout: str,
               rd: int, coordinates: Tensor | None, axes: Tensor | None,
               pending: kernels.UncheckedRange | None, given: tuple,
               slot: Tensor | None = None) -> Plan | None:
    """The plan of a checked call, kept under ``key`` (a launch where every operand is the
    caller's tensor, ``given``); None when the backend refuses the call."""
    try:
        backend, assessed = kernels.choose_backend(xs, outs, cos, sin, rd, coordinates)
    except ValueError:
        return None
    operands = (cos, sin, coordinates, axes) + (() if slot is None else (slot,))
    own = all(a is None if b is None else (a is not None and a.data_ptr() == b.data_ptr())
              for a, b in zip(operands, given, strict=True))
    plan = Plan(None)
    if backend.prepare is not None and own:
        same = all(map(operator.is_, xs, outs))
        spans = map(kernels.byte_span, _kept_apart(xs, outs, cos, sin, same))
        plan = Plan(backend, backend.prepare(assessed, xs, outs, layout, rd, False, axes,
                                             pending, slot is not None, same),
                    tuple(end - start for start, end in spans), same)
    if len(_plans) >= MAX_PLANS:
        _plans.clear()
    _plans[key] = plan
    return plan


def _run_plan(plan: Plan, xs: tuple, outs: tuple, given: tuple) -> list[Tensor]:
    """A planned call: its addresses checked (exactly where the spans of ``_kept_apart``
    meet), one launch, the destinations' versions bumped. Returns the outputs."""
    cos, sin, coordinates, axes = given[:4]
    slot = given[4] if len(given) > 4 else None
    written = outs[1:] if slot is not None else outs if outs[0] is not None else ()
    if written:
        if not _apart(plan, _kept_apart(xs, outs, cos, sin, plan.in_place)) or (
                written[0].is_inference() or written[-1].is_inference()):
            if slot is not None:
                _check_caches_apart(outs[1], outs[2])
            else:
                kernels.check_out_memory(xs, outs, cos, sin, kernels.OUT_NAMES[len(xs)])
    done = [new_output(x) if o is None else o for x, o in zip(xs, outs, strict=True)]
    plan.kernel.launch(plan.launch, xs, done, cos, sin, coordinates, axes, slot)
    if written:
        torch.autograd.graph.increment_version(written)
    return done


def _kept_apart(xs: tuple, outs: tuple, cos: Tensor, sin: Tensor,
                in_place: bool) -> tuple[Tensor, ...]:
    """The tensors a call must keep apart: x's, tables and destinations given (none in place,
    nothing for new ones); a cache step's two caches."""
    if outs[0] is None:
        return tuple(o for o in outs if o is not None)
    return (*xs, cos, sin) if in_place else (*xs, *outs, cos, sin)


def _apart(plan: Plan, tensors: Sequence[Tensor]) -> bool:
    """Whether ``tensors``, each spanning ``plan.extents`` bytes from its address, meet
    nowhere; where two meet, the exact checks decide."""
    last = 0
    for start, extent in sorted(zip(map(Tensor.data_ptr, tensors), plan.extents, strict=True)):
        if start < last:
            return False
        last = start + extent
    return True


def _check_like_q(name: str, t: object, q: torch.Tensor) -> None:
    """k (or v) of q's shape but for the heads dim (-3), q's dtype and device."""
    check_float_tensor(name, t)
    if (t.ndim != q.ndim or q.ndim < 3 or t.shape[:-3] != q.shape[:-3]
            or t.shape[-2:] != q.shape[-2:] or t.dtype != q.dtype or t.device != q.device):
        raise ValueError(f"{name} must have q's shape but for the heads dim (-3), q's dtype "
                         f"and device: q is {tuple(q.shape)} {q.dtype} on {q.device}, got "
                         f"{name} {tuple(t.shape)} {t.dtype} on {t.device}")


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
    """(cos, sin, coordinates, axes, pending): rows that broadcast against x, or 2-D tables
    with coordinates ``(1 or batch, 1, ..., seq, k)`` (their range ``pending`` on a device)."""
    if cos.ndim != 2:  # rows already gathered
        if axes is not None:
            raise ValueError(f"axes selects rows of 2-D tables (table_len, {rd // 2}); cos/sin "
                             f"given here are already gathered (shape {tuple(cos.shape)})")
        if positions is not None or _given(offset):
            raise ValueError("positions/offset select rows of a 2-D table; cos/sin given here "
                             f"are already gathered (shape {tuple(cos.shape)})")
        return cos, sin, None, None, None
    traced = watched is not None and tracing()
    seq, table_len = x.shape[-2], cos.shape[0]
    if axes is None and positions is None and not isinstance(offset, torch.Tensor):
        needed = offset + seq  # x's own rows: a slice
        if not traced and not offset and needed == table_len:
            return cos, sin, None, None, None  # a graph keeps the slice (other lengths)
        if needed <= table_len:
            return cos[offset:needed], sin[offset:needed], None, None, None
        if short_table == "raise" or table_len == 0:
            raise ValueError(
                f"cos has {table_len} rows but positions {offset}..{needed - 1} need "
                f"{needed} (seq_len={seq}, offset={offset}); generate a longer table, "
                f"e.g. generate_rope_embeddings({needed}, head_dim)")
        index = torch.arange(offset, needed, device=cos.device).clamp_max(table_len - 1)
        return cos[index], sin[index], None, None, None
    deferred = not traced and _on_device(x)
    clamp = short_table == "repeat_last" and table_len > 0
    if positions is None and axes is None:  # a 0-d offset tensor
        if deferred:
            return (cos, sin, offset.reshape((1,) * x.ndim), None,
                    kernels.UNCHECKED_RANGES[clamp, True])
        positions, offset = offset + torch.arange(seq, device=offset.device), 0
    positions, axes = _check_positions(positions, x, offset, cos, short_table, deferred,
                                       axes, rd)
    dims = 1 + (axes is not None)
    lead = (1,) * (x.ndim - 2) if positions.ndim == dims else (
        positions.shape[:1] + (1,) * (x.ndim - 3))
    if axes is not None or deferred:
        coordinates = positions if axes is not None else positions[..., None]
        return (cos, sin, coordinates.reshape(lead + coordinates.shape[-2:]).to(cos.device),
                None if axes is None else axes.to(cos.device),
                kernels.UNCHECKED_RANGES[clamp, False] if deferred else None)
    index = positions.reshape(lead + positions.shape[-1:]).to(cos.device)
    return cos[index], sin[index], None, None, None


def _on_device(x: torch.Tensor) -> bool:
    """Whether x's values live off the host (reading one would wait for the device)."""
    return x.device.type != "cpu"


def _given(offset: int | torch.Tensor) -> bool:
    """Whether an offset was given (a tensor always counts)."""
    return isinstance(offset, torch.Tensor) or offset != 0


def _check_positions(positions: torch.Tensor | None, x: torch.Tensor, offset: object,
                     cos: torch.Tensor, short_table: str, deferred: bool,
                     axes: object, rd: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(positions, axes) as int64, checked on the host, asserted on a device, or (``deferred``)
    only their shapes; clamped to the table for ``repeat_last``."""
    seq, batch, table_len = x.shape[-2], x.shape[0] if x.ndim >= 3 else "batch", cos.shape[0]
    multi = axes is not None
    if multi:
        axes = check_int_tensor("axes", axes)
        if axes.shape != (rd // 2,):
            raise ValueError(f"axes must have shape ({rd // 2},) (one axis per rotated pair, "
                             f"rotary_dim // 2), got {tuple(axes.shape)}")
        if positions is None:
            raise ValueError(f"axes needs multi-axis positions of shape ({seq}, k) or (batch, "
                             f"{seq}, k)")
    positions = check_int_tensor("positions", positions)
    dims = 1 + multi
    if not (positions.ndim == dims or positions.ndim == dims + 1 and x.ndim >= 3
            and positions.shape[0] in (1, x.shape[0])) or positions.shape[-dims] != seq or (
            multi and positions.shape[-1] < 1):
        one, two = (", k", ", k") if multi else (",", "")
        raise ValueError(f"positions{' with axes' if multi else ''} must have shape (seq_len"
                         f"{one}) = ({seq}{one}) or (batch, seq_len{two}) = ({batch}, {seq}"
                         f"{two}), got {tuple(positions.shape)}")
    if _given(offset):
        raise ValueError(f"pass either positions or offset, not both (offset={offset}); "
                         "add the offset to positions instead")
    if deferred:
        return positions, axes
    k, clamp = positions.shape[-1], short_table == "repeat_last" and table_len > 0
    if tracing() or _on_device(positions):  # no data-dependent branch, no wait: asserted
        if torch.jit.is_tracing():  # its graph drops _assert_async: an operator checks
            positions = traced_nonnegative(positions)
        return kernels.resolve_pending(x, cos, positions, axes,
                                       kernels.UNCHECKED_RANGES[clamp, False]), axes
    bounds = [*torch.aminmax(axes)] if multi else []
    if positions.numel():
        bounds += [t.to(bounds[0].device) if multi else t for t in torch.aminmax(positions)]
    bounds = torch.stack(bounds).tolist() if bounds else []  # one read of the device
    if multi and (bounds[0] < 0 or bounds[1] >= k):
        raise ValueError(f"axes must be in [0, {k}) (k = positions.shape[-1] coordinates), "
                         f"got values in [{bounds[0]}, {bounds[1]}]")
    if positions.numel():
        low, high = bounds[-2:]
        if low < 0:
            raise ValueError(f"positions must be >= 0, got min {low}")
        if high >= table_len and (short_table == "raise" or not table_len):
            longer = (f"RotaryEmbedding.tables({high + 1})" if multi
                      else f"generate_rope_embeddings({high + 1}, head_dim)")
            raise ValueError(f"positions go up to {high} but the cos/sin table has only "
                             f"{table_len} rows (positions 0..{table_len - 1}); generate "
                             f"a longer table, e.g. {longer}")
    return positions.clamp_max(table_len - 1) if clamp else positions, axes


def _check_arguments(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str,
                     offset: object, rotary_dim: int | None, short_table: str,
                     name: str = "x") -> tuple[int, int]:
    """Checks all but ``out`` and ``positions`` (``name``: the caller's name for x); returns
    (rotary_dim, offset)."""
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
    """offset as a non-negative int (Python or NumPy integer, 0-d integer tensor); a 0-d
    tensor on a GPU stays one (not read back; checked where its rows are used)."""
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
    """Hints for tables ``width`` wide that do not fit: a partial rotation, transformers'."""
    hint = (f"; for a partial rotation pass rotary_dim={2 * width}"
            if default_dim and 2 * width <= head_dim else "")
    if width <= head_dim and width % 2 == 0:
        partial = f", rotary_dim={width}" if width < head_dim else ""
        hint += (f"; tables {width} wide may be transformers' (cat(freqs, freqs), as wide as "
                 f"the channels they rotate): pass cos[..., :{width // 2}] and sin[..., "
                 f":{width // 2}] with layout='half'{partial}, or call ropelib.hf."
                 "apply_rotary_pos_emb(q, k, cos, sin), which takes them as they are")
    return hint


def _check_out(out: object, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               name: str = "out", x_name: str = "x", inplace: bool = False) -> None:
    """``out`` (called ``name``) as a destination of x (``x_name``); ``inplace``: q_out and
    k_out are q and k of ``apply_rope_qk(..., inplace=True)``."""
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
