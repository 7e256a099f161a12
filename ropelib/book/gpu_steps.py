"""RoPE on a GPU, written step by step (chapter 15): three small Triton kernels for teaching.

Not the library's path: ``ropelib.triton_rope`` is the kernel ``apply_rope`` runs, with every
feature (strides, positions, M-RoPE, partial rotation). These kernels take contiguous
``(batch, heads, seq, head_dim)`` tensors and float32 tables ``(seq, head_dim // 2)`` and
show one idea each:

1. ``kernel_per_head`` (half layout): one program per block of tokens of one head; every
   program reads its tokens' cos and sin rows, so the tables are read once per head.
2. ``kernel_interleaved`` (interleaved layout, per head like step 1): pairs (2i, 2i + 1)
   loaded with a stride of 2 (``STRIDED``), or whole rows loaded and split in registers.
3. ``kernel_blocks`` (both layouts): one program per block of tokens of one batch entry and
   a group of ``HEADS`` heads; the cos/sin block is read once and reused for every head of
   the group, the heads of q and then of k in one launch; ``INVERSE`` rotates by -theta (the
   backward pass). Its launch shape (tokens and heads a program, warps) is step 4's tuning.

Each launcher runs the compiled kernel on CUDA tensors and the same Python function in
Triton's interpreter on CPU tensors (``InterpretedFunction``, as ``ropelib.triton_rope``
does: no ``TRITON_INTERPRET`` needed). Arithmetic is float32 whatever the storage; results
are rounded once on store. ``source_hash`` names the kernels' source, so that stored
timings of them can be told from timings of other code (``ropelib.book.gpu_runs``).
"""

from __future__ import annotations

import hashlib
import inspect
import math

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
TABLE_BYTES = 4
"""Bytes of one table entry: cos and sin are float32 whatever x's dtype."""


