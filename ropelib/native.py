"""The fused CPU kernel: RoPE as one C loop (``native_rope.c``), compiled on first use.

Eager PyTorch needs at least two passes over memory for the half layout (its pairs are d/2
apart, so there is no complex view) and a temporary for half precision. A loop that reads
each pair once and writes it once costs what a copy costs. ropelib compiles that loop with
the system's C compiler (``$CC``, default ``cc``; it may carry flags, split as a shell
would, e.g. ``CC="ccache gcc -march=native"``) the first time it is needed, keeps the
shared library in ``$ROPELIB_CACHE_DIR`` (default ``~/.cache/ropelib``) and calls it through
ctypes. Built with OpenMP (where the compiler has it), it splits large tensors across
``torch.get_num_threads()`` threads of the OpenMP runtime PyTorch itself uses, so a forked
process (a DataLoader worker) has the same rule as torch: use one thread there. Fresh outputs
of 4 MiB or more get transparent huge pages (Linux), which makes their first touch, most of
the cost of any new tensor here, several times cheaper.

This module is one of the backends at the bottom of ``apply_rope``'s path: ``ropelib.kernels``
asks its ``decline_reason`` whether it takes a CPU call and then calls its ``run``. ``axis_rows``
is the CPU implementation of ``ropelib::axis_rows`` (``ropelib.multiaxis``): M-RoPE's
per-token rows read from the 1D tables. Nothing here keeps a tensor or a pointer between
calls. Without a compiler and for other dtypes, ``ropelib.kernels`` picks the eager backend
(``ropelib.eager``); CUDA tensors go to the Triton kernel. A failed build is said once, in
a warning that names the cause and the cost; ``native_status()`` (``ropelib.native_status``) tells which
path CPU calls take and why, ``unavailable_reason()`` why the kernel is missing, and
``set_enabled(False)`` (or ``ROPELIB_NATIVE=0`` in the environment) turns it off, e.g. to
compare the two.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shlex
import struct
import subprocess
import tempfile
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import torch

from ._checks import check_coordinates, check_count

NAME = "native"
CHECKS_PENDING = False  # coordinates arrive settled (``kernels.resolve_pending``)
CHECKS_COORDINATES = True  # the C loop checks each coordinate's range as it reads it
prepare = None  # no launch to prepare: ``ropelib.plans`` sends such calls the full path
run_cache = None  # a cache step is ``run`` into the key cache's slots and a copy of v
SOURCE = Path(__file__).with_name("native_rope.c")
DTYPES = (torch.float32, torch.float64, torch.bfloat16)
TABLE_DTYPES = (torch.float32, torch.float64)
FLAGS = ("-O3", "-shared", "-fPIC", "-ffp-contract=off")
OPENMP_FLAG = "-fopenmp"
HUGE_PAGE_BYTES = 4 << 20
PARALLEL_ELEMENTS = 1 << 16

_enabled = os.environ.get("ROPELIB_NATIVE", "1") != "0"
_compile_lock = threading.Lock()
_I64 = ctypes.c_int64
_PTR = ctypes.c_void_p


def set_enabled(enabled: bool) -> bool:
    """Use the compiled kernel when it applies (default) or never; returns the previous setting."""
    global _enabled
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool, got {type(enabled).__name__}")
    previous, _enabled = _enabled, enabled
    return previous


def cache_dir() -> Path:
    """Where the compiled library is kept: ``$ROPELIB_CACHE_DIR`` or ``~/.cache/ropelib``."""
    if os.environ.get("ROPELIB_CACHE_DIR"):
        return Path(os.environ["ROPELIB_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "ropelib"


def _compile(compiler: str, target: Path) -> None:
    """Build the library next to ``target`` and move it into place (atomic for racing processes);
    with OpenMP if the compiler has it, else without (one thread). ``compiler`` is a command
    line, split as a shell would (``$CC`` often carries flags or a wrapper)."""
    command = shlex.split(compiler)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        for flags in ((*FLAGS, OPENMP_FLAG), FLAGS):
            result = subprocess.run([*command, *flags, "-o", tmp, str(SOURCE)],
                                    capture_output=True, text=True, timeout=120)
            if not result.returncode:
                os.replace(tmp, target)
                return
        raise RuntimeError(f"{compiler} failed: {result.stderr.strip()[-2000:]}")
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@functools.cache
def _load() -> tuple[ctypes.CDLL | None, str | None]:
    """(library, None), or (None, why it could not be built or loaded); a failure is also
    said once, in a warning."""
    compiler = os.environ.get("CC") or "cc"
    source = SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([source, compiler.encode(), " ".join(FLAGS).encode(),
                                     platform.machine().encode(), platform.system().encode()]))
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
    lib.compiler = compiler  # what built it: $CC may change while it stays loaded
    rotation = [_PTR, _PTR, _PTR, _PTR, _I64, _I64, _PTR, _I64, _I64, _I64, _I64]
    lib.rope = _typed(lib, "rope_{}", DTYPES, None, rotation)
    lib.rope_axes = _typed(lib, "rope_{}_axes", DTYPES, _I64,
                           [*rotation, _PTR, _PTR, _I64, _I64])
    lib.axis_rows = _typed(lib, "rope_axis_rows_{}", TABLE_DTYPES, _I64,
                           [_PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _I64, _PTR, _PTR, _I64])
    lib.rope_max_dims.restype = _I64
    lib.rope_threaded.restype = _I64
    lib.max_dims = lib.rope_max_dims()
    for name in ("tile_bytes", "table_cache_bytes", "table_tile_bytes"):
        getattr(lib, f"rope_{name}").restype = _I64
        setattr(lib, name, getattr(lib, f"rope_{name}")())
    lib.rope_tile_rows.argtypes = [_I64] * 5
    lib.rope_tile_rows.restype = _I64
    lib.rope_advise_huge_pages.argtypes = [_PTR, _I64]
    lib.rope_advise_huge_pages.restype = ctypes.c_int
    return lib, None


def _typed(lib: ctypes.CDLL, pattern: str, dtypes: tuple[torch.dtype, ...], restype,
           argtypes: list) -> dict[torch.dtype, object]:
    """The library's functions named ``pattern.format(dtype name)``, by dtype, with their C
    signature."""
    functions = {}
    for dtype in dtypes:
        fn = getattr(lib, pattern.format(str(dtype).removeprefix("torch.")))
        fn.argtypes, fn.restype = argtypes, restype
        functions[dtype] = fn
    return functions


def unavailable_reason() -> str | None:
    """None when the kernel is built and loaded, else why not (compiler error, no compiler)."""
    return _load()[1]


class NativeStatus(NamedTuple):
    """Which path ``apply_rope`` takes on the CPU (float32, float64, bfloat16) and why."""

    path: str | None  # "native" (the compiled loop), "eager", "triton" (forced); None: raises
    reason: str  # why that path
    threaded: bool  # whether the compiled loop runs on several threads (OpenMP)


def native_status() -> NativeStatus:
    """Which path ``apply_rope``'s CPU calls (float32, float64, bfloat16) take and why,
    building the compiled loop if needed, e.g. ``NativeStatus(path='eager', reason='disabled
    (ROPELIB_NATIVE=0 or set_enabled(False))', threaded=False)``: ``"native"`` (the compiled
    loop), ``"eager"`` (PyTorch operations), or the backend ``ROPELIB_BACKEND`` forces
    (``"triton"``: the kernel in Triton's interpreter, which takes float32 and bfloat16:
    float64 calls then raise); None where every such call raises
    (an unknown ``ROPELIB_BACKEND``, or ``native`` forced while the loop is unavailable).
    Other dtypes take the eager backend, CUDA tensors the Triton kernel:
    ``ropelib.backend_status(device, dtype)`` says what any call does."""
    loop = _loop_status()
    forced = os.environ.get("ROPELIB_BACKEND")
    if not forced:
        return loop
    if forced == "native":
        if loop.path == "native":
            return loop._replace(reason=f"forced by ROPELIB_BACKEND=native; {loop.reason}")
        return NativeStatus(None, f"ROPELIB_BACKEND=native forces the compiled loop, which "
                                  f"does not run ({loop.reason}): every CPU call raises "
                                  "ValueError", False)
    if forced in ("eager", "triton"):
        return NativeStatus(forced, f"forced by ROPELIB_BACKEND={forced} (the compiled loop: "
                                    f"{loop.reason})", False)
    return NativeStatus(None, f"ROPELIB_BACKEND={forced!r} is not one of ('native', 'triton', "
                              "'eager'): every call raises ValueError", False)


def _loop_status() -> NativeStatus:
    """Whether the compiled loop runs when nothing is forced, and why."""
    if not _enabled:
        return NativeStatus("eager", "disabled (ROPELIB_NATIVE=0 or set_enabled(False))", False)
    reason = unavailable_reason()
    if reason is not None:
        return NativeStatus("eager", f"the kernel could not be built: {reason}", False)
    openmp = threaded()
    how = "with OpenMP" if openmp else "without OpenMP (one thread)"
    return NativeStatus("native", f"compiled {how} by CC={_load()[0].compiler!r}", openmp)


def threaded() -> bool:
    """Whether the loaded kernel was built with OpenMP (runs on several threads)."""
    lib = _load()[0]
    return lib is not None and bool(lib.rope_threaded())


def supports(x: torch.Tensor, out: torch.Tensor | None) -> bool:
    """Whether ``rotate`` applies: enabled and built, CPU, float32/float64/bfloat16, channels
    contiguous (stride 1) in x and out, at most ``rope_max_dims()`` dims before the channels."""
    return _declines_tensor(x, out) is None


def _declines_tensor(x: torch.Tensor, out: torch.Tensor | None) -> str | None:
    if not _enabled:
        return "disabled (ROPELIB_NATIVE=0 or set_enabled(False))"
    if not x.is_cpu:
        return f"the compiled loop runs on the CPU, got {x.device}"
    if x.dtype not in DTYPES:
        return f"the compiled loop takes {', '.join(map(str, DTYPES))}, got {x.dtype}"
    if x.stride(-1) != 1 or (out is not None and out.stride(-1) != 1):
        return "the channels of x and out must be contiguous (stride 1)"
    if x.is_neg() or (out is not None and out.is_neg()):
        return "x and out must not be lazily negated views"
    lib, reason = _load()
    if lib is None:
        return f"the kernel could not be built: {reason}"
    if x.ndim - 1 > lib.max_dims:
        return f"at most {lib.max_dims} dims before the channels, got {x.ndim - 1}"
    return None


def decline_reason(xs: Sequence[torch.Tensor], outs: Sequence[torch.Tensor | None], cos: torch.Tensor,
             sin: torch.Tensor, rotary_dim: int, positions: torch.Tensor | None) -> str | None:
    """None when the compiled loop takes the call (``run``), else why not (a sentence)."""
    for x, out in zip(xs, outs, strict=True):
        reason = _declines_tensor(x, out)
        if reason is not None:
            return reason
    if cos.is_neg() or sin.is_neg():
        return "cos and sin must not be lazily negated views"
    if positions is not None and not supports_axes(xs[0], rotary_dim):
        return (f"a gathered row of {rotary_dim} channels does not fit the loop's tile buffer "
                f"({_load()[0].tile_bytes} bytes)")
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
    """``rotate`` for every x in ``xs`` (arguments as for ``ropelib.triton_rope.run``;
    ``pending`` and ``plan`` are None here: ``CHECKS_PENDING`` is False, ``assess`` makes
    no plan), with
    the tables made contiguous in the loop's precision (float64 for float64 x, else float32)
    once for all of them (q and k have one dtype). With ``positions`` the loop steps through
    the tables' rows by ``rotary_dim // 2``: wider tables are cut to that first."""
    if positions is not None:
        cos, sin = cos[:, :rotary_dim // 2], sin[:, :rotary_dim // 2]
        if axes is None:  # one coordinate per token: every pair its 0
            axes = torch.zeros(rotary_dim // 2, dtype=torch.int32)
    accumulate = torch.float64 if xs[0].dtype == torch.float64 else torch.float32
    cos, sin = cos.to(accumulate).contiguous(), sin.to(accumulate).contiguous()
    done = []
    for x, out in zip(xs, outs, strict=True):  # a loop, not a comprehension: no frame of its own
        done.append(rotate(x, cos, sin, layout, rotary_dim, out, inverse, positions, axes))
    return done


def supports_axis_rows(cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Whether ``axis_rows`` applies: enabled and built, CPU tables of one float32 or float64
    dtype, not lazily negated views (the loop reads their memory as it is)."""
    return (_enabled and cos.is_cpu and sin.is_cpu and cos.dtype in TABLE_DTYPES
            and sin.dtype == cos.dtype and not (cos.is_neg() or sin.is_neg())
            and _load()[0] is not None)


def axis_rows(cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
              pair_axes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Multi-axis RoPE's rows when every pair follows one axis, with the compiled loop:
    ``rows[n, i] = table[positions[n, pair_axes[i]], i]``.

    Like ``rotate``, it holds a reference to every tensor whose pointer it hands to C and
    keeps nothing after it returns.

    Args:
        cos, sin: ``(table_len, pairs)`` CPU tables, ``supports_axis_rows(cos, sin)``.
        positions: ``(tokens, k)`` int64 coordinates in ``[0, table_len)``.
        pair_axes: ``(pairs,)`` int32, the axis of each pair, in ``[0, k)``.

    Returns:
        ``(cos_rows, sin_rows)``, each ``(tokens, pairs)`` in the tables' dtype.

    Raises:
        ValueError: a position or an axis out of range (the loop checks each index before
            it reads the table with it).
    """
    cos, sin = cos.contiguous(), sin.contiguous()
    positions, pair_axes = positions.contiguous(), pair_axes.contiguous()
    tokens, k = positions.shape
    pairs = cos.shape[1]
    cos_rows, sin_rows = cos.new_empty(tokens, pairs), sin.new_empty(tokens, pairs)
    if tokens and pairs:
        threads = min(torch.get_num_threads(), max(1, tokens * pairs // PARALLEL_ELEMENTS))
        status = _load()[0].axis_rows[cos.dtype](
            cos.data_ptr(), sin.data_ptr(), positions.data_ptr(), pair_axes.data_ptr(), tokens,
            k, cos.shape[0], pairs, cos_rows.data_ptr(), sin_rows.data_ptr(), threads)
        if status:
            raise ValueError(f"positions must be in [0, {cos.shape[0]}) (the table's rows) and "
                             f"pair_axes in [0, {k}) (the axes), got positions in "
                             f"[{int(positions.min())}, {int(positions.max())}] and pair_axes "
                             f"in [{int(pair_axes.min())}, {int(pair_axes.max())}]")
    return cos_rows, sin_rows


def empty_like(x: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU tensor like x; from 4 MiB on, asked to live on huge pages."""
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    nbytes = out.numel() * out.element_size()
    if nbytes >= HUGE_PAGE_BYTES:
        _load()[0].rope_advise_huge_pages(out.data_ptr(), nbytes)
    return out


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str, rotary_dim: int,
           out: torch.Tensor | None = None, inverse: bool = False,
           positions: torch.Tensor | None = None, axes: torch.Tensor | None = None
           ) -> torch.Tensor:
    """out = R_Theta x (or R_{-Theta} x, the inverse) with the compiled loop.

    Every pointer handed to C belongs to a tensor this call holds a reference to, and nothing
    is kept after it returns, so concurrent calls (the loop runs without the GIL) share nothing.

    Args:
        x: ``(..., seq, head_dim)`` on the CPU, ``supports(x, out)``.
        cos, sin: ``(..., seq, rotary_dim // 2)`` broadcastable to x's rows (e.g. the 2-D
            rows ``(seq, rotary_dim // 2)``), float64 for float64 x and float32 otherwise,
            channels contiguous, both with the same strides. With ``positions``: the
            contiguous 1-D tables ``(table_len, rotary_dim // 2)`` (row m: angles m theta_i).
        layout: ``"interleaved"`` or ``"half"``.
        rotary_dim: rotated channels; the rest are copied (unless out is x).
        out: destination of x's shape and dtype, channels contiguous; x itself or memory that
            shares no element with x. Default: new.
        inverse: rotate by the opposite angles (sin read as -sin), as the gradient does.
        positions: multi-axis coordinates ``(..., seq, k)``, int64, broadcastable to x's rows
            (e.g. ``(1, 1, seq, k)``), last dim contiguous: pair i of a row reads the table
            row of its coordinate ``axes[i]`` (M-RoPE), gathered in the loop, a tile of rows
            at a time, and reused across heads (``supports_axes``).
        axes: with ``positions``, integer ``(rotary_dim // 2,)``, the axis of each pair.

    Raises:
        ValueError: a coordinate outside the table or an axis outside ``[0, k)`` (the loop
            checks each before it reads the table with it).
    """
    if out is None:
        out = empty_like(x)
    if not x.numel():
        return out
    if positions is not None:
        positions = positions.to(torch.int64).contiguous()
    table = cos if positions is None else positions
    dims = _dims(x.shape, x.stride(), out.stride(), table.shape, table.stride())
    threads = min(torch.get_num_threads(), max(1, x.numel() // PARALLEL_ELEMENTS))
    args = (x.data_ptr(), out.data_ptr(), cos.data_ptr(), sin.data_ptr(), threads, x.ndim - 1,
            dims, x.shape[-1], rotary_dim, int(layout == "half"), int(inverse))
    if positions is None:
        _load()[0].rope[x.dtype](*args)
        return out
    k = positions.shape[-1]
    axes = axes.to(torch.int32).contiguous()
    if _load()[0].rope_axes[x.dtype](*args, positions.data_ptr(), axes.data_ptr(), k,
                                     cos.shape[0]):
        check_coordinates(positions, axes, cos.shape[0])  # raises: the loop found one
        raise AssertionError("the compiled loop refused coordinates that are in range")
    return out


def supports_axes(x: torch.Tensor, rotary_dim: int) -> bool:
    """Whether ``rotate`` gathers multi-axis rows itself (``positions``): a gathered row of
    cos and sin fits in the loop's tile buffer (``ROPE_TILE_BYTES``
    in ``native_rope.c``, 16 KiB: rotary_dim up to 4096 channels for float32 tables, 2048 for float64)."""
    table_bytes = 8 if x.dtype == torch.float64 else 4
    return rotary_dim * table_bytes <= _load()[0].tile_bytes


def tile_rows(seq: int, runs: int, table_row_bytes: int, threads: int = 1,
              gathered: bool = False) -> int:
    """The positions the compiled loop rotates per tile, for every one of ``runs`` rows of
    each position (batch x heads) before the next tile: all ``seq`` where the tables of a
    sequence fit in a cache (x and out are then walked in memory order), fewer where they are
    larger, gathered (M-RoPE) or needed to share the rows among ``threads`` (rope_tile_rows in
    ``native_rope.c``). ``table_row_bytes``: the bytes of one position's cos and sin rows
    together (rotary_dim times 4 for float32 tables).

    Raises:
        ValueError: a count that is not a positive int.
        RuntimeError: the compiled loop is not available (``unavailable_reason()``).
    """
    counts = [check_count(name, value) for name, value in (
        ("seq", seq), ("runs", runs), ("table_row_bytes", table_row_bytes), ("threads", threads))]
    lib, reason = _load()
    if lib is None:
        raise RuntimeError(f"the compiled loop is not available: {reason}")
    return lib.rope_tile_rows(*counts[:3], int(gathered), counts[3])


@functools.lru_cache(maxsize=256)
def _dims(shape: tuple[int, ...], x_strides: tuple[int, ...], out_strides: tuple[int, ...],
          table_shape: tuple[int, ...], table_strides: tuple[int, ...]) -> bytes:
    """The leading dims' sizes, then x's, out's and the tables' strides, as int64s for C; a
    table's stride is 0 along the dims it broadcasts over (absent or of size 1). Kept for
    recently seen shapes and strides (plain integers, never a tensor)."""
    lead = shape[:-1]
    per_table = [0] * (len(lead) - len(table_shape) + 1) + [
        0 if n == 1 else st for n, st in zip(table_shape[:-1], table_strides[:-1], strict=True)]
    values = (*lead, *x_strides[:-1], *out_strides[:-1], *per_table)
    return struct.pack(f"{len(values)}q", *values)
