"""Every documented error: the exception type and a message naming the argument and values."""

from __future__ import annotations

import itertools

import pytest
import torch
from reference import angles, attention_module_reference, repeat_last_row, thetas

from ropelib import (
    KVCache,
    RotaryEmbedding,
    StandardAttentionWithRoPE,
    apply_rope,
    convert_activations,
    convert_qk_weight,
    generate_rope_embeddings,
    linear_attention,
    rope_frequencies,
    scaled_frequencies,
)
from ropelib._checks import broadcasts

F64 = torch.float64


def tables(n: int = 5, dim: int = 8):
    return generate_rope_embeddings(n, dim)


def x_of(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


def attn(**kw):
    return StandardAttentionWithRoPE(16, 2, **kw)


def rotate_into_own_transpose(x):
    """out= a view of x itself with other strides (same shape, same memory)."""
    return apply_rope(x, *tables(4, 4), out=x.transpose(-2, -1))


def overlapping_table_out(name: str):
    """out= a view into the cos or sin table that x is rotated with."""
    cos, sin = tables(8, 8)
    table = cos if name == "cos" else sin
    return apply_rope(x_of(4, 8), cos, sin, out=table.view(-1)[:32].view(4, 8))


def yarn(**params):
    return {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, **params}


def longrope(**params):
    return {"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4,
            "original_max_position_embeddings": 16, "factor": 4.0, **params}


PER_LAYER = {"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
             "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                "rope_theta": 1e6}}

X = torch.randn(2, 5, 16)  # (B, N, D) for attn()

CASES = {
    # ---- odd head_dim or rotary_dim
    "odd head_dim in apply_rope": (
        lambda: apply_rope(x_of(2, 5, 7), *tables(5, 8)), ValueError,
        r"head_dim \(x.shape\[-1\]\) must be a positive even number.*got 7"),
    "odd head_dim in tables": (
        lambda: generate_rope_embeddings(5, 7), ValueError, r"head_dim must be a positive even.*got 7"),
    "odd dim in rope_frequencies": (
        lambda: rope_frequencies(9), ValueError, r"dim must be a positive even.*got 9"),
    "odd dim in RotaryEmbedding": (
        lambda: RotaryEmbedding(5), ValueError, r"dim must be a positive even.*got 5"),
    "odd head_dim in attention": (
        lambda: StandardAttentionWithRoPE(12, 4), ValueError,
        r"head_dim = embed_dim / num_heads = 12 / 4 = 3 must be even"),
    "odd rotary_dim in apply_rope": (
        lambda: apply_rope(x_of(2, 5, 8), *tables(5, 8), rotary_dim=3), ValueError,
        r"rotary_dim must be a positive even number <= head_dim=8, got 3"),
    "rotary_dim above head_dim": (
        lambda: apply_rope(x_of(2, 5, 8), *tables(5, 8), rotary_dim=10), ValueError,
        r"rotary_dim must be a positive even number <= head_dim=8, got 10"),
    "odd rotary_dim in attention": (
        lambda: attn(rotary_dim=5), ValueError,
        r"rotary_dim must be a positive even int <= head_dim=8, got 5"),
    "odd rotary_dim in layouts": (
        lambda: convert_activations(x_of(3, 8), src="interleaved", dst="half", rotary_dim=3),
        ValueError, r"rotary_dim must be a positive even number.*got 3"),
    # ---- head counts
    "embed_dim not divisible by num_heads": (
        lambda: StandardAttentionWithRoPE(10, 4), ValueError,
        r"embed_dim=10 is not divisible by num_heads=4"),
    "num_heads not divisible by num_kv_heads": (
        lambda: StandardAttentionWithRoPE(32, 4, num_kv_heads=3), ValueError,
        r"num_heads=4 is not divisible by num_kv_heads=3"),
    "weight rows not divisible by heads": (
        lambda: convert_qk_weight(torch.randn(10, 4), 4, src="interleaved", dst="half"), ValueError,
        r"weight has 10 output rows, not divisible by num_heads=4"),
    # ---- linear attention shapes
    "q/k head dims differ in linear_attention": (
        lambda: linear_attention(x_of(1, 2, 5, 8), x_of(1, 2, 5, 6), x_of(1, 2, 5, 4)), ValueError,
        r"q and k must have the same shape, got \(1, 2, 5, 8\) and \(1, 2, 5, 6\)"),
    "v length differs in linear_attention": (
        lambda: linear_attention(x_of(1, 2, 5, 8), x_of(1, 2, 5, 8), x_of(1, 2, 4, 3)), ValueError,
        r"v must have shape \(1, 2, 5\) \+ \(v_dim,\), got \(1, 2, 4, 3\)"),
    "unknown feature map": (
        lambda: linear_attention(x_of(5, 4), x_of(5, 4), x_of(5, 4), feature_map="relu"), ValueError,
        r"feature_map must be one of \['elu\+1'\].*got 'relu'"),
    "bad chunk size": (
        lambda: linear_attention(x_of(5, 4), x_of(5, 4), x_of(5, 4), causal=True, chunk_size=0),
        ValueError, r"chunk_size must be a positive int, got 0"),
    # ---- cos/sin tables
    "cos/sin last dim wrong": (
        lambda: apply_rope(x_of(2, 5, 8), torch.zeros(5, 3), torch.zeros(5, 3)), ValueError,
        r"cos/sin must have shape \(table_len, 4\).*got \(5, 3\)"),
    "cos/sin for a partial rotation without rotary_dim": (
        lambda: apply_rope(x_of(2, 5, 8), *tables(5, 4)), ValueError,
        r"got \(5, 2\); for a partial rotation pass rotary_dim=4"),
    "cos/sin 1-D": (
        lambda: apply_rope(x_of(2, 5, 8), torch.zeros(4), torch.zeros(4)), ValueError,
        r"cos/sin must have shape \(table_len, 4\).*got \(4,\)"),
    "cos and sin shapes differ": (
        lambda: apply_rope(x_of(2, 5, 8), torch.zeros(6, 4), torch.zeros(5, 4)), ValueError,
        r"cos and sin must have the same shape, got \(6, 4\) and \(5, 4\)"),
    "cos and sin on different devices": (
        lambda: apply_rope(x_of(2, 5, 8), torch.zeros(5, 4), torch.zeros(5, 4, device="meta")),
        ValueError, r"cos is on cpu but sin is on meta"),
    "cos/sin on another device than x": (
        lambda: apply_rope(x_of(2, 5, 8), torch.zeros(5, 4, device="meta"),
                           torch.zeros(5, 4, device="meta")),
        ValueError, r"cos/sin are on meta but x is on cpu"),
    "gathered cos/sin that do not broadcast": (
        lambda: apply_rope(x_of(2, 3, 5, 8), torch.zeros(1, 1, 4, 4), torch.zeros(1, 1, 4, 4)),
        ValueError, r"gathered cos/sin must have 4 dims and broadcast to \(2, 3, 5, 4\), got \(1, 1, 4, 4\)"),
    "gathered cos/sin with positions": (
        lambda: apply_rope(x_of(1, 5, 8), torch.zeros(1, 5, 4), torch.zeros(1, 5, 4),
                           positions=torch.arange(5)),
        ValueError, r"positions/offset select rows of a 2-D table"),
    "rope_embeddings not a pair": (
        lambda: attn()(X, X, X, rope_embeddings=tables(5, 8)[0]), ValueError,
        r"rope_embeddings must be a \(cos, sin\) pair"),
    # ---- positions beyond the table, and the short table
    "positions beyond the table": (
        lambda: apply_rope(x_of(2, 3, 8), *tables(5, 8), positions=torch.tensor([0, 5, 1])),
        ValueError, r"positions go up to 5 but the cos/sin table has only 5 rows"),
    "per-batch positions beyond the table": (
        lambda: apply_rope(x_of(2, 1, 2, 8), *tables(5, 8), positions=torch.tensor([[0, 1], [3, 9]])),
        ValueError, r"positions go up to 9 but the cos/sin table has only 5 rows"),
    "negative positions": (
        lambda: apply_rope(x_of(2, 2, 8), *tables(5, 8), positions=torch.tensor([-1, 0])),
        ValueError, r"positions must be >= 0, got min -1"),
    "positions of the wrong length": (
        lambda: apply_rope(x_of(2, 3, 8), *tables(5, 8), positions=torch.tensor([0, 1])),
        ValueError, r"positions must have shape \(seq_len,\) = \(3,\).*got \(2,\)"),
    "positions batch mismatch": (
        lambda: apply_rope(x_of(2, 1, 2, 8), *tables(5, 8), positions=torch.zeros(3, 2, dtype=torch.long)),
        ValueError, r"positions must have shape.*\(batch, seq_len\) = \(2, 2\), got \(3, 2\)"),
    "positions and offset together": (
        lambda: apply_rope(x_of(2, 2, 8), *tables(5, 8), positions=torch.tensor([0, 1]), offset=1),
        ValueError, r"pass either positions or offset, not both \(offset=1\)"),
    "offset past the table": (
        lambda: apply_rope(x_of(2, 4, 8), *tables(5, 8), offset=3), ValueError,
        r"cos has 5 rows but positions 3..6 need 7 \(seq_len=4, offset=3\)"),
    "table shorter than the sequence": (
        lambda: apply_rope(x_of(2, 9, 8), *tables(5, 8)), ValueError,
        r"cos has 5 rows but positions 0..8 need 9 \(seq_len=9.*generate_rope_embeddings\(9, head_dim\)"),
    "attention with a table shorter than the sequence": (
        lambda: attn()(X, X, X, rope_embeddings=tables(3, 8)), ValueError,
        r"cos has 3 rows but positions 0..4 need 5 \(seq_len=5"),
    "negative offset": (
        lambda: apply_rope(x_of(2, 2, 8), *tables(5, 8), offset=-1), ValueError,
        r"offset must be a non-negative int, got -1"),
    "RotaryEmbedding negative positions": (
        lambda: RotaryEmbedding(8)(positions=torch.tensor([3, -2])), ValueError,
        r"positions must be >= 0, got min -2"),
    "RotaryEmbedding neither seq_len nor positions": (
        lambda: RotaryEmbedding(8)(), ValueError, r"pass exactly one of seq_len or positions"),
    # ---- masks
    "mask that does not broadcast": (
        lambda: attn()(X, X, X, attn_mask=torch.ones(3, 3, dtype=torch.bool)), ValueError,
        r"attn_mask of shape \(3, 3\) does not broadcast to \(batch, heads, q_len, k_len\) = \(2, 2, 5, 5\)"),
    "mask with too many dims": (
        lambda: attn()(X, X, X, attn_mask=torch.ones(1, 1, 1, 5, 5, dtype=torch.bool), return_attn=True),
        ValueError, r"attn_mask of shape \(1, 1, 1, 5, 5\) does not broadcast"),
    "integer mask": (
        lambda: attn()(X, X, X, attn_mask=torch.ones(5, 5, dtype=torch.long)), TypeError,
        r"attn_mask must be boolean \(True = may attend\) or float.*got dtype torch.int64"),
    # ---- integers where floats are needed
    "integer x": (
        lambda: apply_rope(torch.ones(2, 5, 8, dtype=torch.long), *tables(5, 8)), TypeError,
        r"x must be a floating-point tensor, got dtype torch.int64; convert it first, e.g. x.float\(\)"),
    "integer cos": (
        lambda: apply_rope(x_of(2, 5, 8), torch.ones(5, 4, dtype=torch.int32), tables(5, 8)[1]),
        TypeError, r"cos must be a floating-point tensor, got dtype torch.int32"),
    "integer query": (
        lambda: attn()(X.long(), X, X), TypeError,
        r"query must be a floating-point tensor, got dtype torch.int64"),
    "integer value in linear attention": (
        lambda: linear_attention(x_of(5, 4), x_of(5, 4), torch.ones(5, 4, dtype=torch.int64)), TypeError,
        r"v must be a floating-point tensor, got dtype torch.int64"),
    "float positions": (
        lambda: apply_rope(x_of(2, 2, 8), *tables(5, 8), positions=torch.tensor([0.0, 1.0])),
        TypeError, r"positions must hold integer positions, got dtype torch.float32; use .long\(\)"),
    "float positions in RotaryEmbedding": (
        lambda: RotaryEmbedding(8)(positions=torch.tensor([0.5])), TypeError,
        r"positions must hold integer positions, got dtype torch.float32"),
    # ---- out=
    "out of the wrong shape": (
        lambda: apply_rope(x_of(2, 5, 8), *tables(5, 8), out=torch.empty(2, 5, 6)), ValueError,
        r"out must match x: shape \(2, 5, 8\), dtype torch.float32.*got shape \(2, 5, 6\)"),
    "out of the wrong dtype": (
        lambda: apply_rope(x_of(2, 5, 8), *tables(5, 8), out=torch.empty(2, 5, 8, dtype=F64)), ValueError,
        r"out must match x.*got shape \(2, 5, 8\), dtype torch.float64"),
    "out not a tensor": (
        lambda: apply_rope(x_of(2, 5, 8), *tables(5, 8), out=[0.0]), TypeError,
        r"out must be a torch.Tensor, got list"),
    "out with gradients": (
        lambda: apply_rope(x_of(2, 5, 8).requires_grad_(), *tables(5, 8), out=torch.empty(2, 5, 8)),
        ValueError, r"apply_rope\(..., out=...\) is not differentiable; call it under torch.no_grad\(\)"),
    "out aliasing x with other strides": (
        lambda: rotate_into_own_transpose(x_of(2, 4, 4)), ValueError,
        r"out shares memory with x but is not x itself \(other strides or offset\); pass out=x"),
    "out with elements sharing memory": (
        lambda: apply_rope(x_of(2, 5, 8), *tables(5, 8), out=torch.empty(1, 5, 8).expand(2, 5, 8)),
        ValueError, r"out has elements that share memory \(stride 0 in a dim of size > 1, strides "
        r"\(0, 8, 1\)"),
    "out overlapping x at an offset": (
        lambda: apply_rope(X[:, 1:], *tables(4, 16), out=X[:, :-1]), ValueError,
        r"out shares memory with x but is not x itself"),
    # ---- other arguments
    "unknown layout": (
        lambda: apply_rope(x_of(2, 5, 8), *tables(5, 8), layout="neox"), ValueError,
        r"layout must be one of \('interleaved', 'half'\), got 'neox'"),
    "unknown short_table": (
        lambda: apply_rope(x_of(2, 5, 8), *tables(5, 8), short_table="pad"), ValueError,
        r"short_table must be one of \('raise', 'repeat_last'\), got 'pad'"),
    "x of one dim": (
        lambda: apply_rope(x_of(8), *tables(5, 8)), ValueError,
        r"x must have shape \(..., seq, head_dim\), got \(8,\)"),
    "query of the wrong width": (
        lambda: attn()(torch.randn(2, 5, 12), X, X), ValueError,
        r"query must have shape \(batch, seq, embed_dim=16\), got \(2, 5, 12\)"),
    "key and value of different lengths": (
        lambda: attn()(X, X, X[:, :4]), ValueError, r"key and value must have the same length, got 5 and 4"),
    "batch sizes differ": (
        lambda: attn()(X, X[:1], X[:1]), ValueError,
        r"query, key and value must share the batch size, got 2, 1, 1"),
    "dropout out of range": (
        lambda: attn(dropout=1.0), ValueError, r"dropout must be in \[0, 1\), got 1.0"),
    "base not above 1": (
        lambda: generate_rope_embeddings(4, 8, base=1.0), ValueError, r"base must be a finite number > 1"),
    "negative seq_len": (
        lambda: generate_rope_embeddings(-1, 8), ValueError, r"seq_len must be a non-negative int, got -1"),
    "table dtype too low": (
        lambda: generate_rope_embeddings(4, 8, dtype=torch.bfloat16), ValueError,
        r"dtype must be one of .*float32.*float64.*got torch.bfloat16"),
    # ---- scaling configs
    "unknown rope_type": (
        lambda: scaled_frequencies(8, 10000.0, {"rope_type": "ntk-by-parts", "factor": 2.0}),
        ValueError, r"scaling\['rope_type'\] must be one of .*got 'ntk-by-parts'"),
    "missing scaling key": (
        lambda: generate_rope_embeddings(4, 8, scaling={"rope_type": "yarn", "factor": 4.0}), ValueError,
        r"scaling of rope_type 'yarn' needs the key\(s\) \['original_max_position_embeddings'\]"),
    "unknown scaling key": (
        lambda: rope_frequencies(8, scaling={"rope_type": "linear", "factor": 2.0, "beta_fast": 3}),
        ValueError, r"scaling of rope_type 'linear' does not accept the key\(s\) \['beta_fast'\]"),
    "factor below one": (
        lambda: RotaryEmbedding(8, scaling={"rope_type": "ntk", "factor": 0.5}), ValueError,
        r"scaling\['factor'\] must be a finite number >= 1, got 0.5"),
    "scaling not a dict": (
        lambda: rope_frequencies(8, scaling="linear"), TypeError, r"scaling must be a dict"),
    "llama3 factors in the wrong order": (
        lambda: rope_frequencies(8, scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0,
                                             "high_freq_factor": 1.0,
                                             "original_max_position_embeddings": 64}),
        ValueError,
        r"scaling\['high_freq_factor'\] \(1.0\) must exceed scaling\['low_freq_factor'\] \(4.0\)"),
    # ---- issue 13: inputs that used to pass silently or fail with an unclear error
    "out overlapping cos": (
        lambda: overlapping_table_out("cos"), ValueError, r"out shares memory with cos"),
    "out overlapping sin": (
        lambda: overlapping_table_out("sin"), ValueError, r"out shares memory with sin"),
    "float mask with +inf": (
        lambda: attn()(X, X, X, attn_mask=torch.zeros(5, 5).fill_diagonal_(float("inf"))),
        ValueError, r"attn_mask contains \+inf"),
    "infinite factor": (
        lambda: scaled_frequencies(64, 1e4, {"rope_type": "linear", "factor": float("inf")}),
        ValueError, r"scaling\['factor'\] must be a finite number >= 1, got inf"),
    "bool factor": (
        lambda: scaled_frequencies(64, 1e4, {"rope_type": "linear", "factor": True}),
        ValueError, r"scaling\['factor'\] must be a finite number >= 1, got True"),
    "nan factor": (
        lambda: scaled_frequencies(64, 1e4, {"rope_type": "ntk", "factor": float("nan")}),
        ValueError, r"scaling\['factor'\] must be a finite number >= 1, got nan"),
    "bool original_max_position_embeddings": (
        lambda: scaled_frequencies(64, 1e4, {"rope_type": "yarn", "factor": 2.0,
                                             "original_max_position_embeddings": True}),
        ValueError, r"original_max_position_embeddings'\] must be a positive int, got True"),
    "yarn beta_fast below beta_slow": (
        lambda: scaled_frequencies(64, 1e4, yarn(beta_fast=1.0, beta_slow=32.0)), ValueError,
        r"scaling\['beta_fast'\] \(1.0\) must be >= scaling\['beta_slow'\] \(32.0\)"),
    "yarn beta_fast zero (log domain)": (
        lambda: scaled_frequencies(64, 1e4, yarn(beta_fast=0.0, beta_slow=0.0)), ValueError,
        r"scaling\['beta_fast'\] must be a finite number > 0, got 0.0"),
    "yarn negative attention_factor": (
        lambda: scaled_frequencies(64, 1e4, yarn(attention_factor=-1.0)), ValueError,
        r"scaling\['attention_factor'\] must be a finite number > 0, got -1.0"),
    "yarn truncate not a bool": (
        lambda: scaled_frequencies(64, 1e4, yarn(truncate="no")), ValueError,
        r"scaling\['truncate'\] must be a bool, got 'no'"),
    "llama3 low_freq_factor zero (division by zero)": (
        lambda: scaled_frequencies(64, 1e4, {"rope_type": "llama3", "factor": 8.0,
                                             "original_max_position_embeddings": 64,
                                             "low_freq_factor": 0.0}),
        ValueError, r"scaling\['low_freq_factor'\] must be a finite number > 0, got 0.0"),
    "dynamic negative seq_len": (
        lambda: scaled_frequencies(64, 1e4, {"rope_type": "dynamic", "factor": 2.0,
                                             "original_max_position_embeddings": 64}, seq_len=-1),
        ValueError, r"seq_len must be a non-negative int or None, got -1"),
    "ntk with dim 2 (division by zero)": (
        lambda: scaled_frequencies(2, 1e4, {"rope_type": "ntk", "factor": 2.0}), ValueError,
        r"dim must be >= 4 for 'ntk' scaling"),
    # ---- issue 24: the transformers-5 rope types and keys
    "longrope short_factor of the wrong length": (
        lambda: scaled_frequencies(8, config=longrope(short_factor=[1.0, 1.0, 1.0])), ValueError,
        r"scaling\['short_factor'\] must hold one factor per rotated pair, 4 \(rotated dim 8 / "
        r"2\), got 3 values"),
    "longrope factors for the whole head under a partial rotation": (
        lambda: scaled_frequencies(8, config=longrope(partial_rotary_factor=0.5)), ValueError,
        r"scaling\['short_factor'\] must hold one factor per rotated pair, 2 \(rotated dim 4 / "
        r"2\), got 4 values"),
    "longrope negative pair factor": (
        lambda: generate_rope_embeddings(3, 8, scaling=longrope(long_factor=[1.0, -2.0, 1.0, 1.0])),
        ValueError, r"scaling\['long_factor'\]\[1\] must be a finite number > 0 \(the stretch "
        r"factor of pair 1\), got -2.0"),
    "longrope NaN pair factor": (
        lambda: RotaryEmbedding(8, scaling=longrope(short_factor=[float("nan")] * 4)), ValueError,
        r"scaling\['short_factor'\]\[0\] must be a finite number > 0.*got nan"),
    "longrope factors not a list": (
        lambda: rope_frequencies(8, scaling=longrope(short_factor="1.0")), ValueError,
        r"scaling\['short_factor'\] must be a list of numbers.*got '1.0'"),
    "longrope negative factor": (
        lambda: scaled_frequencies(8, config=longrope(factor=-4.0)), ValueError,
        r"scaling\['factor'\] must be a finite number >= 1, got -4.0"),
    "longrope NaN attention_factor": (
        lambda: scaled_frequencies(8, config=longrope(attention_factor=float("nan"))), ValueError,
        r"scaling\['attention_factor'\] must be a finite number > 0, got nan"),
    "longrope unknown key lists the accepted ones": (
        lambda: scaled_frequencies(8, config=longrope(beta_fast=32.0)), ValueError,
        r"rope_type 'longrope' does not accept the key\(s\) \['beta_fast'\]; accepted keys: "
        r"\['attention_factor', 'factor', 'long_factor', 'mrope_interleaved', 'mrope_section', "
        r"'original_max_position_embeddings', 'partial_rotary_factor', 'rope_theta', "
        r"'short_factor'\]"),
    "proportional NaN factor": (
        lambda: scaled_frequencies(8, config={"rope_type": "proportional", "factor": float("nan")}),
        ValueError, r"scaling\['factor'\] must be a finite number >= 1, got nan"),
    "proportional p = 0": (
        lambda: scaled_frequencies(8, config={"rope_type": "proportional",
                                              "partial_rotary_factor": 0.0}),
        ValueError, r"scaling\['partial_rotary_factor'\] must be a number p with 0 < p <= 1 "
        r"\(the fraction of the head that rotates\), got 0.0"),
    "partial_rotary_factor above 1": (
        lambda: StandardAttentionWithRoPE(16, 2, scaling={"rope_type": "default",
                                                          "partial_rotary_factor": 1.5}),
        ValueError, r"scaling\['partial_rotary_factor'\] must be a number p with 0 < p <= 1.*"
        r"got 1.5"),
    "partial_rotary_factor NaN": (
        lambda: rope_frequencies(8, scaling={"rope_type": "linear", "factor": 2.0,
                                             "partial_rotary_factor": float("nan")}),
        ValueError, r"scaling\['partial_rotary_factor'\] must be a number p.*got nan"),
    "partial_rotary_factor giving an odd rotated dim": (
        lambda: rope_frequencies(12, scaling={"rope_type": "default", "partial_rotary_factor": 0.25}),
        ValueError, r"scaling\['partial_rotary_factor'\]=0.25 rotates int\(0.25 \* dim\) = 3 of "
        r"dim=12 channels; that must be a positive even number"),
    "rope_theta not above 1": (
        lambda: rope_frequencies(8, scaling={"rope_type": "default", "rope_theta": 0.5}),
        ValueError, r"scaling\['rope_theta'\] must be a finite number > 1, got 0.5"),
    "per-layer-type dict where one config is expected": (
        lambda: generate_rope_embeddings(4, 8, scaling=PER_LAYER), ValueError,
        r"scaling holds one rope config per layer type \['full_attention', 'sliding_attention'\]"
        r"; pick one, scaling\[layer_type\], or pass layer_type="),
    "per-layer-type dict without layer_type": (
        lambda: RotaryEmbedding(8, scaling=PER_LAYER), ValueError,
        r"scaling holds one rope config per layer type \['full_attention', 'sliding_attention'\]"
        r"; pass layer_type= one of them, e.g. layer_type='full_attention'"),
    "layer_type for a single config": (
        lambda: RotaryEmbedding(8, scaling={"rope_type": "default"}, layer_type="full_attention"),
        ValueError, r"layer_type='full_attention' was given, but scaling is a single rope config"),
    "layer type without RoPE": (
        lambda: attn(scaling={**PER_LAYER, "full_attention": None}, layer_type="full_attention"),
        ValueError, r"scaling\['full_attention'\] is None: layers of that type use no RoPE "
        r"\(NoPE\); build them without it, e.g. StandardAttentionWithRoPE\(..., rope=False\)"),
    "bool offset": (
        lambda: apply_rope(x_of(2, 2, 8), *tables(5, 8), offset=True), ValueError,
        r"offset must be a non-negative int, got True"),
    "float offset": (
        lambda: apply_rope(x_of(2, 2, 8), *tables(5, 8), offset=1.0), ValueError,
        r"offset must be a non-negative int, got 1.0"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_error(case):
    call, exc, pattern = CASES[case]
    with pytest.raises(exc, match=pattern):
        call()


def test_kv_cache_refuses_keys_that_do_not_extend_it():
    cache = KVCache()
    cache.update(torch.zeros(2, 2, 3, 8), torch.zeros(2, 2, 3, 8))
    with pytest.raises(ValueError, match=r"new keys of shape \(1, 2, 1, 8\) do not extend the cached "
                                         r"keys of shape \(2, 2, 3, 8\)"):
        cache.update(torch.zeros(1, 2, 1, 8), torch.zeros(1, 2, 1, 8))


def test_mask_on_another_device_than_the_inputs():
    mask = torch.ones(5, 5, dtype=torch.bool, device="meta")
    with pytest.raises(ValueError, match=r"attn_mask is on meta but the inputs are on cpu"):
        attn()(X, X, X, attn_mask=mask)


def test_cuda_tables_for_cpu_input():
    if not torch.cuda.is_available():
        pytest.skip("CUDA is not available on this machine")
    cos, sin = generate_rope_embeddings(5, 8, device="cuda")
    with pytest.raises(ValueError, match=r"cos/sin are on cuda:0 but x is on cpu; move them"):
        apply_rope(x_of(2, 5, 8), cos, sin)


def test_short_table_repeat_last_in_the_module_reproduces_the_original():
    """The module's opt-in legacy mode: the old behaviour, exactly (and only when asked)."""
    module = StandardAttentionWithRoPE(16, 2, short_table="repeat_last", dtype=F64).eval()
    x = torch.randn(2, 9, 16, dtype=F64)
    cos, sin = generate_rope_embeddings(5, 8, dtype=F64)
    legacy = repeat_last_row(angles(torch.arange(5), thetas(8)), 9)
    expected, _ = attention_module_reference(module, x, x, x, legacy, legacy)
    torch.testing.assert_close(module(x, x, x, rope_embeddings=(cos, sin)), expected,
                               rtol=1e-10, atol=1e-10)
    strict = StandardAttentionWithRoPE(16, 2, dtype=F64)
    strict.load_state_dict(module.state_dict())
    with pytest.raises(ValueError, match=r"cos has 5 rows but positions 0..8 need 9"):
        strict(x, x, x, rope_embeddings=(cos, sin))


def test_the_broadcast_check_agrees_with_torch_broadcast_shapes():
    """``broadcasts`` (masks, gathered rows, step masks) decides as
    ``torch.broadcast_shapes(shape, target) == target`` would, for every shape of 0-3 dims
    of sizes 0-3 against every 3-dim target of sizes 0-3."""
    for target in itertools.product(range(4), repeat=3):
        for ndim in range(4):
            for shape in itertools.product(range(4), repeat=ndim):
                try:
                    expected = torch.broadcast_shapes(torch.Size(shape), target) == target
                except RuntimeError:
                    expected = False
                assert broadcasts(torch.Size(shape), target) == expected, (shape, target)