def kernel_per_head(X, OUT, COS, SIN, SEQ, HEAD_DIM: tl.constexpr,
                    BLOCK_S: tl.constexpr):
    """Step 1, half layout: program (t, r) rotates tokens t * BLOCK_S, ...
    of row r = b * heads + h of x, reading these tokens' cos/sin rows."""
    t = tl.program_id(0)
    r = tl.program_id(1).to(tl.int64)
    s = t * BLOCK_S + tl.arange(0, BLOCK_S)  # this program's tokens
    i = tl.arange(0, HEAD_DIM // 2)  # pair i: channels i and i + d/2
    mask = (s < SEQ)[:, None]
    table = s[:, None] * (HEAD_DIM // 2) + i[None, :]
    cos = tl.load(COS + table, mask=mask)
    sin = tl.load(SIN + table, mask=mask)
    row = (r * SEQ + s[:, None]) * HEAD_DIM  # each token's row of x
    a = tl.load(X + row + i[None, :], mask=mask).to(tl.float32)
    b = tl.load(X + row + HEAD_DIM // 2 + i[None, :], mask=mask)
    b = b.to(tl.float32)
    a_new = (a * cos - b * sin).to(OUT.dtype.element_ty)
    b_new = (a * sin + b * cos).to(OUT.dtype.element_ty)
    tl.store(OUT + row + i[None, :], a_new, mask=mask)
    tl.store(OUT + row + HEAD_DIM // 2 + i[None, :], b_new, mask=mask)


def kernel_interleaved(X, OUT, COS, SIN, SEQ, HEAD_DIM: tl.constexpr,
                       BLOCK_S: tl.constexpr, STRIDED: tl.constexpr):
    """Step 2, interleaved layout (pair i: channels 2i and 2i + 1), one
    program per block of tokens of one head as in step 1. STRIDED: load a
    and b with a stride of 2; else load whole rows, split them in registers.
    """
    t = tl.program_id(0)
    r = tl.program_id(1).to(tl.int64)
    s = t * BLOCK_S + tl.arange(0, BLOCK_S)
    i = tl.arange(0, HEAD_DIM // 2)
    mask = (s < SEQ)[:, None]
    table = s[:, None] * (HEAD_DIM // 2) + i[None, :]
    cos = tl.load(COS + table, mask=mask)
    sin = tl.load(SIN + table, mask=mask)
    row = (r * SEQ + s[:, None]) * HEAD_DIM
    c = tl.arange(0, HEAD_DIM)  # every channel of a row
    if STRIDED:
        a = tl.load(X + row + 2 * i[None, :], mask=mask).to(tl.float32)
        b = tl.load(X + row + 2 * i[None, :] + 1, mask=mask).to(tl.float32)
    else:
        pairs = tl.load(X + row + c[None, :], mask=mask).to(tl.float32)
        a, b = tl.split(tl.reshape(pairs, (BLOCK_S, HEAD_DIM // 2, 2)))
    a_new = (a * cos - b * sin).to(OUT.dtype.element_ty)
    b_new = (a * sin + b * cos).to(OUT.dtype.element_ty)
    if STRIDED:
        tl.store(OUT + row + 2 * i[None, :], a_new, mask=mask)
        tl.store(OUT + row + 2 * i[None, :] + 1, b_new, mask=mask)
    else:
        rows = tl.reshape(tl.join(a_new, b_new), (BLOCK_S, HEAD_DIM))
        tl.store(OUT + row + c[None, :], rows, mask=mask)


def kernel_blocks(Q, K, QO, KO, COS, SIN, HQ, HK, SEQ, TABLE_B,
                  HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                  BLOCK_S: tl.constexpr, HALF: tl.constexpr,
                  INVERSE: tl.constexpr):
    """Step 3: program (t, b, g) reads the cos/sin rows of tokens
    t * BLOCK_S, ... of batch entry b once (TABLE_B: the tables' batch
    stride, 0 if shared) and rotates those tokens in heads g * HEADS, ...
    of the HQ heads of q followed by the HK heads of k."""
    t = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    g = tl.program_id(2)
    s = t * BLOCK_S + tl.arange(0, BLOCK_S)
    i = tl.arange(0, HEAD_DIM // 2)
    c = tl.arange(0, HEAD_DIM)
    table = b * TABLE_B + s[:, None] * (HEAD_DIM // 2) + i[None, :]
    cos = tl.load(COS + table, mask=(s < SEQ)[:, None])
    sin = tl.load(SIN + table, mask=(s < SEQ)[:, None])
    if INVERSE:  # R^T = the rotation by -theta
        sin = -sin
    for j in tl.static_range(HEADS):  # the block's rows serve every head
        head = g * HEADS + j
        is_k = head >= HQ
        h = tl.where(is_k, head - HQ, head).to(tl.int64)
        n = tl.where(is_k, HK, HQ)  # heads of the tensor this head is in
        row = ((b * n + h) * SEQ + s[:, None]) * HEAD_DIM
        x = tl.where(is_k, K, Q) + row
        o = tl.where(is_k, KO, QO) + row
        mask = (s < tl.where(head < HQ + HK, SEQ, 0))[:, None]  # none past k
        if HALF:
            a = tl.load(x + i[None, :], mask=mask).to(tl.float32)
            z = tl.load(x + HEAD_DIM // 2 + i[None, :], mask=mask)
            z = z.to(tl.float32)
        else:
            pairs = tl.load(x + c[None, :], mask=mask).to(tl.float32)
            a, z = tl.split(tl.reshape(pairs, (BLOCK_S, HEAD_DIM // 2, 2)))
        a_new = (a * cos - z * sin).to(QO.dtype.element_ty)
        z_new = (a * sin + z * cos).to(QO.dtype.element_ty)
        if HALF:
            tl.store(o + i[None, :], a_new, mask=mask)
            tl.store(o + HEAD_DIM // 2 + i[None, :], z_new, mask=mask)
        else:
            rows = tl.reshape(tl.join(a_new, z_new), (BLOCK_S, HEAD_DIM))
            tl.store(o + c[None, :], rows, mask=mask)


KERNELS = (kernel_per_head, kernel_interleaved, kernel_blocks)
"""The step kernels, in the order of the chapter (their source is what ``source_hash`` hashes)."""

COMPILED = {fn.__name__: triton.jit(fn) for fn in KERNELS}
"""Each kernel compiled by Triton for a GPU (on first launch with CUDA tensors)."""

INTERPRETED = {fn.__name__: InterpretedFunction(fn) for fn in KERNELS}
"""Each kernel run by Triton's interpreter, one program after another, on CPU tensors."""


def source_hash() -> str:
    """The first 16 hex digits of the SHA-256 of the step kernels' source."""
    source = "\n".join(inspect.getsource(fn) for fn in KERNELS)
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def per_head(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *,
             block_s: int = 16, num_warps: int = 4) -> torch.Tensor:
    """Step 1: R_Theta x in the half layout, tables read once per head.

    Args:
        x: ``(batch, heads, seq, head_dim)``, contiguous, float32, bfloat16 or float16;
            head_dim a power of two.
        cos, sin: float32 ``(seq, head_dim // 2)``, contiguous.
        block_s: tokens per program (a power of two).
        num_warps: warps per program (compiled kernel only).

    Returns:
        A new tensor like x.
    """
    batch, heads, seq, head_dim = _check_x(x, "x")
    _check_tables(cos, sin, (seq, head_dim // 2), x.device)
    _check_pow2(block_s, "block_s")
    out = torch.empty_like(x)
    grid = (triton.cdiv(seq, block_s), batch * heads)
    _launch(kernel_per_head, x, grid, x, out, cos, sin, seq, HEAD_DIM=head_dim,
            BLOCK_S=block_s, num_warps=num_warps)
    return out


def interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, strided: bool,
                block_s: int = 16, num_warps: int = 4) -> torch.Tensor:
    """Step 2: R_Theta x in the interleaved layout, tables read once per head; ``strided``
    loads the pairs with a stride of 2, else rows are loaded whole and split in registers.
    Arguments as ``per_head``."""
    batch, heads, seq, head_dim = _check_x(x, "x")
    _check_tables(cos, sin, (seq, head_dim // 2), x.device)
    _check_pow2(block_s, "block_s")
    out = torch.empty_like(x)
    grid = (triton.cdiv(seq, block_s), batch * heads)
    _launch(kernel_interleaved, x, grid, x, out, cos, sin, seq, HEAD_DIM=head_dim,
            BLOCK_S=block_s, STRIDED=bool(strided), num_warps=num_warps)
    return out


def blocks(q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor, *,
           layout: str, heads_per_program: int | None = None, block_s: int = 16,
           inverse: bool = False, num_warps: int = 4,
           out: tuple[torch.Tensor, torch.Tensor | None] | None = None
           ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Steps 3 and 4: R_Theta q and R_Theta k in one launch, each program reading its block
    of table rows once for ``heads_per_program`` heads.

    Args:
        q: ``(batch, heads_q, seq, head_dim)``, contiguous; head_dim a power of two.
        k: ``(batch, heads_k, seq, head_dim)`` of q's dtype, or None (q alone).
        cos, sin: float32 ``(seq, head_dim // 2)`` shared by the batch, or
            ``(batch, seq, head_dim // 2)`` (rows of each batch entry's own positions).
        layout: ``"half"`` or ``"interleaved"``.
        heads_per_program: heads of q and k a program rotates (None: all of them).
        block_s: tokens per program (a power of two).
        inverse: rotate by -theta (the gradient of the rotation).
        num_warps: warps per program (compiled kernel only).
        out: destinations ``(q_out, k_out)`` shaped like q and k (q and k themselves: in
            place), or None for new tensors.

    Returns:
        ``(q_out, k_out)``; ``k_out`` is None when k is.
    """
    batch, heads_q, seq, head_dim = _check_x(q, "q")
    heads_k = 0
    if k is not None:
        heads_k = _check_x(k, "k")[1]
        if (k.shape[0], k.shape[2], k.shape[3]) != (batch, seq, head_dim) or k.dtype != q.dtype:
            raise ValueError(f"k must be (batch, heads_k, seq, head_dim) = ({batch}, *, {seq}, "
                             f"{head_dim}) of q's dtype {q.dtype}, got {tuple(k.shape)} "
                             f"{k.dtype}")
    if layout not in ("half", "interleaved"):
        raise ValueError(f"layout must be 'half' or 'interleaved', got {layout!r}")
    shared = cos.dim() == 2
    _check_tables(cos, sin, (seq, head_dim // 2) if shared else (batch, seq, head_dim // 2),
                  q.device)
    _check_pow2(block_s, "block_s")
    heads = heads_q + heads_k
    per_program = heads if heads_per_program is None else heads_per_program
    if not isinstance(per_program, int) or isinstance(per_program, bool) or per_program < 1:
        raise ValueError(f"heads_per_program must be an int >= 1 or None, got "
                         f"{heads_per_program!r}")
    q_out, k_out = out if out is not None else (torch.empty_like(q),
                                                None if k is None else torch.empty_like(k))
    for name, dest, src in (("out[0]", q_out, q), ("out[1]", k_out, k)):
        if src is not None and (dest is None or dest.shape != src.shape
                                or dest.dtype != src.dtype or not dest.is_contiguous()):
            raise ValueError(f"{name} must be a contiguous tensor of shape {tuple(src.shape)} "
                             f"and dtype {src.dtype}, got "
                             f"{None if dest is None else (tuple(dest.shape), dest.dtype)}")
    grid = (triton.cdiv(seq, block_s), batch, triton.cdiv(heads, per_program))
    k_in, k_dest = (q, q_out) if k is None else (k, k_out)  # HK = 0: never read
    _launch(kernel_blocks, q, grid, q, k_in, q_out, k_dest, cos, sin, heads_q, heads_k, seq,
            0 if shared else cos.stride(0), HEADS=per_program, HEAD_DIM=head_dim,
            BLOCK_S=block_s, HALF=layout == "half", INVERSE=bool(inverse),
            num_warps=num_warps)
    return q_out, k_out


def predicted_bytes(design: str, batch: int, heads: int, seq: int, head_dim: int,
                    x_bytes: int, heads_per_program: int | None = None) -> int:
    """The bytes a step kernel asks for: x read once and its result written once, plus the
    float32 cos and sin rows (``head_dim // 2`` entries each per token) as often as its
    programs load them.

    Args:
        design: ``"copy"`` (no tables), ``"per head"`` (steps 1 and 2: every head's programs
            load their tokens' rows) or ``"per block"`` (steps 3 and 4: once per batch entry
            and group of ``heads_per_program`` heads; None: all heads in one group).
        batch, heads, seq, head_dim: x's shape (heads: of q and k together).
        x_bytes: bytes of one element of x.
    """
    x_traffic = 2 * batch * heads * seq * head_dim * x_bytes
    row = head_dim * TABLE_BYTES  # cos and sin, head_dim // 2 entries each
    if design == "copy":
        return x_traffic
    if design == "per head":
        return x_traffic + batch * heads * seq * row
    if design == "per block":
        groups = 1 if heads_per_program is None else math.ceil(heads / heads_per_program)
        return x_traffic + batch * groups * seq * row
    raise ValueError(f"design must be 'copy', 'per head' or 'per block', got {design!r}")


def _launch(kernel, x: torch.Tensor, grid: tuple[int, ...], *args, num_warps: int, **meta):
    if x.is_cuda:
        COMPILED[kernel.__name__][grid](*args, **meta, num_warps=num_warps)
    else:
        INTERPRETED[kernel.__name__][grid](*args, **meta)


def _check_x(x: object, name: str) -> tuple[int, int, int, int]:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 4:
        raise ValueError(f"{name} must be (batch, heads, seq, head_dim), got shape "
                         f"{tuple(x.shape)}")
    if x.dtype not in DTYPES:
        raise TypeError(f"{name} must be float32, bfloat16 or float16, got {x.dtype}")
    if not x.is_contiguous():
        raise ValueError(f"{name} must be contiguous (these teaching kernels take no strides): "
                         f"call .contiguous() first")
    if not (x.is_cuda or x.is_cpu):
        raise ValueError(f"{name} must be on a CUDA device or the CPU, got {x.device}")
    _check_pow2(x.shape[-1], f"{name}'s head_dim")
    if x.shape[-1] < 2:
        raise ValueError(f"{name}'s head_dim must be >= 2, got {x.shape[-1]}")
    return tuple(x.shape)


def _check_tables(cos: object, sin: object, shape: tuple[int, ...], device: torch.device):
    for name, t in (("cos", cos), ("sin", sin)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if tuple(t.shape) != shape or t.dtype != torch.float32 or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous float32 table of shape {shape}, got "
                             f"{tuple(t.shape)} {t.dtype}"
                             f"{'' if t.is_contiguous() else ' (not contiguous)'}")
        if t.device != device:
            raise ValueError(f"{name} must be on x's device {device}, got {t.device}")


def _check_pow2(n: object, name: str) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1 or n & (n - 1):
        raise ValueError(f"{name} must be a power of two (Triton's tl.arange), got {n!r}")
