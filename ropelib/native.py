"""The CPU backend: RoPE as one C loop (``native_rope.c``), compiled on first use.

Eager PyTorch needs two or more passes over memory for the half layout and a temporary for
half precision; a loop that reads each pair once and writes it once costs what a copy costs.
It is built with ``$CC`` (default ``cc``; a command line, e.g. ``CC="ccache gcc"``) when a
CPU call first needs it, kept in ``cache_dir()`` and called through ctypes. With OpenMP
(where the compiler has it) it splits large tensors over ``torch.get_num_threads()`` threads
of the runtime PyTorch uses, so a forked DataLoader worker runs one thread, as torch does.
``ropelib.kernels`` asks ``assess`` whether it takes a call, then calls ``run``; ``axis_rows``
implements ``ropelib::axis_rows`` on the CPU. Nothing is kept between calls. A failed build
is warned once; ``native_status()`` says which path CPU calls take and why, and
``set_enabled(False)`` (or ``ROPELIB_NATIVE=0``) turns the loop off, e.g. to compare.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import mmap
import os
import platform
import shlex
import struct
import subprocess
import tempfile
import threading
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import torch

from ._checks import check_coordinates, check_count

NAME = "native"
CHECKS_PENDING = False  # coordinates arrive settled (``kernels.resolve_pending``)
CHECKS_COORDINATES = True  # the C loop checks each coordinate as it reads it
prepare = None  # no launch to prepare: such calls take the full path
run_cache = None  # a cache step is ``run`` into the key cache's slots and a copy of v
SOURCE = Path(__file__).with_name("native_rope.c")
DTYPES = (torch.float32, torch.float64, torch.bfloat16)
TABLE_DTYPES = (torch.float32, torch.float64)
FLAGS = ("-O3", "-shared", "-fPIC", "-ffp-contract=off")
PARALLEL_ELEMENTS = 1 << 16  # elements per thread, at least
HUGE_PAGE_BYTES = 4 << 20  # new outputs from this size on ask for huge pages (of 2 MiB)
# Tiles (``tile_rows``): one run's tables up to TABLE_CACHE_BYTES stay in the last-level cache
# while every head reads them, so x streams in memory order (about 0.8 of the time of 16 KiB
# tiles in float32, 0.6 in bfloat16: benchmarks/results/2026-11-26-cpu-1thread-tiles.txt).
TABLE_CACHE_BYTES = 4 << 20
TABLE_TILE_BYTES = 256 << 10  # larger tables: tiles of this much, in a second-level cache
GATHER_BYTES = 16 << 10  # gathered M-RoPE rows of a tile: on the loop's stack, in L1
UNITS_PER_THREAD = 4  # so that threads' shares differ by a quarter at most

_enabled = os.environ.get("ROPELIB_NATIVE", "1") != "0"
_DISABLED = "disabled (ROPELIB_NATIVE=0 or set_enabled(False))"
_compile_lock = threading.Lock()
_I64, _PTR = ctypes.c_int64, ctypes.c_void_p


def _bind(lib: ctypes.CDLL, name: str, restype, *argtypes) -> Callable[..., int]:
    """The C function ``name`` of ``lib`` with its signature."""
    function = getattr(lib, name)
    function.restype, function.argtypes = restype, argtypes
    return function


_MADVISE = (_bind(ctypes.CDLL(None), "madvise", ctypes.c_int, _PTR, ctypes.c_size_t,
                  ctypes.c_int) if hasattr(mmap, "MADV_HUGEPAGE") else None)


class Loop(NamedTuple):
    """The loaded library: its entry points by dtype, and how it was built."""

    rope: dict[torch.dtype, Callable[..., int]]
    axis_rows: dict[torch.dtype, Callable[..., int]]
    compiler: str  # $CC when it was built: $CC may change while it stays loaded
    threaded: bool  # built with OpenMP


def set_enabled(enabled: bool) -> bool:
    """Use the compiled loop where it applies (default) or never; returns the previous setting."""
    global _enabled
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool, got {type(enabled).__name__}")
    previous, _enabled = _enabled, enabled
    return previous


def cache_dir() -> Path:
    """Where the library is kept: ``$ROPELIB_CACHE_DIR``, else ``~/.cache/ropelib``."""
    if os.environ.get("ROPELIB_CACHE_DIR"):
        return Path(os.environ["ROPELIB_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ropelib"


def _compile(compiler: str, target: Path) -> None:
    """Build the library into ``target`` (moved into place: atomic for racing processes), with
    OpenMP if the compiler has it, else without (one thread)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        for flags in ((*FLAGS, "-fopenmp"), FLAGS):
            result = subprocess.run([*shlex.split(compiler), *flags, "-o", tmp, str(SOURCE)],
                                    capture_output=True, text=True, timeout=120)
            if not result.returncode:
                os.replace(tmp, target)
                return
        raise RuntimeError(f"{compiler} failed: {result.stderr.strip()[-2000:]}")
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@functools.cache
def _load() -> tuple[Loop | None, str | None]:
    """(the loop, None), or (None, why it could not be built or loaded, also warned once)."""
    compiler = os.environ.get("CC") or "cc"
    key = hashlib.sha256(b"\0".join(s if isinstance(s, bytes) else s.encode() for s in (
        SOURCE.read_bytes(), compiler, " ".join(FLAGS), platform.machine(), platform.system())))
    target = cache_dir() / f"native_rope-{key.hexdigest()[:16]}.so"
    try:
        with _compile_lock:
            if not target.exists():
                _compile(compiler, target)
        lib = ctypes.CDLL(str(target))
    except (OSError, RuntimeError, ValueError, subprocess.SubprocessError) as error:
        reason = f"{type(error).__name__}: {error}"
        warnings.warn(f"ropelib could not build its compiled RoPE kernel with CC={compiler!r} "
                      f"({reason}); apply_rope falls back to eager PyTorch on the CPU, several "
                      "times slower (two or more passes over memory and temporaries instead of "
                      "one loop). ropelib.native_status() tells which path runs; set CC to a "
                      "working C compiler, or ROPELIB_NATIVE=0 to choose the eager path "
                      "silently", RuntimeWarning, stacklevel=2)
        return None, reason
    name = {dtype: str(dtype).removeprefix("torch.") for dtype in DTYPES}
    rope = {dtype: _bind(lib, f"rope_{name[dtype]}", _I64, _PTR, _PTR, _PTR, _PTR, _PTR,
                         *[_I64] * 7, _PTR, _PTR, _I64, _I64) for dtype in DTYPES}
    rows = {dtype: _bind(lib, f"rope_axis_rows_{name[dtype]}", _I64, _PTR, _PTR, _PTR, _PTR,
                         *[_I64] * 4, _PTR, _PTR, _I64) for dtype in TABLE_DTYPES}
    return Loop(rope, rows, compiler, bool(_bind(lib, "rope_threaded", ctypes.c_int)())), None


