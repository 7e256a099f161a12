"""ropelib in a Hugging Face transformers model: drop-in ``apply_rotary_pos_emb`` and
``apply_rotary_pos_emb_vision``, and the rope parameters of a transformers config as ropelib
reads them.

transformers' Llama-family attention layers (Llama, Mistral, Qwen2, Qwen2-VL's and
Qwen3-VL's text models, Gemma, Phi-3, GPT-NeoX, ...) rotate q and k with a module-level
function, ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)``, computing
``q * cos + rotate_half(q) * sin``: the half layout (pairs (i, i + d/2)), with tables
``cat(freqs, freqs)`` (each angle twice) of shape ``(batch, seq, rotary_dim)``, already
multiplied by the rope type's attention factor. ``apply_rotary_pos_emb`` here takes the same
arguments as they come and returns the same two tensors, rotated by ``apply_rope_qk``: one
pass over q and k (one launch for both on a GPU), float32 arithmetic, one rounding. Swap it
into a model's module (see the README)::

    import transformers.models.llama.modeling_llama as llama
    llama.apply_rotary_pos_emb = ropelib.hf.apply_rotary_pos_emb

The function is for the ``rotate_half`` family only: GLM and Cohere rotate interleaved pairs
with tables of another arrangement, and their own function must stay.
``apply_rotary_pos_emb_vision(q, k, cos, sin)`` is the same for the vision towers of Qwen2-VL
and Qwen2.5-VL, whose q and k are ``(seq, heads, head_dim)`` with a table row per patch::

    import transformers.models.qwen2_vl.modeling_qwen2_vl as qwen2_vl
    qwen2_vl.apply_rotary_pos_emb_vision = ropelib.hf.apply_rotary_pos_emb_vision

``rope_parameters(config)`` gives a config's ``rope_parameters`` for ``scaling=`` of
``RotaryEmbedding`` and ``StandardAttentionWithRoPE``, with what transformers' model code
adds to them: a Qwen2-VL, Qwen2.5-VL or Qwen3-VL config without ``mrope_section`` (as
``Qwen2VLConfig()`` is) gets the sections transformers falls back to, so it is read as the
M-RoPE the model runs, not as 1D RoPE.

Nothing here imports transformers.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ._checks import check_float_tensor, tracing
from .rotation import apply_rope_qk

# model_type of a text config: (the mrope_section transformers' rotary embedding falls back
# to when the config has none, whether it deals the pairs out in turn: Qwen3-VL)
MROPE_DEFAULTS = {
    "qwen2_vl_text": ((16, 24, 24), False),
    "qwen2_5_vl_text": ((16, 24, 24), False),
    "qwen3_vl_text": ((24, 20, 20), True),
    "qwen3_vl_moe_text": ((24, 20, 20), True),
}


def apply_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                         sin: torch.Tensor, unsqueeze_dim: int = 1
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' ``apply_rotary_pos_emb``, computed by ropelib.

    Args:
        q: ``(batch, heads_q, seq, head_dim)``, or ``(batch, seq, heads_q, head_dim)`` with
            ``unsqueeze_dim=2``.
        k: as q, with its own number of heads (GQA, MQA).
        cos, sin: transformers' tables ``(batch, seq, rotary_dim)`` (batch may be 1), as its
            rotary embedding returns them: ``cat(freqs, freqs)``, each half the same, any
            float dtype. ``rotary_dim`` (even, <= head_dim) is the rotated part of each head,
            the first channels (GPT-NeoX, Phi-3); the rest pass through unchanged.
        unsqueeze_dim: where the heads dim of q and k is, 1 or 2 (as in transformers, where
            the tables are unsqueezed there).

    Returns:
        ``(q_embed, k_embed)``, q's and k's shape and dtype. With ``unsqueeze_dim=2`` they
        are ``(batch, seq, heads, head_dim)`` views of contiguous ``(batch, heads, seq,
        head_dim)`` tensors (``.reshape`` works on them, ``.view`` across the heads does not).
        Where it differs from transformers, on purpose: bfloat16 and float16 results are
        computed in float32 and rounded once (transformers rounds after each operation);
        bfloat16 q and k with float32 tables give bfloat16 (transformers promotes them to
        float32); q and k of different dtypes are refused.

    Raises:
        ValueError: tables of another shape, an odd or too wide ``rotary_dim``, or tables
            whose two halves differ (not transformers' ``cat(freqs, freqs)``: on a GPU this
            is a device-side assertion, nothing read back).
    """
    for name, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        check_float_tensor(name, t)
    if type(unsqueeze_dim) is not int or unsqueeze_dim not in (1, 2, -3, -2):
        raise ValueError(f"unsqueeze_dim must be 1 (q, k of shape (batch, heads, seq, "
                         f"head_dim)) or 2 ((batch, seq, heads, head_dim)), got "
                         f"{unsqueeze_dim!r}")
    if q.ndim != 4 or k.ndim != 4:
        raise ValueError(f"q and k must have 4 dims, (batch, heads, seq, head_dim) or (batch, "
                         f"seq, heads, head_dim) with unsqueeze_dim=2; got {tuple(q.shape)} "
                         f"and {tuple(k.shape)}")
    heads_first = unsqueeze_dim % 4 == 1
    seq_dim = 2 if heads_first else 1
    head_dim, seq = q.shape[-1], q.shape[seq_dim]
    if cos.ndim != 3 or cos.shape != sin.shape or cos.shape[1] != seq or (
            cos.shape[0] not in (1, q.shape[0])):
        raise ValueError(f"cos and sin must be transformers' tables (batch, seq, rotary_dim) "
                         f"with batch {q.shape[0]} or 1 and seq {seq}, one shape for both, got "
                         f"{tuple(cos.shape)} and {tuple(sin.shape)}")
    rotary_dim = cos.shape[-1]
    if rotary_dim == 0 or rotary_dim % 2 or rotary_dim > head_dim:
        raise ValueError(f"cos/sin are {rotary_dim} wide: the rotated channels of a head of "
                         f"{head_dim} must be a positive even number <= {head_dim}")
    half = rotary_dim // 2
    _check_repeated(cos, half, "cos")
    _check_repeated(sin, half, "sin")
    rows = cos[..., :half].unsqueeze(1), sin[..., :half].unsqueeze(1)  # (batch, 1, seq, half)
    if heads_first:
        return apply_rope_qk(q, k, *rows, layout="half", rotary_dim=rotary_dim)
    q_embed, k_embed = apply_rope_qk(q.transpose(1, 2), k.transpose(1, 2), *rows,
                                     layout="half", rotary_dim=rotary_dim)
    return q_embed.transpose(1, 2), k_embed.transpose(1, 2)


