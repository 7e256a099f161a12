"""Attention masks: validation, causal masks and rows that may attend to nothing.

Conventions follow ``torch.nn.functional.scaled_dot_product_attention``: a boolean mask is
True where a query may attend; a float mask is added to the scores (0 to keep, -inf to
block). Masks broadcast to ``(batch, heads, q_len, k_len)``.

A query row that may attend to no key has no softmax (0/0). ropelib returns zeros for such a
row (and zero attention weights), never NaN, so one fully padded row cannot poison a batch
or its gradients.
"""

from __future__ import annotations

import torch

from ._checks import broadcasts, tracing

NAN_MASK_HELP = (
    "attn_mask contains NaN. The recipe (~pad_mask)[:, None, None, :] * float('-inf') "
    "computes 0 * -inf = NaN at every kept position. Pass the boolean mask "
    "pad_mask[:, None, None, :] (True = may attend) instead, or build a float mask with "
    "torch.zeros(pad_mask.shape).masked_fill(~pad_mask, float('-inf'))[:, None, None, :]."
)


def causal_mask(q_len: int, k_len: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Boolean ``(q_len, k_len)`` mask, lower-right aligned: query i sees keys j <= i + k_len - q_len.

    With q_len == k_len this is the usual lower triangle; with fewer queries than keys (the
    queries are the last tokens, as in decoding with a KV cache) the last query sees every key.
    """
    i = torch.arange(q_len, device=device)[:, None]
    j = torch.arange(k_len, device=device)[None, :]
    return j <= i + (k_len - q_len)


def prepare_mask(attn_mask: torch.Tensor | None, shape: tuple[int, int, int, int],
                 is_causal: bool, dtype: torch.dtype, device: torch.device
                 ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Validate and combine a user mask with causality.

    Args:
        attn_mask: None, boolean or float, broadcastable to ``shape``.
        shape: ``(batch, heads, q_len, k_len)``.
        is_causal: add the lower-right aligned causal mask.
        dtype: dtype of the scores (float masks are cast to it).

    Returns:
        ``(mask, empty_rows)``: ``mask`` (bool or float, broadcastable to ``shape``, with rows
        that allow nothing opened up so that softmax stays finite) or None; ``empty_rows``
        (bool, broadcastable to ``(batch, heads, q_len, 1)``) marking rows whose output must be
        zero, or None when there are none. Under a compiler or tracer, where the mask's
        values are unknown, and on a GPU, whose values are not read back, ``empty_rows`` is
        always a tensor (all False when no row is empty: the same result) and the checks of
        a float mask's values are assertions on the device.
    """
    q_len, k_len = shape[-2:]
    if attn_mask is not None:
        if not isinstance(attn_mask, torch.Tensor):
            raise TypeError(f"attn_mask must be a torch.Tensor, got {type(attn_mask).__name__}")
        if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
            raise TypeError(f"attn_mask must be boolean (True = may attend) or float (added to "
                            f"the scores), got dtype {attn_mask.dtype}")
        if attn_mask.ndim > 4 or not broadcasts(attn_mask.shape, shape):
            raise ValueError(f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to "
                             f"(batch, heads, q_len, k_len) = {shape}")
        if attn_mask.device != device:
            raise ValueError(f"attn_mask is on {attn_mask.device} but the inputs are on {device}")
        # 4-D from here on: scaled_dot_product_attention rejects a 1-D (k_len,) mask
        attn_mask = attn_mask.reshape((1,) * (4 - attn_mask.ndim) + tuple(attn_mask.shape))
        if attn_mask.is_floating_point():
            _check_float_mask(attn_mask)
            attn_mask = attn_mask.to(dtype)
    if is_causal:
        causal = causal_mask(q_len, k_len, device)
        if attn_mask is None:
            attn_mask = causal
        elif attn_mask.dtype == torch.bool:
            attn_mask = attn_mask & causal
        else:
            attn_mask = attn_mask.masked_fill(~causal, float("-inf"))
    if attn_mask is None:
        return None, None
    if attn_mask.dtype == torch.bool:
        empty = ~attn_mask.any(dim=-1, keepdim=True)
        if not _on_device(attn_mask) and not empty.any():
            return attn_mask, None
        return attn_mask | empty, empty
    empty = torch.isneginf(attn_mask).all(dim=-1, keepdim=True)
    if not _on_device(attn_mask) and not empty.any():
        return attn_mask, None
    return attn_mask.masked_fill(empty, 0.0), empty


def _on_device(t: torch.Tensor) -> bool:
    """Whether t's values must not be read on the host: under a compiler or tracer (they
    are unknown), or on a GPU (reading them would wait for it, and a CUDA graph cannot
    hold the wait). Checks of values become assertions on the device there."""
    return tracing() or t.device.type != "cpu"


def _check_float_mask(attn_mask: torch.Tensor) -> None:
    """No NaN (the -inf recipe's 0 * -inf) and no +inf in a float mask: raised here, an
    assertion on the device on a GPU and in the graph under a compiler or tracer."""
    posinf_help = ("attn_mask contains +inf: a score plus inf is inf, and the softmax of a "
                   "row holding inf is NaN. Use 0 to keep a key and -inf to mask it")
    if _on_device(attn_mask):  # a device assert takes a short message (under 255 bytes)
        torch._assert_async(~torch.isnan(attn_mask).any(), "attn_mask contains NaN (0 * -inf "
                            "of the pad_mask * -inf recipe): pass the boolean pad_mask "
                            "(ropelib.masks.NAN_MASK_HELP)")
        torch._assert_async(~torch.isposinf(attn_mask).any(),
                            "attn_mask contains +inf: use 0 to keep a key, -inf to mask it")
        return
    if torch.isnan(attn_mask).any():
        raise ValueError(NAN_MASK_HELP)
    if torch.isposinf(attn_mask).any():
        raise ValueError(posinf_help)
