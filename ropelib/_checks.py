"""Argument checks shared by the public functions, and what every layer of the rotation
asks alike (``watcher``: who watches a call; ``new_output``: the layout of a new output).

Every message names the argument, what was seen and what was expected. This module is the
bottom of the rotation's layers: it imports no other module of ropelib.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import numpy as np
import torch
from torch.autograd.forward_ad import unpack_dual
from torch.compiler import is_compiling
from torch.jit import is_tracing
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

LAYOUTS = ("interleaved", "half")


def check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def tracing() -> bool:
    """Whether a compiler or tracer records the call (``torch.compile``, ``torch.export``,
    ``torch.jit.trace``): sizes may then be symbolic and tensor values unknown, so nothing
    may branch on them. Checks that only guard against misuse are skipped or become
    runtime assertions there; the computation is never skipped."""
    return is_compiling() or is_tracing()


_PROBE = torch.empty(0)  # watcher's question to forward AD


def watcher(*tensors: object, written: Sequence[object] = ()) -> str | None:
    """Who watches a call with these tensors (anything else, such as None for an optional
    tensor not given, is passed over) and with the destinations ``written``: the one answer
    every entry of ropelib acts on (the pattern of flash-attention's PR 2823).

    - None: nobody, an eager call of plain ``torch.Tensor`` s: the kernel is launched
      directly, without the dispatcher's layers;
    - ``"dispatcher"``: a compiler or tracer (``torch.compile``, ``torch.export``,
      ``torch.jit.trace``), a ``TorchDispatchMode``, or a tensor of a subclass (a DTensor,
      a fake tensor, a Parameter): the call goes through the registered operators
      (``ropelib::rotate`` and its siblings), which they see as one node;
    - ``"transform"``: a ``torch.func`` transform (vmap, grad, jvp, ...: a tensor read is
      its wrapper, which has no storage of its own, also one kept after its transform
      ended) or forward-mode AD (a tensor read carries a tangent): the rotation runs as PyTorch
      operations (``eager.rotate_composite``), which the transform batches and
      differentiates.

    Asked without ``torch._C``: public functions, and ``is_in_torch_dispatch_mode`` from
    ``torch.utils._python_dispatch``, the module of the documented ``TorchDispatchMode``
    (PyTorch has no public way to ask whether a mode is active)."""
    if is_compiling() or is_tracing() or is_in_torch_dispatch_mode():
        return "dispatcher"
    # With no forward-AD level active unpack_dual returns its tensor itself, with one a view:
    # one call tells whether any tensor can carry a tangent. Were it to return a view always,
    # every tensor read would be asked (right, only slower); were it to return a plain
    # tensor itself under a level, tangents would go unseen: tests/test_call_path.py's
    # tangent on cos after plain calls fails then.
    dual = unpack_dual(_PROBE).primal is not _PROBE
    subclass = False
    for t in tensors:
        if type(t) is not torch.Tensor:
            if not isinstance(t, torch.Tensor):
                continue
            subclass = True
        try:
            t.untyped_storage()
        except (NotImplementedError, RuntimeError):  # a wrapper: no storage of its own
            return "transform"
        if dual and t.dtype.is_floating_point and unpack_dual(t).tangent is not None:
            return "transform"
    for t in written:  # a wrapper here fails where the kernel asks for its data pointer
        if type(t) is not torch.Tensor and isinstance(t, torch.Tensor):
            subclass = True
    return "dispatcher" if subclass else None


def as_int(value: object) -> int | None:
    """value as a Python int if it is an integer: a Python or NumPy integer, or a 0-d
    integer tensor; None for anything else, bools included."""
    if type(value) is int:
        return value
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, torch.Tensor) and (
            value.dtype == torch.bool or value.is_floating_point() or value.is_complex())):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def check_even_positive(name: str, value: int) -> int:
    """value as an int (NumPy integers accepted) if it is positive and even."""
    number = as_int(value)
    if number is None:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if number <= 0 or number % 2:
        raise ValueError(
            f"{name} must be a positive even number (RoPE rotates channel pairs), got {number}"
        )
    return number


def check_count(name: str, value: object, *, zero: bool = False, extra: str = "") -> int:
    """value as an int (NumPy integers accepted) if it is positive (or 0 with ``zero``),
    else a ValueError naming it; ``extra`` is appended to what is expected."""
    number = as_int(value)
    if number is None or number < (0 if zero else 1):
        what = "a non-negative int" if zero else "a positive int"
        raise ValueError(f"{name} must be {what}{extra}, got {value!r}")
    return number


def check_float_tensor(name: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(
            f"{name} must be a floating-point tensor, got dtype {t.dtype}; "
            f"convert it first, e.g. {name}.float()"
        )
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be a floating-point tensor of {_FLOAT_NAMES}, got dtype "
                        f"{t.dtype}; convert it first, e.g. {name}.float()")
    return t


FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_FLOAT_NAMES = "float16, bfloat16, float32 or float64"


def check_int_tensor(name: str, t: object) -> torch.Tensor:
    """t as int64 positions: a tensor of any integer dtype (uint8 included, which would
    otherwise index as a boolean mask; uint64 beyond 2^63 - 1 turns negative and is
    refused as a negative position by the callers)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of integer positions, got {type(t).__name__}")
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer positions, got dtype {t.dtype}; use .long() "
                        "(every integer dtype is accepted)")
    return t if t.dtype == torch.int64 else t.long()


