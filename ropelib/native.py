"""The fused CPU kernel: RoPE as one C loop (``native_rope.c``), compiled on first use.

Eager PyTorch needs at least two passes over memory for the half layout (its pairs are d/2
apart, so there is no complex view) and a temporary for half precision. A loop that reads
each pair once and writes it once costs what a copy costs. ropelib compiles that loop with
the system's C compiler (``$CC``, default ``cc``) the first time it is needed, keeps the
shared library in ``$ROPELIB_CACHE_DIR`` (default ``~/.cache/ropelib``) and calls it through
ctypes. Built with OpenMP (where the compiler has it), it splits large tensors across
``torch.get_num_threads()`` threads of the OpenMP runtime PyTorch itself uses, so a forked
process (a DataLoader worker) has the same rule as torch: use one thread there. Fresh outputs
of 4 MiB or more get transparent huge pages (Linux), which makes their first touch, most of
the cost of any new tensor here, several times cheaper.

Without a compiler, on other devices and for other dtypes, ``ropelib.kernels`` uses its eager
paths; ``unavailable_reason()`` says why the kernel is missing, ``set_enabled(False)`` (or
``ROPELIB_NATIVE=0`` in the environment) turns it off, e.g. to compare the two.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import struct
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch

SOURCE = Path(__file__).with_name("native_rope.c")
DTYPES = (torch.float32, torch.float64, torch.bfloat16)
FLAGS = ("-O3", "-shared", "-fPIC", "-ffp-contract=off")
OPENMP_FLAG = "-fopenmp"
HUGE_PAGE_BYTES = 4 << 20
PARALLEL_ELEMENTS = 1 << 16

_enabled = os.environ.get("ROPELIB_NATIVE", "1") != "0"
_compile_lock = threading.Lock()
_I64 = ctypes.c_int64
_PTR = ctypes.c_void_p
_DIMS: dict[tuple, bytes] = {}  # rotate's packed dims for recently seen shapes and strides


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
    with OpenMP if the compiler has it, else without (one thread)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        for flags in ((*FLAGS, OPENMP_FLAG), FLAGS):
            result = subprocess.run([compiler, *flags, "-o", tmp, str(SOURCE)],
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
    """(library, None), or (None, why it could not be built or loaded)."""
    compiler = os.environ.get("CC", "cc")
    source = SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([source, compiler.encode(), " ".join(FLAGS).encode(),
                                     platform.machine().encode(), platform.system().encode()]))
    target = cache_dir() / f"native_rope-{key.hexdigest()[:16]}.so"
    try:
        with _compile_lock:
            if not target.exists():
                _compile(compiler, target)
        lib = ctypes.CDLL(str(target))
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:
        return None, f"{type(error).__name__}: {error}"
    lib.rope = {}
    for dtype in DTYPES:
        fn = getattr(lib, f"rope_{str(dtype).removeprefix('torch.')}")
        fn.argtypes = [_PTR, _PTR, _PTR, _PTR, _I64, _I64, _PTR, _I64, _I64, _I64]
        fn.restype = None
        lib.rope[dtype] = fn
    lib.rope_max_dims.restype = _I64
    lib.rope_threaded.restype = _I64
    lib.max_dims = lib.rope_max_dims()
    lib.rope_advise_huge_pages.argtypes = [_PTR, _I64]
    lib.rope_advise_huge_pages.restype = ctypes.c_int
    return lib, None


def unavailable_reason() -> str | None:
    """None when the kernel is built and loaded, else why not (compiler error, no compiler)."""
    return _load()[1]


def threaded() -> bool:
    """Whether the loaded kernel was built with OpenMP (runs on several threads)."""
    lib = _load()[0]
    return lib is not None and bool(lib.rope_threaded())


def supports(x: torch.Tensor, out: torch.Tensor | None) -> bool:
    """Whether ``rotate`` applies: ``active()``, CPU, float32/float64/bfloat16, channels
    contiguous (stride 1) in x and out, at most ``rope_max_dims()`` dims before the channels."""
    if not (x.is_cpu and x.dtype in DTYPES and x.stride(-1) == 1 and not x.is_neg()
            and (out is None or (out.stride(-1) == 1 and not out.is_neg())) and active()):
        return False
    return x.ndim - 1 <= _load()[0].max_dims


def active() -> bool:
    """Enabled, built, and not inside torch.compile's tracing (which cannot trace a C call)."""
    return _enabled and not torch.compiler.is_compiling() and _load()[0] is not None


