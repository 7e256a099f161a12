"""The rotation's arithmetic, arranged to move as few bytes as possible.

RoPE reads x once and writes the result once, like a copy; everything beyond that is
overhead. On the CPU, for float32, float64 and bfloat16, ``ropelib.native`` does it in one
compiled loop (path ``"native"``) whenever its C compiler was found. Elsewhere, in eager
PyTorch:

- **Interleaved layout, float32/float64:** a pair (a, b) is the complex number a + ib and the
  rotation is one complex multiply by e^{i m theta} (``view_as_complex``): a single pass.
- **Interleaved layout, float16/bfloat16:** there is no half-precision complex multiply on the
  CPU, so x is widened to float32 once, rotated there in place and rounded once into ``out``
  (which is also more accurate than three rounded half-precision operations).
- **Otherwise:** ``out = x * cos_wide`` (cos repeated to full width in the layout's pair
  order), then ``out_a -= b * sin`` and ``out_b += a * sin`` with ``addcmul_``: two passes, no
  temporaries.
- **In place** (``out`` is ``x``): the complex multiply works in place as it is; otherwise the
  first member of every pair is saved (half of x), then ``a = a cos - b sin`` and
  ``b = b cos + a_saved sin``.

Every path is exact up to the rounding of the dtype; the tests compare each against float64.
"""

from __future__ import annotations

import torch

from . import native

_COMPLEX_DTYPES = (torch.float32, torch.float64)
_UPCAST_DTYPES = (torch.float16, torch.bfloat16)


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


def choose_path(x: torch.Tensor, out: torch.Tensor | None, layout: str, rotary_dim: int) -> str:
    """``"native"`` (the compiled CPU loop), ``"complex"``, ``"upcast"`` (half precision via
    float32 complex) or ``"pairs"``."""
    if native.supports(x, out):
        return "native"
    if layout == "interleaved":
        if x.dtype in _UPCAST_DTYPES:
            return "upcast"
        if (x.dtype in _COMPLEX_DTYPES and _complex_viewable(x[..., :rotary_dim])
                and (out is None or _complex_viewable(out[..., :rotary_dim]))):
            return "complex"
    return "pairs"


def prepare_tables(cos: torch.Tensor, sin: torch.Tensor, path: str, dtype: torch.dtype,
                   layout: str) -> tuple[torch.Tensor, ...]:
    """The tables a path multiplies by, with the rows (dim -2) of cos and sin.

    ``"native"``: (cos, sin), contiguous, float64 for float64 x and float32 otherwise;
    ``"complex"``: (e^{i m theta} in x's precision,); ``"upcast"``: (e^{i m theta} in
    float32,); ``"pairs"``: (cos, sin, cos widened to full width), in x's dtype.
    """
    if path == "native":
        accumulate = torch.float64 if dtype == torch.float64 else torch.float32
        return cos.to(accumulate).contiguous(), sin.to(accumulate).contiguous()
    if path == "complex":
        return (torch.complex(cos.to(dtype), sin.to(dtype)),)
    if path == "upcast":
        return (torch.complex(cos.float(), sin.float()),)
    cos, sin = cos.to(dtype), sin.to(dtype)
    return cos, sin, _widen(cos, layout)


def inverse_tables(tables: tuple[torch.Tensor, ...], path: str) -> tuple[torch.Tensor, ...]:
    """Tables of the inverse rotation (angle -m theta): the gradient's rotation."""
    if path in ("complex", "upcast"):
        return (tables[0].conj(),)
    if path == "native":
        return tables[0], -tables[1]
    cos, sin, cos_wide = tables
    return cos, -sin, cos_wide


def rotate(x: torch.Tensor, tables: tuple[torch.Tensor, ...], path: str, layout: str,
           rotary_dim: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """out = R_Theta x, the first ``rotary_dim`` channels rotated, the rest copied.

    Args:
        x: ``(..., seq, head_dim)``.
        tables: ``prepare_tables(...)`` for ``path``, rows broadcastable to x's
            ``(..., seq, *)``, on x's device.
        path: ``choose_path(x, out, layout, rotary_dim)``.
        layout: ``"interleaved"`` or ``"half"``.
        rotary_dim: rotated channels (even, <= head_dim).
        out: destination of x's shape; may be x itself. Default: a new contiguous tensor.
    """
    if path == "native":
        return native.rotate(x, tables[0], tables[1], layout, rotary_dim, out)
    in_place = out is not None and out.data_ptr() == x.data_ptr() and out.stride() == x.stride()
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    xr, outr = x, out
    if rotary_dim < x.shape[-1]:
        if not in_place:
            out[..., rotary_dim:].copy_(x[..., rotary_dim:])
        xr, outr = x[..., :rotary_dim], out[..., :rotary_dim]
    if path == "complex":
        torch.mul(_as_complex(xr), tables[0], out=_as_complex(outr))
        return out
    if path == "upcast":
        wide = xr.float()
        _as_complex(wide).mul_(tables[0])
        outr.copy_(wide)
        return out
    cos, sin, cos_wide = tables
    a, b = pairs(xr, layout)
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