def check_base(base: float) -> None:
    if isinstance(base, (bool, np.bool_)) or not isinstance(base, (int, float, np.integer)):
        raise TypeError(f"base must be a number, got {type(base).__name__}")
    if not base > 1.0 or base == float("inf"):
        raise ValueError(f"base must be a finite number > 1 (theta_i = base^(-2i/d)), got {base}")


def check_table_pair(cos: object, sin: object) -> None:
    """cos and sin as one pair of tables: tensors of one shape, dtype and device. The
    operators' loops read both with cos's sizes, so a shorter sin would be read past its end."""
    if not (isinstance(cos, torch.Tensor) and isinstance(sin, torch.Tensor)):
        seen = type(sin if isinstance(cos, torch.Tensor) else cos).__name__
        raise TypeError(f"cos and sin must be torch.Tensors, got {seen}")
    if cos.shape != sin.shape or cos.dtype != sin.dtype or cos.device != sin.device:
        raise ValueError(f"cos and sin must have the same shape, dtype and device, got "
                         f"{tuple(cos.shape)} {cos.dtype} on {cos.device} and "
                         f"{tuple(sin.shape)} {sin.dtype} on {sin.device}")


def check_index_tensor(name: str, t: object, device: torch.device) -> None:
    """t is an integer tensor (not bool) on ``device``, the device of the tables it indexes."""
    if not isinstance(t, torch.Tensor) or t.is_floating_point() or t.is_complex() or (
            t.dtype == torch.bool):
        seen = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
        raise TypeError(f"{name} must be an integer tensor, got {seen}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but the tables are on {device}")


def broadcasts(shape: torch.Size, target: tuple[int, ...], last: int = 0) -> bool:
    """Whether ``shape[:last]`` broadcasts to ``target[:last]`` (aligned at the end, size 1
    or equal in every dim, no more dims than the target); with ``last`` 0 the whole shapes:
    ``torch.broadcast_shapes(shape, target) == target`` without its Python (19 us a call
    on a 2-core VM, symbolic shapes)."""
    n = len(shape) + last
    if n > len(target) + last:
        return False
    for j in range(last - 1, last - n - 1, -1):
        if shape[j] != 1 and shape[j] != target[j]:
            return False
    return True


