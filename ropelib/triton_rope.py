"""The GPU kernel: RoPE as one Triton program per block of tokens, tables read once.

A rotation reads x once and writes it once, like a copy; on a GPU the rest of the traffic
is the cos and sin rows. A float32 row of cos and sin is as many bytes as a bfloat16 row of
x, so a kernel that reads them again for every head moves twice the bytes of a copy. Here
each program takes ``BLOCK_S`` tokens of one batch entry, reads their table rows once, and
then walks the heads (of q, then of k, for ``apply_rope_qk``: one launch), rotating one
``(BLOCK_S, head_dim)`` tile per head with the rows it already holds.

- **Layouts.** ``half`` loads the two halves of the rotated channels as two tiles.
  ``interleaved`` loads the rotated channels as one contiguous tile and splits it into the
  pairs (a, b) in registers (``reshape`` + ``split``); loading a and b with a stride of 2
  would be scalar loads, several times slower.
- **Rows.** The rows are given (a slice or a gather, with any strides, broadcast where their
  stride is 0), or read in the kernel from the 2-D tables through positions: one coordinate
  per token (per-row positions) or, for multi-axis RoPE whose pairs each follow one axis
  (M-RoPE), coordinate ``axes[i]`` for pair i. A coordinate outside the table reads no
  memory and turns its rows to NaN (the callers assert the range too, on the device).
- **Arithmetic** in float32 whatever the storage (tables of any float dtype are widened on
  load, x is widened on load and rounded once on store); ``inverse`` rotates by -theta, the
  gradient's rotation. Channels past ``rotary_dim`` are copied unless the rotation is in place.
- **Strides.** x and out may have any strides whose channel stride is 1 (q and k as views of
  a fused projection in ``(batch, seq, heads, dim)`` storage, a slice of a KV cache): the
  leading dims become a batch dim, along which the rows vary, and a heads dim, along which
  they are shared; dims that cannot be merged into those two leave the call to eager PyTorch.

``decline_reason`` says whether the kernel takes a call (and why not), ``assess`` says it with
the ``Plan`` that ``run`` takes on, ``run`` runs it: the interface every backend of
``ropelib.kernels`` has, with what this one can do that the others cannot (``CHECKS_PENDING``,
``run_cache``, ``prepare``). ``find_plan`` gives the verdict as that ``Plan``: one lookup
per call, by the tensors' shapes, strides and dtypes, for the verdict and the prepared
launch. ``run``'s launch has two halves,
``prepare`` (its numbers) and ``launch`` (made with the tensors' addresses), which
``ropelib.plans`` calls apart. CUDA tensors run the compiled kernel; CPU tensors run it in
Triton's interpreter (``ROPELIB_BACKEND=triton``), which is how the tests check every
feature on machines without a GPU. Nothing of a tensor is kept between calls
(the plans hold numbers and dtypes).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from ._checks import new_output

NAME = "triton"
CHECKS_PENDING = True  # the launch checks coordinates still pending (``kernels.UncheckedRange``)
CHECKS_COORDINATES = False  # settled ones are checked before ``run`` (on the CPU)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
TILE_ELEMENTS = 2048  # elements of x in one (BLOCK_S, head_dim) tile
HEADS_PER_PROGRAM = 4
MAX_GRID_Y = 65535  # CUDA's limit on the grid's second dim (the batch)


def _rope(X1, O1, X2, O2, X3, O3, COS, SIN, POS, AXES, SLOT,
          H1, x1_b, x1_h, x1_s, o1_b, o1_h, o1_s,
          H2, x2_b, x2_h, x2_s, o2_b, o2_h, o2_s,
          H3, x3_b, x3_h, x3_s, o3_b, o3_h, o3_s,
          c_b, c_h, c_s, c_i, s_b, s_h, s_s, s_i, p_b, p_s, p_k, a_i,
          AXIS_COUNT, TABLE_LEN, SEQ, CAPACITY,
          HEADS_PER_PROGRAM: tl.constexpr, ROTARY: tl.constexpr, HEAD_DIM: tl.constexpr,
          BLOCK_S: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_R: tl.constexpr,
          BLOCK_D: tl.constexpr, HALF: tl.constexpr, INVERSE: tl.constexpr,
          MODE: tl.constexpr, ROWS_PER_HEAD: tl.constexpr, STEP: tl.constexpr,
          CLAMP: tl.constexpr, CHECK: tl.constexpr, SLOTTED: tl.constexpr):
    """Rotate heads [g * HEADS_PER_PROGRAM, ...) of the H1 + H2 heads (x1's, then x2's) and
    copy those of x3 (H3 heads, BLOCK_D > 0), at tokens [t * BLOCK_S, ...) of batch entry b,
    for program (t, b, g).

    MODE 0: rows given (strides c_*, s_*); 1: one coordinate per token, POS[b, s] (+ s with
    STEP: POS is a 0-d offset); 2: M-RoPE, pair i reads coordinate AXES[i] (stride a_i) of
    POS[b, s, :].
    CLAMP: coordinates past the table read its last row. CHECK: coordinates outside the table
    (and axes outside [0, AXIS_COUNT)) fail a device-side assertion that names them (a CUDA
    kernel is compiled with debug on; Triton's interpreter runs no assertion unless its
    options ask for it); their rows are NaN either way and read no memory. SLOTTED: x2 and x3
    go to rows SLOT[0] + s of their destinations (a KV cache of CAPACITY rows), asserted to
    lie inside it (no row outside is written). BLOCK_R > 0: copy channels ROTARY.. of each
    rotated head (the pass-through of a partial rotation).
    """
    t = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    g = tl.program_id(2)
    s = t * BLOCK_S + tl.arange(0, BLOCK_S)
    i = tl.arange(0, BLOCK_P)
    rows = s < SEQ
    pairs = i < ROTARY // 2
    mask = rows[:, None] & pairs[None, :]
    s64 = s.to(tl.int64)
    if MODE == 0:
        cos_at = COS + b * c_b + s64[:, None] * c_s + i[None, :] * c_i
        sin_at = SIN + b * s_b + s64[:, None] * s_s + i[None, :] * s_i
        row_mask = mask
    else:
        if MODE == 1:
            coord = tl.load(POS + b * p_b + s64 * p_s, mask=rows, other=0).to(tl.int64)
            if STEP:
                coord = coord + s64
            coord = coord[:, None]
        else:
            axis = tl.load(AXES + i * a_i, mask=pairs, other=0).to(tl.int64)
            axis_ok = (axis >= 0) & (axis < AXIS_COUNT)
            if CHECK:
                tl.device_assert(axis_ok | (pairs == 0),
                                 "ropelib: axes must be in [0, k), k = positions.shape[-1]")
            coord = tl.load(POS + b * p_b + s64[:, None] * p_s + axis[None, :] * p_k,
                            mask=mask & axis_ok[None, :], other=-1).to(tl.int64)
        if CLAMP:
            coord = tl.minimum(coord, TABLE_LEN - 1)
        inside = (coord >= 0) & (coord < TABLE_LEN)
        if CHECK:
            if CLAMP:
                tl.device_assert(inside | (mask == 0), "ropelib: positions must be >= 0")
            elif STEP:
                tl.device_assert(inside | (mask == 0), "ropelib: offset + row must be >= 0 "
                                 "and < the cos/sin table length")
            else:
                tl.device_assert(inside | (mask == 0), "ropelib: positions must be >= 0 and "
                                 "< the cos/sin table length")
        row_mask = mask & inside
        cos_at = COS + coord * c_s + i[None, :] * c_i
        sin_at = SIN + coord * s_s + i[None, :] * s_i
    if not ROWS_PER_HEAD:
        cos = tl.load(cos_at, mask=row_mask, other=0.0).to(tl.float32)
        if MODE != 0:  # a coordinate outside the table turns its row to NaN, never to memory
            cos = tl.where(inside, cos, float("nan"))
        sin = tl.load(sin_at, mask=row_mask, other=0.0).to(tl.float32)
        if INVERSE:
            sin = -sin
    if SLOTTED:
        dest = tl.load(SLOT).to(tl.int64) + s64
        in_cache = (dest >= 0) & (dest < CAPACITY)
        tl.device_assert(in_cache | (rows == 0), "ropelib: cache_position + row must be in "
                         "[0, capacity) of the KV cache")
    if BLOCK_R > 0:
        r = ROTARY + tl.arange(0, BLOCK_R)
        rest = r < HEAD_DIM
    if BLOCK_D > 0:
        d = tl.arange(0, BLOCK_D)
        channels = d < HEAD_DIM
    if not HALF:
        c = tl.arange(0, 2 * BLOCK_P)
        pair_channels = c < ROTARY
    first = g * HEADS_PER_PROGRAM
    rotated = H1 + H2
    for j in tl.static_range(HEADS_PER_PROGRAM):  # unrolled: the heads' loads overlap
        head = first + j
        second = head >= H1
        third = head >= rotated
        h = tl.where(third, head - rotated, tl.where(second, head - H1, head)).to(tl.int64)
        x_at = tl.where(third, X3 + b * x3_b + h * x3_h,
                        tl.where(second, X2 + b * x2_b + h * x2_h, X1 + b * x1_b + h * x1_h))
        o_at = tl.where(third, O3 + b * o3_b + h * o3_h,
                        tl.where(second, O2 + b * o2_b + h * o2_h, O1 + b * o1_b + h * o1_h))
        x_at = x_at + s64[:, None] * tl.where(third, x3_s, tl.where(second, x2_s, x1_s))
        o_step = tl.where(third, o3_s, tl.where(second, o2_s, o1_s))
        live = s < tl.where(head < rotated + H3, SEQ, 0)  # this head's rows (none past the last)
        if SLOTTED:  # x2 and x3 into the cache's rows, and only inside it
            o_at = o_at + tl.where(second, dest, s64)[:, None] * o_step
            live = tl.where(second, live & in_cache, live)
        else:
            o_at = o_at + s64[:, None] * o_step
        turn = tl.where(third, False, live)  # (a scalar & a vector is refused by the interpreter)
        if ROWS_PER_HEAD:
            cos = tl.load(cos_at + h * c_h, mask=row_mask & turn[:, None],
                          other=0.0).to(tl.float32)
            sin = tl.load(sin_at + h * s_h, mask=row_mask & turn[:, None],
                          other=0.0).to(tl.float32)
            if INVERSE:
                sin = -sin
        turn_mask = turn[:, None] & pairs[None, :]
        if HALF:
            a = tl.load(x_at + i[None, :], mask=turn_mask, other=0.0).to(tl.float32)
            z = tl.load(x_at + ROTARY // 2 + i[None, :], mask=turn_mask,
                        other=0.0).to(tl.float32)
        else:
            both = turn[:, None] & pair_channels[None, :]
            tile = tl.load(x_at + c[None, :], mask=both, other=0.0).to(tl.float32)
            a, z = tl.split(tl.reshape(tile, (BLOCK_S, BLOCK_P, 2)))
        a_new = a * cos - z * sin
        z_new = a * sin + z * cos
        if HALF:
            tl.store(o_at + i[None, :], a_new.to(O1.dtype.element_ty), mask=turn_mask)
            tl.store(o_at + ROTARY // 2 + i[None, :], z_new.to(O1.dtype.element_ty),
                     mask=turn_mask)
        else:
            tile = tl.reshape(tl.join(a_new, z_new), (BLOCK_S, 2 * BLOCK_P))
            tl.store(o_at + c[None, :], tile.to(O1.dtype.element_ty), mask=both)
        if BLOCK_R > 0:
            rest_mask = turn[:, None] & rest[None, :]
            tl.store(o_at + r[None, :], tl.load(x_at + r[None, :], mask=rest_mask),
                     mask=rest_mask)
        if BLOCK_D > 0:  # x3: copied whole (the values of a cache step)
            copy_mask = tl.where(third, live, False)[:, None] & channels[None, :]
            tl.store(o_at + d[None, :], tl.load(x_at + d[None, :], mask=copy_mask),
                     mask=copy_mask)


def _cuda_options() -> dict:
    """Compile options of the CUDA kernel: debug on, so its device-side assertions run, and
    Triton's integer overflow checks (which debug also turns on, where the installed Triton
    has them) off: they would check every index computation."""
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        return {}
    return {"sanitize_overflow": False} if "sanitize_overflow" in getattr(
        CUDAOptions, "__dataclass_fields__", {}) else {}


_compiled = triton.jit(_rope, debug=True)
_interpreted = InterpretedFunction(_rope)
_CUDA_OPTIONS = _cuda_options()
# Triton 3.4 and later launch a compiled kernel with every argument, constexprs included
_RAW_LAUNCH = tuple(int(v) for v in triton.__version__.split(".")[:2]) >= (3, 4)
_launchers: dict[tuple, object] = {}  # prepared launches, by shapes, strides, dtypes, alignment
MAX_LAUNCHERS = 1024


class Config(NamedTuple):
    """A launch's shape: tokens per program, heads per program, warps."""

    block_s: int
    heads_per_program: int
    num_warps: int