def unavailable_reason() -> str | None:
    """None when the loop is built and loaded, else why not (compiler error, no compiler)."""
    return _load()[1]


def threaded() -> bool:
    """Whether the loaded loop was built with OpenMP (runs on several threads)."""
    return _load()[0] is not None and _load()[0].threaded


class NativeStatus(NamedTuple):
    """Which path ``apply_rope`` takes on the CPU (float32, float64, bfloat16) and why."""

    path: str | None  # "native" (the compiled loop), "eager", "triton" (forced); None: raises
    reason: str  # why that path
    threaded: bool  # whether the compiled loop runs on several threads (OpenMP)


def native_status() -> NativeStatus:
    """Which path CPU calls of float32, float64 and bfloat16 take and why (building the loop):
    ``"native"`` (naming the compiler that built the loaded loop), ``"eager"``, the backend
    ``ROPELIB_BACKEND`` forces, or None where every such call raises (an unknown backend, or
    ``native`` forced while the loop does not run). ``ropelib.backend_status`` covers any call."""
    lib, reason = _load() if _enabled else (None, None)
    if lib is not None:
        how = "with OpenMP" if lib.threaded else "without OpenMP (one thread)"
        loop = NativeStatus("native", f"compiled {how} by CC={lib.compiler!r}", lib.threaded)
    else:
        loop = NativeStatus("eager", f"the kernel could not be built: {reason}" if reason
                            else _DISABLED, False)
    forced = os.environ.get("ROPELIB_BACKEND")
    if not forced:
        return loop
    if forced == "native" and loop.path == "native":
        return loop._replace(reason=f"forced by ROPELIB_BACKEND=native; {loop.reason}")
    if forced == "native":
        return NativeStatus(None, f"ROPELIB_BACKEND=native forces the compiled loop, which "
                                  f"does not run ({loop.reason}): every CPU call raises "
                                  "ValueError", False)
    if forced in ("eager", "triton"):
        return NativeStatus(forced, f"forced by ROPELIB_BACKEND={forced} (the compiled loop: "
                                    f"{loop.reason})", False)
    return NativeStatus(None, f"ROPELIB_BACKEND={forced!r} is not one of ('native', 'triton', "
                              "'eager'): every call raises ValueError", False)


