"""Argument checks shared by the public functions.

Every message names the argument, what was seen and what was expected.
"""

from __future__ import annotations

import torch

LAYOUTS = ("interleaved", "half")


def check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def check_even_positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value <= 0 or value % 2:
        raise ValueError(
            f"{name} must be a positive even number (RoPE rotates channel pairs), got {value}"
        )


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
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of integer positions, got {type(t).__name__}")
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer positions, got dtype {t.dtype}; use .long()")
    return t


def check_base(base: float) -> None:
    if isinstance(base, bool) or not isinstance(base, (int, float)):
        raise TypeError(f"base must be a number, got {type(base).__name__}")
    if not base > 1.0 or base == float("inf"):
        raise ValueError(f"base must be a finite number > 1 (theta_i = base^(-2i/d)), got {base}")
