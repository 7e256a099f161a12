"""The CPU backend: RoPE as one C loop (``native_rope.c``) that reads each pair once and writes
it once, as a copy does (eager PyTorch makes two or more passes, and temporaries). Built with
``$CC`` (default ``cc``, or a command line: ``CC="ccache gcc"``) on first use, kept in
``cache_dir()``, called through ctypes; with OpenMP it splits large tensors over PyTorch's
threads (one in a forked DataLoader worker). Positions: ``eager.table_rows``, then the loop. A
failed build warns once; ``ropelib.native_status()`` says which path CPU calls take;
``set_enabled(False)`` (or ``ROPELIB_NATIVE=0``) turns the loop off."""

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
from torch import Tensor

from .eager import table_rows

NAME = "native"
CHECKS_PENDING = False  # coordinates arrive settled (``kernels.resolve_pending``)
prepare = None  # no launch to prepare: such calls take the full path
run_cache = None  # a cache step is ``run`` into the key cache's slots and a copy of v
SOURCE = Path(__file__).with_name("native_rope.c")
DTYPES = (torch.float32, torch.float64, torch.bfloat16)
FLAGS = ("-O3", "-shared", "-fPIC", "-ffp-contract=off")
PARALLEL_ELEMENTS = 1 << 16  # elements per thread, at least
HUGE_PAGE_BYTES = 4 << 20  # new outputs from this size on ask for huge pages (of 2 MiB)
# ``tile_rows``: a run's tables up to this stay in the last-level cache for every head; x goes in
# memory order (0.6-0.8 of 16 KiB tiles' time: benchmarks/results/2026-11-26-cpu-1thread-tiles.txt)
TABLE_CACHE_BYTES = 4 << 20
TABLE_TILE_BYTES = 256 << 10  # larger tables: tiles of this much, in a second-level cache
UNITS_PER_THREAD = 4  # so that threads' shares differ by a quarter at most

_enabled = os.environ.get("ROPELIB_NATIVE", "1") != "0"
_build_lock = threading.Lock()  # one build per process (racing processes replace atomically)
_PTR = ctypes.c_void_p
_MADVISE = ctypes.CDLL(None).madvise if hasattr(mmap, "MADV_HUGEPAGE") else None


class Loop(NamedTuple):
    """The loaded library: its entry point per dtype, and how it was built."""

    rope: dict[torch.dtype, Callable[..., None]]
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
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ropelib"
    return Path(os.environ.get("ROPELIB_CACHE_DIR") or cache)


