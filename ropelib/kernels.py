"""The rotation's operators, their autograd formula, and the choice of a backend per call.

Layers: rotation -> distributed -> kernels (here) -> native | triton_rope | eager -> _checks.
``ropelib::rotate`` and ``ropelib::rotate_qk`` are what compilers, tracers, dispatch modes and
DTensor see; ``rotate_each`` runs a call directly when nobody watches it (``plain_call``),
else through the operator (a destination then takes a copy). The gradient is the rotation
with ``inverse`` flipped: one formula (``_save``, ``_backward``) for the operators and
``_EagerRotation``. A backend module exports ``NAME``, ``assess`` (why it declines a call, or
None, and its plan), ``run``, ``CHECKS_PENDING``, ``run_cache`` and ``prepare``;
``ROPELIB_BACKEND`` (read per call) forces one.
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Sequence
from types import ModuleType
from typing import NamedTuple

import torch

from . import eager
from ._checks import (
    FLOAT_DTYPES,
    check_coordinates,
    check_rotation_operands,
    new_output,
    tracing,
    watcher,
)

BACKENDS = ("native", "triton", "eager")
ORDER = {"cpu": ("native", "eager"), "cuda": ("triton", "eager")}
OUT_NAMES = {1: (("out", "x"),), 2: (("q_out", "q"), ("k_out", "k"))}
Tensor = torch.Tensor


@torch.library.custom_op("ropelib::rotate", mutates_args=())
def _rotate_op(x: Tensor, cos: Tensor, sin: Tensor, layout: str, rotary_dim: int,
               inverse: bool = False, positions: Tensor | None = None,
               axes: Tensor | None = None) -> Tensor:
    """R_Theta x (R_{-Theta} x with ``inverse``), a new tensor: x ``(..., seq, head_dim)``,
    rows ``(..., seq, rotary_dim // 2)`` broadcastable to x's, or 2-D tables with int64
    ``positions`` ``(..., seq, k)`` (and ``axes`` ``(rotary_dim // 2,)`` for M-RoPE)."""
    return run_backend([x], [None], cos, sin, layout, rotary_dim, inverse, positions, axes,
                       check=True)[0]


@torch.library.custom_op("ropelib::rotate_qk", mutates_args=())
def _rotate_qk_op(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, layout: str,
                  rotary_dim: int, inverse: bool = False, positions: Tensor | None = None,
                  axes: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``ropelib::rotate`` of q ``(..., heads_q, seq, d)`` and k ``(..., heads_k, seq, d)`` at
    the same positions, in one launch where the backend can."""
    q_out, k_out = run_backend([q, k], [None, None], cos, sin, layout, rotary_dim, inverse,
                               positions, axes, check=True)
    return q_out, k_out


def _fake(xs, cos, sin, rotary_dim, positions, axes) -> list[Tensor]:
    """The operators' fake: their checks, and new outputs laid out as the kernels'."""
    for x in xs:
        check_rotation_operands(x, cos, sin, rotary_dim, positions, axes)
    return [new_output(x) for x in xs]


@_rotate_op.register_fake
def _rotate_fake(x, cos, sin, layout, rotary_dim, inverse=False, positions=None, axes=None):
    return _fake([x], cos, sin, rotary_dim, positions, axes)[0]


@_rotate_qk_op.register_fake
def _rotate_qk_fake(q, k, cos, sin, layout, rotary_dim, inverse=False, positions=None,
                    axes=None):
    return tuple(_fake([q, k], cos, sin, rotary_dim, positions, axes))


def rotate_each(xs: Sequence[Tensor], outs: Sequence[Tensor | None], cos: Tensor, sin: Tensor,
                layout: str, rotary_dim: int, inverse: bool = False,
                positions: Tensor | None = None, axes: Tensor | None = None,
                pending: UncheckedRange | None = None) -> list[Tensor]:
    """x (or q and k) rotated into ``outs`` (None: new; given: ``inverse`` is False), by the
    implementation when ``plain_call``, else by the operator and a copy into ``outs``."""
    written = () if outs[0] is None else outs
    if plain_call(*xs, cos, sin, *written, positions, axes):
        if written:
            check_out_memory(xs, outs, cos, sin, OUT_NAMES[len(xs)])
        done = run_backend(xs, outs, cos, sin, layout, rotary_dim, inverse, positions, axes,
                           pending)
        if written:
            torch.autograd.graph.increment_version(written)
        return done
    if written and not tracing():  # a DTensor's memory is its local tensor's
        local = [t.to_local() if hasattr(t, "to_local") else t for t in (*xs, *outs, cos, sin)]
        try:
            for t in local:
                t.data_ptr()
        except RuntimeError:  # fake or wrapper tensors: no memory to check
            local = None
        if local is not None:
            n = len(xs)
            check_out_memory(local[:n], local[n:2 * n], *local[2 * n:], OUT_NAMES[n])
    positions = resolve_pending(xs[0], cos, positions, axes, pending)
    args = (cos, sin, layout, rotary_dim, inverse, positions, axes)
    done = ([torch.ops.ropelib.rotate.default(xs[0], *args)] if len(xs) == 1
            else list(torch.ops.ropelib.rotate_qk.default(*xs, *args)))
    return [o.copy_(r) for o, r in zip(outs, done, strict=True)] if written else done


def rotate(x: Tensor, cos: Tensor, sin: Tensor, layout: str, rotary_dim: int,
           inverse: bool = False, positions: Tensor | None = None, axes: Tensor | None = None,
           pending: UncheckedRange | None = None) -> Tensor:
    """``rotate_each`` of one tensor into a new one (``ropelib::rotate``'s arguments)."""
    return rotate_each([x], [None], cos, sin, layout, rotary_dim, inverse, positions, axes,
                       pending)[0]


def plain_call(*tensors: Tensor | None) -> bool:
    """Whether the call may skip the dispatcher: not watched, no tensor needs a gradient."""
    if watcher(*tensors) is not None:
        return False
    if torch.is_grad_enabled():
        for t in tensors:
            if t is not None and t.requires_grad:
                return False
    return True


def rotate_qk_cache(q: Tensor, k: Tensor, v: Tensor, cos: Tensor, sin: Tensor, layout: str,
                    rotary_dim: int, key_cache: Tensor, value_cache: Tensor, slot: Tensor,
                    positions: Tensor | None = None, pending: UncheckedRange | None = None
                    ) -> Tensor:
    """A decode step: q rotated (returned), k rotated into ``key_cache[..., slot + 0 .. n - 1,
    :]``, v copied into ``value_cache`` there (caches ``(..., kv_heads, capacity, d)``)."""
    n, capacity = q.shape[-2], key_cache.shape[-2]
    if plain_call(q, k, v, cos, sin, key_cache, value_cache, slot, positions):
        backend, plan = choose_backend([q, k, v], [None, key_cache, value_cache], cos, sin,
                                       rotary_dim, positions)
        if backend.run_cache is not None:
            q_rot = backend.run_cache(q, k, v, key_cache, value_cache, slot, cos, sin, layout,
                                      rotary_dim, positions, None, pending, plan)
            torch.autograd.graph.increment_version((key_cache, value_cache))
            return q_rot
    positions = resolve_pending(q, cos, positions, None, pending)
    if slot.device.type == "cpu" and not tracing():
        start = int(slot)
        q_rot = new_output(q)
        rotate_each([q, k], [q_rot, key_cache[..., start:start + n, :]], cos, sin, layout,
                    rotary_dim, False, positions)
        value_cache[..., start:start + n, :].copy_(v)
        return q_rot
    slots = slot.reshape(()) + torch.arange(n, device=slot.device)
    torch._assert_async(((slots >= 0) & (slots < capacity)).all(),
                        "cache_position + row must be in [0, capacity) of the KV cache")
    q_rot, k_rot = rotate_each([q, k], [None, None], cos, sin, layout, rotary_dim, False,
                               positions)
    key_cache.index_copy_(-2, slots, k_rot)
    value_cache.index_copy_(-2, slots, v)
    return q_rot


def _save(ctx, inputs: tuple, output) -> None:
    """The gradient formula's context for ``rotate`` (no k), ``rotate_qk`` and
    ``_EagerRotation`` (k None); x saved only when the tables need grads."""
    ctx.alone = len(inputs) == 8
    if ctx.alone:
        inputs, needs = (inputs[0], None, *inputs[1:]), ctx.needs_input_grad
        ctx.needs = (needs[0], False, needs[1], needs[2])
    else:
        ctx.needs = tuple(ctx.needs_input_grad[:4])
    q, k, cos, sin, ctx.layout, ctx.rotary_dim, ctx.inverse, positions, axes = inputs[:9]
    ctx.pending = inputs[9] if len(inputs) > 9 else None
    ctx.count = 1 if k is None else 2
    tables = ctx.needs[2] or ctx.needs[3]
    ctx.save_for_backward(q if tables else None, k if tables else None, cos, sin, positions,
                          axes)
    if not tables and k is not None and not (ctx.needs[0] and ctx.needs[1]):
        ctx.mark_non_differentiable(*(rotated for rotated, needs in zip(
            output, ctx.needs[:2], strict=True) if not needs))


def _backward(ctx, *grads: Tensor) -> tuple:
    """dL/dx = R_Theta^T g = R_{-Theta} g: the same rotation inverted (differentiable again);
    the tables' grads from the pairs of x and g (``_table_grads``)."""
    q, k, cos, sin, positions, axes = ctx.saved_tensors
    grads = grads[:ctx.count]
    if grads[-1].stride(-1) != 1 or grads[0].stride(-1) != 1:  # a sum's grad: stride 0
        grads = [g.contiguous() for g in grads]
    result = [None] * 4
    if ctx.needs[0] or ctx.needs[1]:
        result[:ctx.count] = rotate_each(grads, (None,) * ctx.count, cos, sin, ctx.layout,
                                         ctx.rotary_dim, not ctx.inverse, positions, axes,
                                         ctx.pending)
    if ctx.needs[2] or ctx.needs[3]:
        parts = [_table_grads(ctx, x, g, cos, sin, positions, axes)
                 for x, g in zip((q, k)[:ctx.count], grads, strict=True)]
        result[2:] = [sum(part[i] for part in parts) for i in (0, 1)]
    if ctx.alone:
        del result[1]
    return *result, *[None] * 6


def _table_grads(ctx, x: Tensor, grad: Tensor, cos: Tensor, sin: Tensor,
                 positions: Tensor | None, axes: Tensor | None) -> tuple[Tensor, Tensor]:
    """The grads of cos and sin from the pairs of x and g, summed over the dims the rows
    broadcast over (with positions: scattered into the table rows they came from)."""
    rd = ctx.rotary_dim
    a, b = eager.pairs(x[..., :rd], ctx.layout)
    ga, gb = eager.pairs(grad[..., :rd], ctx.layout)
    grad_cos = ga * a + gb * b
    grad_sin = (ga * b - gb * a) if ctx.inverse else (gb * a - ga * b)
    if positions is None:
        return grad_cos.sum_to_size(cos.shape), grad_sin.sum_to_size(sin.shape)
    positions = positions.long()  # any integer dtype: scatter_add_ takes int64
    index = positions.index_select(-1, axes.long()) if axes is not None else positions.expand(
        *positions.shape[:-1], rd // 2)
    flat = index.reshape(-1, index.shape[-1])
    return tuple(
        torch.zeros_like(table).scatter_add_(
            0, flat, g.sum_to_size(index.shape).reshape(flat.shape).to(table.dtype))
        for table, g in ((cos, grad_cos), (sin, grad_sin)))


torch.library.register_autograd("ropelib::rotate", _backward, setup_context=_save)
torch.library.register_autograd("ropelib::rotate_qk", _backward, setup_context=_save)


class _EagerRotation(torch.autograd.Function):
    """``ropelib::rotate_qk`` (k None: ``rotate``) as one node running the backend directly:
    eager training steps with constant tables (the operators' layers cost about 100 us)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor | None, cos: Tensor, sin: Tensor, layout: str,
                rotary_dim: int, inverse: bool, positions: Tensor | None, axes: Tensor | None,
                pending: UncheckedRange | None) -> Tensor | tuple[Tensor, Tensor]:
        xs = [q] if k is None else [q, k]
        done = run_backend(xs, [None] * len(xs), cos, sin, layout, rotary_dim, inverse,
                           positions, axes, pending)
        _save(ctx, (q, k, cos, sin, layout, rotary_dim, inverse, positions, axes, pending),
              done)
        return done[0] if k is None else (done[0], done[1])

    backward = staticmethod(_backward)


# ``apply`` without ``Function.apply``'s Python layer (signature binding, torch.func hand-off)
eager_rotation = super(torch.autograd.Function, _EagerRotation).apply


def run_backend(xs: Sequence[Tensor], outs: Sequence[Tensor | None], cos: Tensor, sin: Tensor,
                layout: str, rotary_dim: int, inverse: bool, positions: Tensor | None = None,
                axes: Tensor | None = None, pending: UncheckedRange | None = None,
                check: bool = False) -> Sequence[Tensor]:
    """R_Theta x for each x of ``xs`` into ``outs`` (None: new) by ``choose_backend``'s
    backend; ``check`` (the operators): operands checked first."""
    if check:
        for x in xs:
            check_rotation_operands(x, cos, sin, rotary_dim, positions, axes)
    backend, plan = choose_backend(xs, outs, cos, sin, rotary_dim, positions)
    if pending is not None and not backend.CHECKS_PENDING:
        positions, pending = resolve_pending(xs[0], cos, positions, axes, pending), None
    if pending is None and positions is not None and xs[0].device.type == "cpu":
        check_coordinates(positions, axes, cos.shape[0])
    return backend.run(xs, outs, cos, sin, layout, rotary_dim, inverse, positions, axes,
                       pending=pending, plan=plan)


class UncheckedRange(NamedTuple):
    """Coordinates whose range is left to the rotation (on a device): ``clamp`` them to the
    last row; ``step``: they are a 0-d offset and row s sits at offset + s."""

    clamp: bool
    step: bool


UNCHECKED_RANGES = {(clamp, step): UncheckedRange(clamp, step) for clamp in (False, True)
                    for step in (False, True)}  # made once: a call builds none


def resolve_pending(x: Tensor, cos: Tensor, positions: Tensor | None, axes: Tensor | None,
                    pending: UncheckedRange | None) -> Tensor | None:
    """``pending`` coordinates made plain on their device (no value read back)."""
    if pending is None:
        return positions
    seq, table_len = x.shape[-2], cos.shape[0]
    if pending.step:
        rows = positions.reshape(()) + torch.arange(seq, device=positions.device)
        positions = rows.reshape((1,) * (x.ndim - 2) + (seq, 1))
    if axes is not None:
        k = positions.shape[-1]
        torch._assert_async(((axes >= 0) & (axes < k)).all(), "axes must be in [0, k)")
    within = positions >= 0
    if pending.clamp:
        positions = positions.clamp_max(table_len - 1)
    else:
        within &= positions < table_len
    torch._assert_async(within.all(), "positions must be >= 0 and < the cos/sin table length "
                        "(rows 0 .. table_len - 1)")
    return positions


def choose_backend(xs: Sequence[Tensor], outs: Sequence[Tensor | None], cos: Tensor,
                   sin: Tensor, rotary_dim: int, positions: Tensor | None = None
                   ) -> tuple[ModuleType, object]:
    """(the forced backend, a ValueError if it declines, else the first of the device's
    ``ORDER`` that takes the call; the plan its ``assess`` made)."""
    forced = os.environ.get("ROPELIB_BACKEND")
    if forced and forced not in BACKENDS:
        raise ValueError(f"ROPELIB_BACKEND must be one of {BACKENDS}, got {forced!r}")
    for name in (forced,) if forced else ORDER.get(xs[0].device.type, ()):
        backend, reason = _backend(name)
        if backend is not None:
            reason, plan = backend.assess(xs, outs, cos, sin, rotary_dim, positions)
            if not reason:
                return backend, plan
        if forced:
            raise ValueError(f"ROPELIB_BACKEND={forced} cannot rotate this call: {reason}")
    return eager, None


_MODULES = {"native": ".native", "triton": ".triton_rope", "eager": ".eager"}


@functools.cache
def _backend(name: str) -> tuple[ModuleType | None, str | None]:
    """(the backend's module, None), or (None, why it cannot be imported)."""
    try:
        return importlib.import_module(_MODULES[name], __package__), None
    except ImportError as error:
        return None, f"ropelib{_MODULES[name]} cannot be imported ({error})"


class BackendStatus(NamedTuple):
    """Which backend ``apply_rope`` takes on a device for a usual call and why."""

    backend: str | None  # "native", "triton" or "eager"; None: every such call raises
    reason: str


def backend_status(device: str | torch.device = "cpu",
                   dtype: torch.dtype = torch.float32) -> BackendStatus:
    """What the next ``apply_rope`` of a contiguous ``dtype`` tensor on ``device`` does,
    honouring ``ROPELIB_BACKEND`` (read now, as every call reads it).

    Returns:
        ``BackendStatus(backend, reason)``, e.g. ``('triton', 'the first of triton, eager
        that takes the call')``: the backend and what the others said when they declined;
        or ``backend=None`` with why every such call raises (an unknown or declining forced
        backend, a device this PyTorch cannot use, a dtype other than float16, bfloat16,
        float32 or float64). Under ``torch.func`` transforms (and forward-mode AD) the
        rotation runs as PyTorch operations whatever the backend: ``ROPELIB_BACKEND`` does
        not apply there.
    """
    device, forced = torch.device(device), os.environ.get("ROPELIB_BACKEND")
    if dtype not in FLOAT_DTYPES:
        return BackendStatus(None, f"x of dtype {dtype}: every call raises TypeError (the "
                                   f"rotation takes {', '.join(map(str, FLOAT_DTYPES))})")
    if forced and forced not in BACKENDS:
        return BackendStatus(None, f"ROPELIB_BACKEND={forced!r} is not one of {BACKENDS}: "
                                   "every call raises ValueError")
    try:  # assess's arguments: a (1, 1, 2, 8) x with float32 rows
        if device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False" + (
                " (this PyTorch is built without CUDA)" if torch.version.cuda is None else ""))
        cos = torch.empty(2, 4, device=device)
        probe = [torch.empty(1, 1, 2, 8, device=device, dtype=dtype)], [None], cos, cos, 8, None
    except (RuntimeError, AssertionError) as error:  # no such device in this build or machine
        return BackendStatus(None, f"no tensor can be made on {device} here: every call "
                                   f"raises ({type(error).__name__}: {error})")
    names = (forced,) if forced else ORDER.get(device.type, ("eager",))
    declined = []
    for name in names:
        backend, reason = _backend(name)
        reason = reason or backend.assess(*probe)[0]
        if not reason:
            return BackendStatus(name, "forced by ROPELIB_BACKEND" if forced else (
                f"the first of {', '.join(names)} that takes the call"
                + "".join(f"; {d}" for d in declined)))
        if forced:
            return BackendStatus(None, f"ROPELIB_BACKEND={forced} forces a backend that "
                                       f"declines this call ({reason}): every such call "
                                       "raises ValueError")
        declined.append(f"{name} declined: {reason}")
    return BackendStatus("eager", "; ".join(declined) or "no compiled backend for this device")


class NativeStatus(NamedTuple):
    """Which path ``apply_rope`` takes on the CPU (float32, float64, bfloat16) and why."""

    path: str | None  # "native" (the compiled loop) or "eager"; None: every such call raises
    reason: str  # why that path
    threaded: bool  # whether the compiled loop runs on several threads (OpenMP)


def native_status() -> NativeStatus:
    """Which path CPU calls of float32, float64 and bfloat16 take and why (building the loop):
    ``"native"`` (naming the compiler that built the loaded loop), ``"eager"``, or None where
    every such call raises, as ``backend_status`` (which covers any call) says."""
    path, reason = backend_status("cpu", torch.float32)
    loop = _backend("native")[0].loop() if path == "native" else None
    if loop is None:
        return NativeStatus(path, reason, False)
    how = "with OpenMP" if loop.threaded else "without OpenMP (one thread)"
    return NativeStatus(path, f"{reason}; compiled {how} by CC={loop.compiler!r}", loop.threaded)


def check_out_memory(xs: Sequence[Tensor], outs: Sequence[Tensor], cos: Tensor, sin: Tensor,
                     names: Sequence[tuple[str, str]] = (("out", "x"),)) -> None:
    """Each destination (``names[i]``: its name, its x's) may not overlap the tables, share an
    element with its x unless it is x, nor (q and k) with the other x or a later destination;
    an inference tensor takes no write outside inference mode. Meta tensors hold no memory."""
    n, tensors = len(xs), (*xs, *outs)
    labels = [x_name for _, x_name in names] + [name for name, _ in names]
    spans = [byte_span(t) for t in tensors]
    tables = (("cos", byte_span(cos)), ("sin", byte_span(sin)))
    for i, (out, (name, x_name)) in enumerate(zip(outs, names, strict=True)):
        if out.is_inference() and not torch.is_inference_mode_enabled():
            raise ValueError(f"{name} is an inference tensor (made under "
                             "torch.inference_mode()) and this call is outside inference "
                             "mode, where PyTorch refuses in-place updates to inference "
                             "tensors; call it under torch.inference_mode(), or pass a "
                             f"destination made outside it (e.g. {x_name}.clone())")
        for table_name, table_span in tables:
            if _intersect(spans[n + i], table_span):
                raise ValueError(f"{name} shares memory with {table_name}; the rotation "
                                 "would overwrite the table it reads. Pass a separate buffer")
        for j in (*range(n), *range(n + i + 1, 2 * n)):
            other = tensors[j]
            if j == i and out.data_ptr() == other.data_ptr() and out.stride() == other.stride():
                continue  # x itself: in place
            if _intersect(spans[n + i], spans[j]) and _share_elements(out, other):
                if j == i:
                    raise ValueError(f"{name} shares memory with {x_name} but is not {x_name} "
                                     f"itself (other strides or offset); pass {name}={x_name} "
                                     "for an in-place rotation or a separate buffer")
                raise ValueError(f"{name} shares memory with {labels[j]}; rotating q and k "
                                 "together needs destinations apart from the other tensor")


def share_memory(a: Tensor, b: Tensor) -> bool:
    """Whether a and b address a common element (a tensor shares all of its own)."""
    return _intersect(byte_span(a), byte_span(b)) and _share_elements(a, b)


def byte_span(t: Tensor) -> tuple[int, int]:
    """The addresses [first, last + 1) of t's elements; empty for an empty or meta tensor."""
    if t.is_meta or not t.numel():
        return 0, 0
    start = t.data_ptr()
    extent = t.nbytes if t.is_contiguous() else (sum(
        (n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True)) + 1) * t.element_size()
    return start, start + extent


def _intersect(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def _share_elements(a: Tensor, b: Tensor) -> bool:
    """Whether views a and b of one buffer address a common element (the gap between their
    starts a sum of strides within their sizes); a search too wide counts as shared."""
    size = a.element_size()
    gap = b.data_ptr() - a.data_ptr()
    if gap % size or b.element_size() != size:
        return True
    ranges: dict[int, tuple[int, int]] = {}
    for t, sign in ((a, 1), (b, -1)):
        for n, stride in zip(t.shape, t.stride(), strict=True):
            if n > 1 and stride > 0:
                low, high = ranges.get(stride, (0, 0))
                ranges[stride] = (low, high + n - 1) if sign > 0 else (low - n + 1, high)
    dims = sorted(((stride, low, high) for stride, (low, high) in ranges.items()),
                  reverse=True)
    return _reachable(gap // size, dims, [4096])


def _reachable(gap: int, dims: list[tuple[int, int, int]], budget: list[int]) -> bool:
    """Whether gap = sum_k c_k stride_k, low_k <= c_k <= high_k; True past ``budget[0]``."""
    if not dims:
        return gap == 0
    (stride, low, high), rest = dims[0], dims[1:]
    rest_low = sum(lo * st for st, lo, _ in rest)
    rest_high = sum(hi * st for st, _, hi in rest)
    first = max(low, -((rest_high - gap) // stride))  # ceil((gap - rest_high) / stride)
    last = min(high, (gap - rest_low) // stride)
    for c in range(first, last + 1):
        budget[0] -= 1
        if budget[0] < 0 or _reachable(gap - c * stride, rest, budget):
            return True
    return False
