"""The rotation as PyTorch operators, and the one choice of the backend that runs it.

A call of ``apply_rope`` comes down here once, with its rows or positions prepared by
``ropelib.rotation``, and goes to exactly one backend, chosen here per call (``backend_for``):

- ``native`` (``ropelib.native``): the compiled C loop, on the CPU, float32/float64/bfloat16;
- ``triton`` (``ropelib.triton_rope``): the Triton kernel on a GPU (float32, bfloat16,
  float16), q and k in one launch; Triton is imported when the first CUDA tensor arrives;
- ``eager`` (``ropelib.eager``): PyTorch operations, everywhere else.

Every backend module has the same interface, and this module treats them alike:
``decline_reason(xs, outs, cos, sin, rotary_dim, positions)`` returns None when it takes the call,
else why not; ``assess`` (same arguments) returns that reason with what the backend worked
out for its ``run`` (the Triton backend's ``Plan``, looked up once per call's tensors; None
for the others); ``run(xs, outs, cos, sin, layout, rotary_dim, inverse, positions, axes,
pending=, plan=)`` rotates (each prepares its own tables). What a backend can do it declares:
``CHECKS_PENDING`` (its launch checks an ``UncheckedRange`` of coordinates, else ``resolve_pending`` does
first), ``CHECKS_COORDINATES`` (it checks settled coordinates' range as it reads them on the
CPU, else ``check_coordinates`` does first), ``run_cache`` (a decode step's rotation and
cache write in one launch, or None) and ``prepare`` (a launch ``ropelib.plans`` can keep, or
None). The first backend of the device's order that takes the call runs it.

The environment variable ``ROPELIB_BACKEND`` (``native``, ``triton`` or ``eager``, read per
call) forces one, for tests and benchmarks; ``triton`` with CPU tensors runs the kernel in
Triton's interpreter. A forced backend that declines is an error that says why.
``backend_status(device)`` says which backend a device's calls take.

The rotation enters PyTorch as the operators ``ropelib::rotate`` (a new output),
``ropelib::rotate_out`` (into a given ``out``) and, for a query and a key rotated together,
``ropelib::rotate_qk`` and ``ropelib::rotate_qk_out``, registered with
``torch.library.custom_op`` and a fake implementation, so ``torch.compile``, ``torch.export``
and ``torch.jit.trace`` see one opaque node whose shape they know. For a call nobody
watches (``_checks.watcher``) that needs no gradient, ``rotate`` and its siblings call the
implementation directly (``plain_call``). The autograd formulas are registered by
``ropelib.rotation``, which also runs an eager training step (plain tensors, constant
tables) as one autograd node with the same formula, outside the operators' layers;
``eager.rotate_composite`` is the same rotation in differentiable PyTorch operations,
for ``torch.func`` transforms and forward-mode AD, which must not hand a kernel their
wrapped tensors.
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Sequence
from types import ModuleType
from typing import NamedTuple

import torch

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


@torch.library.custom_op("ropelib::rotate", mutates_args=())
def _rotate_op(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str,
               rotary_dim: int, inverse: bool = False, positions: torch.Tensor | None = None,
               axes: torch.Tensor | None = None) -> torch.Tensor:
    """R_Theta x, a new tensor (``new_output``): the first ``rotary_dim`` channels
    rotated, the rest copied; R_{-Theta} x with ``inverse`` (the gradient's rotation).

    Args:
        x: ``(..., seq, head_dim)``.
        cos, sin: rows ``(..., seq, rotary_dim // 2)`` broadcastable to x's, any float
            dtype, on x's device; with ``positions``, the 2-D tables
            ``(table_len, rotary_dim // 2)`` (row m: angles m * theta_i).
        layout: ``"interleaved"`` or ``"half"``.
        rotary_dim: rotated channels (even, <= head_dim).
        inverse: rotate by the opposite angles, as if sin were -sin.
        positions: multi-axis coordinates ``(..., seq, k)``, int64 in ``[0, table_len)``,
            with as many dims as x and broadcastable to its rows: pair i of a row reads the
            table row of coordinate ``axes[i]`` (``gather_rows``; M-RoPE).
        axes: with ``positions``, int64 ``(rotary_dim // 2,)`` in ``[0, k)``.

    The arguments are checked before the loop runs (``check_rotation_operands``): a table
    pair of other shapes, dtypes or devices, rows that do not cover x's, or a short
    ``axes`` is a ValueError, never a read past a tensor.
    """
    return rotate_plain(x, cos, sin, layout, rotary_dim, None, inverse, positions, axes,
                        check=True)


@_rotate_op.register_fake
def _rotate_fake(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str,
                 rotary_dim: int, inverse: bool = False, positions: torch.Tensor | None = None,
                 axes: torch.Tensor | None = None) -> torch.Tensor:
    check_rotation_operands(x, cos, sin, rotary_dim, None, positions, axes)
    return new_output(x)


@torch.library.custom_op("ropelib::rotate_out", mutates_args=("out",))
def _rotate_out_op(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str,
                   rotary_dim: int, out: torch.Tensor, positions: torch.Tensor | None = None,
                   axes: torch.Tensor | None = None) -> None:
    """``ropelib::rotate`` written into ``out`` (x's shape and dtype, channels of any stride;
    x itself, or memory that shares no element with x)."""
    rotate_plain(x, cos, sin, layout, rotary_dim, out, False, positions, axes, check=True)


@_rotate_out_op.register_fake
def _rotate_out_fake(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str,
                     rotary_dim: int, out: torch.Tensor, positions: torch.Tensor | None = None,
                     axes: torch.Tensor | None = None) -> None:
    check_rotation_operands(x, cos, sin, rotary_dim, out, positions, axes)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str,
           rotary_dim: int, inverse: bool = False, positions: torch.Tensor | None = None,
           axes: torch.Tensor | None = None, pending: UncheckedRange | None = None) -> torch.Tensor:
    """``ropelib::rotate``: R_Theta x (R_{-Theta} x with ``inverse``), a new tensor
    (arguments as there; ``pending``: see ``UncheckedRange``)."""
    if plain_call(x, cos, sin, positions, axes):
        return rotate_plain(x, cos, sin, layout, rotary_dim, None, inverse, positions, axes,
                            pending)
    return torch.ops.ropelib.rotate.default(x, cos, sin, layout, rotary_dim, inverse,
                                            resolve_pending(x, cos, positions, axes, pending), axes)


def rotate_out(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str,
               rotary_dim: int, out: torch.Tensor, positions: torch.Tensor | None = None,
               axes: torch.Tensor | None = None, pending: UncheckedRange | None = None) -> None:
    """``ropelib::rotate_out``: R_Theta x written into ``out``, whose version counter is
    bumped like any in-place write's (arguments as there; ``pending``: see ``UncheckedRange``)."""
    if plain_call(x, cos, sin, out, positions, axes):
        _rotate_into(x, cos, sin, layout, rotary_dim, out, positions, axes, pending)
        torch.autograd.graph.increment_version(out)
    else:
        torch.ops.ropelib.rotate_out.default(x, cos, sin, layout, rotary_dim, out,
                                             resolve_pending(x, cos, positions, axes, pending), axes)


@torch.library.custom_op("ropelib::rotate_qk", mutates_args=())
def _rotate_qk_op(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  layout: str, rotary_dim: int, inverse: bool = False,
                  positions: torch.Tensor | None = None, axes: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """``ropelib::rotate`` of a query ``(..., heads_q, seq, head_dim)`` and a key ``(...,
    heads_k, seq, head_dim)`` at the same positions, in one launch where the backend can
    (one read of the table rows for both): two new tensors (``new_output``)."""
    q_out, k_out = run_backend([q, k], [None, None], cos, sin, layout, rotary_dim, inverse,
                               positions, axes, check=True)
    return q_out, k_out


def _check_qk(q, k, cos, sin, rotary_dim, q_out, k_out, positions, axes) -> None:
    """``check_rotation_operands`` of q and of k."""
    check_rotation_operands(q, cos, sin, rotary_dim, q_out, positions, axes)
    check_rotation_operands(k, cos, sin, rotary_dim, k_out, positions, axes)


@_rotate_qk_op.register_fake
def _rotate_qk_fake(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                    layout: str, rotary_dim: int, inverse: bool = False,
                    positions: torch.Tensor | None = None, axes: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    _check_qk(q, k, cos, sin, rotary_dim, None, None, positions, axes)
    return new_output(q), new_output(k)


@torch.library.custom_op("ropelib::rotate_qk_out", mutates_args=("q_out", "k_out"))
def _rotate_qk_out_op(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                      layout: str, rotary_dim: int, q_out: torch.Tensor, k_out: torch.Tensor,
                      positions: torch.Tensor | None = None,
                      axes: torch.Tensor | None = None) -> None:
    """``ropelib::rotate_qk`` written into ``q_out`` and ``k_out`` (each its tensor itself, or
    memory that shares no element with q, k, the other destination or the tables)."""
    run_backend([q, k], [q_out, k_out], cos, sin, layout, rotary_dim, False, positions, axes,
                check=True)


@_rotate_qk_out_op.register_fake
def _rotate_qk_out_fake(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                        layout: str, rotary_dim: int, q_out: torch.Tensor, k_out: torch.Tensor,
                        positions: torch.Tensor | None = None,
                        axes: torch.Tensor | None = None) -> None:
    _check_qk(q, k, cos, sin, rotary_dim, q_out, k_out, positions, axes)


def rotate_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              layout: str, rotary_dim: int, inverse: bool = False,
              positions: torch.Tensor | None = None, axes: torch.Tensor | None = None,
              pending: UncheckedRange | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``ropelib::rotate_qk`` (arguments as there; ``pending``: see ``UncheckedRange``)."""
    if plain_call(q, k, cos, sin, positions, axes):
        q_out, k_out = run_backend([q, k], [None, None], cos, sin, layout, rotary_dim, inverse,
                                   positions, axes, pending)
        return q_out, k_out
    return torch.ops.ropelib.rotate_qk.default(q, k, cos, sin, layout, rotary_dim, inverse,
                                               resolve_pending(q, cos, positions, axes, pending), axes)


def rotate_qk_out(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  layout: str, rotary_dim: int, q_out: torch.Tensor, k_out: torch.Tensor,
                  positions: torch.Tensor | None = None, axes: torch.Tensor | None = None,
                  pending: UncheckedRange | None = None) -> None:
    """``ropelib::rotate_qk_out``: both destinations' version counters are bumped
    (``pending``: see ``UncheckedRange``)."""
    if plain_call(q, k, cos, sin, q_out, k_out, positions, axes):
        _rotate_qk_into(q, k, cos, sin, layout, rotary_dim, q_out, k_out, positions, axes,
                        pending)
        torch.autograd.graph.increment_version((q_out, k_out))
    else:
        torch.ops.ropelib.rotate_qk_out.default(q, k, cos, sin, layout, rotary_dim, q_out,
                                                k_out, resolve_pending(q, cos, positions, axes, pending),
                                                axes)


def _rotate_qk_into(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                    layout: str, rotary_dim: int, q_out: torch.Tensor, k_out: torch.Tensor,
                    positions: torch.Tensor | None, axes: torch.Tensor | None,
                    pending: UncheckedRange | None = None) -> None:
    """``run_backend`` of q and k into their destinations, after ``check_out_memory``
    (neither destination may overwrite what the other rotation still reads or writes)."""
    check_out_memory((q, k), (q_out, k_out), cos, sin, (("q_out", "q"), ("k_out", "k")))
    run_backend([q, k], [q_out, k_out], cos, sin, layout, rotary_dim, False, positions, axes,
                pending)


def rotate_qk_cache(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor,
                    sin: torch.Tensor, layout: str, rotary_dim: int, key_cache: torch.Tensor,
                    value_cache: torch.Tensor, slot: torch.Tensor,
                    positions: torch.Tensor | None = None, pending: UncheckedRange | None = None
                    ) -> torch.Tensor:
    """A decode step's rotation and cache write: q rotated into a new tensor, k rotated into
    ``key_cache[..., slot + 0 .. n - 1, :]`` and v copied into ``value_cache`` there.

    q, k and v are ``(..., heads, n, head_dim)`` (k and v with the caches' heads), the caches
    ``(..., kv_heads, capacity, head_dim)``, ``slot`` a 0-d integer tensor; rows or
    positions as for ``rotate_qk`` (shared by q and k). Eager, where the Triton kernel takes
    the call (a GPU, or ``ROPELIB_BACKEND=triton``), it is one launch that reads the slot on
    the device and asserts its range there; on the CPU the slot is read (checked first
    by ``ropelib.rotation.apply_rope_qk_to_cache``), then k is rotated straight into its
    slots (one pass) and v copied; under a compiler or autograd the rotation is followed by
    ``index_copy_`` into the caches.
    """
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
    if slot.device.type == "cpu" and not tracing():  # its range checked by the caller
        start = int(slot)
        q_rot = new_output(q)
        rotate_qk_out(q, k, cos, sin, layout, rotary_dim, q_rot,
                      key_cache[..., start:start + n, :], positions)
        value_cache[..., start:start + n, :].copy_(v)
        return q_rot
    slots = slot.reshape(()) + torch.arange(n, device=slot.device)
    torch._assert_async(((slots >= 0) & (slots < capacity)).all(),
                        "cache_position + row must be in [0, capacity) of the KV cache")
    q_rot, k_rot = rotate_qk(q, k, cos, sin, layout, rotary_dim, False, positions)
    key_cache.index_copy_(-2, slots, k_rot)
    value_cache.index_copy_(-2, slots, v)
    return q_rot


def plain_call(*tensors: torch.Tensor | None) -> bool:
    """Whether the operators' implementation may run without the dispatcher: nobody watches
    the call (``watcher`` is None) and no tensor needs a gradient. The dispatcher would run
    the same function after 10-30 us of Python layers, which at small shapes cost more than
    the rotation."""
    if watcher(*tensors) is not None:
        return False
    if torch.is_grad_enabled():
        for t in tensors:
            if t is not None and t.requires_grad:
                return False
    return True


def _rotate_into(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str,
                 rotary_dim: int, out: torch.Tensor, positions: torch.Tensor | None,
                 axes: torch.Tensor | None, pending: UncheckedRange | None = None) -> None:
    """``rotate_plain`` into ``out`` after ``check_out_memory``."""
    check_out_memory((x,), (out,), cos, sin)
    rotate_plain(x, cos, sin, layout, rotary_dim, out, False, positions, axes, pending)


def check_out_memory(xs: Sequence[torch.Tensor], outs: Sequence[torch.Tensor],
                     cos: torch.Tensor, sin: torch.Tensor,
                     names: Sequence[tuple[str, str]] = (("out", "x"),)) -> None:
    """Checked on the real tensors (so also in a compiled graph), for each destination of
    ``outs`` (named ``names[i] = (its name, its x's name)``): it may not overlap the tables,
    nor share an element with its x unless it is x itself; for a query and a key rotated
    together, neither destination may share an element with the other x or the other
    destination. Each tensor's addresses are worked out once (``byte_span``). Meta tensors
    hold no memory (every one reports address 0): nothing to check. An inference tensor
    (made under ``torch.inference_mode()``) takes no write outside inference mode, as
    PyTorch's own in-place operators refuse it."""
    tables = (("cos", byte_span(cos)), ("sin", byte_span(sin)))
    x_spans = [byte_span(x) for x in xs]
    in_place = [out.data_ptr() == x.data_ptr() and out.stride() == x.stride()
                for x, out in zip(xs, outs, strict=True)]
    out_spans = [x_span if same else byte_span(out)
                 for x_span, same, out in zip(x_spans, in_place, outs, strict=True)]
    for x, out, x_span, same, out_span, (name, x_name) in zip(
            xs, outs, x_spans, in_place, out_spans, names, strict=True):
        if out.is_inference() and not torch.is_inference_mode_enabled():
            raise ValueError(f"{name} is an inference tensor (made under "
                             "torch.inference_mode()) and this call is outside inference "
                             "mode, where PyTorch refuses in-place updates to inference "
                             "tensors; call it under torch.inference_mode(), or pass a "
                             f"destination made outside it (e.g. {x_name}.clone())")
        for table_name, table_span in tables:
            if _intersect(out_span, table_span):
                raise ValueError(f"{name} shares memory with {table_name}; the rotation "
                                 "would overwrite the table it reads. Pass a separate buffer")
        if not same and _intersect(out_span, x_span) and _share_elements(out, x):
            raise ValueError(f"{name} shares memory with {x_name} but is not {x_name} itself "
                             f"(other strides or offset); pass {name}={x_name} for an "
                             "in-place rotation or a separate buffer")
    if len(xs) == 2:
        (q, k), (q_out, k_out), (q_span, k_span), (q_out_span, k_out_span) = (
            xs, outs, x_spans, out_spans)
        for name, a, a_span, other, b, b_span in (
                ("q_out", q_out, q_out_span, "k", k, k_span),
                ("k_out", k_out, k_out_span, "q", q, q_span),
                ("q_out", q_out, q_out_span, "k_out", k_out, k_out_span)):
            if _intersect(a_span, b_span) and _share_elements(a, b):
                raise ValueError(f"{name} shares memory with {other}; rotating q and k "
                                 "together needs destinations apart from the other tensor")


def share_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a and b address a common element (a tensor shares all of its own)."""
    return _intersect(byte_span(a), byte_span(b)) and _share_elements(a, b)


def byte_span(t: torch.Tensor) -> tuple[int, int]:
    """The addresses [first, last + 1) of t's elements; empty for an empty tensor and for a
    meta tensor (it holds no memory). Only views of one buffer can have intersecting
    spans."""
    if t.is_meta or not t.numel():
        return 0, 0
    start = t.data_ptr()
    return start, start + (t.nbytes if t.is_contiguous() else _extent(t))


def _extent(t: torch.Tensor) -> int:
    """The bytes from t's first element to past its last (t not empty)."""
    return (sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True)) + 1) * (
        t.element_size())


def _intersect(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def _share_elements(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a and b (views of one buffer with intersecting spans) address a common
    element, decided by the elements they touch: whether b's first element minus a's is
    ``sum_d i_d stride_d - sum_e j_e stride_e`` for indices inside a's and b's sizes. Dims
    of one stride merge into one coefficient (its range the sum of theirs), so q and k of
    different head counts taken from one fused ``(batch, seq, heads, dim)`` buffer are
    told apart exactly; a search too wide to finish counts as shared."""
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
    return _reachable(gap // size, dims, [_SEARCH_BUDGET])


_SEARCH_BUDGET = 4096  # coefficients tried before an undecided overlap counts as shared


def _reachable(gap: int, dims: list[tuple[int, int, int]], budget: list[int]) -> bool:
    """Whether gap = sum_k c_k stride_k for integers low_k <= c_k <= high_k, dims =
    [(stride_k, low_k, high_k)] by decreasing stride; each coefficient is bounded by what
    the smaller strides can still reach. ``budget[0]``: coefficients left to try; when they
    run out the answer is True (undecided counts as reachable)."""
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


def rotate_plain(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str,
                 rotary_dim: int, out: torch.Tensor | None, inverse: bool,
                 positions: torch.Tensor | None = None, axes: torch.Tensor | None = None,
                 pending: UncheckedRange | None = None, check: bool = False) -> torch.Tensor:
    """The operators' implementation for one tensor: ``run_backend`` of ``[x]``."""
    return run_backend([x], [out], cos, sin, layout, rotary_dim, inverse, positions, axes,
                       pending, check)[0]


OUT_NAMES = {1: (("out", "x"),), 2: (("q_out", "q"), ("k_out", "k"))}


def run_backend(xs: Sequence[torch.Tensor], outs: Sequence[torch.Tensor | None],
                cos: torch.Tensor, sin: torch.Tensor, layout: str, rotary_dim: int,
                inverse: bool, positions: torch.Tensor | None = None,
                axes: torch.Tensor | None = None, pending: UncheckedRange | None = None,
                check: bool = False) -> Sequence[torch.Tensor]:
    """R_Theta x (R_{-Theta} x with ``inverse``) for every x of ``xs`` (one tensor, or a query
    and a key), into ``outs`` (None: new), by the backend ``backend_for`` picks. Called
    directly for plain tensors in eager mode (``plain_call``), by the operators'
    implementations and by the autograd formulas; arguments as for ``ropelib::rotate``.
    Coordinates still ``pending`` go to the Triton kernel as they are (it checks them in its
    one launch); for another backend ``resolve_pending`` checks them first.

    ``check`` (the operators' implementations): the operands are checked first
    (``check_rotation_operands`` of each x, ``check_out_memory`` of the destinations)."""
    if check:
        for x, out in zip(xs, outs, strict=True):
            check_rotation_operands(x, cos, sin, rotary_dim, out, positions, axes)
        if outs[0] is not None:
            check_out_memory(xs, outs, cos, sin, OUT_NAMES[len(xs)])
    backend, plan = choose_backend(xs, outs, cos, sin, rotary_dim, positions)
    if pending is not None and not backend.CHECKS_PENDING:
        positions, pending = resolve_pending(xs[0], cos, positions, axes, pending), None
    if (pending is None and positions is not None and xs[0].device.type == "cpu"
            and not backend.CHECKS_COORDINATES):
        check_coordinates(positions, axes, cos.shape[0])
    return backend.run(xs, outs, cos, sin, layout, rotary_dim, inverse, positions, axes,
                       pending=pending, plan=plan)


class UncheckedRange(NamedTuple):
    """Coordinates handed on by a call that reads no value on the host (a GPU call in eager
    mode): their range is still to be checked (against the tables' rows, and axes against
    the coordinates per token), and ``clamp``: clamped to the last row first
    (``short_table="repeat_last"``). ``step``: the coordinates are a 0-d offset (shaped as
    ones, x's number of dims) and row s of x sits at offset + s. The Triton kernel does all
    of it in its one launch (a device-side assertion that names what is out of range);
    ``resolve_pending`` does it with PyTorch operations for any other route."""

    clamp: bool
    step: bool


UNCHECKED_RANGES = {(clamp, step): UncheckedRange(clamp, step) for clamp in (False, True)
           for step in (False, True)}  # the four, made once (a call builds none)


def resolve_pending(x: torch.Tensor, cos: torch.Tensor, positions: torch.Tensor | None,
           axes: torch.Tensor | None, pending: UncheckedRange | None) -> torch.Tensor | None:
    """``UncheckedRange`` coordinates made plain with PyTorch operations on their device (no value
    read back): the rows of a 0-d offset spelled out, their range asserted on the device,
    clamped for ``clamp``; coordinates with nothing pending are returned as they are."""
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


def backend_for(xs: Sequence[torch.Tensor], outs: Sequence[torch.Tensor | None],
                cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int,
                positions: torch.Tensor | None = None) -> ModuleType:
    """The backend that runs this call: the one ``ROPELIB_BACKEND`` names (a ValueError if
    it declines), else the first of the device's ``ORDER`` that takes it."""
    return choose_backend(xs, outs, cos, sin, rotary_dim, positions)[0]


def choose_backend(xs: Sequence[torch.Tensor], outs: Sequence[torch.Tensor | None],
                   cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int,
                   positions: torch.Tensor | None = None) -> tuple[ModuleType, object]:
    """(``backend_for``, what the backend worked out when it took the call, for its ``run``:
    the Triton backend's ``Plan``, None for the others)."""
    forced = os.environ.get("ROPELIB_BACKEND")
    if forced:
        if forced not in BACKENDS:
            raise ValueError(f"ROPELIB_BACKEND must be one of {BACKENDS}, got {forced!r}")
        backend, reason = _backend(forced)
        plan = None
        if backend is not None:
            reason, plan = backend.assess(xs, outs, cos, sin, rotary_dim, positions)
        if reason:
            raise ValueError(f"ROPELIB_BACKEND={forced} cannot rotate this call: {reason}")
        return backend, plan
    for name in ORDER.get(xs[0].device.type, ()):
        backend, reason = _backend(name)
        if backend is not None:
            reason, plan = backend.assess(xs, outs, cos, sin, rotary_dim, positions)
            if not reason:
                return backend, plan
    return _backend("eager")[0], None


_MODULES = {"native": ".native", "triton": ".triton_rope", "eager": ".eager"}


@functools.cache
def _backend(name: str) -> tuple[ModuleType | None, str | None]:
    """(the module of the backend ``name``, None), or (None, why it cannot be loaded): each
    is imported here, when the first call asks for it (Triton with the first CUDA tensor)."""
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
    """What the next call of ``apply_rope`` with a contiguous ``dtype`` tensor on ``device``
    does, honouring ``ROPELIB_BACKEND`` (read now, as every call reads it), e.g.
    ``BackendStatus(backend='triton', reason='the first of triton, eager that takes the
    call')``: the backend that runs it and what the others said when they declined, or
    ``backend=None`` with the reason every such call raises (an unknown ``ROPELIB_BACKEND``,
    a forced backend that declines, a device this PyTorch cannot use, a dtype other than
    float16, bfloat16, float32 or float64). Under ``torch.func``
    transforms the rotation runs as PyTorch operations whatever the backend, and a forced
    backend that declines the call raises there too."""
    device = torch.device(device)
    if dtype not in FLOAT_DTYPES:
        return BackendStatus(None, f"x of dtype {dtype}: every call raises TypeError (the "
                                   f"rotation takes {', '.join(map(str, FLOAT_DTYPES))})")
    forced = os.environ.get("ROPELIB_BACKEND")
    if forced and forced not in BACKENDS:
        return BackendStatus(None, f"ROPELIB_BACKEND={forced!r} is not one of {BACKENDS}: "
                                   "every call raises ValueError")
    try:
        probe = _probe(device, dtype)
    except (RuntimeError, AssertionError) as error:  # no such device in this build or machine
        return BackendStatus(None, f"no tensor can be made on {device} here: every call "
                                   f"raises ({type(error).__name__}: {error})")
    if forced:
        reason = _refusal(forced, *probe)
        if reason:
            return BackendStatus(None, f"ROPELIB_BACKEND={forced} forces a backend that "
                                       f"declines this call ({reason}): every such call "
                                       "raises ValueError")
        return BackendStatus(forced, "forced by ROPELIB_BACKEND")
    names = ORDER.get(device.type, ("eager",))
    declined = []
    for name in names:
        backend, reason = _backend(name)
        reason = reason or backend.decline_reason(*probe)
        if not reason:
            return BackendStatus(name, f"the first of {', '.join(names)} that takes the call"
                                 + "".join(f"; {d}" for d in declined))
        declined.append(f"{name} declined: {reason}")
    return BackendStatus("eager", "; ".join(declined) or "no compiled backend for this device")


def _probe(device: torch.device, dtype: torch.dtype) -> tuple:
    """``decline_reason``' arguments for a contiguous ``(1, 1, 2, 8)`` x of ``dtype`` on ``device``
    with float32 rows: what a backend is asked about a usual call."""
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("torch.cuda.is_available() is False"
                           + (" (this PyTorch is built without CUDA)"
                              if torch.version.cuda is None else ""))
    x = torch.empty(1, 1, 2, 8, device=device, dtype=dtype)
    cos = torch.empty(2, 4, device=device)
    return [x], [None], cos, cos, 8, None


def _refusal(forced: str, xs: Sequence[torch.Tensor], outs: Sequence[torch.Tensor | None],
             cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int,
             positions: torch.Tensor | None = None) -> str | None:
    """Why the backend ``forced`` (the value of ``ROPELIB_BACKEND``, read once by the
    caller) cannot take this call (None: it takes it); ``decline_reason``' arguments."""
    if forced not in BACKENDS:
        return f"ROPELIB_BACKEND must be one of {BACKENDS}, got {forced!r}"
    backend, reason = _backend(forced)
    return reason or backend.decline_reason(xs, outs, cos, sin, rotary_dim, positions)


def check_forced_under_transform(x: torch.Tensor) -> None:
    """Under a ``torch.func`` transform the rotation runs as PyTorch operations whatever
    the backend (the kernels take plain tensors only); a forced backend that would decline
    the call (x's dtype on x's device, contiguous) raises as the call without the transform
    does, so a forced backend is never passed over in silence."""
    forced = os.environ.get("ROPELIB_BACKEND")
    if not forced:
        return
    reason = _refusal(forced, *_probe(x.device, x.dtype))
    if reason:
        raise ValueError(f"ROPELIB_BACKEND={forced} cannot rotate this call: {reason} (under "
                         "a torch.func transform the rotation runs as PyTorch operations, but "
                         "a forced backend that declines the call refuses it there too)")
