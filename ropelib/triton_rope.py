"""The GPU kernel: RoPE as one Triton program per block of tokens, tables read once.

A program reads ``BLOCK_S`` tokens' cos and sin rows once (given, or through positions) and
rotates them in float32 in each head of q, then of k (one launch). x and out: any strides,
contiguous channels, leading dims that merge into a batch and a heads dim. ``ropelib.kernels``'
backend interface, ``prepare`` and ``launch``; CPU tensors run in Triton's interpreter.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from ._checks import new_output

NAME = "triton"
CHECKS_PENDING = True  # the launch checks coordinates still pending (``kernels.UncheckedRange``)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
TILE_ELEMENTS = 2048  # elements of x in one (BLOCK_S, head_dim) tile
HEADS_PER_PROGRAM = 4
MAX_GRID_Y = 65535  # CUDA's limit on the grid's second dim (the batch)


def _rope(X1, O1, X2, O2, X3, O3, COS, SIN, POS, AXES, SLOT,
          H1, x1_b, x1_h, x1_s, o1_b, o1_h, o1_s, H2, x2_b, x2_h, x2_s, o2_b, o2_h, o2_s,
          H3, x3_b, x3_h, x3_s, o3_b, o3_h, o3_s, c_b, c_s, c_i, s_b, s_s, s_i,
          p_b, p_s, p_k, a_i, AXIS_COUNT, TABLE_LEN, SEQ, CAPACITY,
          HEADS_PER_PROGRAM: tl.constexpr, ROTARY: tl.constexpr, HEAD_DIM: tl.constexpr,
          BLOCK_S: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_R: tl.constexpr,
          BLOCK_D: tl.constexpr, HALF: tl.constexpr, INVERSE: tl.constexpr,
          MODE: tl.constexpr, STEP: tl.constexpr, CLAMP: tl.constexpr, CHECK: tl.constexpr):
    """Program (t, b, g): tokens [t * BLOCK_S, ...) of batch entry b, heads [g *
    HEADS_PER_PROGRAM, ...) of x1's H1 heads, then x2's H2, then (BLOCK_D > 0) x3's H3, copied
    (x_i, o_i: (batch, heads, seq) strides). MODE 0: rows given, cos[b, s, i] (strides c_*,
    sin's s_*); 1: table row POS[b, s] (+ s with STEP: a 0-d offset); 2: M-RoPE, pair i reads
    row POS[b, s, AXES[i]]. A coordinate outside the table reads no memory and turns its rows
    to NaN; CLAMP: past the table reads its last row; CHECK: outside the table (or axes outside
    [0, AXIS_COUNT)) fails a device-side assertion. BLOCK_D > 0: x2 and x3 go to rows SLOT[0]
    + s of a KV cache of CAPACITY rows, asserted inside it. BLOCK_R > 0: channels ROTARY.. are
    copied."""
    b = tl.program_id(1).to(tl.int64)
    s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
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
        if MODE == 2:
            axis = tl.load(AXES + i * a_i, mask=pairs, other=0).to(tl.int64)
            axis_ok = (axis >= 0) & (axis < AXIS_COUNT)
            if CHECK:
                tl.device_assert(axis_ok | (pairs == 0),
                                 "ropelib: axes must be in [0, k), k = positions.shape[-1]")
            coord = tl.load(POS + b * p_b + s64[:, None] * p_s + axis[None, :] * p_k,
                            mask=mask & axis_ok[None, :], other=-1).to(tl.int64)
        else:
            coord = tl.load(POS + b * p_b + s64 * p_s, mask=rows, other=0).to(tl.int64)
            coord = (coord + s64 if STEP else coord)[:, None]
        if CLAMP:
            coord = tl.minimum(coord, TABLE_LEN - 1)
        inside = (coord >= 0) & (coord < TABLE_LEN)
        if CHECK:
            tl.device_assert(inside | (mask == 0), "ropelib: positions must be >= 0" if CLAMP
                             else ("ropelib: offset + row must be >= 0 and < the cos/sin "
                                   "table length") if STEP else ("ropelib: positions must be >= 0"
                                                                 " and < the cos/sin table length"))
        row_mask = mask & inside
        cos_at = COS + coord * c_s + i[None, :] * c_i
        sin_at = SIN + coord * s_s + i[None, :] * s_i
    cos = tl.load(cos_at, mask=row_mask, other=0.0).to(tl.float32)
    if MODE > 0:  # a coordinate outside the table turns its row to NaN, never to memory
        cos = tl.where(inside, cos, float("nan"))
    sin = tl.load(sin_at, mask=row_mask, other=0.0).to(tl.float32)
    if INVERSE:
        sin = -sin
    if BLOCK_D > 0:
        dest = tl.load(SLOT).to(tl.int64) + s64
        in_cache = (dest >= 0) & (dest < CAPACITY)
        tl.device_assert(in_cache | (rows == 0), "ropelib: cache_position + row must be in "
                         "[0, capacity) of the KV cache")
        d = tl.arange(0, BLOCK_D)
        channels = d < HEAD_DIM
    if BLOCK_R > 0:
        r = ROTARY + tl.arange(0, BLOCK_R)
        rest = r < HEAD_DIM
    if not HALF:
        c = tl.arange(0, 2 * BLOCK_P)
        pair_channels = c < ROTARY
    first = tl.program_id(2) * HEADS_PER_PROGRAM
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
        if BLOCK_D > 0:  # x2 and x3 into the cache's rows, and only inside it
            o_at = o_at + tl.where(second, dest, s64)[:, None] * o_step
            live = tl.where(second, live & in_cache, live)
        else:
            o_at = o_at + s64[:, None] * o_step
        turn = tl.where(third, False, live)  # (a scalar & a vector is refused by the interpreter)
        turn_mask = turn[:, None] & pairs[None, :]
        if HALF:
            a = tl.load(x_at + i[None, :], mask=turn_mask, other=0.0).to(tl.float32)
            z = tl.load(x_at + ROTARY // 2 + i[None, :], mask=turn_mask, other=0.0).to(tl.float32)
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
            tl.store(o_at + r[None, :], tl.load(x_at + r[None, :], mask=rest_mask), mask=rest_mask)
        if BLOCK_D > 0:  # x3: copied whole (the values of a cache step)
            copy_mask = tl.where(third, live, False)[:, None] & channels[None, :]
            tl.store(o_at + d[None, :], tl.load(x_at + d[None, :], mask=copy_mask), mask=copy_mask)


_compiled = triton.jit(_rope, debug=True)  # debug: the device-side assertions run
_interpreted = InterpretedFunction(_rope)
try:  # debug turns on Triton's integer overflow checks too (every index): off, where it has them
    from triton.backends.nvidia.compiler import CUDAOptions
    _CUDA_OPTIONS = {k: False for k in CUDAOptions.__dataclass_fields__ if k == "sanitize_overflow"}
except ImportError:
    _CUDA_OPTIONS = {}
# Triton 3.4 and later launch a compiled kernel with every argument, constexprs included
_RAW_LAUNCH = tuple(int(v) for v in triton.__version__.split(".")[:2]) >= (3, 4)
# The one cache (emptied when full) of Verdicts, Launches and compiled kernels' launchers: a
# GPU call through Triton's JIT costs 26 us more (2026-11-27-h200-run6.txt: 115.8 vs 89.3).
_launchers: dict[tuple, object] = {}
MAX_LAUNCHERS = 1024


class Config(NamedTuple):
    """A launch's shape: tokens per program, heads per program, warps."""
    block_s: int
    heads_per_program: int
    num_warps: int


class Launch(NamedTuple):
    """A launch but its pointers: grid, integer arguments, constexprs (name, value), warps."""
    grid: tuple[int, int, int]
    scalars: tuple[int, ...]
    constexprs: tuple[tuple[str, object], ...]
    num_warps: int


class Verdict:
    """``_reason`` of tensors of these ``_meta``s ((xs, outs, cos, sin, positions))."""

    def __init__(self, metas: tuple) -> None:
        self.metas, self.reason = metas, _reason(*metas)


def _kept(key: tuple, make: Callable, *args: object) -> object:
    """``make(*args)``, kept in ``_launchers`` under ``key``."""
    try:
        return _launchers[key]
    except KeyError:
        if len(_launchers) >= MAX_LAUNCHERS:
            _launchers.clear()
        value = _launchers[key] = make(*args)
        return value


def _meta(t: torch.Tensor) -> tuple:
    """(shape, strides, dtype): what a launch reads of t but its address."""
    return t.shape, t.stride(), t.dtype


def assess(xs: Sequence[torch.Tensor], outs: Sequence[torch.Tensor | None], cos: torch.Tensor,
           sin: torch.Tensor, rotary_dim: int, positions: torch.Tensor | None
           ) -> tuple[str | None, Verdict | None]:
    """(None when the kernel takes the call, else why not; the ``Verdict`` that ``run``,
    ``run_cache`` and ``prepare`` take)."""
    if not (xs[0].is_cuda or xs[0].is_cpu):
        return ("Triton runs on CUDA tensors (and on the CPU in its interpreter), got "
                f"{xs[0].device}"), None
    if any(t is not None and (t.is_neg() or t.is_conj()) for t in (*xs, *outs, cos, sin)):
        return "x, out, cos and sin must not be lazily negated or conjugated views", None
    metas = (tuple(map(_meta, xs)), tuple(None if o is None else _meta(o) for o in outs),
             _meta(cos), _meta(sin), None if positions is None else _meta(positions))
    verdict = _kept(metas, Verdict, metas)
    return verdict.reason, verdict


def _reason(xs: tuple, outs: tuple, cos: tuple, sin: tuple, positions: tuple | None) -> str | None:
    """``assess``'s reason for tensors of these ``_meta``s."""
    shape, dtype = xs[0][0], xs[0][2]
    for t_shape, t_strides, t_dtype in (*xs, *(o for o in outs if o is not None)):
        if t_dtype not in DTYPES:
            return f"the kernel takes {', '.join(map(str, DTYPES))}, got {t_dtype}"
        if t_shape[-1] > 1 and t_strides[-1] != 1:
            return "the channels of x and out must be contiguous (stride 1)"
        if t_dtype != dtype:
            return "q, k and their destinations must have one dtype"
    if any(t[0][:-3] != shape[:-3] or t[0][-2:] != shape[-2:] for t in xs[1:]):
        return "q and k must have the same shape but for the heads dim (-3)"
    merged = _batch_heads(xs, [o or x for x, o in zip(xs, outs, strict=True)], cos, sin, positions)
    if merged is None:
        rows = (cos if positions is None else positions)[0]
        return ("the leading dims of x, out and the rows cannot be merged into a batch dim "
                "(rows vary) and a heads dim (rows shared)" + ("; rows that differ per head "
                "(dim -3) are taken only where x's, out's and the rows' leading dims all "
                "merge into the batch dim"
                if len(rows) > 2 and rows[-3] > 1 else ""))
    if merged[0] > MAX_GRID_Y:
        return f"at most {MAX_GRID_Y} batch entries with rows of their own, got {merged[0]}"
    return None


def run(xs: Sequence[torch.Tensor], outs: Sequence[torch.Tensor | None], cos: torch.Tensor,
        sin: torch.Tensor, layout: str, rotary_dim: int, inverse: bool,
        positions: torch.Tensor | None, axes: torch.Tensor | None,
        config: Config | None = None, *, pending=None, plan: Verdict | None = None
        ) -> list[torch.Tensor]:
    """R_Theta x (``inverse``: R_-Theta x) for each of ``xs`` (one or two ``(..., heads, seq,
    head_dim)``) in one launch into ``outs`` (None: ``new_output``; x: in place); returns them.
    cos, sin: rows broadcastable to ``(..., seq, rotary_dim // 2)``, or with ``positions``
    (``(..., seq, k)``) tables ``(table_len, rotary_dim // 2)``; pair i reads coordinate
    ``axes[i]``. pending: ``kernels.UncheckedRange`` of the coordinates. plan: ``assess``'s."""
    plan = plan or assess(xs, outs, cos, sin, rotary_dim, positions)[1]
    new = [new_output(x) if o is None else o for x, o in zip(xs, outs, strict=True)]
    in_place = all(o.data_ptr() == x.data_ptr() for x, o in zip(xs, new, strict=True))
    launch(prepare(plan, xs, outs, layout, rotary_dim, inverse, axes, pending, False,
                   in_place, config), xs, new, cos, sin, positions, axes)
    return new


def run_cache(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_cache: torch.Tensor,
              value_cache: torch.Tensor, slot: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              layout: str, rotary_dim: int, positions: torch.Tensor | None,
              axes: torch.Tensor | None, pending=None, plan: Verdict | None = None) -> torch.Tensor:
    """A decode step in one launch: q rotated into a new tensor (returned), k rotated into
    ``key_cache[..., slot + 0 .. n - 1, :]``, v copied into ``value_cache`` there (``slot``:
    0-d, read by the kernel). The rest as for ``run`` (``plan``: ``assess`` of [q, k, v])."""
    xs, outs = [q, k, v], [None, key_cache, value_cache]
    plan = plan or assess(xs, outs, cos, sin, rotary_dim, positions)[1]
    q_out = new_output(q)
    launch(prepare(plan, xs, outs, layout, rotary_dim, False, axes, pending, True, False),
           xs, [q_out, key_cache, value_cache], cos, sin, positions, axes, slot)
    return q_out


def prepare(verdict: Verdict, xs: Sequence[torch.Tensor], outs: Sequence[torch.Tensor | None],
            layout: str, rotary_dim: int, inverse: bool, axes: torch.Tensor | None, pending,
            cache_step: bool, in_place: bool, config: Config | None = None) -> Launch | None:
    """The ``Launch`` of a call ``verdict`` took (arguments as for ``run``, ``cache_step``:
    ``run_cache``'s; ``in_place``: pass-through channels left alone); None if empty."""
    key = (verdict, layout, rotary_dim, inverse, cache_step, xs[0].is_cuda, config, in_place,
           None if axes is None else (*axes.shape, *axes.stride()),
           None if pending is None else (pending.step, pending.clamp))
    return _kept(key, _prepare, *verdict.metas, *key[1:])


def launch(prepared: Launch | None, xs: Sequence[torch.Tensor], outs: Sequence[torch.Tensor],
           cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor | None,
           axes: torch.Tensor | None, slot: torch.Tensor | None = None) -> None:
    """Launches ``prepared`` on these tensors (as ``run`` takes them): reads their addresses."""
    if prepared is not None:  # cos: for the pointers the launch does not read
        x, two = xs[0], 1 if len(xs) > 1 else 0
        _launch(x, prepared, (x, outs[0], xs[two], outs[two], x if slot is None else xs[-1],
                              outs[-1], cos, sin, cos if positions is None else positions,
                              cos if axes is None else axes, cos if slot is None else slot))


def _prepare(xs: tuple, outs: tuple, cos: tuple, sin: tuple, positions: tuple | None,
             layout: str, rotary_dim: int, inverse: bool, slotted: bool, cuda: bool,
             config: Config | None, in_place: bool, axes: tuple[int, int] | None,
             pending: tuple[bool, bool] | None) -> Launch | None:
    """``prepare`` of these ``_meta``s; ``axes``: (pairs, stride); ``pending``: (step, clamp)."""
    outs = [o or (x[0], new_output(torch.empty_strided(x[0], x[1], dtype=x[2], device="meta"),
                                   cuda).stride()) for x, o in zip(xs, outs, strict=True)]
    batch, operands, tables, coordinates = _batch_heads(xs, outs, cos, sin, positions)
    seq, head_dim = xs[0][0][-2], xs[0][0][-1]
    heads = sum(operand[0] for operand in operands)
    if not (heads and batch and seq and head_dim):
        return None
    config = config or choose_config(batch, heads, seq, head_dim, cuda, axes is not None)
    flat = [*operands, (0,) * 7, (0,) * 7]
    scalars = (*flat[0], *flat[1], *flat[2], *tables, *coordinates, 0 if axes is None else axes[1],
               1 if positions is None else positions[0][-1], cos[0][0], seq, outs[-1][0][-2])
    constexprs = (
        ("HEADS_PER_PROGRAM", config.heads_per_program), ("ROTARY", rotary_dim),
        ("HEAD_DIM", head_dim), ("BLOCK_S", config.block_s), ("BLOCK_P", _pow2(rotary_dim // 2)),
        ("BLOCK_R", 0 if in_place or head_dim == rotary_dim else _pow2(head_dim - rotary_dim)),
        ("BLOCK_D", _pow2(head_dim) if slotted else 0), ("HALF", layout == "half"),
        ("INVERSE", inverse), ("MODE", 0 if positions is None else 1 if axes is None else 2),
        ("STEP", pending is not None and pending[0]),
        ("CLAMP", pending is not None and pending[1]), ("CHECK", pending is not None))
    grid = (-(-seq // config.block_s), batch, -(-heads // config.heads_per_program))
    return Launch(grid, scalars, constexprs, config.num_warps)


def _launch(x: torch.Tensor, launch: Launch, tensors: tuple) -> None:
    """Launches the kernel: interpreted for CPU tensors; on a GPU with x's device current,
    through Triton's JIT the first time, then through the compiled kernel's launcher."""
    grid, scalars, constexprs, num_warps = launch
    if not x.is_cuda:
        _interpreted[grid](*tensors, *scalars, **dict(constexprs))
        return
    device = x.get_device()
    if device != torch.cuda.current_device():
        with torch.cuda.device(device):
            return _launch(x, launch, tensors)
    key = (launch, device, *(t.dtype for t in tensors), *(t.data_ptr() % 16 == 0 for t in tensors))
    found = _launchers.get(key)
    if found is not None:
        runner, tail, current_stream = found
        runner(*tensors, *tail, stream=current_stream(device))
        return
    kernel = _compiled[grid](*tensors, *scalars, **dict(constexprs), num_warps=num_warps,
                             **_CUDA_OPTIONS)
    if _RAW_LAUNCH and len(getattr(getattr(kernel, "src", None), "signature", ())) == len(
            tensors) + len(scalars) + len(constexprs):
        _kept(key, lambda: (kernel[grid], (*scalars, *(value for _, value in constexprs)),
                            triton.runtime.driver.active.get_current_stream))


def choose_config(batch: int, heads: int, seq: int, head_dim: int, cuda: bool,
                  mrope: bool = False) -> Config:
    """Tiles of ``TILE_ELEMENTS`` elements, ``HEADS_PER_PROGRAM`` heads, 8 warps: the best of
    48 on an H200 (benchmarks/results/2026-11-26-h200.txt). M-RoPE over a tile of tokens or
    more: half the tokens, a quarter of the heads, 4 warps (2026-11-27-h200-run5.txt)."""
    block_s = max(1, min(_pow2(seq), TILE_ELEMENTS // _pow2(head_dim)))
    if not cuda:
        return Config(block_s, max(heads, 1), 8)
    if mrope and seq >= TILE_ELEMENTS // _pow2(head_dim):
        return Config(max(1, block_s // 2), max(1, -(-heads // 4)), 4)
    return Config(block_s, HEADS_PER_PROGRAM, 8)


def _pow2(n: int) -> int:
    return 1 << (max(n, 1) - 1).bit_length()


def _batch_heads(xs: Sequence, outs: Sequence, cos: tuple, sin: tuple,
                 positions: tuple | None) -> tuple | None:
    """x's leading dims as a batch dim (rows vary) and a heads dim (rows shared), cut first where
    all strides (t: (shape, strides, ...)) allow: (batch, per x (heads, x's and out's (b, h, s)
    strides), cos's and sin's (b, s, channel) strides, positions' (b, s, k)), or None."""
    rows = [cos, sin] if positions is None else [positions]
    for cut in range(len(xs[0][0]) - 1):
        views = [[_view(t, x[0], cut) for t in (x, o, *rows)]
                 for x, o in zip(xs, outs, strict=True)]
        if len({math.prod(x[0][:cut]) for x in xs}) > 1 or any(
                None in v or any(r[1] for r in v[2:]) for v in views):
            continue
        batch = math.prod(xs[0][0][:cut])
        operands = [(math.prod(x[0][cut:-2]), *v[0][:3], *v[1][:3])
                    for x, v in zip(xs, views, strict=True)]
        strides = [(b, s, c) for b, _, s, c in views[-1][2:]]
        if positions is None:
            return batch, operands, (*strides[0], *strides[1]), (0, 0, 0)
        return batch, operands, (0, *cos[1], 0, *sin[1]), strides[0]
    return None


def _view(t: tuple, shape: tuple, cut: int) -> tuple[int, ...] | None:
    """t = (shape, strides, ...) broadcast to x's ``shape``: its (batch: ``shape[:cut]``, heads:
    ``shape[cut:-2]``, rows, channels) strides (0 along size 1), None if they do not merge."""
    k = len(shape) - len(t[0])  # t's missing leading dims
    dims = [(n, 0 if d < k or t[0][d - k] == 1 else t[1][d - k])
            for d, n in enumerate(shape[:-2])]
    merged = _merged(dims[:cut]), _merged(dims[cut:])
    rows = (0 if n == 1 else stride for n, stride in zip(t[0][-2:], t[1][-2:], strict=True))
    return None if None in merged else (*merged, *rows)


def _merged(dims: list[tuple[int, int]]) -> int | None:
    """The stride of dims (size, stride) as one dim (0 if all have size 1), None if each
    dim of size > 1 does not step over the next one's elements."""
    dims = [(n, stride) for n, stride in dims if n != 1]
    if any(outer != n * inner for (_, outer), (n, inner) in pairwise(dims)):
        return None
    return dims[-1][1] if dims else 0