def _compile(compiler: str, target: Path) -> None:
    """Build into ``target`` (moved into place: atomic), with OpenMP where the compiler has it."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        for flags in ((*FLAGS, "-fopenmp"), FLAGS):
            built = os.path.join(tmp, target.name)
            result = subprocess.run([*shlex.split(compiler), *flags, "-o", built, str(SOURCE)],
                                    capture_output=True, text=True, timeout=120)
            if not result.returncode:
                os.replace(built, target)
                return
        raise RuntimeError(f"{compiler} failed: {result.stderr.strip()[-2000:]}")


@functools.cache
def _load() -> tuple[Loop | None, str | None]:
    """(the loop, None), or (None, why it could not be built or loaded, also warned once)."""
    compiler = os.environ.get("CC") or "cc"
    key = hashlib.sha256(b"\0".join(s if isinstance(s, bytes) else s.encode() for s in (
        SOURCE.read_bytes(), compiler, " ".join(FLAGS), platform.machine(), platform.system())))
    target = cache_dir() / f"native_rope-{key.hexdigest()[:16]}.so"
    try:
        with _build_lock:
            if not target.exists():
                _compile(compiler, target)
        lib = ctypes.CDLL(str(target))
    except (OSError, RuntimeError, ValueError, subprocess.SubprocessError) as error:
        reason = f"{type(error).__name__}: {error}"
        warnings.warn(f"ropelib could not build its compiled RoPE kernel with CC={compiler!r} "
                      f"({reason}); apply_rope falls back to eager PyTorch on the CPU, several "
                      "times slower. ropelib.native_status() tells which path runs; set CC to "
                      "a working C compiler, or ROPELIB_NATIVE=0 to choose eager silently",
                      RuntimeWarning, stacklevel=2)
        return None, reason
    rope = {dtype: getattr(lib, f"rope_{str(dtype).removeprefix('torch.')}") for dtype in DTYPES}
    for function in rope.values():
        function.restype, function.argtypes = None, (*[_PTR] * 5, *[ctypes.c_int64] * 7)
    return Loop(rope, compiler, bool(lib.rope_threaded())), None  # an int, ctypes' default


def unavailable_reason() -> str | None:
    """None when the loop is built and loaded, else why not (compiler error, no compiler)."""
    return _load()[1]


def loop() -> Loop | None:
    """The loaded loop (built on first use), or None where it cannot be."""
    return _load()[0]


def assess(xs: Sequence[Tensor], outs: Sequence[Tensor | None], cos: Tensor, sin: Tensor,
           rotary_dim: int, positions: Tensor | None) -> tuple[str | None, None]:
    """(None when the loop takes the call, else why not; no plan), building the loop if
    needed: what ``ropelib.kernels`` asks every backend."""
    if not _enabled:
        return "disabled (ROPELIB_NATIVE=0 or set_enabled(False))", None
    for x, out in zip(xs, outs, strict=True):
        if not x.is_cpu:
            return f"the compiled loop runs on the CPU, got {x.device}", None
        if x.dtype not in DTYPES:
            return f"the compiled loop takes {', '.join(map(str, DTYPES))}, got {x.dtype}", None
        if x.stride(-1) != 1 or (out is not None and out.stride(-1) != 1):
            return "the channels of x and out must be contiguous (stride 1)", None
        if x.is_neg() or (out is not None and out.is_neg()):
            return "x and out must not be lazily negated views", None
    if cos.is_neg() or sin.is_neg():
        return "cos and sin must not be lazily negated views", None
    reason = _load()[1]  # not unavailable_reason(): a frame fewer on every call
    return None if reason is None else f"the kernel could not be built: {reason}", None


def supports(x: Tensor, out: Tensor | None) -> bool:
    """Whether ``rotate`` takes x into out (``assess``, x standing for the tables)."""
    return assess([x], [out], x, x, x.shape[-1], None)[0] is None


def run(xs: Sequence[Tensor], outs: Sequence[Tensor | None], cos: Tensor, sin: Tensor,
        layout: str, rotary_dim: int, inverse: bool, positions: Tensor | None,
        axes: Tensor | None, *, pending: None = None, plan: None = None) -> list[Tensor]:
    """``rotate`` of each x (q and k share a dtype) into its out, the tables in the loop's
    precision (float64 for float64 x, else float32), contiguous; with ``positions`` (checked,
    2-D tables) rows ``(..., seq, rotary_dim // 2)`` gathered first. No pending, no plan."""
    accumulate = torch.float64 if xs[0].dtype == torch.float64 else torch.float32
    if positions is not None:
        cos, sin = (table_rows(t[:, :rotary_dim // 2].to(accumulate), positions, axes)
                    for t in (cos, sin))
    cos, sin = cos.to(accumulate).contiguous(), sin.to(accumulate).contiguous()
    done = []
    for x, out in zip(xs, outs, strict=True):  # a loop, not a comprehension: no frame of its own
        done.append(rotate(x, cos, sin, layout, rotary_dim, out, inverse))
    return done


def empty_like(x: Tensor) -> Tensor:
    """A contiguous CPU tensor like x; from ``HUGE_PAGE_BYTES`` on its 2 MiB-aligned part asks for
    transparent huge pages (Linux), which make the first touch several times cheaper."""
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    end = out.data_ptr() + out.numel() * out.element_size()
    if end - out.data_ptr() >= HUGE_PAGE_BYTES and _MADVISE is not None:
        start = -(-out.data_ptr() >> 21) << 21
        _MADVISE(_PTR(start), ctypes.c_size_t((end >> 21 << 21) - start), mmap.MADV_HUGEPAGE)
    return out


def rotate(x: Tensor, cos: Tensor, sin: Tensor, layout: str, rotary_dim: int,
           out: Tensor | None = None, inverse: bool = False) -> Tensor:
    """out = R_Theta x (R_{-Theta} x with ``inverse``) by the loop, for ``supports(x, out)``.

    x ``(..., seq, head_dim)``, channels past ``rotary_dim`` copied. cos, sin ``(..., seq,
    rotary_dim // 2)`` broadcastable to x's rows, float64 for float64 x else float32, channels
    contiguous, one stride for both. out: x, a tensor sharing no element with x, or None
    (new). Concurrent calls (the loop runs without the GIL) share nothing."""
    out = empty_like(x) if out is None else out
    if not x.numel():
        return out
    lib = _load()[0]
    threads = min(torch.get_num_threads(), max(1, x.numel() // PARALLEL_ELEMENTS))
    layout_args = _layout(x.shape, x.stride(), out.stride(), cos.shape, cos.stride(),
                          rotary_dim * cos.element_size(), threads if lib.threaded else 1)
    lib.rope[x.dtype](x.data_ptr(), out.data_ptr(), cos.data_ptr(), sin.data_ptr(),
                      *layout_args, x.shape[-1], rotary_dim, layout == "half", inverse)
    return out


@functools.lru_cache(maxsize=256)
def _layout(shape: tuple[int, ...], x_strides: tuple[int, ...], out_strides: tuple[int, ...],
            table_shape: tuple[int, ...], table_strides: tuple[int, ...], row_bytes: int,
            threads: int) -> tuple[bytes, int, int, int]:
    """``rotate``'s (leading sizes, then x's, out's, the tables' strides as int64s (0 where the
    tables broadcast); their number; the tile; the threads). Cached: a hit takes 0.1 us."""
    lead = shape[:-1] or (1,)  # a 1-D x is one row
    tables = [0] * (len(lead) - len(table_shape) + 1) + [
        0 if n == 1 else st for n, st in zip(table_shape[:-1], table_strides[:-1], strict=True)]
    values = (*lead, *(x_strides[:-1] or (0,)), *(out_strides[:-1] or (0,)), *tables)
    seq, runs = lead[-1], math.prod(lead[:-1])
    tile = tile_rows(seq, runs, row_bytes, threads) if tables[-1] else seq  # else no tiles
    return struct.pack(f"{len(values)}q", *values), len(lead), tile, threads


def tile_rows(seq: int, runs: int, row_bytes: int, threads: int = 1) -> int:
    """Positions the loop rotates in each of ``runs`` (batch x heads) before the next tile: all
    ``seq`` where a run's tables (``row_bytes`` a position: rotary_dim x 4 for float32) fit
    ``TABLE_CACHE_BYTES``, else ``TABLE_TILE_BYTES`` of them; cut for ``threads``."""
    tile = seq if seq * row_bytes <= TABLE_CACHE_BYTES else max(TABLE_TILE_BYTES // row_bytes, 1)
    if threads > 1 and runs * -(-seq // tile) < UNITS_PER_THREAD * threads:
        tile = -(-seq // -(-UNITS_PER_THREAD * threads // runs))
    return tile
