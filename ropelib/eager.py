"""The eager backend: the rotation in PyTorch operations, for every device and dtype.

It is what runs where no compiled kernel takes a call (float64 on a GPU, a CPU without a C
compiler, other devices), arranged to move few bytes:

- **Interleaved layout, float32/float64:** a pair (a, b) is the complex number a + ib and the
  rotation is one complex multiply by e^{i m theta} (``view_as_complex``): a single pass.
- **Interleaved layout, float16/bfloat16:** there is no half-precision complex multiply on the
  CPU, so x is widened to float32 once, rotated there in place and rounded once into ``out``
  (which is also more accurate than three rounded half-precision operations).
- **Half layout, float16/bfloat16:** the products with sin first, into float32 temporaries
  (half of x each, computed before anything is written, so also in place), then
  ``out_a = addcmul(-b sin, a, cos)`` and ``out_b = addcmul(a sin, b, cos)`` with
  half-precision outputs: PyTorch computes them in float32 and rounds once on the store, as
  the compiled loop and the Triton kernel do (three rounded half-precision operations were
  up to 5 ulp off), and x is never widened as a whole.
- **Otherwise:** ``out = x * cos_wide`` (cos repeated to full width in the layout's pair
  order), then ``out_a -= b * sin`` and ``out_b += a * sin`` with ``addcmul_``: two passes, no
  temporaries.
- **In place** (``out`` is ``x``): the complex multiply works in place as it is; otherwise the
  first member of every pair is saved (half of x), then ``a = a cos - b sin`` and
  ``b = b cos + a_saved sin``.

``decline_reason`` (never: this backend takes every call) and ``run`` are the interface of every
backend of ``ropelib.kernels``. ``gather_rows``, ``pairs`` and ``rotate_composite`` (the
rotation in differentiable operations, for ``torch.func``) are shared with the callers above.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._checks import new_output

NAME = "eager"
CHECKS_PENDING = False  # coordinates arrive settled (``kernels.resolve_pending``)
CHECKS_COORDINATES = False  # their range is checked before ``run`` (``check_coordinates``)
prepare = None  # no launch to prepare: ``ropelib.plans`` sends such calls the full path
run_cache = None  # a cache step is ``run`` into the key cache's slots and a copy of v
_COMPLEX_DTYPES = (torch.float32, torch.float64)
_UPCAST_DTYPES = (torch.float16, torch.bfloat16)


def decline_reason(xs: Sequence[torch.Tensor], outs: Sequence[torch.Tensor | None], cos: torch.Tensor,
             sin: torch.Tensor, rotary_dim: int, positions: torch.Tensor | None) -> str | None:
    """None: eager PyTorch takes every call."""
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
    """R_Theta x (R_{-Theta} x with ``inverse``) for every x in ``xs``, into ``outs`` (None: a
    new tensor, ``new_output``); arguments as for ``ropelib.triton_rope.run`` (``pending``
    and ``plan`` are None here: ``CHECKS_PENDING`` is False, ``assess`` makes no plan).
    Tables (or rows) wider than ``rotary_dim // 2`` are read in their first
    ``rotary_dim // 2`` columns."""
    cos, sin = cos[..., :rotary_dim // 2], sin[..., :rotary_dim // 2]
    if positions is not None:
        cos, sin = gather_rows(cos, sin, positions, axes)
    return [_rotate_one(x, cos, sin, layout, rotary_dim, out, inverse)
            for x, out in zip(xs, outs, strict=True)]


def _rotate_one(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str,
                rotary_dim: int, out: torch.Tensor | None, inverse: bool) -> torch.Tensor:
    path = choose_path(x, out, layout, rotary_dim)
    tables = prepare_tables(cos, sin, path, x.dtype, layout, inverse)
    in_place = out is not None and out.data_ptr() == x.data_ptr() and out.stride() == x.stride()
    if out is None:
        out = new_output(x)
    xr, outr = x, out
    if rotary_dim < x.shape[-1]:
        if not in_place:
            out[..., rotary_dim:].copy_(x[..., rotary_dim:])
        xr, outr = x[..., :rotary_dim], out[..., :rotary_dim]
    if path == "complex":
        torch.mul(_as_complex(xr), tables[0], out=_as_complex(outr))
        return out
    if path == "upcast":
        wide = xr.to(torch.float32, memory_format=torch.contiguous_format)
        _as_complex(wide).mul_(tables[0])
        outr.copy_(wide)
        return out
    a, b = pairs(xr, layout)
    if path == "upcast_pairs":
        cos, sin, minus_sin = tables
        minus_b_sin, a_sin = torch.mul(b, minus_sin), torch.mul(a, sin)  # float32
        out_a, out_b = pairs(outr, layout)
        torch.addcmul(minus_b_sin, a, cos, out=out_a)
        torch.addcmul(a_sin, b, cos, out=out_b)
        return out
    cos, sin, cos_wide = tables
    if in_place:
        a_saved = a.clone()
        a.mul_(cos).addcmul_(b, sin, value=-1)
        b.mul_(cos).addcmul_(a_saved, sin)
        return out
    out_a, out_b = pairs(outr, layout)
    torch.mul(xr, cos_wide, out=outr)
    out_a.addcmul_(b, sin, value=-1)
    out_b.addcmul_(a, sin)
    return out


def choose_path(x: torch.Tensor, out: torch.Tensor | None, layout: str, rotary_dim: int) -> str:
    """``"complex"``, ``"upcast"`` (half precision via float32 complex), ``"upcast_pairs"``
    (half precision, half layout, in float32) or ``"pairs"``."""
    if layout == "half" and x.dtype in _UPCAST_DTYPES:
        return "upcast_pairs"
    if layout == "interleaved":
        if x.dtype in _UPCAST_DTYPES:
            return "upcast"
        if (x.dtype in _COMPLEX_DTYPES and _complex_viewable(x[..., :rotary_dim])
                and (out is None or _complex_viewable(out[..., :rotary_dim]))):
            return "complex"
    return "pairs"


def prepare_tables(cos: torch.Tensor, sin: torch.Tensor, path: str, dtype: torch.dtype,
                   layout: str, inverse: bool = False) -> tuple[torch.Tensor, ...]:
    """The tables a path multiplies by, with the rows (dim -2) of cos and sin:
    ``"complex"``: (e^{i m theta} in x's precision,); ``"upcast"``: (e^{i m theta} in
    float32,); ``"pairs"``: (cos, sin, cos widened to full width), in x's dtype;
    ``"upcast_pairs"``: (cos, sin, -sin) in float32. With
    ``inverse`` they are those of -theta (sin negated)."""
    if inverse:
        sin = -sin
    if path == "complex":
        return (torch.complex(cos.to(dtype), sin.to(dtype)),)
    if path == "upcast":
        return (torch.complex(cos.float(), sin.float()),)
    if path == "upcast_pairs":
        cos, sin = cos.float(), sin.float()
        return cos, sin, -sin
    cos, sin = cos.to(dtype), sin.to(dtype)
    return cos, sin, _widen(cos, layout)


def gather_rows(cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                axes: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of positions read from 2-D tables: ``rows[..., n, i] = table[positions[...,
    n, axes[i]], i]`` (multi-axis RoPE whose pairs each follow one axis), or with ``axes``
    None ``table[positions[..., n, 0], i]`` (one coordinate per token). A coordinate outside
    ``[0, table_len)`` reads no memory: its row is NaN, as in the Triton kernel (on the CPU
    ``ropelib.kernels`` refuses such coordinates before any backend runs).

    Args:
        cos, sin: ``(table_len, pairs)``.
        positions: ``(..., seq, k)`` int64 coordinates.
        axes: ``(pairs,)`` int64, the axis of each pair, or None (k is 1).

    Returns:
        ``(cos, sin)`` rows ``(..., seq, pairs)``, differentiable in the tables (a gather).
    """
    table_len, width = cos.shape
    index = (positions[..., :1].expand(*positions.shape[:-1], width) if axes is None
             else positions.index_select(-1, axes))
    inside = (index >= 0) & (index < table_len)
    flat = index.clamp(0, max(table_len - 1, 0)).reshape(-1, width)
    if not table_len:  # nothing to read: every row is outside
        return (torch.full(index.shape, float("nan"), dtype=cos.dtype, device=cos.device),) * 2
    return tuple(table.gather(0, flat).reshape(index.shape).masked_fill(~inside, float("nan"))
                 for table in (cos, sin))


def pairs(t: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The two members (a, b) of every pair, as views of shape (..., d/2)."""
    if layout == "half":
        h = t.shape[-1] // 2
        return t[..., :h], t[..., h:]
    return t[..., 0::2], t[..., 1::2]


def _complex_viewable(t: torch.Tensor) -> bool:
    if t.is_contiguous():
        return t.storage_offset() % 2 == 0
    return (t.stride(-1) == 1 and t.storage_offset() % 2 == 0
            and all(s % 2 == 0 for s in t.stride()[:-1]))


def _as_complex(t: torch.Tensor) -> torch.Tensor:
    return torch.view_as_complex(t.view(*t.shape[:-1], t.shape[-1] // 2, 2))


def _widen(cos: torch.Tensor, layout: str) -> torch.Tensor:
    """cos (..., d/2) repeated to (..., d) in the layout's channel order."""
    return torch.cat((cos, cos), dim=-1) if layout == "half" else cos.repeat_interleave(2, -1)


def rotate_composite(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str,
                     rotary_dim: int, positions: torch.Tensor | None = None,
                     axes: torch.Tensor | None = None) -> torch.Tensor:
    """The rotation in plain differentiable PyTorch operations (at least float32 arithmetic,
    one rounding): what ``torch.func`` transforms (grad, vmap, jvp, ...) and forward-mode AD
    differentiate and batch, since the kernels only take plain tensors."""
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
