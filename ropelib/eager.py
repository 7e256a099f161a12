"""The eager backend: the rotation in PyTorch operations, for every device and dtype.

It runs where no compiled kernel takes a call (float16 on the CPU, float64 on a GPU, no C
compiler, other devices). The interleaved layout is one complex multiply by e^{i m theta};
otherwise two ``mul`` and two ``addcmul_`` into the destination (in place or in half
precision, products in float32 temporaries first: half precision rounds once).
``rotate_composite`` (differentiable) serves ``torch.func`` transforms.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._checks import new_output

NAME = "eager"
CHECKS_PENDING = False  # coordinates arrive settled (``kernels.resolve_pending``)
prepare = None  # no launch to prepare: such calls take the full path
run_cache = None  # a cache step is ``run`` into the key cache's slots and a copy of v


def assess(xs, outs, cos, sin, rotary_dim, positions) -> tuple[None, None]:
    """(no reason to decline: eager PyTorch takes every call, no plan)."""
    return None, None


def run(xs: Sequence[torch.Tensor], outs: Sequence[torch.Tensor | None], cos: torch.Tensor,
        sin: torch.Tensor, layout: str, rotary_dim: int, inverse: bool,
        positions: torch.Tensor | None, axes: torch.Tensor | None, *, pending: None = None,
        plan: None = None) -> list[torch.Tensor]:
    """R_Theta x (R_{-Theta} x with ``inverse``) for each x ``(..., seq, head_dim)`` into
    ``outs`` (None: new); rows ``(..., seq, >= rotary_dim // 2)`` or 2-D tables read through
    ``positions`` (and ``axes``)."""
    cos, sin = cos[..., :rotary_dim // 2], sin[..., :rotary_dim // 2]
    if positions is not None:
        cos, sin = gather_rows(cos, sin, positions, axes)
    if inverse:
        sin = -sin
    return [_rotate_one(x, cos, sin, layout, rotary_dim, out)
            for x, out in zip(xs, outs, strict=True)]


def _rotate_one(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str,
                rotary_dim: int, out: torch.Tensor | None) -> torch.Tensor:
    in_place = out is not None and out.data_ptr() == x.data_ptr() and out.stride() == x.stride()
    out = new_output(x) if out is None else out
    xr, outr = x[..., :rotary_dim], out[..., :rotary_dim]
    if rotary_dim < x.shape[-1] and not in_place:
        out[..., rotary_dim:].copy_(x[..., rotary_dim:])
    wide = torch.promote_types(x.dtype, torch.float32)
    if layout == "interleaved" and (wide != x.dtype or _complex_viewable(xr)
                                    and _complex_viewable(outr)):
        turn = torch.complex(cos.to(wide), sin.to(wide))
        if wide == x.dtype:
            torch.mul(_as_complex(xr), turn, out=_as_complex(outr))
        else:  # half precision: widened once, rounded once
            widened = xr.to(wide, memory_format=torch.contiguous_format)
            _as_complex(widened).mul_(turn)
            outr.copy_(widened)
        return out
    cos, sin = cos.to(wide), sin.to(wide)
    (a, b), (out_a, out_b) = pairs(xr, layout), pairs(outr, layout)
    if in_place or wide != x.dtype:  # products in wide temporaries before any write
        minus_b_sin, a_sin = b * -sin, a * sin
        torch.addcmul(minus_b_sin, a, cos, out=out_a)
        torch.addcmul(a_sin, b, cos, out=out_b)
    else:
        torch.mul(a, cos, out=out_a).addcmul_(b, sin, value=-1)
        torch.mul(b, cos, out=out_b).addcmul_(a, sin)
    return out


def _complex_viewable(t: torch.Tensor) -> bool:
    return t.stride(-1) == 1 and t.storage_offset() % 2 == 0 and (
        t.is_contiguous() or all(s % 2 == 0 for s in t.stride()[:-1]))


def _as_complex(t: torch.Tensor) -> torch.Tensor:
    return torch.view_as_complex(t.view(*t.shape[:-1], t.shape[-1] // 2, 2))


def gather_rows(cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                axes: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``table_rows`` of both tables, where a coordinate outside the table reads no memory
    and gives NaN, as in the Triton kernel."""
    table_len, width = cos.shape
    positions = positions.long()
    if not table_len:  # nothing to read: every row is outside
        shape = positions.shape[:-1] + (width,)
        return (torch.full(shape, float("nan"), dtype=cos.dtype, device=cos.device),) * 2
    outside = (positions < 0) | (positions >= table_len)
    outside = (outside.expand(*outside.shape[:-1], width) if axes is None
               else outside.index_select(-1, axes.long()))
    inside = positions.clamp(0, table_len - 1)
    return tuple(table_rows(table, inside, axes).masked_fill(outside, float("nan"))
                 for table in (cos, sin))


def table_rows(table: torch.Tensor, positions: torch.Tensor,
               axes: torch.Tensor | None) -> torch.Tensor:
    """Rows ``(..., seq, pairs)`` of a table ``(table_len, pairs)`` at coordinates ``(..., seq,
    k)`` in range: pair i from coordinate ``axes[i]`` (None: k is 1). PyTorch operations."""
    flat = positions.reshape(-1, positions.shape[-1]).long()  # index_select takes int32/64
    rows = table.index_select(0, flat[:, 0])
    for axis in range(1, flat.shape[1]):  # M-RoPE: axes given
        rows = torch.where(axes == axis, table.index_select(0, flat[:, axis]), rows)
    return rows.view(*positions.shape[:-1], table.shape[1])


def pairs(t: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The two members (a, b) of every pair, as views of shape (..., d/2)."""
    if layout == "half":
        h = t.shape[-1] // 2
        return t[..., :h], t[..., h:]
    return t[..., 0::2], t[..., 1::2]


def rotate_composite(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str,
                     rotary_dim: int, positions: torch.Tensor | None = None,
                     axes: torch.Tensor | None = None) -> torch.Tensor:
    """The rotation in differentiable PyTorch operations (at least float32, one rounding),
    for ``torch.func`` transforms and forward-mode AD, which the kernels cannot take."""
    cos, sin = cos[..., :rotary_dim // 2], sin[..., :rotary_dim // 2]
    if positions is not None:
        cos, sin = gather_rows(cos, sin, positions, axes)
    wide = torch.promote_types(x.dtype, torch.float32)
    a, b = (t.to(wide) for t in pairs(x[..., :rotary_dim], layout))
    cos, sin = cos.to(wide), sin.to(wide)
    first, second = a * cos - b * sin, a * sin + b * cos
    rotated = (torch.cat((first, second), -1) if layout == "half"
               else torch.stack((first, second), -1).flatten(-2)).to(x.dtype)
    if rotary_dim < x.shape[-1]:
        return torch.cat((rotated, x[..., rotary_dim:]), -1)
    return rotated
