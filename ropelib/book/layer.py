"""A decoder layer of the Llama family, written out part by part, for chapter 11: what share
of a whole layer's time is RoPE?

``DecoderLayer`` is a pre-norm layer as Llama 2/3 build it: RMSNorm, one fused projection
to q, k and v (grouped KV heads), RoPE on q and k, causal scaled-dot-product attention, the
output projection, RMSNorm and a SwiGLU MLP, each with a residual connection. RoPE runs
once for q and k together: q and k are adjacent slices of the fused projection's output and
rotate by the same table, so one in-place ``apply_rope`` call on their joint view rotates
both (half layout, as in Hugging Face's Llama).

``parts`` returns, for one input, a closure per part that repeats just that part on the
intermediate tensors of a forward pass, so that each can be timed alone: the parts in
``PARTS`` (and, for a decoding step, the KV-cache append) make up the layer, ``"whole
layer"`` is the forward itself and
``"hf_rotate_half (q, k)"`` is Hugging Face's formula applied to the same q and k, for
comparison. Inference only: the parameters do not require grad.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..rotation import apply_rope
from .bench import hf_rotate_half

__all__ = ["PARTS", "DecoderLayer"]

PARTS = ("norms", "q, k, v projection", "ropelib RoPE (q, k)", "attention",
         "output projection", "MLP")


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


class DecoderLayer(nn.Module):
    """A Llama-style pre-norm decoder layer (inference only).

    Args:
        hidden: model width.
        num_heads: query heads; ``hidden`` must be a multiple of it (head_dim =
            hidden / num_heads, even).
        num_kv_heads: key/value heads, a divisor of ``num_heads`` (grouped-query attention).
        mlp_hidden: width of the SwiGLU MLP.
        dtype: parameter dtype.

    ``forward(x, cos, sin, past=None)``: x ``(batch, seq, hidden)``; cos, sin the RoPE tables
    ``(table_len, head_dim // 2)`` covering positions ``past_len .. past_len + seq - 1``;
    ``past`` the rotated keys and values of earlier positions, ``(k, v)`` each
    ``(batch, num_kv_heads, past_len, head_dim)``, or None. With a past, seq must be 1 (one
    decoding step); without, the attention is causal. Returns ``(out, (k, v))``: out like x,
    and the keys and values of all positions so far.
    """

    def __init__(self, hidden: int, num_heads: int, num_kv_heads: int, mlp_hidden: int, *,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        for name, value in (("hidden", hidden), ("num_heads", num_heads),
                            ("num_kv_heads", num_kv_heads), ("mlp_hidden", mlp_hidden)):
            _positive(name, value)
        if hidden % num_heads or (hidden // num_heads) % 2:
            raise ValueError(f"hidden ({hidden}) must be num_heads ({num_heads}) times an even "
                             "head_dim")
        if num_heads % num_kv_heads:
            raise ValueError(f"num_kv_heads ({num_kv_heads}) must divide num_heads ({num_heads})")
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_dim = hidden // num_heads
        self.attn_norm = nn.RMSNorm(hidden, dtype=dtype)
        self.qkv = nn.Linear(hidden, (num_heads + 2 * num_kv_heads) * self.head_dim, bias=False,
                             dtype=dtype)
        self.o = nn.Linear(hidden, hidden, bias=False, dtype=dtype)
        self.mlp_norm = nn.RMSNorm(hidden, dtype=dtype)
        self.gate_up = nn.Linear(hidden, 2 * mlp_hidden, bias=False, dtype=dtype)
        self.down = nn.Linear(mlp_hidden, hidden, bias=False, dtype=dtype)
        self.requires_grad_(False)  # inference only, in forward and in the timed parts

    def _heads(self, qkv: torch.Tensor, first: int, count: int) -> torch.Tensor:
        """Heads first .. first + count - 1 of the fused projection, a view
        ``(batch, count, seq, head_dim)``."""
        d = self.head_dim
        batch, seq, _ = qkv.shape
        return qkv[..., first * d:(first + count) * d].view(batch, seq, count, d).transpose(1, 2)

    def _rope(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, offset: int) -> None:
        """q and k rotated in place, in one call: their heads are adjacent in qkv."""
        qk = self._heads(qkv, 0, self.num_heads + self.num_kv_heads)
        apply_rope(qk, cos, sin, layout="half", offset=offset, out=qk)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        causal = q.shape[-2] > 1
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                             enable_gqa=self.num_kv_heads != self.num_heads)
        return out.transpose(1, 2).flatten(2)

    def _mlp(self, h: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(h).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)

    @torch.no_grad()
    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                past: tuple[torch.Tensor, torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        if x.ndim != 3:
            raise ValueError(f"x must be (batch, seq, hidden), got shape {tuple(x.shape)}")
        past_len = 0 if past is None else past[0].shape[-2]
        if past is not None and x.shape[1] != 1:
            raise ValueError(f"with a past, x must hold one position (a decoding step), got "
                             f"seq = {x.shape[1]}")
        qkv = self.qkv(self.attn_norm(x))
        self._rope(qkv, cos, sin, past_len)
        q = self._heads(qkv, 0, self.num_heads)
        k = self._heads(qkv, self.num_heads, self.num_kv_heads)
        v = self._heads(qkv, self.num_heads + self.num_kv_heads, self.num_kv_heads)
        if past is not None:
            k, v = torch.cat((past[0], k), dim=-2), torch.cat((past[1], v), dim=-2)
        h = x + self.o(self._attend(q, k, v))
        return h + self._mlp(self.mlp_norm(h)), (k, v)

    @torch.no_grad()
    def parts(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              past: tuple[torch.Tensor, torch.Tensor] | None = None
              ) -> dict[str, Callable[[], object]]:
        """A closure per part of ``forward(x, cos, sin, past)`` (arguments as there), each
        repeating only that part on the intermediates of one forward pass: the ``PARTS`` (with
        a past, also ``"KV cache append"`` after the RoPE), then ``"hf_rotate_half (q, k)"``
        and ``"whole layer"``. The RoPE closure rotates its own copy of the projection in
        place, again at every call."""
        past_len = 0 if past is None else past[0].shape[-2]
        h_norm = self.attn_norm(x)
        qkv = self.qkv(h_norm)
        scratch = qkv.clone()
        self._rope(qkv, cos, sin, past_len)
        q = self._heads(qkv, 0, self.num_heads)
        k = self._heads(qkv, self.num_heads, self.num_kv_heads)
        v = self._heads(qkv, self.num_heads + self.num_kv_heads, self.num_kv_heads)
        k_new, v_new = k, v
        if past is not None:
            k, v = torch.cat((past[0], k), dim=-2), torch.cat((past[1], v), dim=-2)
        attended = self._attend(q, k, v)
        h = x + self.o(attended)
        h_mlp = self.mlp_norm(h)
        rows = slice(past_len, past_len + x.shape[1])
        cos_wide = torch.cat((cos[rows], cos[rows]), -1).to(x.dtype)
        sin_wide = torch.cat((sin[rows], sin[rows]), -1).to(x.dtype)
        q_raw = self._heads(scratch, 0, self.num_heads)
        k_raw = self._heads(scratch, self.num_heads, self.num_kv_heads)
        parts: dict[str, Callable[[], object]] = {
            "norms": lambda: (self.attn_norm(x), self.mlp_norm(h)),
            "q, k, v projection": lambda: self.qkv(h_norm),
            "ropelib RoPE (q, k)": lambda: self._rope(scratch, cos, sin, past_len),
        }
        if past is not None:
            parts["KV cache append"] = lambda: (torch.cat((past[0], k_new), dim=-2),
                                                torch.cat((past[1], v_new), dim=-2))
        parts |= {
            "attention": lambda: self._attend(q, k, v),
            "output projection": lambda: self.o(attended),
            "MLP": lambda: self._mlp(h_mlp),
            "hf_rotate_half (q, k)": lambda: (hf_rotate_half(q_raw, cos_wide, sin_wide),
                                              hf_rotate_half(k_raw, cos_wide, sin_wide)),
            "whole layer": lambda: self(x, cos, sin, past),
        }
        return parts
