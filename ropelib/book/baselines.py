"""Position schemes RoPE is compared with: absolute embeddings and additive relative biases.

Absolute (added to the token embeddings before attention):

- ``sinusoidal_embeddings``: Vaswani et al. (2017), PE(pos, 2i) = sin(pos / base^(2i/d)),
  PE(pos, 2i+1) = cos(pos / base^(2i/d)). A learned table is just a trained
  ``(num_positions, d)`` parameter and needs no function here.
- ``absolute_score_terms``: the four terms of (x_m + p_m)^T W_q^T W_k (x_n + p_n).

Relative (an additive bias B on the attention scores, B depending on n - m):

- ``shaw_bias``: Shaw et al. (2018), q_m . w_{clip(n - m, -K, K)} with a learned table w.
- ``t5_relative_bucket`` / ``t5_bias``: T5's (Raffel et al. 2020) learned scalar per head and
  bucket, buckets exact for short distances and logarithmic up to ``max_distance``.
- ``alibi_slopes`` / ``alibi_bias``: ALiBi (Press et al. 2022), -slope_h * |m - n| with the
  geometric slopes 2^(-8h/H).

Positions follow the book: a query at position m, a key at position n, and relative position
n - m. Query i sits at position ``q_offset + i`` and key j at position j; the default
``q_offset = k_len - q_len`` puts the queries at the end of the keys, as in decoding with a
KV cache (and gives m = i for a square matrix). Needs only torch.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

__all__ = [
    "ScoreTerms",
    "absolute_score_terms",
    "alibi_bias",
    "alibi_slopes",
    "relative_positions",
    "shaw_bias",
    "shaw_relative_index",
    "sinusoidal_embeddings",
    "t5_bias",
    "t5_relative_bucket",
]


# --------------------------------------------------------------------------- checks

def _check_int(name: str, value: object, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value}")
    return value


def _check_tensor(name: str, t: object, ndim: int | None = None, *, min_ndim: int | None = None
                  ) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}; "
                        f"convert it first, e.g. {name}.float()")
    if ndim is not None and t.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")
    if min_ndim is not None and t.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dims, got shape {tuple(t.shape)}")
    return t


def _query_offset(q_len: int, k_len: int, q_offset: int | None) -> int:
    if q_offset is None:
        if q_len > k_len:
            raise ValueError(f"q_len={q_len} > k_len={k_len}: the default q_offset = k_len - "
                             "q_len would be negative; pass q_offset (the query's first "
                             "position) explicitly")
        return k_len - q_len
    return _check_int("q_offset", q_offset, minimum=0)


# --------------------------------------------------------------------------- positions

def relative_positions(q_len: int, k_len: int, *, q_offset: int | None = None,
                       device: torch.device | str | None = None) -> torch.Tensor:
    """The relative position n - m of every (query, key) pair.

    Args:
        q_len: number of queries; query i is at position m = q_offset + i.
        k_len: number of keys; key j is at position n = j.
        q_offset: position of the first query (default ``k_len - q_len``).
        device: where the result goes.

    Returns:
        int64 tensor ``(q_len, k_len)`` with entry ``[i, j] = j - (q_offset + i)``.
    """
    _check_int("q_len", q_len, minimum=0)
    _check_int("k_len", k_len, minimum=0)
    offset = _query_offset(q_len, k_len, q_offset)
    m = torch.arange(offset, offset + q_len, device=device)
    n = torch.arange(k_len, device=device)
    return n[None, :] - m[:, None]


# --------------------------------------------------------------------------- absolute

def sinusoidal_embeddings(num_positions: int, dim: int, base: float = 10000.0, *,
                          positions: torch.Tensor | None = None,
                          dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Vaswani et al.'s sinusoidal position embeddings.

    ``PE[pos, 2i] = sin(pos * w_i)`` and ``PE[pos, 2i+1] = cos(pos * w_i)`` with
    ``w_i = base^(-2i/dim)``, computed in float64 and cast to ``dtype``.

    Args:
        num_positions: number of rows (positions ``0 .. num_positions - 1``).
        dim: model dimension d (even, >= 2).
        base: the wavelength scale (10000 in the paper).
        positions: optional ``(num_positions,)`` positions (int or float, negative allowed)
            instead of ``0 .. num_positions - 1``.
        dtype: floating-point dtype of the result.

    Returns:
        ``(num_positions, dim)`` tensor.
    """
    _check_int("num_positions", num_positions, minimum=0)
    _check_int("dim", dim, minimum=2)
    if dim % 2:
        raise ValueError(f"dim must be even (sin and cos channels come in pairs), got {dim}")
    if isinstance(base, bool) or not isinstance(base, (int, float)) or not 1.0 < base < math.inf:
        raise ValueError(f"base must be a finite number > 1, got {base!r}")
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point dtype, got {dtype}")
    if positions is None:
        pos = torch.arange(num_positions, dtype=torch.float64)
    else:
        if not isinstance(positions, torch.Tensor) or positions.shape != (num_positions,):
            seen = tuple(positions.shape) if isinstance(positions, torch.Tensor) else positions
            raise ValueError(f"positions must be a tensor of shape (num_positions,) = "
                             f"({num_positions},), got {seen}")
        pos = positions.detach().cpu().to(torch.float64)
    freqs = float(base) ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = pos[:, None] * freqs[None, :]
    out = torch.empty(num_positions, dim, dtype=torch.float64)
    out[:, 0::2] = torch.sin(angles)
    out[:, 1::2] = torch.cos(angles)
    return out.to(dtype)