class Launch(NamedTuple):
    """One call's launch, worked out from its tensors' shapes, strides and dtypes: the grid,
    the integer arguments in the kernel's order, its constexprs and warps."""

    grid: tuple[int, int, int]
    scalars: tuple[int, ...]
    constexprs: tuple[tuple[str, object], ...]
    num_warps: int


class _Operand(NamedTuple):
    """x and its destination as (batch, heads, seq) strides, and the heads count."""

    x: torch.Tensor
    out: torch.Tensor
    heads: int
    x_strides: tuple[int, int, int]
    out_strides: tuple[int, int, int]


class Plan:
    """What ``find_plan`` worked out from a call's tensors: their (shape, strides, dtype)
    (``metas``, built once per call), why the kernel declines such a call (``reason``;
    None: it takes it), and the launches of such calls, prepared by ``launch`` as they are
    first asked for. One per (shape, strides, dtype) of the tensors (``_plan_for``): it
    holds numbers and dtypes only, never a tensor."""

    __slots__ = ("metas", "reason", "_launches")
    MAX_LAUNCHES = 64  # launches kept per plan (tile configs, layouts, ...)

    def __init__(self, metas: tuple | None, reason: str | None) -> None:
        self.metas, self.reason = metas, reason
        self._launches: dict[tuple, Launch | None] = {}

    def launch(self, *call: object) -> Launch | None:
        """``_prepare`` of these tensors and ``call`` (its arguments after the tensors'),
        worked out once (a dict: threads that race work out the same launch)."""
        try:
            return self._launches[call]
        except KeyError:
            pass
        launch = _prepare(*self.metas, *call)
        if len(self._launches) >= self.MAX_LAUNCHES:
            self._launches.clear()
        self._launches[call] = launch
        return launch