def empty_like(x: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU tensor like x; from 4 MiB on, asked to live on huge pages."""
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    nbytes = out.numel() * out.element_size()
    if nbytes >= HUGE_PAGE_BYTES:
        _load()[0].rope_advise_huge_pages(out.data_ptr(), nbytes)
    return out


class Call(NamedTuple):
    """One call of the kernel worked out for x of one shape and strides, out of given (or
    contiguous) strides and fixed tables: all ``run`` still needs is x and out."""

    fn: Callable[..., None]
    ndim: int
    dims: bytes
    cos_ptr: int
    sin_ptr: int
    row_bytes: int
    head_dim: int
    rotary_dim: int
    half_layout: int
    max_threads: int


def prepare_call(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str,
                 rotary_dim: int, out: torch.Tensor | None = None) -> Call:
    """The ``Call`` for ``rotate``'s arguments (see there); x and out may change between runs
    but not their shapes and strides, and cos and sin must stay alive and in place."""
    out_strides = _contiguous_strides(x.shape) if out is None else out.stride()
    key = (x.shape, x.stride(), out_strides, cos.shape, cos.stride())
    dims = _DIMS.get(key)
    if dims is None:
        dims = _dims(x.shape, x.stride(), out_strides, cos)
        if len(_DIMS) >= 256:
            _DIMS.clear()
        _DIMS[key] = dims
    return Call(_load()[0].rope[x.dtype], x.ndim - 1, dims, cos.data_ptr(), sin.data_ptr(),
                cos.stride(0) * cos.element_size(), x.shape[-1], rotary_dim,
                int(layout == "half"), max(1, x.numel() // PARALLEL_ELEMENTS))


def run(call: Call, x: torch.Tensor, out: torch.Tensor | None = None, first_row: int = 0
        ) -> torch.Tensor:
    """Run a prepared call on x (of the shape and strides it was prepared for) into out
    (default: new, contiguous), starting at row ``first_row`` of a 2-D table."""
    if out is None:
        out = empty_like(x)
    if x.numel():
        skip = first_row * call.row_bytes
        call.fn(x.data_ptr(), out.data_ptr(), call.cos_ptr + skip, call.sin_ptr + skip,
                min(torch.get_num_threads(), call.max_threads), call.ndim, call.dims,
                call.head_dim, call.rotary_dim, call.half_layout)
    return out


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str, rotary_dim: int,
           out: torch.Tensor | None = None, first_row: int = 0) -> torch.Tensor:
    """out = R_Theta x with the compiled loop.

    Args:
        x: ``(..., seq, head_dim)`` on the CPU, ``supports(x, out)``.
        cos, sin: ``(..., seq, rotary_dim // 2)`` broadcastable to x's rows, channels contiguous,
            float64 for float64 x and float32 otherwise, with the same strides; or a 2-D table
            ``(table_len, rotary_dim // 2)`` whose rows ``first_row .. first_row + seq - 1``
            are used (no slice is made).
        layout: ``"interleaved"`` or ``"half"``.
        rotary_dim: rotated channels; the rest are copied (unless out is x).
        out: destination of x's shape and dtype, channels contiguous; x itself or memory that
            does not overlap x. Default: new.
        first_row: the table row of x's first position (with a 2-D table).
    """
    return run(prepare_call(x, cos, sin, layout, rotary_dim, out), x, out, first_row)


def _contiguous_strides(shape: torch.Size) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def _dims(shape: torch.Size, x_strides: tuple, out_strides: tuple, cos: torch.Tensor) -> bytes:
    """The leading dims' sizes, then x's, out's and the tables' strides, as int64s for C; a
    table's stride is 0 along the dims it broadcasts over (absent or of size 1)."""
    lead = shape[:-1]
    table_strides = [0] * (len(lead) - cos.ndim + 1) + [
        0 if n == 1 else st for n, st in zip(cos.shape[:-1], cos.stride()[:-1], strict=True)]
    values = (*lead, *x_strides[:-1], *out_strides[:-1], *table_strides)
    return struct.pack(f"{len(values)}q", *values)