def _declines(x: torch.Tensor, out: torch.Tensor | None) -> str | None:
    """Why the loop cannot rotate x into out (None: it can); builds the loop if needed."""
    if not _enabled:
        return _DISABLED
    if not x.is_cpu:
        return f"the compiled loop runs on the CPU, got {x.device}"
    if x.dtype not in DTYPES:
        return f"the compiled loop takes {', '.join(map(str, DTYPES))}, got {x.dtype}"
    if x.stride(-1) != 1 or (out is not None and out.stride(-1) != 1):
        return "the channels of x and out must be contiguous (stride 1)"
    if x.is_neg() or (out is not None and out.is_neg()):
        return "x and out must not be lazily negated views"
    reason = _load()[1]  # not unavailable_reason(): a frame fewer on every call
    return None if reason is None else f"the kernel could not be built: {reason}"


def supports(x: torch.Tensor, out: torch.Tensor | None) -> bool:
    """Whether ``rotate`` takes x into out: enabled and built, CPU, a dtype of ``DTYPES``,
    channels contiguous, no lazily negated view."""
    return _declines(x, out) is None


def supports_axes(x: torch.Tensor, rotary_dim: int) -> bool:
    """Whether ``rotate`` gathers M-RoPE rows of x (``positions``) itself: a gathered row of
    cos and sin fits ``GATHER_BYTES`` (4096 channels for float32 tables, 2048 for float64)."""
    return rotary_dim * (8 if x.dtype == torch.float64 else 4) <= GATHER_BYTES


def decline_reason(xs: Sequence[torch.Tensor], outs: Sequence[torch.Tensor | None],
                   cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int,
                   positions: torch.Tensor | None) -> str | None:
    """None when the loop takes the call (``run``), else why not (a sentence)."""
    for x, out in zip(xs, outs, strict=True):
        reason = _declines(x, out)
        if reason is not None:
            return reason
    if cos.is_neg() or sin.is_neg():
        return "cos and sin must not be lazily negated views"
    if positions is not None and not supports_axes(xs[0], rotary_dim):
        return (f"a gathered row of {rotary_dim} channels does not fit the loop's tile buffer "
                f"({GATHER_BYTES} bytes)")
    return None


def assess(xs: Sequence[torch.Tensor], outs: Sequence[torch.Tensor | None], cos: torch.Tensor,
           sin: torch.Tensor, rotary_dim: int, positions: torch.Tensor | None
           ) -> tuple[str | None, None]:
    """(``decline_reason``, no plan): what ``ropelib.kernels`` asks every backend."""
    return decline_reason(xs, outs, cos, sin, rotary_dim, positions), None


