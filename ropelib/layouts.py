"""Permutations between the two pair layouts.

``interleaved`` pairs channels (2i, 2i+1); ``half`` pairs (i, i + d/2). Both rotate pair i by
m * theta_i, so they are the same operation up to the channel permutation

    half[..., j] = interleaved[..., perm[j]],  perm = [0, 2, 4, ..., d-2, 1, 3, ..., d-1].

Applied to the output rows of the q and k projections (per head) it converts a model's
weights exactly: that is how Meta's Llama checkpoints (interleaved) become Hugging Face's
(half). A projection with a bias (Qwen's q and k) needs the same reordering of its bias,
since ``P (W x + b) = (P W) x + P b``. Channels past ``rotary_dim`` are not rotated and keep
their place.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ._checks import LAYOUTS, check_count, check_even_positive, check_layout


def half_from_interleaved_index(dim: int, rotary_dim: int | None = None) -> torch.Tensor:
    """Index ``perm`` with ``x_half = x_interleaved[..., perm]``, shape ``(dim,)``."""
    rd = _rotary(dim, rotary_dim)
    return torch.cat([torch.arange(0, rd, 2), torch.arange(1, rd, 2), torch.arange(rd, dim)])


def interleaved_from_half_index(dim: int, rotary_dim: int | None = None) -> torch.Tensor:
    """Index ``perm`` with ``x_interleaved = x_half[..., perm]``, shape ``(dim,)``."""
    return torch.argsort(half_from_interleaved_index(dim, rotary_dim))


def _rotary(dim: int, rotary_dim: int | None) -> int:
    dim = check_even_positive("dim", dim)
    rd = dim if rotary_dim is None else check_even_positive("rotary_dim", rotary_dim)
    if rd > dim:
        raise ValueError(f"rotary_dim must be <= head_dim={dim}, got {rd}")
    return rd


def _index(src: str, dst: str, dim: int, rotary_dim: int | None) -> torch.Tensor:
    check_layout(src)
    check_layout(dst)
    _rotary(dim, rotary_dim)
    if src == dst:
        return torch.arange(dim)
    if dst == "half":
        return half_from_interleaved_index(dim, rotary_dim)
    return interleaved_from_half_index(dim, rotary_dim)


def convert_activations(x: torch.Tensor, *, src: str, dst: str,
                        rotary_dim: int | None = None) -> torch.Tensor:
    """Reorder the last dim of ``x`` ``(..., head_dim)`` from layout ``src`` to ``dst``."""
    return x[..., _index(src, dst, x.shape[-1], rotary_dim).to(x.device)]


def convert_qk_weight(weight: torch.Tensor, num_heads: int, *, src: str, dst: str,
                      rotary_dim: int | None = None) -> torch.Tensor:
    """Reorder the output rows of a q or k projection from layout ``src`` to ``dst``.

    Args:
        weight: ``(num_heads * head_dim, in_features)`` weight or ``(num_heads * head_dim,)``
            bias, as stored by ``nn.Linear``.
        num_heads: heads of this projection (the number of KV heads for k under GQA/MQA).
        src, dst: ``"interleaved"`` or ``"half"``.
        rotary_dim: rotated channels per head, default head_dim.

    Returns:
        The converted tensor, same shape.
    """
    if not isinstance(weight, torch.Tensor) or weight.ndim not in (1, 2):
        seen = tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise ValueError(f"weight must be a (out_features, in_features) weight or an "
                         f"(out_features,) bias, got {seen}")
    num_heads = check_count("num_heads", num_heads)
    rows = weight.shape[0]
    if rows % num_heads:
        raise ValueError(f"weight has {rows} output rows, not divisible by num_heads={num_heads}")
    head_dim = rows // num_heads
    index = _index(src, dst, head_dim, rotary_dim).to(weight.device)
    per_head = weight.reshape(num_heads, head_dim, *weight.shape[1:])
    return per_head[:, index].reshape(weight.shape)


def convert_meta_attention_state_dict(state_dict: dict, num_heads: int,
                                      num_kv_heads: int | None = None, *,
                                      layout: str = "half") -> dict:
    """Map a Meta Llama attention state dict (``wq``, ``wk``, ``wv``, ``wo``) to ropelib's names.

    Meta's checkpoints store q and k rows in the interleaved layout. For ``layout="half"``
    (Hugging Face's) the rows of ``wq`` and ``wk`` are permuted per head, exactly as
    Hugging Face's conversion script does; for ``layout="interleaved"`` they are copied as
    they are. Keys may carry a ``.weight`` suffix or not.

    Returns:
        ``{"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"}`` for
        ``StandardAttentionWithRoPE(..., bias=False, layout=layout)``.
    """
    check_layout(layout)
    num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
    out = {}
    for meta, ours in (("wq", "q_proj"), ("wk", "k_proj"), ("wv", "v_proj"), ("wo", "o_proj")):
        key = meta if meta in state_dict else f"{meta}.weight"
        if key not in state_dict:
            raise ValueError(f"state_dict has no {meta!r} (or {meta + '.weight'!r}); "
                             f"keys seen: {sorted(state_dict)}")
        w = state_dict[key]
        if meta in ("wq", "wk"):
            heads = num_heads if meta == "wq" else num_kv_heads
            w = convert_qk_weight(w, heads, src="interleaved", dst=layout)
        out[f"{ours}.weight"] = w
    return out


QK_ENTRIES = ("q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias")
"""State-dict entries that ``convert_attention_state_dict`` reorders (by their key's ending)."""


def convert_attention_state_dict(state_dict: Mapping[str, torch.Tensor], num_heads: int,
                                 num_kv_heads: int | None = None, *, src: str, dst: str,
                                 rotary_dim: int | None = None) -> dict[str, torch.Tensor]:
    """Convert the q and k projections of an attention state dict from layout ``src`` to ``dst``.

    Every entry whose key is or ends in ``q_proj.weight``, ``q_proj.bias`` (per query head),
    ``k_proj.weight`` or ``k_proj.bias`` (per key/value head) is reordered with
    ``convert_qk_weight``: biases too, which a conversion of the weights alone would leave in
    the old order (Qwen's q and k projections have biases). Every other entry (values, output
    projection, norms, other layers' modules) is passed through as the same tensor. The keys
    may carry a prefix, so one call converts a single layer (Hugging Face's
    ``LlamaAttention`` or ``Qwen2Attention``, ropelib's ``StandardAttentionWithRoPE``) or a
    whole model whose layers share the head counts.

    Args:
        state_dict: ``{name: tensor}``, q/k weights ``(heads * head_dim, in_features)`` and
            biases ``(heads * head_dim,)``.
        num_heads: query heads.
        num_kv_heads: key/value heads (GQA/MQA); default ``num_heads``.
        src, dst: ``"interleaved"`` or ``"half"``.
        rotary_dim: rotated channels per head, default head_dim.

    Returns:
        A new dict with the same keys.
    """
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"state_dict must be a mapping of names to tensors, got "
                        f"{type(state_dict).__name__}")
    num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
    out, converted = {}, 0
    for name, tensor in state_dict.items():
        entry = next((e for e in QK_ENTRIES if name == e or name.endswith("." + e)), None)
        if entry is None:
            out[name] = tensor
            continue
        heads = num_heads if entry.startswith("q") else num_kv_heads
        out[name] = convert_qk_weight(tensor, heads, src=src, dst=dst, rotary_dim=rotary_dim)
        converted += 1
    if not converted:
        raise ValueError(f"state_dict has no entry ending in one of {QK_ENTRIES}; keys seen: "
                         f"{sorted(state_dict)[:8]}{' ...' if len(state_dict) > 8 else ''}")
    return out


__all__ = ["LAYOUTS", "QK_ENTRIES", "convert_activations", "convert_attention_state_dict",
           "convert_meta_attention_state_dict", "convert_qk_weight",
           "half_from_interleaved_index", "interleaved_from_half_index"]