def find_plan(xs: Sequence[torch.Tensor], outs: Sequence[torch.Tensor | None], cos: torch.Tensor,
            sin: torch.Tensor, rotary_dim: int, positions: torch.Tensor | None) -> Plan:
    """``decline_reason``' verdict in a ``Plan`` (``.reason``), which ``run`` takes on (``plan=``)
    so that a call builds its tensors' keys and looks them up once."""
    x = xs[0]
    if not (x.is_cuda or x.is_cpu):
        return Plan(None, "Triton runs on CUDA tensors (and on the CPU in its interpreter), "
                          f"got {x.device}")
    if any(t.is_neg() or t.is_conj() for t in (*xs, *(o for o in outs if o is not None),
                                                cos, sin)):
        return Plan(None, "x, out, cos and sin must not be lazily negated or conjugated views")
    return _plan_for(tuple(_meta(t) for t in xs),
                     tuple(None if o is None else _meta(o) for o in outs), _meta(cos),
                     _meta(sin), None if positions is None else _meta(positions))


def assess(xs: Sequence[torch.Tensor], outs: Sequence[torch.Tensor | None], cos: torch.Tensor,
           sin: torch.Tensor, rotary_dim: int, positions: torch.Tensor | None
           ) -> tuple[str | None, Plan]:
    """(``decline_reason``, the ``Plan`` that ``run``, ``run_cache`` and ``prepare`` take on):
    what ``ropelib.kernels`` asks every backend."""
    plan = find_plan(xs, outs, cos, sin, rotary_dim, positions)
    return plan.reason, plan