def run(xs: Sequence[torch.Tensor], outs: Sequence[torch.Tensor | None], cos: torch.Tensor,
        sin: torch.Tensor, layout: str, rotary_dim: int, inverse: bool,
        positions: torch.Tensor | None, axes: torch.Tensor | None, *, pending: None = None,
        plan: None = None) -> list[torch.Tensor]:
    """``rotate`` of every x of ``xs`` (q and k share a dtype) into its out, the tables made
    contiguous in the loop's precision (float64 for float64 x, else float32) once for all.
    With ``positions`` the tables are cut to ``rotary_dim // 2`` columns and ``axes`` None
    means one coordinate per token. ``pending`` and ``plan`` are always None here."""
    if positions is not None:
        cos, sin = cos[:, :rotary_dim // 2], sin[:, :rotary_dim // 2]
        if axes is None:
            axes = torch.zeros(rotary_dim // 2, dtype=torch.int32)
    accumulate = torch.float64 if xs[0].dtype == torch.float64 else torch.float32
    cos, sin = cos.to(accumulate).contiguous(), sin.to(accumulate).contiguous()
    done = []
    for x, out in zip(xs, outs, strict=True):  # a loop, not a comprehension: no frame of its own
        done.append(rotate(x, cos, sin, layout, rotary_dim, out, inverse, positions, axes))
    return done


def empty_like(x: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU tensor like x; from ``HUGE_PAGE_BYTES`` on, its 2 MiB-aligned part asks
    for transparent huge pages (Linux) before the first touch, most of the cost of a new
    tensor here, which they make several times cheaper."""
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    end = out.data_ptr() + out.numel() * out.element_size()
    if end - out.data_ptr() >= HUGE_PAGE_BYTES and _MADVISE is not None:
        start = -(-out.data_ptr() >> 21) << 21
        _MADVISE(start, (end >> 21 << 21) - start, mmap.MADV_HUGEPAGE)
    return out


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str, rotary_dim: int,
           out: torch.Tensor | None = None, inverse: bool = False,
           positions: torch.Tensor | None = None, axes: torch.Tensor | None = None
           ) -> torch.Tensor:
    """out = R_Theta x (R_{-Theta} x with ``inverse``) by the loop, for ``supports(x, out)``.

    x ``(..., seq, head_dim)``, channels past ``rotary_dim`` copied. cos, sin ``(..., seq,
    rotary_dim // 2)`` broadcastable to x's rows, float64 for float64 x else float32, channels
    contiguous, one stride for both; with ``positions`` (``(..., seq, k)`` integers
    broadcastable to x's rows) 1-D tables ``(table_len, rotary_dim // 2)``, contiguous, and
    pair i reads the row of coordinate ``axes[i]`` (``supports_axes``). out: x, a tensor
    sharing no element with x, or None (new). Nothing is kept: concurrent calls (the loop
    runs without the GIL) share nothing. A ValueError names a coordinate out of range.
    """
    if out is None:
        out = empty_like(x)
    if not x.numel():
        return out
    lib = _load()[0]
    table, pointers, k = cos, (None, None), 0
    if positions is not None:
        positions = table = positions.to(torch.int64).contiguous()
        axes = axes.to(torch.int32).contiguous()
        pointers, k = (positions.data_ptr(), axes.data_ptr()), positions.shape[-1]
    threads = min(torch.get_num_threads(), max(1, x.numel() // PARALLEL_ELEMENTS))
    layout_args = _layout(x.shape, x.stride(), out.stride(), table.shape, table.stride(),
                          rotary_dim * cos.element_size(), positions is not None,
                          threads if lib.threaded else 1)
    if lib.rope[x.dtype](x.data_ptr(), out.data_ptr(), cos.data_ptr(), sin.data_ptr(),
                         *layout_args, x.shape[-1], rotary_dim, layout == "half", inverse,
                         *pointers, k, cos.shape[0]):
        check_coordinates(positions, axes, cos.shape[0])  # raises: the loop found one
        raise AssertionError("the compiled loop refused coordinates that are in range")
    return out


@functools.lru_cache(maxsize=256)
def _layout(shape: tuple[int, ...], x_strides: tuple[int, ...], out_strides: tuple[int, ...],
            table_shape: tuple[int, ...], table_strides: tuple[int, ...], row_bytes: int,
            gathered: bool, threads: int) -> tuple[bytes, int, int, int]:
    """``rotate``'s (the leading dims' sizes, then x's, out's and the table's strides as C
    int64s; their number; the tile; the threads). A 1-D x is a ``(1, d)`` one; a table's
    stride is 0 along the dims it broadcasts over. Cached: a hit takes 0.1 us, working it out
    2.7 us of a call of about 10 (one thread, a (2, 8, 16, 64) x)."""
    lead = shape[:-1] or (1,)
    tables = [0] * (len(lead) - len(table_shape) + 1) + [
        0 if n == 1 else st for n, st in zip(table_shape[:-1], table_strides[:-1], strict=True)]
    values = (*lead, *(x_strides[:-1] or (0,)), *(out_strides[:-1] or (0,)), *tables)
    seq, runs = lead[-1], math.prod(lead[:-1])
    tile = (tile_rows(seq, runs, row_bytes, threads, gathered) if gathered or tables[-1]
            else seq)  # tables constant along seq: the whole seq
    return struct.pack(f"{len(values)}q", *values), len(lead), tile, threads


def tile_rows(seq: int, runs: int, table_row_bytes: int, threads: int = 1,
              gathered: bool = False) -> int:
    """The positions the loop rotates for each of ``runs`` (batch x heads) before the next
    tile: all ``seq`` where a run's tables fit ``TABLE_CACHE_BYTES`` (x then goes in memory
    order), else ``TABLE_TILE_BYTES`` of table rows, ``GATHER_BYTES`` of gathered (M-RoPE)
    rows; with ``threads`` > 1 cut until each thread gets ``UNITS_PER_THREAD`` units.
    ``table_row_bytes``: one position's cos and sin rows (rotary_dim x 4 for float32 tables).
    A ValueError names a count that is not a positive int."""
    seq, runs, row, threads = (check_count(name, value) for name, value in (
        ("seq", seq), ("runs", runs), ("table_row_bytes", table_row_bytes), ("threads", threads)))
    tile = (GATHER_BYTES if gathered else seq * row if seq * row <= TABLE_CACHE_BYTES
            else TABLE_TILE_BYTES) // row
    tile = min(max(tile, 1), seq)
    if threads > 1 and runs * -(-seq // tile) < UNITS_PER_THREAD * threads:
        tile = -(-seq // -(-UNITS_PER_THREAD * threads // runs))
    return tile


def supports_axis_rows(cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Whether ``axis_rows`` takes the tables: enabled and built, CPU, one dtype of
    ``TABLE_DTYPES``, no lazily negated view (the loop reads their memory as it is)."""
    return (_enabled and cos.is_cpu and sin.is_cpu and cos.dtype in TABLE_DTYPES
            and sin.dtype == cos.dtype and not (cos.is_neg() or sin.is_neg())
            and _load()[0] is not None)


def axis_rows(cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
              pair_axes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """M-RoPE's rows, ``rows[n, i] = table[positions[n, pair_axes[i]], i]``, by the loop.

    cos, sin ``(table_len, pairs)`` (``supports_axis_rows``), positions ``(tokens, k)`` int64
    in ``[0, table_len)``, pair_axes ``(pairs,)`` int32 in ``[0, k)``; returns ``(cos_rows,
    sin_rows)``, each ``(tokens, pairs)`` in the tables' dtype. A ValueError names a position
    or an axis out of range (the loop checks each before it reads with it).
    """
    cos, sin = cos.contiguous(), sin.contiguous()
    positions, pair_axes = positions.contiguous(), pair_axes.contiguous()
    (tokens, k), pairs = positions.shape, cos.shape[1]
    cos_rows, sin_rows = cos.new_empty(tokens, pairs), sin.new_empty(tokens, pairs)
    threads = min(torch.get_num_threads(), max(1, tokens * pairs // PARALLEL_ELEMENTS))
    if tokens and pairs and _load()[0].axis_rows[cos.dtype](
            cos.data_ptr(), sin.data_ptr(), positions.data_ptr(), pair_axes.data_ptr(), tokens,
            k, cos.shape[0], pairs, cos_rows.data_ptr(), sin_rows.data_ptr(), threads):
        raise ValueError(f"positions must be in [0, {cos.shape[0]}) (the table's rows) and "
                         f"pair_axes in [0, {k}) (the axes), got positions in "
                         f"[{int(positions.min())}, {int(positions.max())}] and pair_axes "
                         f"in [{int(pair_axes.min())}, {int(pair_axes.max())}]")
    return cos_rows, sin_rows