class ScoreTerms(NamedTuple):
    """The four terms of (x_m + p_m)^T W_q^T W_k (x_n + p_n), each ``(..., q_len, k_len)``."""

    content_content: torch.Tensor
    """x_m^T W_q^T W_k x_n: the only term without a position."""
    content_position: torch.Tensor
    """x_m^T W_q^T W_k p_n."""
    position_content: torch.Tensor
    """p_m^T W_q^T W_k x_n."""
    position_position: torch.Tensor
    """p_m^T W_q^T W_k p_n."""

    def total(self) -> torch.Tensor:
        """The full score, the sum of the four terms."""
        return (self.content_content + self.content_position + self.position_content
                + self.position_position)


def absolute_score_terms(x_q: torch.Tensor, x_k: torch.Tensor, p_q: torch.Tensor,
                         p_k: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor) -> ScoreTerms:
    """Split the score of additive absolute embeddings into its four terms.

    With q = W_q (x_m + p_m) and k = W_k (x_n + p_n) (``nn.Linear`` convention: the query
    rows are ``(x_q + p_q) @ w_q.T``), the score q^T k expands into content-content,
    content-position, position-content and position-position terms.

    Args:
        x_q: token contents at the query positions, ``(..., q_len, d_model)``.
        x_k: token contents at the key positions, ``(..., k_len, d_model)``.
        p_q: position embeddings of the query positions, broadcastable to ``x_q``.
        p_k: position embeddings of the key positions, broadcastable to ``x_k``.
        w_q, w_k: projection weights ``(d_head, d_model)``.

    Returns:
        ``ScoreTerms`` of four ``(..., q_len, k_len)`` tensors, broadcast to one shape
        (a term without batch dims, such as position-position, is an expanded view);
        ``.total()`` is the score.
    """
    for name, t in (("x_q", x_q), ("x_k", x_k), ("p_q", p_q), ("p_k", p_k)):
        _check_tensor(name, t, min_ndim=2)
    _check_tensor("w_q", w_q, 2)
    _check_tensor("w_k", w_k, 2)
    d_model = x_q.shape[-1]
    for name, t in (("x_k", x_k), ("p_q", p_q), ("p_k", p_k)):
        if t.shape[-1] != d_model:
            raise ValueError(f"{name} must end in d_model = x_q.shape[-1] = {d_model}, "
                             f"got shape {tuple(t.shape)}")
    if w_q.shape != w_k.shape or w_q.shape[1] != d_model:
        raise ValueError(f"w_q and w_k must both have shape (d_head, d_model={d_model}), got "
                         f"{tuple(w_q.shape)} and {tuple(w_k.shape)}")
    qx, qp = x_q @ w_q.T, p_q @ w_q.T
    kx, kp = x_k @ w_k.T, p_k @ w_k.T
    terms = torch.broadcast_tensors(qx @ kx.mT, qx @ kp.mT, qp @ kx.mT, qp @ kp.mT)
    return ScoreTerms(*terms)