def decline_reason(xs: Sequence[torch.Tensor], outs: Sequence[torch.Tensor | None], cos: torch.Tensor,
             sin: torch.Tensor, rotary_dim: int, positions: torch.Tensor | None) -> str | None:
    """None when the kernel takes the call, else why not (a sentence); worked out once per
    shapes, strides and dtypes (``find_plan``)."""
    return find_plan(xs, outs, cos, sin, rotary_dim, positions).reason


@functools.lru_cache(maxsize=512)
def _plan_for(xs: tuple, outs: tuple, cos: tuple, sin: tuple, positions: tuple | None) -> Plan:
    """The ``Plan`` of tensors of these (shape, strides, dtype) (None: a new destination)."""
    return Plan((xs, outs, cos, sin, positions), _reason_to_decline(xs, outs, cos, sin, positions))


def _reason_to_decline(xs: tuple, outs: tuple, cos: tuple, sin: tuple, positions: tuple | None
             ) -> str | None:
    """``decline_reason`` for tensors of these (shape, strides, dtype)."""
    shape, dtype = xs[0][0], xs[0][2]
    for t_shape, t_strides, t_dtype in (*xs, *(o for o in outs if o is not None)):
        if t_dtype not in DTYPES:
            return f"the kernel takes {', '.join(map(str, DTYPES))}, got {t_dtype}"
        if t_shape[-1] > 1 and t_strides[-1] != 1:
            return "the channels of x and out must be contiguous (stride 1)"
        if t_dtype != dtype:
            return "q, k and their destinations must have one dtype"
    leading = _plan(tuple(m[:2] for m in xs), tuple(
        (x if o is None else o)[:2] for x, o in zip(xs, outs, strict=True)), cos[:2], sin[:2],
        None if positions is None else positions[:2])
    if leading is None:
        return ("the leading dims of x, out and the rows cannot be merged into a batch dim "
                "(rows vary) and a heads dim (rows shared)")
    if leading[0] > MAX_GRID_Y:
        return f"at most {MAX_GRID_Y} batch entries with rows of their own, got {leading[0]}"
    if any(t[0][:-3] != shape[:-3] or t[0][-2:] != shape[-2:] for t in xs[1:]):
        return "q and k must have the same shape but for the heads dim (-3)"
    return None


