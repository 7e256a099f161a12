"""apply_rope: rotate channel pairs of q or k by the angles m * theta_i.

For position m and pair i, with (a, b) the two channels of the pair,

    a' = a cos(m theta_i) - b sin(m theta_i)
    b' = a sin(m theta_i) + b cos(m theta_i),

which is multiplication by the block-diagonal matrix R_{Theta,m} of RoFormer eq. (15). The
layout says which channels pair up: ``"interleaved"`` pairs (2i, 2i+1) (RoFormer, GPT-J,
Meta's Llama), ``"half"`` pairs (i, i + d/2) (GPT-NeoX, Hugging Face Llama).

The gradient of a rotation is the rotation by the opposite angle, so the backward pass is the
same kernel with sin negated instead of a chain of autograd nodes. The arithmetic itself is in
``ropelib.native`` (the compiled CPU loop) and ``ropelib.kernels`` (the eager paths).
"""

from __future__ import annotations

from typing import Literal

import torch

from . import kernels, native
from ._checks import check_float_tensor, check_int_tensor, check_layout

Layout = Literal["interleaved", "half"]
SHORT_TABLE_MODES = ("raise", "repeat_last")


class _RotaryFunction(torch.autograd.Function):
    """y = R_Theta x with the backward g -> R_Theta^T g = R_{-Theta} g (and the grads of cos
    and sin when they require them). ``cos``, ``sin``: the selected rows; ``tables``: the
    same rows prepared for ``path``. x is kept for the backward only when the grads of cos or
    sin need it, so the rotation adds no activation memory in the usual training step."""

    @staticmethod
    def forward(ctx, x, cos, sin, layout, rotary_dim, path, tables):
        tables_need_grad = ctx.needs_input_grad[1] or ctx.needs_input_grad[2]
        ctx.save_for_backward(x if tables_need_grad else None, cos, sin)
        ctx.layout, ctx.rotary_dim, ctx.path, ctx.tables = layout, rotary_dim, path, tables
        return kernels.rotate(x, tables, path, layout, rotary_dim)

    @staticmethod
    def backward(ctx, grad):
        x, cos, sin = ctx.saved_tensors
        layout, rd = ctx.layout, ctx.rotary_dim
        grad_x = grad_cos = grad_sin = None
        if ctx.needs_input_grad[0]:
            path = kernels.choose_path(grad, None, layout, rd)
            tables = (kernels.inverse_tables(ctx.tables, path) if path == ctx.path
                      else kernels.prepare_tables(cos, -sin, path, grad.dtype, layout))
            if torch.is_grad_enabled():  # create_graph=True: the gradient is differentiated too
                grad_x = _RotaryFunction.apply(grad, cos, -sin, layout, rd, path, tables)
            else:
                grad_x = kernels.rotate(grad, tables, path, layout, rd)
        if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
            a, b = kernels.pairs(x[..., :rd], layout)
            ga, gb = kernels.pairs(grad[..., :rd], layout)
            grad_cos = (ga * a + gb * b).sum_to_size(cos.shape)
            grad_sin = (gb * a - ga * b).sum_to_size(sin.shape)
        return grad_x, grad_cos, grad_sin, None, None, None, None


class _TableRotation(torch.autograd.Function):
    """The compiled kernel on rows ``first_row, first_row + 1, ...`` of whole 2-D tables that do
    not require grad, through calls memoized on the tables (``_table_memo``): y = R_Theta x, and
    the backward is the same kernel with the inverse tables (sin negated, memoized too)."""

    @staticmethod
    def forward(ctx, x, cos, sin, call, first_row, layout, rotary_dim, short_table):
        ctx.save_for_backward(cos, sin)  # so that editing a table before backward raises
        ctx.first_row, ctx.layout, ctx.rotary_dim = first_row, layout, rotary_dim
        ctx.short_table = short_table
        return native.run(call, x, first_row=first_row)

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        first_row, layout, rotary_dim = ctx.first_row, ctx.layout, ctx.rotary_dim
        if torch.is_grad_enabled() or not native.supports(grad, None):
            # create_graph=True (the gradient is differentiated too), or a gradient the kernel
            # cannot take (e.g. its channels are not contiguous): the general path
            rows = slice(first_row, first_row + grad.shape[-2])
            grad_x = apply_rope(grad, cos[rows], -sin[rows], layout=layout, rotary_dim=rotary_dim)
        else:
            call = _memoized_call(grad, cos, sin, layout, rotary_dim, ctx.short_table,
                                  inverse=True)[0]
            grad_x = native.run(call, grad, first_row=first_row)
        return grad_x, None, None, None, None, None, None, None