def check_rotation_operands(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                            rotary_dim: int, out: torch.Tensor | None,
                            positions: torch.Tensor | None, axes: torch.Tensor | None) -> None:
    """What the rotation operators (``ropelib::rotate``, ``ropelib::rotate_out`` and, for q
    and for k, the q-and-k ones) need before their loop runs, so that it reads and writes
    only inside the tensors it is given: one pair of tables on x's device with (at least)
    ``rotary_dim // 2`` columns; rows broadcastable to x's rows, or (with ``positions``) 2-D
    tables, coordinates ``(..., seq, k)`` with x's number of dims broadcastable to x's rows,
    and one axis per pair (none: k is 1); ``out`` of x's shape, dtype and device."""
    check_table_pair(cos, sin)
    shape, table = x.shape, cos.shape
    if rotary_dim <= 0 or rotary_dim % 2 or rotary_dim > shape[-1]:
        raise ValueError(f"rotary_dim must be a positive even number <= head_dim="
                         f"{shape[-1]}, got {rotary_dim}")
    if cos.device != x.device:
        raise ValueError(f"cos/sin are on {cos.device} but x is on {x.device}")
    if not table or table[-1] < rotary_dim // 2:  # the loop reads the first rotary_dim // 2
        raise ValueError(f"cos/sin must have rotary_dim // 2 = {rotary_dim // 2} columns, got "
                         f"shape {tuple(table)}")
    if out is not None and (out.shape != shape or out.dtype != x.dtype
                            or out.device != x.device):
        raise ValueError(f"out must have x's shape {tuple(shape)}, dtype {x.dtype} and device "
                         f"{x.device}, got {tuple(out.shape)}, {out.dtype} on {out.device}")
    if positions is None:
        if not broadcasts(table, shape, -1):
            raise ValueError(f"cos/sin rows {tuple(table)} do not broadcast to x's rows "
                             f"{tuple(shape[:-1]) + (rotary_dim // 2,)}")
        return
    check_index_tensor("positions", positions, cos.device)
    if len(table) != 2:
        raise ValueError(f"with positions, cos/sin must be 2-D tables (table_len, "
                         f"{rotary_dim // 2}), got {tuple(table)}")
    if axes is None and positions.shape[-1:] != (1,):
        raise ValueError(f"positions without axes are one coordinate per token, (..., seq, "
                         f"1), got {tuple(positions.shape)}")
    if axes is not None:
        check_index_tensor("axes", axes, cos.device)
        if axes.shape != (rotary_dim // 2,):
            raise ValueError(f"axes must have shape ({rotary_dim // 2},) (one axis per pair), "
                             f"got {tuple(axes.shape)}")
    if positions.ndim != x.ndim or positions.shape[-1] < 1 or not broadcasts(
            positions.shape, shape, -1):
        raise ValueError(f"positions must have shape (..., seq, k) with {x.ndim} dims, "
                         f"broadcastable to x's rows {tuple(shape[:-1])}, got "
                         f"{tuple(positions.shape)}")


def check_coordinates(positions: torch.Tensor, axes: torch.Tensor | None,
                      table_len: int) -> None:
    """The rotation operators' coordinates on the CPU: each in ``[0, table_len)`` (the
    table's rows) and each axis in ``[0, k)``, else a ValueError naming both ranges. Every
    CPU backend refuses them so (the compiled loop as it reads each row); on a GPU their
    rows become NaN instead (nothing is read back to check them)."""
    k = positions.shape[-1]
    bounds = [*torch.aminmax(positions)] if positions.numel() else []
    if axes is not None and axes.numel():
        bounds += [t.to(positions.device) for t in torch.aminmax(axes)]
    bounds = torch.stack(bounds).tolist() if bounds else []
    low, high = bounds[:2] if positions.numel() else (0, -1)
    axis_low, axis_high = bounds[-2:] if axes is not None and axes.numel() else (0, 0)
    if low < 0 or high >= table_len or axis_low < 0 or axis_high >= k:
        raise ValueError(f"positions must be in [0, {table_len}) (the table's rows) and axes "
                         f"in [0, {k}) (the coordinates), got positions in [{low}, {high}] and "
                         f"axes in [{axis_low}, {axis_high}]")


@torch.library.custom_op("ropelib::nonnegative", mutates_args=())
def _nonnegative(positions: torch.Tensor) -> torch.Tensor:
    """A copy of ``positions`` after checking that none is negative, as an operator:
    ``torch.jit.trace`` drops ``torch._assert_async`` from its graph, but keeps an operator
    whose result the graph uses."""
    if positions.numel() and int(positions.min()) < 0:
        raise ValueError(f"positions must be >= 0, got min {int(positions.min())}")
    return positions.clone()


@_nonnegative.register_fake
def _nonnegative_fake(positions: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(positions)


def traced_nonnegative(positions: torch.Tensor) -> torch.Tensor:
    """``positions``, checked to be >= 0 by the recorded graph when one is being recorded: an
    assertion under ``torch.compile`` / ``torch.export``, the operator ``ropelib::nonnegative``
    in its data flow under ``torch.jit.trace`` (which would drop the assertion)."""
    if is_tracing():
        return torch.ops.ropelib.nonnegative(positions)
    torch._assert_async((positions >= 0).all(), "positions must be >= 0")
    return positions


def new_output(x: torch.Tensor, gpu: bool | None = None) -> torch.Tensor:
    """The new output of a rotation of x, every backend's and the operators' fake one: on a
    GPU in x's memory layout where x is dense with contiguous channels, as PyTorch's
    elementwise operations make theirs (a ``(batch, seq, heads, dim)`` view stays one, so
    attention reads it and its output without a copy), else contiguous (the CPU's compiled
    loop writes rows in order). ``gpu``: whether x counts as on a GPU (default: x's device;
    the Triton backend plans launches on meta tensors)."""
    keep = (x.device.type == "cuda" if gpu is None else gpu) and x.stride(-1) == 1
    return torch.empty_like(x, memory_format=torch.preserve_format if keep
                            else torch.contiguous_format)
