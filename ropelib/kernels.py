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

The rotation enters PyTorch as the operators ``ropelib::rotate`` (a new output) and
``ropelib::rotate_out`` (into a given ``out``), registered with ``torch.library.custom_op``
and a fake implementation, so ``torch.compile``, ``torch.export`` and ``torch.jit.trace``
see one opaque node whose shape they know; ``rotate`` and ``rotate_out`` call them. Their
implementation is ``rotate_plain``: it picks the path for the tensors of this call and
prepares the tables for it, every call, keeping nothing; for plain tensors in eager mode
that need no gradient, ``rotate`` calls it directly (``plain_call``), and so does the eager
training step's autograd node in ``ropelib.rotation``. The autograd formula is registered
by ``ropelib.rotation``. ``rotate_composite`` is the same rotation written in
differentiable PyTorch operations, for ``torch.func`` transforms and forward-mode AD, which
must not hand the kernel their wrapped tensors.
"""

from __future__ import annotations

import math

import torch
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from . import native
from ._checks import check_rotation_operands

_COMPLEX_DTYPES = (torch.float32, torch.float64)
_UPCAST_DTYPES = (torch.float16, torch.bfloat16)


@torch.library.custom_op("ropelib::rotate", mutates_args=())
def _rotate_op(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str,
               rotary_dim: int, inverse: bool = False, positions: torch.Tensor | None = None,
               axes: torch.Tensor | None = None) -> torch.Tensor:
    """R_Theta x, a new contiguous tensor: the first ``rotary_dim`` channels rotated, the
    rest copied; R_{-Theta} x with ``inverse`` (the gradient's rotation).

    Args:
        x: ``(..., seq, head_dim)``.
        cos, sin: rows ``(..., seq, rotary_dim // 2)`` broadcastable to x's, any float
            dtype, on x's device; with ``positions``, the 2-D tables
            ``(table_len, rotary_dim // 2)`` (row m: angles m * theta_i).
        layout: ``"interleaved"`` or ``"half"``.
        rotary_dim: rotated channels (even, <= head_dim).
        inverse: rotate by the opposite angles, as if sin were -sin.
        positions: multi-axis coordinates ``(..., seq, k)``, int64 in ``[0, table_len)``,
            with as many dims as x and broadcastable to its rows: pair i of a row reads the
            table row of coordinate ``axes[i]`` (``gather_rows``; M-RoPE).
        axes: with ``positions``, int64 ``(rotary_dim // 2,)`` in ``[0, k)``.

    The arguments are checked before the loop runs (``check_rotation_operands``): a table
    pair of other shapes, dtypes or devices, rows that do not cover x's, or a short ``axes``
    is a ValueError, never a read past a tensor.
    """
    check_rotation_operands(x, cos, sin, rotary_dim, None, positions, axes)
    return rotate_plain(x, cos, sin, layout, rotary_dim, None, inverse, positions, axes)


@_rotate_op.register_fake
def _rotate_fake(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str,
                 rotary_dim: int, inverse: bool = False, positions: torch.Tensor | None = None,
                 axes: torch.Tensor | None = None) -> torch.Tensor:
    check_rotation_operands(x, cos, sin, rotary_dim, None, positions, axes)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("ropelib::rotate_out", mutates_args=("out",))
def _rotate_out_op(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str,
                   rotary_dim: int, out: torch.Tensor, positions: torch.Tensor | None = None,
                   axes: torch.Tensor | None = None) -> None:
    """``ropelib::rotate`` written into ``out`` (x's shape and dtype, channels of any stride;
    x itself, or memory that shares no element with x)."""
    check_rotation_operands(x, cos, sin, rotary_dim, out, positions, axes)
    _rotate_into(x, cos, sin, layout, rotary_dim, out, positions, axes)


@_rotate_out_op.register_fake
def _rotate_out_fake(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str,
                     rotary_dim: int, out: torch.Tensor, positions: torch.Tensor | None = None,
                     axes: torch.Tensor | None = None) -> None:
    check_rotation_operands(x, cos, sin, rotary_dim, out, positions, axes)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str,
           rotary_dim: int, inverse: bool = False, positions: torch.Tensor | None = None,
           axes: torch.Tensor | None = None) -> torch.Tensor:
    """``ropelib::rotate``: R_Theta x (R_{-Theta} x with ``inverse``), a new contiguous
    tensor (arguments as there)."""
    if plain_call(x, cos, sin, *_given(positions, axes)):
        return rotate_plain(x, cos, sin, layout, rotary_dim, None, inverse, positions, axes)
    return torch.ops.ropelib.rotate.default(x, cos, sin, layout, rotary_dim, inverse,
                                            positions, axes)


def rotate_out(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str,
               rotary_dim: int, out: torch.Tensor, positions: torch.Tensor | None = None,
               axes: torch.Tensor | None = None) -> None:
    """``ropelib::rotate_out``: R_Theta x written into ``out``, whose version counter is
    bumped like any in-place write's (arguments as there)."""
    if plain_call(x, cos, sin, out, *_given(positions, axes)):
        _rotate_into(x, cos, sin, layout, rotary_dim, out, positions, axes)
        torch.autograd.graph.increment_version(out)
    else:
        torch.ops.ropelib.rotate_out.default(x, cos, sin, layout, rotary_dim, out, positions,
                                             axes)


def _given(*tensors: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    return tuple(t for t in tensors if t is not None)


def plain_call(*tensors: torch.Tensor) -> bool:
    """Whether the operators' implementation may run without the dispatcher: plain tensors
    that need no gradient, in eager mode, with no compiler, tracer, ``torch.func`` transform
    or dispatch mode watching. The dispatcher would run the same function after 10-30 us of
    Python layers, which at small shapes cost more than the rotation."""
    if (torch.compiler.is_compiling() or torch.jit.is_tracing()
            or torch._C._are_functorch_transforms_active() or is_in_torch_dispatch_mode()):
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if not plain_tensor(t) or (grad and t.requires_grad):
            return False
    return True


def plain_tensor(t: torch.Tensor) -> bool:
    """Whether t is a ``torch.Tensor`` itself, not a subclass nor a ``torch.func`` wrapper
    (such as one kept after its transform ended, which the dispatcher unwraps)."""
    return type(t) is torch.Tensor and not torch._C._functorch.is_functorch_wrapped_tensor(t)


def _rotate_into(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str,
                 rotary_dim: int, out: torch.Tensor, positions: torch.Tensor | None,
                 axes: torch.Tensor | None) -> None:
    """``rotate_plain`` into ``out`` after checking its memory, on the real tensors (so
    also in a compiled graph): out may not overlap the tables, nor share an element with x
    unless it is x itself."""
    out_span = _byte_span(out)
    for name, table in (("cos", cos), ("sin", sin)):
        if _intersect(out_span, _byte_span(table)):
            raise ValueError(f"out shares memory with {name}; the rotation would overwrite "
                             "the table it reads. Pass a separate buffer")
    if ((out.data_ptr(), out.stride()) != (x.data_ptr(), x.stride())
            and _intersect(out_span, _byte_span(x)) and _share_elements(out, x)):
        raise ValueError("out shares memory with x but is not x itself (other strides or "
                         "offset); pass out=x for an in-place rotation or a separate buffer")
    rotate_plain(x, cos, sin, layout, rotary_dim, out, False, positions, axes)


def _byte_span(t: torch.Tensor) -> tuple[int, int]:
    """The addresses [first, last + 1) of t's elements; empty for an empty tensor. Only
    views of one buffer can have intersecting spans."""
    if t.numel() == 0:
        return 0, 0
    if t.is_contiguous():
        return t.data_ptr(), t.data_ptr() + t.nbytes
    extent = sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
    return t.data_ptr(), t.data_ptr() + (extent + 1) * t.element_size()


def _intersect(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def _share_elements(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a and b (one dtype, intersecting spans) address a common element. Exact when
    they have the same shape and strides (e.g. ``qkv[:, :8]`` and ``qkv[:, 8:]``, which
    interleave in memory but share nothing); otherwise assumed."""
    gap, size = abs(b.data_ptr() - a.data_ptr()), a.element_size()
    if a.shape != b.shape or a.stride() != b.stride() or gap % size:
        return True
    dims = sorted(((st, n) for n, st in zip(a.shape, a.stride(), strict=True)
                   if n > 1 and st > 0), reverse=True)
    return _reachable(gap // size, dims)


def _reachable(gap: int, dims: list[tuple[int, int]]) -> bool:
    """Whether gap = sum_k j_k stride_k for integers |j_k| < n_k, dims = [(stride_k, n_k)] by
    decreasing stride; undecided (a very wide search) counts as reachable."""
    if not dims:
        return gap == 0
    (stride, n), rest = dims[0], dims[1:]
    reach = sum((m - 1) * st for st, m in rest)
    low = max(1 - n, math.ceil((gap - reach) / stride))
    high = min(n - 1, math.floor((gap + reach) / stride))
    if high - low > 64:
        return True
    return any(_reachable(gap - j * stride, rest) for j in range(low, high + 1))


def rotate_plain(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str,
                 rotary_dim: int, out: torch.Tensor | None, inverse: bool,
                 positions: torch.Tensor | None = None, axes: torch.Tensor | None = None
                 ) -> torch.Tensor:
    """The operators' implementation: the path for these tensors, its tables, the rotation
    (by the opposite angles with ``inverse``: the compiled loop negates sin as it reads it,
    the eager paths negate their copy of the table). With ``positions``, the compiled loop
    gathers the rows itself, a tile at a time (``native.supports_axes``); the other paths
    gather them first (``gather_rows``). Called directly only for plain tensors in eager
    mode (``plain_call``); arguments as for ``ropelib::rotate``."""
    path = choose_path(x, out, layout, rotary_dim)
    if positions is not None:
        if path == "native" and native.supports_axes(x, rotary_dim):
            cos, sin = prepare_tables(cos, sin, path, x.dtype, layout)
            return native.rotate(x, cos, sin, layout, rotary_dim, out, inverse, positions,
                                 axes)
        cos, sin = gather_rows(cos, sin, positions, axes)
    tables = prepare_tables(cos, sin, path, x.dtype, layout, inverse)
    if path == "native":
        return native.rotate(x, tables[0], tables[1], layout, rotary_dim, out, inverse)
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
        wide = xr.to(torch.float32, memory_format=torch.contiguous_format)
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
                   layout: str, inverse: bool = False) -> tuple[torch.Tensor, ...]:
    """The tables a path multiplies by, with the rows (dim -2) of cos and sin.

    ``"native"``: (cos, sin), contiguous, float64 for float64 x and float32 otherwise (the
    loop itself negates sin for ``inverse``); ``"complex"``: (e^{i m theta} in x's
    precision,); ``"upcast"``: (e^{i m theta} in float32,); ``"pairs"``: (cos, sin, cos
    widened to full width), in x's dtype. With ``inverse`` the eager paths' tables are
    those of -theta (sin negated).
    """
    if path == "native":
        accumulate = torch.float64 if dtype == torch.float64 else torch.float32
        if cos.dtype != accumulate or sin.dtype != accumulate:
            cos, sin = cos.to(accumulate), sin.to(accumulate)
        return cos.contiguous(), sin.contiguous()
    if inverse:
        sin = -sin
    if path == "complex":
        return (torch.complex(cos.to(dtype), sin.to(dtype)),)
    if path == "upcast":
        return (torch.complex(cos.float(), sin.float()),)
    cos, sin = cos.to(dtype), sin.to(dtype)
    return cos, sin, _widen(cos, layout)


def gather_rows(cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                axes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of multi-axis RoPE whose pairs each follow one axis, read from 2-D tables:
    ``rows[..., n, i] = table[positions[..., n, axes[i]], i]``.

    Args:
        cos, sin: ``(table_len, pairs)``.
        positions: ``(..., seq, k)`` int64 coordinates in ``[0, table_len)``.
        axes: ``(pairs,)`` int64, the axis of each pair.

    Returns:
        ``(cos, sin)`` rows ``(..., seq, pairs)``, differentiable in the tables (a gather).
    """
    index = positions.index_select(-1, axes)
    flat = index.reshape(-1, index.shape[-1])
    return (cos.gather(0, flat).reshape(index.shape),
            sin.gather(0, flat).reshape(index.shape))


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
    """``rotate`` in plain differentiable PyTorch operations (at least float32 arithmetic, one
    rounding): what ``torch.func`` transforms (grad, vmap, jvp, ...) and forward-mode AD
    differentiate and batch, since the kernel only takes plain tensors."""
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