# --------------------------------------------------------------------------- Shaw et al.

def shaw_relative_index(q_len: int, k_len: int, max_relative_position: int, *,
                        q_offset: int | None = None,
                        device: torch.device | str | None = None) -> torch.Tensor:
    """Row of Shaw et al.'s relative table for every pair: clip(n - m, -K, K) + K.

    Args:
        q_len, k_len, q_offset, device: as in ``relative_positions``.
        max_relative_position: the clipping distance K (>= 0); the table has 2K + 1 rows.

    Returns:
        int64 tensor ``(q_len, k_len)`` with values in ``0 .. 2K``.
    """
    k = _check_int("max_relative_position", max_relative_position, minimum=0)
    rel = relative_positions(q_len, k_len, q_offset=q_offset, device=device)
    return rel.clamp(-k, k) + k


def shaw_bias(q: torch.Tensor, rel_k: torch.Tensor, k_len: int, *,
              q_offset: int | None = None) -> torch.Tensor:
    """Shaw et al.'s key-side relative term as an additive bias on the scores.

    Shaw et al. compute e_mn = q_m^T (k_n + a_mn) with a_mn = w_{clip(n - m, -K, K)}, a row
    of a learned table. The extra term is the bias B_mn = q_m^T w_{clip(n - m, -K, K)}:
    it depends on the query's content and on n - m only. (Their value-side table a^V is
    not a score bias and is left out.) Scale by 1/sqrt(d) together with q k^T.

    Args:
        q: queries ``(..., q_len, d_head)``.
        rel_k: the table w ``(2K + 1, d_head)``; row K is relative position 0.
        k_len: number of keys.
        q_offset: position of the first query (default ``k_len - q_len``).

    Returns:
        ``(..., q_len, k_len)`` bias.
    """
    _check_tensor("q", q, min_ndim=2)
    _check_tensor("rel_k", rel_k, 2)
    rows, d_head = rel_k.shape
    if rows % 2 == 0:
        raise ValueError(f"rel_k must have 2K + 1 rows (relative positions -K .. K), got {rows}")
    if d_head != q.shape[-1]:
        raise ValueError(f"rel_k must have shape (2K + 1, d_head={q.shape[-1]}), "
                         f"got {tuple(rel_k.shape)}")
    index = shaw_relative_index(q.shape[-2], k_len, (rows - 1) // 2, q_offset=q_offset,
                                device=q.device)
    per_row = q @ rel_k.to(q.dtype).T                      # (..., q_len, 2K + 1)
    return torch.gather(per_row, -1, index.expand(per_row.shape[:-1] + (k_len,)))


# --------------------------------------------------------------------------- T5

def t5_relative_bucket(relative_position: torch.Tensor, bidirectional: bool = True,
                       num_buckets: int = 32, max_distance: int = 128) -> torch.Tensor:
    """T5's bucket for each relative position n - m (memory position minus query position).

    Bidirectional: half the buckets for keys at or before the query (n <= m), half for keys
    after it (offset num_buckets / 2). Within a half, with b = the half's size and
    max_exact = b / 2, a distance |n - m| < max_exact is its own bucket, and longer distances
    share logarithmically wider buckets,
    max_exact + floor(log(dist / max_exact) / log(max_distance / max_exact) * (b - max_exact)),
    capped at b - 1. Unidirectional (causal): all buckets for n <= m; keys after the query
    fall in bucket 0. The float32 arithmetic is that of Mesh TensorFlow / Hugging Face, so
    the buckets match pretrained T5 checkpoints.

    Args:
        relative_position: integer tensor of n - m, any shape.
        bidirectional: encoder (True) or causal decoder (False).
        num_buckets: number of buckets (even and >= 4 when bidirectional, >= 2 otherwise).
        max_distance: distance from which everything shares the last bucket; must exceed
            max_exact.

    Returns:
        int64 tensor of the shape of ``relative_position``, values in ``0 .. num_buckets - 1``.
    """
    if not isinstance(relative_position, torch.Tensor) or relative_position.is_floating_point() \
            or relative_position.is_complex() or relative_position.dtype == torch.bool:
        seen = relative_position.dtype if isinstance(relative_position, torch.Tensor) else \
            type(relative_position).__name__
        raise TypeError(f"relative_position must be an integer tensor, got {seen}")
    if not isinstance(bidirectional, bool):
        raise TypeError(f"bidirectional must be a bool, got {type(bidirectional).__name__}")
    _check_int("num_buckets", num_buckets, minimum=4 if bidirectional else 2)
    if bidirectional and num_buckets % 2:
        raise ValueError(f"num_buckets must be even when bidirectional (half per direction), "
                         f"got {num_buckets}")
    _check_int("max_distance", max_distance, minimum=1)
    rel = relative_position.long()
    buckets = torch.zeros_like(rel)
    if bidirectional:
        num_buckets //= 2
        buckets += (rel > 0).long() * num_buckets
        dist = rel.abs()
    else:
        dist = -torch.clamp(rel, max=0)
    max_exact = num_buckets // 2
    if max_distance <= max_exact:
        raise ValueError(f"max_distance must be > max_exact = {max_exact} (a quarter of "
                         f"num_buckets when bidirectional, half otherwise), got {max_distance}")
    # clamp_min only keeps log() finite where the exact branch is used anyway
    large = max_exact + (
        torch.log(dist.clamp_min(max_exact).float() / max_exact)
        / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    ).long()
    large = torch.clamp(large, max=num_buckets - 1)
    return buckets + torch.where(dist < max_exact, dist, large)


