"""ropelib: Rotary Position Embedding (RoPE) for PyTorch.

Core API (needs only torch and numpy)::

    from ropelib import generate_rope_embeddings, apply_rope, StandardAttentionWithRoPE

Plotting and sliders live in ``ropelib.viz`` (matplotlib, ipywidgets).
"""

from .attention import KVCache, StandardAttentionWithRoPE
from .kernels import backend_status, native_status
from .layouts import (
    convert_activations,
    convert_attention_state_dict,
    convert_meta_attention_state_dict,
    convert_qk_weight,
)
from .linear_attention import linear_attention
from .masks import causal_mask
from .multiaxis import RoPEMixed, axis_frequencies, axis_tables, mrope_positions
from .positions import (
    positions_after_cache,
    positions_for_context_parallel,
    positions_from_cu_seqlens,
    positions_from_padding_mask,
)
from .rotation import apply_rope, apply_rope_qk, apply_rope_qk_to_cache
from .scaling import scaled_frequencies
from .tables import RotaryEmbedding, generate_rope_embeddings, rope_frequencies

__version__ = "0.1.0"

__all__ = [
    "KVCache",
    "RoPEMixed",
    "RotaryEmbedding",
    "StandardAttentionWithRoPE",
    "apply_rope",
    "apply_rope_qk",
    "apply_rope_qk_to_cache",
    "axis_frequencies",
    "axis_tables",
    "backend_status",
    "causal_mask",
    "convert_activations",
    "convert_attention_state_dict",
    "convert_meta_attention_state_dict",
    "convert_qk_weight",
    "generate_rope_embeddings",
    "linear_attention",
    "mrope_positions",
    "native_status",
    "positions_after_cache",
    "positions_for_context_parallel",
    "positions_from_cu_seqlens",
    "positions_from_padding_mask",
    "rope_frequencies",
    "scaled_frequencies",
]