def run(xs: Sequence[torch.Tensor], outs: Sequence[torch.Tensor | None], cos: torch.Tensor,
        sin: torch.Tensor, layout: str, rotary_dim: int, inverse: bool,
        positions: torch.Tensor | None, axes: torch.Tensor | None,
        config: Config | None = None, *, pending=None, plan: Plan | None = None
        ) -> list[torch.Tensor]:
    """R_Theta x for every x in ``xs`` (one launch), into ``outs`` (None: a new tensor,
    ``new_output``; x itself: in place), after ``decline_reason`` returned None.

    Args:
        xs: one or two tensors ``(..., heads, seq, head_dim)`` of one shape but for the heads.
        outs: a destination (or None) per x.
        cos, sin: rows broadcastable to ``(..., seq, rotary_dim // 2)``, or with
            ``positions`` the 2-D tables ``(table_len, rotary_dim // 2)``.
        layout: ``"interleaved"`` or ``"half"``.
        rotary_dim: rotated channels; the rest are copied (unless in place).
        inverse: rotate by -theta.
        positions: coordinates ``(..., seq, k)`` with x's number of dims, broadcastable to
            its rows; pair i reads coordinate ``axes[i]`` (``axes`` None: k is 1).
        axes: ``(rotary_dim // 2,)`` integers in ``[0, k)``, or None.
        config: the launch's tile shape; default ``choose_config``.
        pending: ``ropelib.kernels.UncheckedRange`` of coordinates whose range nobody checked yet
            (a GPU call reads no value on the host): the kernel checks them (and clamps
            them to the table for ``pending.clamp``); with ``pending.step`` the coordinates
            are a 0-d offset (any shape of ones) and row s is at offset + s.
        plan: ``find_plan`` of these arguments, when the caller asked it (else asked here).

    Returns:
        The destinations, in the order of ``xs``.
    """
    plan = plan or find_plan(xs, outs, cos, sin, rotary_dim, positions)
    new = [new_output(x) if o is None else o
           for x, o in zip(xs, outs, strict=True)]
    _rotate(plan, xs, new, cos, sin, layout, rotary_dim, inverse, positions, axes, config,
            pending)
    return new


def run_cache(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_cache: torch.Tensor,
              value_cache: torch.Tensor, slot: torch.Tensor, cos: torch.Tensor,
              sin: torch.Tensor, layout: str, rotary_dim: int,
              positions: torch.Tensor | None, axes: torch.Tensor | None, pending=None,
              plan: Plan | None = None) -> torch.Tensor:
    """One launch of a decode step's rotation and cache write: q rotated into a new tensor,
    k rotated straight into ``key_cache[..., slot + 0 .. n - 1, :]`` and v copied into
    ``value_cache`` there (q, k and v ``(..., heads, n, head_dim)``, the caches ``(...,
    kv_heads, capacity, head_dim)``, ``slot`` a 0-d integer tensor on the device, read by
    the kernel). Rows or positions as for ``run`` (shared by q and k); ``decline_reason`` must
    have taken ``[q, k, v]`` with destinations ``[None, key_cache, value_cache]`` (``plan``:
    its ``find_plan``, else asked here).

    Returns:
        The rotated q.
    """
    plan = plan or find_plan([q, k, v], [None, key_cache, value_cache], cos, sin, rotary_dim,
                           positions)
    q_out = new_output(q)
    _rotate(plan, [q, k, v], [q_out, key_cache, value_cache], cos, sin, layout, rotary_dim,
            False, positions, axes, None, pending, slot)
    return q_out


def _rotate(plan, xs, outs, cos, sin, layout, rotary_dim, inverse, positions, axes, config,
            pending, slot=None) -> None:
    """``run`` into the given destinations (``plan``: their tensors' ``find_plan``, with None
    for a new destination); with ``slot``, the last x is copied (not rotated) and the
    destinations of all but the first are written from row ``slot``."""
    in_place = all(o.data_ptr() == t.data_ptr() for t, o in zip(xs, outs, strict=True))
    launch(prepare(plan, xs, outs, layout, rotary_dim, inverse, axes, pending,
                   slot is not None, in_place, config), xs, outs, cos, sin, positions, axes, slot)


