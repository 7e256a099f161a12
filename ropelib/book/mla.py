"""Multi-head latent attention (MLA) with decoupled RoPE, built from ropelib parts.

DeepSeek-V2 (DeepSeek-AI 2024, "DeepSeek-V2: A Strong, Economical, and Efficient
Mixture-of-Experts Language Model") caches one small latent vector c_n per token instead of
every head's key and value: k_n^h = W_UK^h c_n and v_n^h = W_UV^h c_n. Without RoPE, the
key up-projection folds into the query, q^h^T W_UK^h c_n = (W_UK^h^T q^h)^T c_n, and attention
runs on the cache directly. RoPE would put R_{n-m} between q and W_UK, a different matrix for
every distance, so DeepSeek rotates only a separate, small part: each head's query gets
``qk_rope_head_dim`` extra channels, and one rotated key of that width is shared by all heads
and cached beside c_n. The score of head h is

    q_nope^h^T W_UK^h c_n + (R_m q_rope^h)^T (R_n k_rope_n),

the first term absorbable, the second tiny.

``MultiHeadLatentAttention`` computes it both ways: ``forward(x)`` expands keys and values
like transformers' ``DeepseekV3Attention`` (whose parameter names it uses, so that module's
state dict loads as it is), ``forward(x, absorbed=True)`` attends over the latents with the
up-projections folded into the query and the output. The rotated channels use DeepSeek's
interleaved pair layout (``rope_interleave``). Needs only torch.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..rotation import apply_rope
from ..tables import RotaryEmbedding

__all__ = ["MultiHeadLatentAttention", "kv_cache_bytes_per_token"]


class MultiHeadLatentAttention(nn.Module):
    """Causal MLA with decoupled RoPE (DeepSeek-V2/V3), interleaved rotary layout.

    Args:
        hidden_size: model width D.
        num_heads: attention heads H.
        q_lora_rank: width of the query's low-rank bottleneck (None: a plain ``q_proj``).
        kv_lora_rank: width r of the cached latent c_n.
        qk_nope_head_dim: per-head query/key channels without position.
        qk_rope_head_dim: per-head rotated query channels, and the width of the shared
            rotated key (cached beside c_n).
        v_head_dim: per-head value channels.
        rope_theta: RoPE base of the rotated part.
        attention_bias: bias in ``q_a_proj``, ``kv_a_proj_with_mqa`` and ``o_proj``.

    Shapes: ``forward(x)`` maps ``(batch, seq, hidden_size)`` to the same shape; position m of
    x is position m of the sequence.
    """

    def __init__(self, hidden_size: int, num_heads: int, *, q_lora_rank: int | None,
                 kv_lora_rank: int, qk_nope_head_dim: int, qk_rope_head_dim: int,
                 v_head_dim: int, rope_theta: float = 10000.0,
                 attention_bias: bool = False) -> None:
        super().__init__()
        self.num_heads, self.kv_lora_rank = num_heads, kv_lora_rank
        self.qk_nope_head_dim, self.qk_rope_head_dim = qk_nope_head_dim, qk_rope_head_dim
        self.v_head_dim = v_head_dim
        self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
        self.softmax_scale = self.qk_head_dim ** -0.5
        q_out = num_heads * self.qk_head_dim
        if q_lora_rank is None:
            self.q_proj = nn.Linear(hidden_size, q_out, bias=False)
        else:
            self.q_a_proj = nn.Linear(hidden_size, q_lora_rank, bias=attention_bias)
            self.q_a_layernorm = nn.RMSNorm(q_lora_rank, eps=1e-6)
            self.q_b_proj = nn.Linear(q_lora_rank, q_out, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden_size, kv_lora_rank + qk_rope_head_dim,
                                            bias=attention_bias)
        self.kv_a_layernorm = nn.RMSNorm(kv_lora_rank, eps=1e-6)
        self.kv_b_proj = nn.Linear(kv_lora_rank, num_heads * (qk_nope_head_dim + v_head_dim),
                                   bias=False)
        self.o_proj = nn.Linear(num_heads * v_head_dim, hidden_size, bias=attention_bias)
        self.rotary = RotaryEmbedding(qk_rope_head_dim, rope_theta)

    def _query(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(q_nope, q_rope)``: ``(B, H, N, nope)`` and ``(B, H, N, rope)``, unrotated."""
        q = (self.q_proj(x) if hasattr(self, "q_proj")
             else self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))))
        q = q.unflatten(-1, (self.num_heads, self.qk_head_dim)).transpose(1, 2)
        return q.split([self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)

    def latents(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What a decoder caches per token: ``(c, k_rope)``, ``(B, N, kv_lora_rank)`` and the
        shared key ``(B, 1, N, qk_rope_head_dim)``, unrotated."""
        c, k_rope = self.kv_a_proj_with_mqa(x).split(
            [self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        return self.kv_a_layernorm(c), k_rope[:, None]

    def up_projections(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(W_UK, W_UV)`` of shapes ``(H, nope, r)`` and ``(H, v_head_dim, r)``: head h's key
        is W_UK[h] c and its value W_UV[h] c."""
        w = self.kv_b_proj.weight.unflatten(0, (self.num_heads, -1))
        return w.split([self.qk_nope_head_dim, self.v_head_dim], dim=1)

    def forward(self, x: torch.Tensor, *, absorbed: bool = False) -> torch.Tensor:
        if x.ndim != 3:
            raise ValueError(f"x must be (batch, seq, hidden_size), got {tuple(x.shape)}")
        batch, seq, _ = x.shape
        q_nope, q_rope = self._query(x)
        c, k_rope = self.latents(x)
        cos, sin = self.rotary(seq)
        q_rope = apply_rope(q_rope, cos, sin, layout="interleaved")
        k_rope = apply_rope(k_rope, cos, sin, layout="interleaved")
        w_uk, w_uv = self.up_projections()
        if absorbed:
            q_latent = torch.einsum("bhnd,hdr->bhnr", q_nope, w_uk)  # W_UK^T q, per head
            scores = (q_latent @ c[:, None].transpose(-2, -1)
                      + q_rope @ k_rope.transpose(-2, -1)) * self.softmax_scale
            causal = torch.ones(seq, seq, dtype=torch.bool, device=x.device).tril()
            weights = scores.masked_fill(~causal, -math.inf).softmax(-1)
            out = torch.einsum("bhnr,hvr->bhnv", weights @ c[:, None], w_uv)
        else:
            k_nope = torch.einsum("bnr,hdr->bhnd", c, w_uk)
            v = torch.einsum("bnr,hvr->bhnv", c, w_uv)
            k = torch.cat([k_nope, k_rope.expand(-1, self.num_heads, -1, -1)], dim=-1)
            q = torch.cat([q_nope, q_rope], dim=-1)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                 scale=self.softmax_scale)
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))


def kv_cache_bytes_per_token(*, num_layers: int, bytes_per_value: int, kind: str,
                             num_kv_heads: int = 0, head_dim: int = 0, kv_lora_rank: int = 0,
                             qk_rope_head_dim: int = 0) -> int:
    """Bytes a decoder caches per token, all layers.

    ``"mha"`` / ``"gqa"``: a key and a value of ``head_dim`` per KV head,
    2 * num_kv_heads * head_dim values per layer (MHA: num_kv_heads = the heads).
    ``"mla"``: the latent and the shared rotated key, kv_lora_rank + qk_rope_head_dim values.
    """
    if kind in ("mha", "gqa"):
        per_layer = 2 * num_kv_heads * head_dim
    elif kind == "mla":
        per_layer = kv_lora_rank + qk_rope_head_dim
    else:
        raise ValueError(f"kind must be 'mha', 'gqa' or 'mla', got {kind!r}")
    if per_layer <= 0:
        raise ValueError(f"the sizes for kind={kind!r} give {per_layer} values per layer; pass "
                         "num_kv_heads and head_dim (mha/gqa) or kv_lora_rank and "
                         "qk_rope_head_dim (mla)")
    return num_layers * per_layer * bytes_per_value
