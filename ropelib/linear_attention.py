"""Linear attention (Katharopoulos et al. 2020) with RoPE on the numerator (RoFormer 3.3).

With a positive feature map phi, softmax(q k^T) is replaced by phi(q) phi(k)^T, and
associativity turns the O(N^2 d) product into O(N d^2):

    out_m = phi(q_m)^T (sum_n phi(k_n) v_n^T) / phi(q_m)^T (sum_n phi(k_n)).

RoFormer rotates the features in the numerator only, so the denominator stays positive:

    out_m = (R_m phi(q_m))^T (sum_n R_n phi(k_n) v_n^T) / phi(q_m)^T (sum_n phi(k_n)).

The causal form sums over n <= m. It is computed chunk by chunk: inside a chunk of C tokens
the (C, C) masked products, across chunks a running (d, d_v) state, so memory is
O(N d + C^2 + d^2) per head and time O(N (C d + d^2)), never an (N, d, d) tensor.

Both forms stream: the features phi and their rotations are made per block of about
``STREAM_TOKENS`` tokens, so temporaries are O(block d) per head whatever N, instead of
several tensors the size of q, whose fresh allocation (a page fault per 4 KiB page once they
are large) made the time grow faster than N. The non-causal form makes two passes: one sums
R_n phi(k_n) v_n^T and phi(k_n) over the blocks of k, the other computes the output block by
block (its blocks are ``chunk_size`` tokens, 1024 by default).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ._checks import check_count, check_float_tensor
from .rotation import Layout, apply_rope

FeatureMap = Callable[[torch.Tensor], torch.Tensor]


def elu_plus_one(x: torch.Tensor) -> torch.Tensor:
    """phi(x) = elu(x) + 1 (Katharopoulos et al.): x + 1 for x > 0, exp(x) otherwise.

    Written as exp(x) on the negative side because ``F.elu(x) + 1`` rounds to exactly 0 in
    float32 below x of about -17, which would make the denominator 0.
    """
    return torch.where(x > 0, x + 1.0, torch.exp(x.clamp_max(0.0)))


_FEATURE_MAPS: dict[str, FeatureMap] = {"elu+1": elu_plus_one}
STREAM_TOKENS = 1024
DEFAULT_CHUNK_SIZE = {True: 64, False: STREAM_TOKENS}  # causal, non-causal


def _causal_chunked(q, k, v, features, chunk_size):
    """The causal form: features computed per block of about ``STREAM_TOKENS`` tokens, the
    (C, C) products and the running state per chunk of ``chunk_size`` tokens inside it."""
    n, d, dv = q.shape[-2], q.shape[-1], v.shape[-1]
    state = q.new_zeros(q.shape[:-2] + (d, dv))
    norm = q.new_zeros(q.shape[:-2] + (d, 1))
    tri = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=v.device).tril()
    out = v.new_empty(q.shape[:-1] + (dv,))
    block = chunk_size * max(1, STREAM_TOKENS // chunk_size)
    for block_start in range(0, n, block):
        block_end = min(block_start + block, n)
        den_qb, num_qb = features(q, block_start, block_end)
        den_kb, num_kb = features(k, block_start, block_end)
        for start in range(block_start, block_end, chunk_size):
            end = min(start + chunk_size, block_end)
            a, b = start - block_start, end - block_start
            keep = tri[: end - start, : end - start]
            nq, nk, vc = num_qb[..., a:b, :], num_kb[..., a:b, :], v[..., start:end, :]
            dq, dk = den_qb[..., a:b, :], den_kb[..., a:b, :]
            numerator = (nq @ nk.transpose(-2, -1)).masked_fill(~keep, 0.0) @ vc + nq @ state
            denominator = ((dq @ dk.transpose(-2, -1)).masked_fill(~keep, 0.0).sum(-1, keepdim=True)
                           + dq @ norm)
            out[..., start:end, :] = numerator / denominator
            state = state + nk.transpose(-2, -1) @ vc
            norm = norm + dk.sum(-2).unsqueeze(-1)
    return out


def _noncausal_streamed(q, k, v, features, chunk_size):
    """The non-causal form in two passes over blocks of ``chunk_size`` tokens."""
    d, dv = q.shape[-1], v.shape[-1]
    kv = q.new_zeros(q.shape[:-2] + (d, dv))
    k_sum = q.new_zeros(q.shape[:-2] + (1, d))
    for start in range(0, k.shape[-2], chunk_size):
        end = min(start + chunk_size, k.shape[-2])
        den_k, num_k = features(k, start, end)
        kv += num_k.transpose(-2, -1) @ v[..., start:end, :]
        k_sum += den_k.sum(dim=-2, keepdim=True)
    out = v.new_empty(q.shape[:-1] + (dv,))
    for start in range(0, q.shape[-2], chunk_size):
        end = min(start + chunk_size, q.shape[-2])
        den_q, num_q = features(q, start, end)
        numerator = num_q @ kv
        out[..., start:end, :] = numerator.div_(den_q @ k_sum.transpose(-2, -1))
    return out


def linear_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
    feature_map: str | FeatureMap = "elu+1",
    rope: tuple[torch.Tensor, torch.Tensor] | None = None, layout: Layout = "interleaved",
    positions: torch.Tensor | None = None, causal: bool = False, chunk_size: int | None = None,
) -> torch.Tensor:
    """Kernelized attention in O(N d^2), optionally with RoPE and causal.

    Args:
        q, k: ``(batch, heads, seq, head_dim)``; v: ``(batch, heads, seq, v_dim)``.
        feature_map: ``"elu+1"`` or a callable; it must return positive features (the
            denominator is a sum of their products).
        rope: optional ``(cos, sin)`` tables; the rotation is applied to phi(q) and phi(k) in
            the numerator only.
        layout, positions: passed to ``apply_rope`` (positions of both q and k).
        causal: token m attends to n <= m.
        chunk_size: tokens per chunk: the causal form's (C, C) blocks (default 64), the
            non-causal form's streaming blocks (default 1024).

    Returns:
        ``(batch, heads, seq, v_dim)``.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_float_tensor(name, t)
        if t.ndim < 2:
            raise ValueError(f"{name} must have shape (..., seq, dim), got {tuple(t.shape)}")
    if q.shape != k.shape:
        raise ValueError(f"q and k must have the same shape, got {tuple(q.shape)} and "
                         f"{tuple(k.shape)}")
    if v.shape[:-1] != k.shape[:-1]:
        raise ValueError(f"v must have shape {tuple(k.shape[:-1])} + (v_dim,), got "
                         f"{tuple(v.shape)}")
    if isinstance(feature_map, str):
        if feature_map not in _FEATURE_MAPS:
            raise ValueError(f"feature_map must be one of {sorted(_FEATURE_MAPS)} or a callable, "
                             f"got {feature_map!r}")
        feature_map = _FEATURE_MAPS[feature_map]
    if chunk_size is None:
        chunk_size = DEFAULT_CHUNK_SIZE[bool(causal)]
    chunk_size = check_count("chunk_size", chunk_size)

    def features(t: torch.Tensor, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """phi(t) and its rotation (the numerator's features) for tokens start..end-1."""
        phi = feature_map(t[..., start:end, :])
        if rope is None:
            return phi, phi
        rows = {"offset": start} if positions is None else {"positions": positions[..., start:end]}
        return phi, apply_rope(phi, *rope, layout=layout, **rows)

    if causal:
        return _causal_chunked(q, k, v, features, chunk_size)
    return _noncausal_streamed(q, k, v, features, chunk_size)
