"""The rotation's arithmetic, arranged to move as few bytes as possible.

RoPE reads x once and writes the result once, like a copy; everything beyond that is
overhead. Three choices keep ``apply_rope`` near that bound in eager PyTorch:

- **Interleaved layout, float32/float64:** a pair (a, b) is the complex number a + ib and the
  rotation is one complex multiply by e^{i m theta} (``view_as_complex``), one pass.
- **Otherwise:** ``out = x * cos_wide`` (cos repeated to full width in the layout's pair
  order), then ``out_a -= b * sin`` and ``out_b += a * sin`` with ``addcmul_``: three ops,
  no temporaries.
- **Blocking (CPU, contiguous x, one table for all rows):** the three ops run block by block
  on slices of about 256 KiB, so the second and third read ``out`` and ``x`` from cache
  instead of memory.

``out`` may be ``x`` itself (in place); the non-complex path then copies each block to a
cache-resident scratch buffer first.
"""

from __future__ import annotations

import math

import torch

BLOCK_BYTES = 256 * 1024
_COMPLEX_DTYPES = (torch.float32, torch.float64)


def _pairs(t: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The two members (a, b) of every pair, as views of shape (..., d/2)."""
    if layout == "half":
        h = t.shape[-1] // 2
        return t[..., :h], t[..., h:]
    return t[..., 0::2], t[..., 1::2]


def _complex_viewable(t: torch.Tensor) -> bool:
    return (t.stride(-1) == 1 and t.storage_offset() % 2 == 0
            and all(s % 2 == 0 for s in t.stride()[:-1]))


def _as_complex(t: torch.Tensor) -> torch.Tensor:
    return torch.view_as_complex(t.unflatten(-1, (t.shape[-1] // 2, 2)))


def _prepare_tables(cos: torch.Tensor, sin: torch.Tensor, layout: str, use_complex: bool
                    ) -> tuple[torch.Tensor, ...]:
    """``(e^{i m theta},)`` for the complex path, else ``(cos_wide, sin)``; rows on dim -2."""
    if use_complex:
        return (torch.complex(cos, sin),)
    cos_wide = torch.cat([cos, cos], dim=-1) if layout == "half" else cos.repeat_interleave(2, -1)
    return cos_wide, sin


def _rotate_block(out: torch.Tensor, x: torch.Tensor, tables: tuple[torch.Tensor, ...],
                  layout: str, scratch: torch.Tensor | None) -> None:
    """out = R x on one block, shapes (..., seq, rotary_dim). ``scratch``: x aliases out."""
    if len(tables) == 1:
        torch.mul(_as_complex(x), tables[0], out=_as_complex(out))
        return
    cos_wide, sin = tables
    if scratch is not None:
        x = scratch[: x.numel()].view(x.shape).copy_(x)
    torch.mul(x, cos_wide, out=out)
    a, b = _pairs(x, layout)
    out_a, out_b = _pairs(out, layout)
    out_a.addcmul_(b, sin, value=-1)
    out_b.addcmul_(a, sin)


def _blocks(x: torch.Tensor, out: torch.Tensor, blockable: bool
            ) -> list[tuple[torch.Tensor, torch.Tensor, slice]]:
    """(x block, out block, table rows) covering x; one block unless ``blockable``."""
    seq, dim = x.shape[-2], x.shape[-1]
    if not blockable or x.numel() * x.element_size() <= 2 * BLOCK_BYTES:
        return [(x, out, slice(None))]
    lead = math.prod(x.shape[:-2])
    x3, out3 = x.view(lead, seq, dim), out.view(lead, seq, dim)
    rows = max(1, BLOCK_BYTES // (dim * x.element_size()))
    if rows >= seq:
        step = rows // seq
        return [(x3[p:p + step], out3[p:p + step], slice(None)) for p in range(0, lead, step)]
    return [(x3[p, start:start + rows], out3[p, start:start + rows], slice(start, start + rows))
            for p in range(lead) for start in range(0, seq, rows)]


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str, rotary_dim: int,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """out = R_Theta x, the first ``rotary_dim`` channels rotated, the rest copied.

    Args:
        x: ``(..., seq, head_dim)``.
        cos, sin: ``(seq, rotary_dim // 2)``, or gathered rows broadcastable to
            ``(..., seq, rotary_dim // 2)``, in x's dtype and on x's device.
        layout: ``"interleaved"`` or ``"half"``.
        rotary_dim: rotated channels.
        out: destination of x's shape; may be x itself. Default: a new contiguous tensor.
    """
    in_place = out is not None and out.data_ptr() == x.data_ptr() and out.stride() == x.stride()
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    head_dim = x.shape[-1]
    if rotary_dim < head_dim and not in_place:
        out[..., rotary_dim:].copy_(x[..., rotary_dim:])
    xr, outr = x[..., :rotary_dim], out[..., :rotary_dim]
    use_complex = (layout == "interleaved" and x.dtype in _COMPLEX_DTYPES
                   and _complex_viewable(xr) and _complex_viewable(outr))
    tables = _prepare_tables(cos, sin, layout, use_complex)
    blockable = (x.device.type == "cpu" and cos.ndim == 2 and x.is_contiguous()
                 and out.is_contiguous())
    blocks = _blocks(xr, outr, blockable)
    scratch = None
    if in_place and not use_complex:
        scratch = torch.empty(max(b.numel() for b, _, _ in blocks), dtype=x.dtype, device=x.device)
    for x_block, out_block, rows in blocks:
        _rotate_block(out_block, x_block, tuple(t[..., rows, :] for t in tables), layout, scratch)
    return out