def apply_rotary_pos_emb_vision(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                                sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' ``apply_rotary_pos_emb_vision`` (the vision towers of Qwen2-VL,
    Qwen2.5-VL and their kin), computed by ropelib.

    Args:
        q: ``(seq, heads, head_dim)``, a patch per row (leading dims allowed:
            ``(..., seq, heads, head_dim)``); any float dtype, strided views included.
        k: as q, with its own number of heads.
        cos, sin: the tower's tables ``(seq, head_dim)`` (``(..., seq, head_dim)``, as q's
            leading dims): ``cat(freqs, freqs)``, each half the same, rotating the whole
            head.

    Returns:
        ``(q_embed, k_embed)``, q's and k's shape and dtype. Like transformers, the rotation
        is computed in float32 and rounded once for bfloat16 and float16 (float32 results
        equal transformers' bit for bit on the CPU); unlike it, float64 q and k are rotated
        in float64 (transformers rounds them to float32), and q and k must have one dtype.

    Raises:
        ValueError: q or k not ``(..., seq, heads, head_dim)``, tables of another shape, or
            tables whose two halves differ.
    """
    for name, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        check_float_tensor(name, t)
    if q.ndim < 3 or k.ndim != q.ndim or k.shape[:-2] != q.shape[:-2] or (
            k.shape[-1] != q.shape[-1]):
        raise ValueError(f"q and k must be (..., seq, heads, head_dim) with the same seq and "
                         f"head_dim, got {tuple(q.shape)} and {tuple(k.shape)}")
    expected = (*q.shape[:-2], q.shape[-1])
    if cos.shape != sin.shape or cos.shape != expected:
        raise ValueError(f"cos and sin must be the vision tables (..., seq, head_dim) = "
                         f"{expected}, one shape for both, got {tuple(cos.shape)} and "
                         f"{tuple(sin.shape)}")
    half = q.shape[-1] // 2
    _check_repeated(cos, half, "cos")
    _check_repeated(sin, half, "sin")
    # rows (..., seq, 1, half): one per patch, the same for every head
    return apply_rope_qk(q, k, cos[..., None, :half], sin[..., None, :half], layout="half")


def _check_repeated(table: torch.Tensor, half: int, name: str) -> None:
    """Refuses a table whose halves differ: ropelib reads the first half only, so any other
    table would rotate by angles it was not given."""
    first, second = table[..., :half], table[..., half:]
    if tracing() or table.device.type != "cpu":
        torch._assert_async((first == second).all(), f"{name} must be transformers' "
                            "cat(freqs, freqs): its two halves equal")
    elif not torch.equal(first, second):
        raise ValueError(f"{name} must be transformers' table cat(freqs, freqs), its two halves "
                         f"equal (ropelib reads the first); its halves differ by up to "
                         f"{(first - second).abs().max().item():.3g}. Pass rows of the "
                         "rotated pairs to ropelib.apply_rope_qk instead")


def rope_parameters(config: object, layer_type: str | None = None) -> dict:
    """A transformers config's ``rope_parameters`` (of its text config, for a
    vision-language model), ready for ``scaling=`` of ``RotaryEmbedding`` and
    ``StandardAttentionWithRoPE``, with the M-RoPE sections transformers' model code falls
    back to when a Qwen2-VL / Qwen2.5-VL / Qwen3-VL config has none (``MROPE_DEFAULTS``), and
    Qwen3-VL's interleaved order (``mrope_interleaved``), which transformers takes from the
    model class.

    Args:
        config: a transformers ``PretrainedConfig`` (e.g. ``Qwen2VLConfig()``), or its text
            config.
        layer_type: for configs with one rope dict per layer type (Gemma 3), the one to
            return (e.g. ``"full_attention"``); default: the whole dict.

    Returns:
        A new dict; the config is not changed.
    """
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    params = getattr(text, "rope_parameters", None)
    if not isinstance(params, Mapping):
        raise ValueError(f"config must be a transformers config with rope_parameters (a dict), "
                         f"got {type(config).__name__} whose rope_parameters are {params!r}")
    params = dict(params)
    if layer_type is not None:
        if not isinstance(params.get(layer_type), Mapping):
            raise ValueError(f"layer_type={layer_type!r} is not one of the config's layer types "
                             f"{sorted(k for k, v in params.items() if isinstance(v, Mapping))}")
        params = dict(params[layer_type])
    default = MROPE_DEFAULTS.get(getattr(text, "model_type", None))
    if default is not None:
        sections, interleaved = default
        if params.get("mrope_section") is None:
            params["mrope_section"] = list(sections)
        if interleaved:  # transformers interleaves by the model class, whatever the config
            params.setdefault("mrope_interleaved", True)
    return params