MAX_MEMOIZED_CALLS = 64


def _table_memo(cos: torch.Tensor, sin: torch.Tensor) -> tuple[dict, dict] | None:
    """Two dicts memoizing work on a 2-D table pair: prepared tables and kernel calls; None
    for tables that require grad.

    They live in an attribute of ``cos`` (so they die with the table), remember which ``sin``
    they were made for, and are emptied when either table is modified in place (tensor
    version counters).
    """
    if cos.requires_grad or sin.requires_grad:
        return None
    versions = (cos._version, sin._version)
    memo = getattr(cos, "_ropelib_memo", None)
    if memo is None or memo[0] is not sin or memo[1] != versions:
        memo = (sin, versions, {}, {})
        cos._ropelib_memo = memo
    return memo[2], memo[3]


def _prepared(cos: torch.Tensor, sin: torch.Tensor, path: str, dtype: torch.dtype, layout: str,
              inverse: bool = False) -> tuple[torch.Tensor, ...]:
    """``kernels.prepare_tables`` for a whole 2-D table, or with ``inverse`` its
    ``kernels.inverse_tables``; memoized (``_table_memo``)."""
    memo = _table_memo(cos, sin)
    key = (path, dtype, layout, inverse)
    if memo is not None and key in memo[0]:
        return memo[0][key]
    if inverse:
        tables = kernels.inverse_tables(_prepared(cos, sin, path, dtype, layout), path)
    else:
        tables = kernels.prepare_tables(cos, sin, path, dtype, layout)
    if memo is not None:
        memo[0][key] = tables
    return tables


def _call_key(x: torch.Tensor, layout: str, rotary_dim: int | None, short_table: str,
              inverse: bool = False) -> tuple:
    """What a memoized kernel call (``native.Call``) on the tables depends on besides them and
    the first position."""
    return (x.shape, x.stride(), x.dtype, x.device, layout, rotary_dim, short_table, inverse)


def _memoized_call(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str,
                   rotary_dim: int | None, short_table: str, inverse: bool = False
                   ) -> tuple[native.Call, int]:
    """The kernel call rotating x (by -Theta with ``inverse``) with rows of the whole 2-D
    tables, and the last first row it fits; memoized on tables that do not require grad, at
    most ``MAX_MEMOIZED_CALLS`` of them. x: ``native.supports(x, None)``."""
    memo = _table_memo(cos, sin)
    key = _call_key(x, layout, rotary_dim, short_table, inverse)
    found = memo[1].get(key)
    if found is None:
        tables = _prepared(cos, sin, "native", x.dtype, layout, inverse)
        rd = x.shape[-1] if rotary_dim is None else rotary_dim
        found = native.prepare_call(x, *tables, layout, rd), cos.shape[0] - x.shape[-2]
        if len(memo[1]) >= MAX_MEMOIZED_CALLS:
            memo[1].clear()
        memo[1][key] = found
    return found


def _run_memoized(call: native.Call, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  first_row: int, layout: str, rotary_dim: int | None, short_table: str
                  ) -> torch.Tensor:
    """x rotated by a call from ``_memoized_call`` from table row ``first_row`` on; recorded
    for autograd when x requires grad."""
    if x.requires_grad and torch.is_grad_enabled():
        return _TableRotation.apply(x, cos, sin, call, first_row, layout, rotary_dim, short_table)
    return native.run(call, x, first_row=first_row)


def _select_rows(table: torch.Tensor, name: str, x: torch.Tensor, positions, offset: int,
                 short_table: str) -> torch.Tensor:
    """Rows of a (table_len, d/2) table for x's positions, shaped to broadcast against x."""
    seq_len, table_len = x.shape[-2], table.shape[0]
    if positions is None:
        needed = offset + seq_len
        if needed > table_len:
            if short_table == "raise" or table_len == 0:
                raise ValueError(
                    f"{name} has {table_len} rows but positions {offset}..{needed - 1} need "
                    f"{needed} (seq_len={seq_len}, offset={offset}); generate a longer table, "
                    f"e.g. generate_rope_embeddings({needed}, head_dim)")
            index = torch.arange(offset, needed, device=table.device).clamp_max(table_len - 1)
            return table[index]
        return table[offset:needed]
    index = positions.to(table.device)
    if short_table == "repeat_last":
        index = index.clamp_max(table_len - 1)
    rows = table[index]
    if positions.ndim == 2:
        rows = rows.reshape(rows.shape[:1] + (1,) * (x.ndim - 3) + rows.shape[1:])
    return rows


