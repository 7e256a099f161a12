"""Argument checks shared by ropelib's public functions, ``watcher`` and ``new_output``:
the bottom layer. Every message names the argument, what was seen and what was expected.
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
    """Whether a compiler or tracer (compile, export, jit.trace) records the call: sizes may
    be symbolic and values unknown."""
    return is_compiling() or is_tracing()


_PROBE = torch.empty(0)  # watcher's question to forward AD


def watcher(*tensors: object, written: Sequence[object] = ()) -> str | None:
    """Who watches a call with these tensors and destinations ``written``: None (nobody: the
    kernel is launched directly); ``"dispatcher"`` (a compiler, tracer, dispatch mode or
    tensor subclass: the operators); ``"transform"`` (a ``torch.func`` wrapper or a tangent:
    PyTorch operations)."""
    if is_compiling() or is_tracing() or is_in_torch_dispatch_mode():
        return "dispatcher"
    # unpack_dual returns its tensor itself with no forward-AD level active, else a view:
    # one call tells whether any tensor can carry a tangent (tests/test_call_path.py).
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
    """value as an int if it is a Python or NumPy integer or a 0-d integer tensor; else None
    (bools included)."""
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
    """value as an int (NumPy integers accepted) if positive and even."""
    number = as_int(value)
    if number is None:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if number <= 0 or number % 2:
        raise ValueError(
            f"{name} must be a positive even number (RoPE rotates channel pairs), got {number}"
        )
    return number


def check_count(name: str, value: object, *, zero: bool = False, extra: str = "") -> int:
    """value as an int if positive (or 0 with ``zero``); ``extra`` is added to the expected."""
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
    """t as int64 positions from any integer dtype (uint8 would index as a mask; uint64 past
    2^63 - 1 turns negative and is refused as a negative position)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of integer positions, got "
                        f"{type(t).__name__}")
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
    """cos and sin as one pair: tensors of one shape, dtype and device (the loops read both
    with cos's sizes)."""
    if not (isinstance(cos, torch.Tensor) and isinstance(sin, torch.Tensor)):
        seen = type(sin if isinstance(cos, torch.Tensor) else cos).__name__
        raise TypeError(f"cos and sin must be torch.Tensors, got {seen}")
    if cos.shape != sin.shape or cos.dtype != sin.dtype or cos.device != sin.device:
        raise ValueError(f"cos and sin must have the same shape, dtype and device, got "
                         f"{tuple(cos.shape)} {cos.dtype} on {cos.device} and "
                         f"{tuple(sin.shape)} {sin.dtype} on {sin.device}")


def check_index_tensor(name: str, t: object, device: torch.device) -> None:
    """t is an integer tensor (not bool) on ``device``, the tables' device."""
    if not isinstance(t, torch.Tensor) or t.is_floating_point() or t.is_complex() or (
            t.dtype == torch.bool):
        seen = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
        raise TypeError(f"{name} must be an integer tensor, got {seen}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but the tables are on {device}")


def broadcasts(shape: torch.Size, target: tuple[int, ...], last: int = 0) -> bool:
    """Whether ``shape[:last]`` broadcasts to ``target[:last]`` (whole shapes for 0): what
    ``torch.broadcast_shapes`` says, without its Python cost, for symbolic shapes too."""
    n = len(shape) + last
    if n > len(target) + last:
        return False
    for j in range(last - 1, last - n - 1, -1):
        if shape[j] != 1 and shape[j] != target[j]:
            return False
    return True


def check_rotation_operands(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                            rotary_dim: int, positions: torch.Tensor | None,
                            axes: torch.Tensor | None) -> None:
    """What the operators need so their loop stays inside its tensors: rows that broadcast
    to x's, or 2-D tables with coordinates ``(..., seq, k)`` and one axis per pair."""
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
    """The operators' coordinates on the CPU: in ``[0, table_len)`` and axes in ``[0, k)``,
    else a ValueError naming both ranges (on a GPU their rows would be NaN)."""
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
    """A copy of ``positions`` checked to be >= 0, as an operator: ``torch.jit.trace`` drops
    ``torch._assert_async`` but keeps an operator whose result the graph uses."""
    if positions.numel() and int(positions.min()) < 0:
        raise ValueError(f"positions must be >= 0, got min {int(positions.min())}")
    return positions.clone()


@_nonnegative.register_fake
def _nonnegative_fake(positions: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(positions)


def traced_nonnegative(positions: torch.Tensor) -> torch.Tensor:
    """``positions`` checked >= 0 by the graph being recorded: an assertion under
    ``torch.compile`` / ``torch.export``, ``ropelib::nonnegative`` under ``torch.jit.trace``."""
    if is_tracing():
        return torch.ops.ropelib.nonnegative(positions)
    torch._assert_async((positions >= 0).all(), "positions must be >= 0")
    return positions


def new_output(x: torch.Tensor, gpu: bool | None = None) -> torch.Tensor:
    """A new output for x's rotation: on a GPU (``gpu``, default x's device) in x's layout
    where its channels are contiguous, else contiguous."""
    keep = (x.device.type == "cuda" if gpu is None else gpu) and x.stride(-1) == 1
    return torch.empty_like(x, memory_format=torch.preserve_format if keep
                            else torch.contiguous_format)
