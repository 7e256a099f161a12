"""Linear attention (Katharopoulos et al. 2020) with RoPE on the numerator (RoFormer 3.3).

With a positive feature map phi, softmax(q k^T) is replaced by phi(q) phi(k)^T, and
associativity turns the O(N^2 d) product into O(N d^2):

    out_m = phi(q_m)^T (sum_n phi(k_n) v_n^T) / phi(q_m)^T (sum_n phi(k_n)).

RoFormer rotates the features in the numerator only, so the denominator stays positive:

    out_m = (R_m phi(q_m))^T (sum_n R_n phi(k_n) v_n^T) / phi(q_m)^T (sum_n phi(k_n)).

The causal form sums over n <= m. It is computed chunk by chunk: inside a chunk of C tokens
the (C, C) masked products, across chunks a running (d, d_v) state, so memory is
O(N d + C^2 + d^2) per head and time O(N (C d + d^2)), never an (N, d, d) tensor.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ._checks import check_float_tensor
from .rotation import Layout, apply_rope

FeatureMap = Callable[[torch.Tensor], torch.Tensor]


def elu_plus_one(x: torch.Tensor) -> torch.Tensor:
    """phi(x) = elu(x) + 1 (Katharopoulos et al.): x + 1 for x > 0, exp(x) otherwise.

    Written as exp(x) on the negative side because ``F.elu(x) + 1`` rounds to exactly 0 in
    float32 below x of about -17, which would make the denominator 0.
    """
    return torch.where(x > 0, x + 1.0, torch.exp(x.clamp_max(0.0)))


_FEATURE_MAPS: dict[str, FeatureMap] = {"elu+1": elu_plus_one}


def _causal_chunked(num_q, num_k, den_q, den_k, v, chunk_size):
    d, dv = num_q.shape[-1], v.shape[-1]
    state = num_q.new_zeros(num_q.shape[:-2] + (d, dv))
    norm = den_q.new_zeros(den_q.shape[:-2] + (den_q.shape[-1],))
    tri = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=v.device).tril()
    outs = []
    for start in range(0, v.shape[-2], chunk_size):
        end = min(start + chunk_size, v.shape[-2])
        keep = tri[: end - start, : end - start]
        nq, nk, vc = num_q[..., start:end, :], num_k[..., start:end, :], v[..., start:end, :]
        dq, dk = den_q[..., start:end, :], den_k[..., start:end, :]
        numerator = (nq @ nk.transpose(-2, -1)).masked_fill(~keep, 0.0) @ vc + nq @ state
        denominator = ((dq @ dk.transpose(-2, -1)).masked_fill(~keep, 0.0).sum(-1)
                       + (dq @ norm.unsqueeze(-1)).squeeze(-1))
        outs.append(numerator / denominator.unsqueeze(-1))
        state = state + nk.transpose(-2, -1) @ vc
        norm = norm + dk.sum(-2)
    return torch.cat(outs, dim=-2)


def linear_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
    feature_map: str | FeatureMap = "elu+1",
    rope: tuple[torch.Tensor, torch.Tensor] | None = None, layout: Layout = "interleaved",
    positions: torch.Tensor | None = None, causal: bool = False, chunk_size: int = 64,
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
        chunk_size: tokens per chunk in the causal form.

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
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    den_q, den_k = feature_map(q), feature_map(k)
    num_q, num_k = den_q, den_k
    if rope is not None:
        cos, sin = rope
        num_q = apply_rope(den_q, cos, sin, layout=layout, positions=positions)
        num_k = apply_rope(den_k, cos, sin, layout=layout, positions=positions)
    if causal:
        return _causal_chunked(num_q, num_k, den_q, den_k, v, chunk_size)
    numerator = num_q @ (num_k.transpose(-2, -1) @ v)
    denominator = den_q @ den_k.sum(dim=-2).unsqueeze(-1)
    return numerator / denominator