def _check_positions(positions: torch.Tensor, x: torch.Tensor, offset: int, table_len: int,
                     short_table: str) -> None:
    check_int_tensor("positions", positions)
    seq_len = x.shape[-2]
    ok_shape = positions.ndim == 1 or (positions.ndim == 2 and x.ndim >= 3
                                       and positions.shape[0] in (1, x.shape[0]))
    if not ok_shape or positions.shape[-1] != seq_len:
        raise ValueError(
            f"positions must have shape (seq_len,) = ({seq_len},) or (batch, seq_len) = "
            f"({x.shape[0] if x.ndim >= 3 else 'batch'}, {seq_len}), got {tuple(positions.shape)}")
    if offset:
        raise ValueError(f"pass either positions or offset, not both (offset={offset}); "
                         "add the offset to positions instead")
    if positions.numel() == 0:
        return
    low, high = int(positions.min()), int(positions.max())
    if low < 0:
        raise ValueError(f"positions must be >= 0, got min {low}")
    if high >= table_len and short_table == "raise":
        raise ValueError(f"positions go up to {high} but the cos/sin table has only {table_len} "
                         f"rows (positions 0..{table_len - 1}); generate a longer table, "
                         f"e.g. generate_rope_embeddings({high + 1}, head_dim)")


def apply_rope(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, layout: Layout = "interleaved",
    positions: torch.Tensor | None = None, offset: int = 0, rotary_dim: int | None = None,
    short_table: Literal["raise", "repeat_last"] = "raise", out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rotate x by R_{Theta,m}, where m is each row's position.

    Args:
        x: ``(..., seq, head_dim)``, e.g. ``(batch, heads, seq, head_dim)``; floating point.
        cos, sin: tables ``(table_len, rotary_dim // 2)`` from ``generate_rope_embeddings``
            or ``RotaryEmbedding``, in any float dtype (cast to ``x.dtype`` here); or rows
            already gathered, with as many dims as x and broadcastable to
            ``(..., seq, rotary_dim // 2)``.
        layout: ``"interleaved"`` (pairs (2i, 2i+1)) or ``"half"`` (pairs (i, i + d/2)).
        positions: integer positions ``(seq,)`` or ``(batch, seq)`` (one row per batch entry,
            e.g. for left-padded batches); default ``offset .. offset + seq - 1``.
        offset: first position when ``positions`` is not given (KV-cache decoding).
        rotary_dim: rotate only the first ``rotary_dim`` channels (even, <= head_dim) and pass
            the rest through unchanged, as GPT-NeoX and GPT-J do. Default: head_dim.
        short_table: ``"raise"`` (default): a table shorter than the positions is an error.
            ``"repeat_last"`` reuses the last row for positions past the table, the behaviour
            of the module ropelib grew from; it silently destroys relative positions there.
        out: optional destination with x's shape, dtype and device, e.g. a buffer you own or
            ``x`` itself (in place). Not differentiable: use it under ``torch.no_grad()`` or
            for tensors that do not require grad.

    Returns:
        A new tensor with the shape and dtype of x (contiguous), or ``out``.
    """
    check_layout(layout)
    if short_table not in SHORT_TABLE_MODES:
        raise ValueError(f"short_table must be one of {SHORT_TABLE_MODES}, got {short_table!r}")
    if (out is None and positions is None and isinstance(x, torch.Tensor)
            and isinstance(cos, torch.Tensor) and isinstance(sin, torch.Tensor)
            and type(offset) is int and (rotary_dim is None or type(rotary_dim) is int)):
        # Fast path: a call like one checked before (same tables, x of the same shape, strides
        # and dtype, same arguments, a first position the table has): its kernel call is kept.
        memo = _table_memo(cos, sin)
        found = memo and memo[1].get(_call_key(x, layout, rotary_dim, short_table))
        if found and 0 <= offset <= found[1] and not x.is_neg() and native.active():
            return _run_memoized(found[0], x, cos, sin, offset, layout, rotary_dim, short_table)
    check_float_tensor("x", x)
    if x.ndim < 2:
        raise ValueError(f"x must have shape (..., seq, head_dim), got {tuple(x.shape)}")
    head_dim = x.shape[-1]
    rd = head_dim if rotary_dim is None else rotary_dim
    if isinstance(rd, bool) or not isinstance(rd, int) or rd <= 0 or rd % 2 or rd > head_dim:
        what = "head_dim (x.shape[-1])" if rotary_dim is None else "rotary_dim"
        raise ValueError(f"{what} must be a positive even number <= head_dim={head_dim}, "
                         f"got {rd}")
    check_float_tensor("cos", cos)
    check_float_tensor("sin", sin)
    if cos.shape != sin.shape:
        raise ValueError(f"cos and sin must have the same shape, got {tuple(cos.shape)} and "
                         f"{tuple(sin.shape)}")
    if cos.ndim < 2 or cos.shape[-1] != rd // 2:
        hint = "" if rotary_dim is not None or cos.ndim < 2 else (
            f"; for a partial rotation pass rotary_dim={2 * cos.shape[-1]}")
        raise ValueError(f"cos/sin must have shape (table_len, {rd // 2}) (rotary_dim // 2 = "
                         f"{rd} // 2), got {tuple(cos.shape)}{hint}")
    if sin.device != cos.device:
        raise ValueError(f"cos is on {cos.device} but sin is on {sin.device}; "
                         f"keep both tables on x's device ({x.device})")
    if cos.device != x.device:
        raise ValueError(f"cos/sin are on {cos.device} but x is on {x.device}; "
                         f"move them with cos.to(x.device)")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"offset must be a non-negative int, got {offset!r}")
    if out is not None:
        _check_out(out, x, cos, sin)
    path = kernels.choose_path(x, out, layout, rd)
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or cos.requires_grad
                                              or sin.requires_grad)
    if cos.ndim == 2:
        if positions is not None:
            _check_positions(positions, x, offset, cos.shape[0], short_table)
        prepared = _prepared(cos, sin, path, x.dtype, layout)
        if path == "native" and positions is None and offset + x.shape[-2] <= cos.shape[0]:
            if out is None and _table_memo(cos, sin) is not None:
                call = _memoized_call(x, cos, sin, layout, rotary_dim, short_table)[0]
                return _run_memoized(call, x, cos, sin, offset, layout, rotary_dim, short_table)
            if not needs_grad:
                return native.rotate(x, *prepared, layout, rd, out, first_row=offset)
        tables = tuple(_select_rows(t, "cos", x, positions, offset, short_table) for t in prepared)
        if needs_grad:
            cos = _select_rows(cos, "cos", x, positions, offset, short_table)
            sin = _select_rows(sin, "sin", x, positions, offset, short_table)
    else:
        expected = x.shape[:-1] + (rd // 2,)
        try:
            fits = cos.ndim == x.ndim and torch.broadcast_shapes(cos.shape, expected) == expected
        except RuntimeError:
            fits = False
        if not fits:
            raise ValueError(f"gathered cos/sin must have {x.ndim} dims and broadcast to "
                             f"{tuple(expected)}, got {tuple(cos.shape)}; pass the 2-D table "
                             "with positions= instead")
        if positions is not None or offset:
            raise ValueError("positions/offset select rows of a 2-D table; cos/sin given here "
                             f"are already gathered (shape {tuple(cos.shape)})")
        tables = kernels.prepare_tables(cos, sin, path, x.dtype, layout)
    if out is None:
        if needs_grad:
            return _RotaryFunction.apply(x, cos, sin, layout, rd, path, tables)
        return kernels.rotate(x, tables, path, layout, rd)
    return kernels.rotate(x, tables, path, layout, rd, out=out)


def _check_out(out: object, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
    if out.shape != x.shape or out.dtype != x.dtype or out.device != x.device:
        raise ValueError(f"out must match x: shape {tuple(x.shape)}, dtype {x.dtype}, device "
                         f"{x.device}; got shape {tuple(out.shape)}, dtype {out.dtype}, device "
                         f"{out.device}")
    if torch.is_grad_enabled() and (x.requires_grad or cos.requires_grad or sin.requires_grad
                                    or out.requires_grad):
        raise ValueError("apply_rope(..., out=...) is not differentiable; call it under "
                         "torch.no_grad() or drop out= to get gradients")
    strides = out.stride()
    if 0 in strides and any(st == 0 and n > 1 for n, st in zip(out.shape, strides, strict=True)):
        raise ValueError(f"out has elements that share memory (stride 0 in a dim of size > 1, "
                         f"strides {strides}, e.g. from expand); pass a buffer "
                         "made with torch.empty_like(x)")
    if _overlaps(out, x) and (out.data_ptr(), out.stride()) != (x.data_ptr(), x.stride()):
        raise ValueError("out shares memory with x but is not x itself (other strides or "
                         "offset); pass out=x for an in-place rotation or a separate buffer")


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the byte ranges spanned by a and b in the same storage intersect."""
    if a.numel() == 0 or b.numel() == 0:
        return False
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False

    def span(t: torch.Tensor) -> tuple[int, int]:
        extent = sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
        return t.data_ptr(), t.data_ptr() + (extent + 1) * t.element_size()

    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1
