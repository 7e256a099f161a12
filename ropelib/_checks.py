"""Argument checks shared by the public functions.

Every message names the argument, what was seen and what was expected.
"""

from __future__ import annotations

import operator

import numpy as np
import torch

LAYOUTS = ("interleaved", "half")


def check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def tracing() -> bool:
    """Whether a compiler or tracer records the call (``torch.compile``, ``torch.export``,
    ``torch.jit.trace``): sizes may then be symbolic and tensor values unknown, so nothing
    may branch on them. Checks that only guard against misuse are skipped or become
    runtime assertions there; the computation is never skipped."""
    return torch.compiler.is_compiling() or torch.jit.is_tracing()


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
    return t


def check_int_tensor(name: str, t: object) -> torch.Tensor:
    """t as int64 positions: a tensor of any integer dtype (uint8 included, which would
    otherwise index as a boolean mask; uint64 beyond 2^63 - 1 turns negative and is
    refused as a negative position by the callers)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of integer positions, got {type(t).__name__}")
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer positions, got dtype {t.dtype}; use .long() "
                        "(every integer dtype is accepted)")
    return t.long()


def check_base(base: float) -> None:
    if isinstance(base, (bool, np.bool_)) or not isinstance(base, (int, float, np.integer)):
        raise TypeError(f"base must be a number, got {type(base).__name__}")
    if not base > 1.0 or base == float("inf"):
        raise ValueError(f"base must be a finite number > 1 (theta_i = base^(-2i/d)), got {base}")