def prepare(plan: Plan, xs: Sequence[torch.Tensor], outs: Sequence[torch.Tensor | None],
            layout: str, rotary_dim: int, inverse: bool, axes: torch.Tensor | None,
            pending, slotted: bool, in_place: bool, config: Config | None = None
            ) -> Launch | None:
    """The launch of a call that ``plan`` (``find_plan`` of its tensors) takes, arguments as
    for ``run`` (``slotted``: a cache step, ``run_cache``; ``in_place``: every destination
    is its x, so the pass-through channels are not copied): every number the kernel gets
    but its pointers (None: empty tensors, nothing to launch)."""
    return plan.launch(
        layout, rotary_dim, inverse, None if axes is None else (*axes.shape, *axes.stride()),
        pending is not None and pending.step, pending is not None and pending.clamp,
        pending is not None, slotted, xs[0].is_cuda, config, in_place)


def launch(prepared: Launch | None, xs: Sequence[torch.Tensor], outs: Sequence[torch.Tensor],
           cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor | None,
           axes: torch.Tensor | None, slot: torch.Tensor | None = None) -> None:
    """Launches ``prepared`` (``prepare``'s) on these tensors: only their addresses are
    read, the rest (strides too) is in the launch: x, the destinations, the tables, the
    coordinates and axes and the slot as ``run`` and ``run_cache`` take them, or tensors
    that start at the same addresses."""
    if prepared is None:
        return
    x = xs[0]
    two = xs[1] if len(xs) > 1 else x
    three = xs[2] if slot is not None else x
    placeholder = cos  # an unused pointer argument (Triton wants a tensor there)
    tensors = (x, outs[0], two, outs[1] if len(xs) > 1 else outs[0], three, outs[-1], cos, sin,
               placeholder if positions is None else positions,
               placeholder if axes is None else axes, placeholder if slot is None else slot)
    _launch(x, prepared, tensors)


def _meta(t: torch.Tensor) -> tuple:
    """(shape, strides, dtype): what the launch of t depends on but its pointer."""
    return t.shape, t.stride(), t.dtype