def t5_bias(weight: torch.Tensor, q_len: int, k_len: int, *, bidirectional: bool = True,
            max_distance: int = 128, q_offset: int | None = None) -> torch.Tensor:
    """T5's relative attention bias: B[h, m, n] = weight[bucket(n - m), h].

    Args:
        weight: the learned table ``(num_buckets, num_heads)`` (the ``weight`` of T5's
            ``relative_attention_bias`` embedding).
        q_len, k_len, q_offset: as in ``relative_positions``.
        bidirectional, max_distance: as in ``t5_relative_bucket``.

    Returns:
        ``(num_heads, q_len, k_len)`` bias, added to the scores of every batch entry.
    """
    _check_tensor("weight", weight, 2)
    rel = relative_positions(q_len, k_len, q_offset=q_offset, device=weight.device)
    buckets = t5_relative_bucket(rel, bidirectional, weight.shape[0], max_distance)
    return weight[buckets].permute(2, 0, 1)


# --------------------------------------------------------------------------- ALiBi

def alibi_slopes(num_heads: int, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """ALiBi's head slopes.

    For H a power of two, slope_h = 2^(-8h/H), h = 1 .. H: a geometric sequence that starts
    and has ratio 2^(-8/H) (1/2, 1/4, ..., 1/256 for 8 heads). Otherwise, as in the authors'
    code, the slopes of the largest power of two P < H, followed by every other slope of 2P
    (its odd-indexed ones, h = 1, 3, 5, ...) until there are H.

    Returns:
        ``(num_heads,)`` tensor (computed in float64, cast to ``dtype``).
    """
    _check_int("num_heads", num_heads, minimum=1)

    def power_of_two(n: int) -> list[float]:
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    p = 1 << (num_heads.bit_length() - 1)
    slopes = power_of_two(p)
    if p != num_heads:
        slopes += power_of_two(2 * p)[0::2][: num_heads - p]
    return torch.tensor(slopes, dtype=torch.float64).to(dtype)


def alibi_bias(q_len: int, k_len: int, num_heads: int, *, q_offset: int | None = None,
               dtype: torch.dtype = torch.float32,
               device: torch.device | str | None = None) -> torch.Tensor:
    """ALiBi's bias B[h, m, n] = -slope_h * |m - n|.

    With a causal mask only n <= m is used, where this equals the paper's -slope_h (m - n).

    Args:
        q_len, k_len, q_offset, device: as in ``relative_positions``.
        num_heads: number of heads H (see ``alibi_slopes``).
        dtype: floating-point dtype of the result.

    Returns:
        ``(num_heads, q_len, k_len)`` bias.
    """
    slopes = alibi_slopes(num_heads, dtype=torch.float64).to(device)
    rel = relative_positions(q_len, k_len, q_offset=q_offset, device=device)
    # 0 - x rather than -x, so the diagonal is +0.0, not -0.0
    return (0.0 - slopes[:, None, None] * rel.abs().to(torch.float64)).to(dtype)