def _prepare(xs: tuple, outs: tuple, cos: tuple, sin: tuple, positions: tuple | None,
             layout: str, rotary_dim: int, inverse: bool,
             pairs_with_axes: tuple[int, int] | None,
             step: bool, clamp: bool, check: bool, slotted: bool, cuda: bool,
             config: Config | None, in_place: bool) -> Launch | None:
    """The launch of a call with tensors of these (shape, strides, dtype) (an out of None: a
    new tensor, ``new_output``): every number the kernel gets but its pointers, worked out once per
    shape (``Plan.launch``: a launch's Python costs more than the kernel of a decode step).
    ``pairs_with_axes``: (pairs, stride) of ``axes``, None without. None: nothing to do (an
    empty tensor)."""
    def drop(meta):
        return None if meta is None else meta[:2]

    outs = tuple((x[0], _new_strides(x, cuda)) if o is None else o[:2]
                 for x, o in zip(xs, outs, strict=True))
    capacity = outs[-1][0][-2]
    batch, plan, table_strides, position_strides = _plan(
        tuple(m[:2] for m in xs), outs, cos[:2], sin[:2], drop(positions))
    seq, head_dim = xs[0][0][-2], xs[0][0][-1]
    heads = [p[0] for p in plan]
    if not (sum(heads) and batch and seq and head_dim):
        return None
    config = config or choose_config(batch, sum(heads), seq, head_dim, cuda,
                                     pairs_with_axes is not None)
    operands = [(heads_k, *x_strides, *out_strides) for heads_k, x_strides, out_strides in plan]
    zero = (0,) * 7
    one, two = operands[0], operands[1] if len(operands) > 1 else zero
    three = operands[2] if slotted else zero
    mode = 0 if positions is None else (1 if pairs_with_axes is None else 2)
    rest = head_dim - rotary_dim
    scalars = (*one, *two, *three, *table_strides, *position_strides,
               0 if pairs_with_axes is None else pairs_with_axes[1],
               positions[0][-1] if positions is not None else 1, cos[0][0], seq, capacity)
    grid = (-(-seq // config.block_s), batch, -(-sum(heads) // config.heads_per_program))
    constexprs = (
        ("HEADS_PER_PROGRAM", config.heads_per_program), ("ROTARY", rotary_dim),
        ("HEAD_DIM", head_dim), ("BLOCK_S", config.block_s),
        ("BLOCK_P", _pow2(rotary_dim // 2)),
        ("BLOCK_R", 0 if (in_place or not rest) else _pow2(rest)),
        ("BLOCK_D", _pow2(head_dim) if slotted else 0), ("HALF", layout == "half"),
        ("INVERSE", inverse), ("MODE", mode),
        ("ROWS_PER_HEAD", mode == 0 and bool(table_strides[1] or table_strides[5])),
        ("STEP", step), ("CLAMP", clamp), ("CHECK", check), ("SLOTTED", slotted))
    return Launch(grid, scalars, constexprs, config.num_warps)


def _new_strides(x: tuple, cuda: bool) -> tuple[int, ...]:
    """The strides of ``new_output`` of a tensor x = (shape, strides, dtype) on a GPU
    (``cuda``) or on the CPU, worked out on a meta tensor of x's layout."""
    shape, strides, dtype = x
    return new_output(torch.empty_strided(shape, strides, dtype=dtype, device="meta"),
                      cuda).stride()


def _launch(x: torch.Tensor, launch: Launch, tensors: tuple) -> None:
    """Launches the kernel: in Triton's interpreter for CPU tensors; on a GPU on x's device,
    which Triton takes to be the current one (a model split over GPUs, e.g. Hugging Face's
    ``device_map="auto"``, calls with tensors on another: the launch then runs with x's
    device made current, and the current device is restored)."""
    if not x.is_cuda:
        grid, scalars, constexprs, _ = launch
        _interpreted[grid](*tensors, *scalars, **dict(constexprs))
        return
    device = x.get_device()
    if device == torch.cuda.current_device():
        _launch_on(device, launch, tensors)
        return
    with torch.cuda.device(device):
        _launch_on(device, launch, tensors)


def _launch_on(device: int, launch: Launch, tensors: tuple) -> None:
    """``_launch`` on the current device, ``device``: through Triton's JIT the first time a
    key is seen (it compiles and specializes), then straight through the compiled kernel's
    launcher with the same arguments (the JIT's own argument binding costs several
    microseconds a call). The key holds every value the kernel is specialized on: the
    integers, the dtypes and whether each pointer is 16-byte aligned."""
    grid, scalars, constexprs, num_warps = launch
    key = (launch, device, *(t.dtype for t in tensors),
           *(t.data_ptr() % 16 == 0 for t in tensors))
    go = _launchers.get(key)
    if go is not None:
        go(tensors)
        return
    kernel = _compiled[grid](*tensors, *scalars, **dict(constexprs), num_warps=num_warps,
                             **_CUDA_OPTIONS)
    arguments = len(tensors) + len(scalars) + len(constexprs)
    if _RAW_LAUNCH and len(getattr(getattr(kernel, "src", None), "signature", ())) == arguments:
        if len(_launchers) >= MAX_LAUNCHERS:
            _launchers.clear()
        _launchers[key] = _launcher_for(kernel[grid], launch, device)


def _launcher_for(runner: Callable, launch: Launch, device: int) -> Callable[[Sequence], None]:
    """``runner`` (a compiled kernel's launcher for ``launch.grid``) with ``launch``'s
    numbers, on ``device``'s current stream: a function of the pointer arguments alone
    (tensors, or their addresses as ints, which Triton's launcher takes as they are)."""
    tail = (*launch.scalars, *(value for _, value in launch.constexprs))
    current_stream = triton.runtime.driver.active.get_current_stream

    def go(pointers: Sequence) -> None:
        runner(*pointers, *tail, stream=current_stream(device))
    return go


def choose_config(batch: int, heads: int, seq: int, head_dim: int, cuda: bool,
                  mrope: bool = False) -> Config:
    """Tiles of ``TILE_ELEMENTS`` elements of x and ``HEADS_PER_PROGRAM`` heads a program, 8
    warps: the best of 48 tile shapes for both layouts and dtypes on an H200 at (4, 32, 4096,
    128) (``bench_gpu.py --sweep``, benchmarks/results/2026-11-26-h200.txt). M-RoPE
    (``mrope``: each pair gathers its own table row) over at least a tile of tokens takes
    half the tokens, a quarter of the heads (rounded up) a program and 4 warps: the best of
    16 tile shapes at each of three shapes (q 16 + k 2, 28 + 4 and 12 + 2 heads, 2048-4096
    tokens) on an H200, 0.97-1.03x copying both against 1.22x for the default
    (benchmarks/results/2026-11-27-h200-run5.txt). The interpreter runs one program per
    token block and batch entry (its programs run one after another)."""
    block_s = max(1, min(_pow2(seq), TILE_ELEMENTS // _pow2(head_dim)))
    if not cuda:
        return Config(block_s, max(heads, 1), 8)
    if mrope and seq >= TILE_ELEMENTS // _pow2(head_dim):
        return Config(max(1, block_s // 2), max(1, -(-heads // 4)), 4)
    return Config(block_s, HEADS_PER_PROGRAM, 8)


def _pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


@functools.lru_cache(maxsize=256)
def _plan(xs: tuple, outs: tuple, cos: tuple, sin: tuple, positions: tuple | None):
    """x's leading dims (all but seq and channels) as a batch dim and a heads dim: (batch,
    per x (heads, its (b, h, s) strides, its destination's), the tables' (b, h, s, channel)
    strides for cos then sin, the positions' (b, s, k) strides), or None when they cannot be
    merged so. The rows (or positions) may vary along the batch dim; along the heads dim they
    are shared (a stride of 0), except for given rows with a heads dim of their own (then read
    per head, for one x only). Each argument is (shape, strides).

    The leading dims are cut once into outer dims (the batch) and inner dims (the heads),
    the same cut for q and k (they differ only in their heads dim), and each tensor's groups
    are merged on their own strides: q contiguous and k a ``(batch, seq, heads, dim)`` view
    both become (batch, heads). The first cut that works is taken, with rows shared by the
    heads before rows read per head, and then the most dims among the heads."""
    shape = xs[0][0]
    lead = len(shape) - 2
    source = cos if positions is None else positions
    row_strides = [_broadcast_stride(source, len(shape), d) for d in range(lead)]
    sin_strides = row_strides if positions is not None else [
        _broadcast_stride(sin, len(shape), d) for d in range(lead)]
    per_head_rows = (False,) if positions is not None or len(xs) > 1 else (False, True)
    for rows_per_head in per_head_rows:
        for cut in range(lead + 1):
            plan = _split_batch_heads(xs, outs, row_strides, sin_strides, cut, rows_per_head)
            if plan is not None:
                break
        else:
            continue
        break
    else:
        return None
    batch_dim, operands, heads_rows = plan
    if positions is None:
        tables = (batch_dim[3], heads_rows[0], _row_stride(cos), cos[1][-1],
                  batch_dim[4], heads_rows[1], _row_stride(sin), sin[1][-1])
        return batch_dim[0], operands, tables, (0, 0, 0)
    tables = (0, 0, cos[1][0], cos[1][1], 0, 0, sin[1][0], sin[1][1])
    return batch_dim[0], operands, tables, (batch_dim[3], _row_stride(positions),
                                            positions[1][-1])


def _split_batch_heads(xs: tuple, outs: tuple, row_strides: list[int], sin_strides: list[int],
                       cut: int, rows_per_head: bool) -> tuple | None:
    """``_plan`` with the leading dims ``[:cut]`` as the batch and ``[cut:]`` as the heads:
    (the batch dim (size, then strides of x, out, cos, sin), per x (heads, x's strides, the
    destination's), the rows' strides along the heads), or None where a group does not merge
    into one dim, q and k differ in their batch, or the rows vary along the heads (allowed
    with ``rows_per_head``, for one x)."""
    one = (1, 0, 0, 0, 0)
    base, operands = None, []
    for (x_shape, x_stride), (_, o_stride) in zip(xs, outs, strict=True):
        dims = [(x_shape[d], x_stride[d], o_stride[d], row_strides[d], sin_strides[d])
                for d in range(len(x_shape) - 2)]
        outer, inner = _merge_dims(dims[:cut]), _merge_dims(dims[cut:])
        if outer is None or inner is None or len(outer) > 1 or len(inner) > 1:
            return None
        b_dim, h_dim = (outer or [one])[0], (inner or [one])[0]
        if (h_dim[3] or h_dim[4]) and not rows_per_head:
            return None
        if base is not None and (b_dim[0] != base[0] or b_dim[3:] != base[3:]):
            return None  # q and k must share the batch dim and the rows
        base = base or b_dim
        operands.append((h_dim[0], (b_dim[1], h_dim[1], x_stride[-2]),
                         (b_dim[2], h_dim[2], o_stride[-2])))
    return base, operands, (h_dim[3], h_dim[4])


def _broadcast_stride(t: tuple, ndim: int, d: int) -> int:
    """The stride along dim d of a tensor with ``ndim`` dims that t = (shape, strides)
    broadcasts against (0 where t lacks the dim or has size 1)."""
    shape, strides = t
    k = d - (ndim - len(shape))
    if k < 0 or shape[k] == 1:
        return 0
    return strides[k]


def _row_stride(t: tuple) -> int:
    """The stride of t = (shape, strides) along its rows (dim -2); 0 for a single row."""
    return 0 if t[0][-2] == 1 else t[1][-2]


def _merge_dims(dims: list[tuple[int, ...]]) -> list[tuple[int, ...]] | None:
    """Leading dims (size, then a stride per tensor) merged where every tensor's strides
    allow it, size-1 dims dropped; None when more than two remain."""
    merged: list[tuple[int, ...]] = []
    for dim in dims:
        if dim[0] == 1:
            continue
        if merged:
            size, *strides = merged[-1]
            if all(outer == inner * dim[0] for outer, inner in zip(strides, dim[1:], strict=True)):
                merged[-1] = (size * dim[0], *dim[1:])
                continue
        merged.append(dim)
    return merged if len(merged) <= 2 else None
