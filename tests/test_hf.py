"""ropelib.hf (issue 43, item 16): transformers' ``apply_rotary_pos_emb(q, k, cos, sin,
unsqueeze_dim=1)`` computed by ropelib, swapped into tiny transformers models, against
transformers itself (its own function, its rotary embeddings, its ``generate()``); the rope
parameters of a transformers config with the defaults its model code adds; a Qwen2-VL
attention layer loaded strictly into ``StandardAttentionWithRoPE``.

Models are built here from small configs with random weights (no download).
"""

from __future__ import annotations

import logging

import pytest
import torch
from reference import angles, rope_by_pairs, thetas

import ropelib.hf
from ropelib import RotaryEmbedding, StandardAttentionWithRoPE, mrope_positions

transformers = pytest.importorskip("transformers")
from transformers.models.gpt_neox import modeling_gpt_neox  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402
from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl  # noqa: E402
from transformers.models.qwen2_vl import modeling_qwen2_vl  # noqa: E402
from transformers.models.qwen3_vl import modeling_qwen3_vl  # noqa: E402

logging.getLogger("transformers").setLevel(logging.ERROR)
F64 = torch.float64


def hf_tables(positions: torch.Tensor, rotary_dim: int, dtype=F64):
    """transformers' tables for ``(batch, seq)`` positions: cat(freqs, freqs), float64."""
    freqs = angles(positions, thetas(rotary_dim))
    emb = torch.cat((freqs, freqs), -1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
@pytest.mark.parametrize("head_dim, rotary_dim", [(16, 16), (16, 4), (20, 12)])
def test_equals_transformers_own_function(unsqueeze_dim, head_dim, rotary_dim):
    """Full rotation (Llama's function) and partial (GPT-NeoX's), GQA, per-row positions,
    heads at dim 1 or 2: the same numbers as transformers' own functions and the float64
    formula (in float64, to its rounding)."""
    positions = torch.tensor([[0, 1, 2, 3, 4], [7, 3, 9, 0, 2]])
    cos, sin = hf_tables(positions, rotary_dim)
    shape_q, shape_k = (2, 4, 5, head_dim), (2, 2, 5, head_dim)
    if unsqueeze_dim == 2:
        shape_q, shape_k = (2, 5, 4, head_dim), (2, 5, 2, head_dim)
    q, k = torch.randn(shape_q, dtype=F64), torch.randn(shape_k, dtype=F64)
    got = ropelib.hf.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    theirs = modeling_gpt_neox.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    for ours, want, x in zip(got, theirs, (q, k), strict=True):
        assert ours.shape == x.shape and ours.dtype == x.dtype
        torch.testing.assert_close(ours, want, rtol=1e-12, atol=1e-12)
        heads_first = x if unsqueeze_dim == 1 else x.transpose(1, 2)
        formula = rope_by_pairs(heads_first, angles(positions[:, None], thetas(rotary_dim)),
                                "half")
        torch.testing.assert_close(ours if unsqueeze_dim == 1 else ours.transpose(1, 2),
                                   formula, rtol=1e-12, atol=1e-12)
    if rotary_dim == head_dim:
        llama = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
        torch.testing.assert_close(got[0], llama[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_low_precision_rounds_once(dtype):
    """transformers' tables in the model's dtype, as its rotary embedding returns them. In
    float32 ropelib computes what transformers computes (bit for bit on the CPU); in bfloat16
    and float16 it computes in float32 and rounds once, within one unit in the last place of
    the float64 rotation by those same (rounded) tables (transformers rounds three times)."""
    positions = torch.arange(64)[None]
    cos, sin = hf_tables(positions, 64, dtype)
    q, k = torch.randn(1, 4, 64, 64).to(dtype), torch.randn(1, 2, 64, 64).to(dtype)
    got = ropelib.hf.apply_rotary_pos_emb(q, k, cos, sin)
    if dtype == torch.float32:
        for ours, theirs in zip(got, modeling_llama.apply_rotary_pos_emb(q, k, cos, sin),
                                strict=True):
            assert torch.equal(ours, theirs)
        return
    c, s = cos.to(F64)[:, None, :, :32], sin.to(F64)[:, None, :, :32]
    for ours, x in zip(got, (q, k), strict=True):
        a, b = x.to(F64)[..., :32], x.to(F64)[..., 32:]
        want = torch.cat((a * c - b * s, a * s + b * c), -1)
        # one ulp of the result, and float32's rounding of the terms (cancellation)
        terms = torch.cat(((a * c).abs() + (b * s).abs(), (a * s).abs() + (b * c).abs()), -1)
        bound = torch.finfo(dtype).eps * want.abs() + 2 ** -22 * terms
        assert ((ours.to(F64) - want).abs() <= bound).all()


def test_bad_tables_are_refused():
    q, k = torch.randn(1, 4, 5, 16), torch.randn(1, 2, 5, 16)
    cos, sin = hf_tables(torch.arange(5)[None], 16, torch.float32)
    with pytest.raises(ValueError, match=r"cos must be transformers' table cat\(freqs, freqs\), "
                                         r"its two halves equal"):
        ropelib.hf.apply_rotary_pos_emb(q, k, torch.cat((cos[..., :8], sin[..., :8]), -1), sin)
    with pytest.raises(ValueError, match=r"cos/sin are 18 wide: the rotated channels of a head "
                                         r"of 16 must be"):
        ropelib.hf.apply_rotary_pos_emb(q, k, *(torch.cat((t, t[..., :2]), -1)
                                                for t in (cos, sin)))
    with pytest.raises(ValueError, match=r"cos and sin must be transformers' tables \(batch, "
                                         r"seq, rotary_dim\)"):
        ropelib.hf.apply_rotary_pos_emb(q, k, cos[0], sin[0])
    with pytest.raises(ValueError, match="unsqueeze_dim must be 1"):
        ropelib.hf.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=0)


def test_the_differences_from_transformers_said_in_the_docstring():
    """bfloat16 q and k with float32 tables stay bfloat16 (transformers promotes them to
    float32), and q and k of different dtypes are refused by name."""
    cos, sin = hf_tables(torch.arange(5)[None], 16, torch.float32)
    q, k = torch.randn(1, 4, 5, 16).bfloat16(), torch.randn(1, 2, 5, 16).bfloat16()
    got = ropelib.hf.apply_rotary_pos_emb(q, k, cos, sin)
    theirs = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin)
    assert [t.dtype for t in got] == [torch.bfloat16] * 2
    assert [t.dtype for t in theirs] == [torch.float32] * 2
    with pytest.raises(ValueError, match=r"k must have q's shape but for the heads dim \(-3\), "
                                         r"q's dtype and device"):
        ropelib.hf.apply_rotary_pos_emb(q, k.float(), cos, sin)


def tiny(name: str):
    torch.manual_seed(0)
    if name == "llama":
        config = transformers.LlamaConfig(
            vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
        return transformers.LlamaForCausalLM(config).eval(), modeling_llama
    config = transformers.GPTNeoXConfig(  # partial rotation: a quarter of each head
        vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=128,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                         "partial_rotary_factor": 0.25})
    return transformers.GPTNeoXForCausalLM(config).eval(), modeling_gpt_neox


@pytest.mark.parametrize("name", ["llama", "gpt-neox"])
def test_generate_through_the_drop_in(name, monkeypatch):
    """The README's recipe: the model module's apply_rotary_pos_emb replaced by ropelib's.
    Greedy generate() gives the same ids and bit-identical logits at every step (float32 on
    the CPU: the same products and sums, rounded the same way), and the swapped function
    is what the attention layers called."""
    model, module = tiny(name)
    prompt = torch.randint(0, 64, (2, 6))
    mask = torch.ones_like(prompt)
    settings = {"max_new_tokens": 12, "do_sample": False, "return_dict_in_generate": True,
                "output_logits": True, "attention_mask": mask, "pad_token_id": 0}
    with torch.no_grad():
        theirs = model.generate(prompt, **settings)
    calls = []

    def counted(*args, **kwargs):
        calls.append(args[2].shape)
        return ropelib.hf.apply_rotary_pos_emb(*args, **kwargs)

    monkeypatch.setattr(module, "apply_rotary_pos_emb", counted)
    with torch.no_grad():
        ours = model.generate(prompt, **settings)
    assert len(calls) == 2 * 12  # 2 layers, a prefill and 11 decode steps
    assert torch.equal(ours.sequences, theirs.sequences)
    for got, want in zip(ours.logits, theirs.logits, strict=True):
        assert torch.equal(got, want)


def test_qwen2_vl_text_tables_with_mrope_positions(monkeypatch):
    """Qwen2-VL's rotary embedding merges the (t, h, w) sections into one table per token;
    the drop-in rotates with it as transformers' function does."""
    config = transformers.Qwen2VLConfig(text_config={
        "hidden_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                            "mrope_section": [4, 6, 6]}}).get_text_config()
    rotary = modeling_qwen2_vl.Qwen2VLRotaryEmbedding(config)
    positions = mrope_positions([3, (1, 4, 6), 2], spatial_merge_size=2)  # (11, 3)
    cos, sin = rotary(torch.zeros(1), positions.T[:, None])  # (1, 11, 32)
    q, k = torch.randn(1, 2, 11, 32), torch.randn(1, 1, 11, 32)
    got = ropelib.hf.apply_rotary_pos_emb(q, k, cos, sin)
    want = modeling_qwen2_vl.apply_rotary_pos_emb(q, k, cos, sin)
    for ours, theirs in zip(got, want, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)


# the other findings of item 16 ------------------------------------------------------------------

ROTARY = {
    "Qwen2VLConfig": modeling_qwen2_vl.Qwen2VLRotaryEmbedding,
    "Qwen2_5_VLConfig": modeling_qwen2_5_vl.Qwen2_5_VLRotaryEmbedding,
    "Qwen3VLConfig": modeling_qwen3_vl.Qwen3VLTextRotaryEmbedding,
}


@pytest.mark.parametrize("config_cls, sections, interleaved", [
    ("Qwen2VLConfig", [16, 24, 24], False), ("Qwen2_5_VLConfig", [16, 24, 24], False),
    ("Qwen3VLConfig", [24, 20, 20], True)])
def test_rope_parameters_add_what_the_model_code_falls_back_to(config_cls, sections,
                                                               interleaved):
    """A default Qwen2VLConfig() has no mrope_section (transformers' rotary embedding falls
    back to [16, 24, 24] in its code), so its rope_parameters read as 1D RoPE. The helper
    adds the fallback, and ropelib's rows then equal transformers' at M-RoPE positions."""
    config = getattr(transformers, config_cls)()
    text = config.get_text_config()
    assert "mrope_section" not in text.rope_parameters
    params = ropelib.hf.rope_parameters(config)
    assert params["mrope_section"] == sections
    assert params.get("mrope_interleaved", False) is interleaved
    assert "mrope_section" not in text.rope_parameters  # the config is not changed
    head_dim = text.hidden_size // text.num_attention_heads
    ours = RotaryEmbedding(head_dim, scaling=params)
    assert ours.num_axes == 3
    rotary_cls = ROTARY[config_cls]
    positions = mrope_positions([3, (1, 4, 6), 2], spatial_merge_size=2)
    cos, _ = rotary_cls(text)(torch.zeros(1), positions.T[:, None])
    torch.testing.assert_close(ours(positions=positions)[0], cos[0, :, :head_dim // 2],
                               rtol=0, atol=2e-6)


def test_rope_parameters_of_per_layer_type_configs():
    config = transformers.Gemma3TextConfig()
    whole = ropelib.hf.rope_parameters(config)
    assert set(whole) == {"sliding_attention", "full_attention"}
    assert ropelib.hf.rope_parameters(config, "full_attention") == dict(
        config.rope_parameters["full_attention"])
    with pytest.raises(ValueError, match="layer_type='global' is not one of the config's"):
        ropelib.hf.rope_parameters(config, "global")


def test_a_qwen2_vl_attention_loads_strictly_and_computes_the_same():
    """Qwen2-VL's attention has q, k, v biases and no o_proj bias; ``o_proj_bias=False``
    loads its state dict strictly, and with the config's rope parameters (the sections
    transformers falls back to) and M-RoPE positions the module's output equals the
    transformers layer's (float64, eager attention, causal)."""
    config = transformers.Qwen2VLConfig(text_config={
        "hidden_size": 256, "num_attention_heads": 2, "num_key_value_heads": 1,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}})
    config._attn_implementation = "eager"
    text = config.get_text_config()
    text._attn_implementation = "eager"
    torch.manual_seed(0)
    theirs = modeling_qwen2_vl.Qwen2VLAttention(text, layer_idx=0).double().eval()
    for p in theirs.parameters():  # random biases too (they start at zero)
        torch.nn.init.normal_(p, std=0.05)
    ours = StandardAttentionWithRoPE(256, 2, num_kv_heads=1, bias=True, o_proj_bias=False,
                                     layout="half", scaling=ropelib.hf.rope_parameters(config),
                                     dtype=F64)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    with pytest.raises(RuntimeError, match="Missing key"):
        StandardAttentionWithRoPE(256, 2, num_kv_heads=1, layout="half").load_state_dict(
            theirs.state_dict(), strict=True)
    positions = mrope_positions([3, (1, 4, 6), 2], spatial_merge_size=2)  # (11, 3)
    x = torch.randn(1, 11, 256, dtype=F64)
    rotary = modeling_qwen2_vl.Qwen2VLRotaryEmbedding(text)
    cos, sin = rotary(x, positions.T[:, None])
    causal = torch.full((11, 11), float("-inf"), dtype=F64).triu(1)[None, None]
    with torch.no_grad():
        want, _ = theirs(x, attention_mask=causal, position_embeddings=(cos, sin))
        got = ours(x, x, x, positions=positions, is_causal=True)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_gradients_equal_transformers():
    """Training through the drop-in: the gradients of q and k (GQA, partial rotation, heads
    at dim 2) equal those of transformers' own function (float64)."""
    positions = torch.tensor([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]])
    cos, sin = hf_tables(positions, 12)
    q, k = torch.randn(2, 5, 4, 16, dtype=F64), torch.randn(2, 5, 2, 16, dtype=F64)
    weights = torch.randn(2, 5, 4, 16, dtype=F64), torch.randn(2, 5, 2, 16, dtype=F64)
    grads = []
    for function in (ropelib.hf.apply_rotary_pos_emb, modeling_gpt_neox.apply_rotary_pos_emb):
        leaves = q.clone().requires_grad_(), k.clone().requires_grad_()
        rotated = function(*leaves, cos, sin, unsqueeze_dim=2)
        sum((r * w).sum() for r, w in zip(rotated, weights, strict=True)).backward()
        grads.append([t.grad for t in leaves])
    for ours, theirs in zip(*grads, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)


# the vision towers' function ---------------------------------------------------------------------

def vision_inputs(dtype, seq=20, heads=4, head_dim=16, table_dtype=torch.float32):
    """q and k as a Qwen2-VL vision attention makes them (strided views of one qkv
    projection, ``(seq, heads, head_dim)``), and the tower's float32 tables ``(seq,
    head_dim)`` of 2-D patch angles: ``cat(freqs, freqs)``."""
    qkv = torch.randn(seq, 3, heads, head_dim).to(dtype)
    q, k, _ = qkv.permute(1, 0, 2, 3).unbind(0)
    grid = torch.stack(torch.meshgrid(torch.arange(4), torch.arange(seq // 4), indexing="ij"),
                       -1).reshape(seq, 2)  # (row, column) of each patch
    freqs = angles(grid, thetas(head_dim // 2)).flatten(-2)  # (seq, head_dim // 2)
    emb = torch.cat((freqs, freqs), -1)
    return q, k, freqs, emb.cos().to(table_dtype), emb.sin().to(table_dtype)


@pytest.mark.parametrize("module", [modeling_qwen2_vl, modeling_qwen2_5_vl])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_vision_equals_transformers_own_function(module, dtype):
    """transformers' own function on strided q and k: in float32 the same tensors, bit for
    bit (the same products and sums, rounded the same way); in bfloat16 and float16 both
    compute in float32 and round once, so they differ by at most one unit in the last place
    (a CPU that fuses a multiply-add may move a float32 result across a rounding tie)."""
    q, k, _, cos, sin = vision_inputs(dtype)
    got = ropelib.hf.apply_rotary_pos_emb_vision(q, k, cos, sin)
    want = module.apply_rotary_pos_emb_vision(q, k, cos, sin)
    for ours, theirs in zip(got, want, strict=True):
        assert ours.shape == theirs.shape and ours.dtype == theirs.dtype == dtype
        if dtype == torch.float32:
            assert torch.equal(ours, theirs)
        else:
            ulp = torch.finfo(dtype).eps * theirs.float().abs()
            assert ((ours.float() - theirs.float()).abs() <= ulp).all()


def test_vision_float64_is_the_rotation():
    """In float64 the result is RoFormer's rotation of each head by its patch's angles, to
    float64's rounding (transformers' function computes it in float32)."""
    q, k, freqs, cos, sin = vision_inputs(F64, heads=3, table_dtype=F64)
    q_embed, k_embed = ropelib.hf.apply_rotary_pos_emb_vision(q, k, cos, sin)
    for ours, x in ((q_embed, q), (k_embed, k)):
        want = rope_by_pairs(x.transpose(0, 1), freqs, "half").transpose(0, 1)
        torch.testing.assert_close(ours, want, rtol=1e-12, atol=1e-12)


def test_vision_tower_through_the_drop_in(monkeypatch):
    """A tiny Qwen2-VL vision tower with transformers' function swapped for ropelib's: the
    same output, bit for bit (float32 on the CPU), and every block called the swap."""
    torch.manual_seed(0)
    config = transformers.Qwen2VLVisionConfig(depth=2, embed_dim=32, hidden_size=64,
                                              num_heads=2, patch_size=2)
    tower = modeling_qwen2_vl.Qwen2VisionTransformerPretrainedModel(config).eval()
    grid = torch.tensor([[1, 4, 6], [2, 2, 2]])  # an image and a two-frame video
    pixels = torch.randn(int(grid.prod(-1).sum()), 3 * 2 * 2 * 2)
    with torch.no_grad():
        theirs = tower(pixels, grid_thw=grid).last_hidden_state
    calls = []

    def counted(*args):
        calls.append(args[0].shape)
        return ropelib.hf.apply_rotary_pos_emb_vision(*args)

    monkeypatch.setattr(modeling_qwen2_vl, "apply_rotary_pos_emb_vision", counted)
    with torch.no_grad():
        ours = tower(pixels, grid_thw=grid).last_hidden_state
    assert calls == [torch.Size([32, 2, 16])] * 2
    assert torch.equal(ours, theirs)


def test_vision_bad_arguments_are_refused():
    q, k, _, cos, sin = vision_inputs(torch.float32)
    with pytest.raises(ValueError, match=r"cos and sin must be the vision tables \(\.\.\., seq, "
                                         r"head_dim\) = \(20, 16\), one shape for both, got "
                                         r"\(20, 8\)"):
        ropelib.hf.apply_rotary_pos_emb_vision(q, k, cos[:, :8], sin[:, :8])
    with pytest.raises(ValueError, match=r"cos must be transformers' table cat\(freqs, freqs\)"):
        ropelib.hf.apply_rotary_pos_emb_vision(q, k, torch.cat((cos[:, :8], sin[:, :8]), -1),
                                                sin)
    with pytest.raises(ValueError, match=r"q and k must be \(\.\.\., seq, heads, head_dim\) with "
                                         r"the same seq and head_dim, got \(20, 64\)"):
        ropelib.hf.apply_rotary_pos_emb_vision(q.flatten(-2), k.flatten(-2), cos, sin)
    with pytest.raises(ValueError, match=r"q and k must be .* got \(20, 4, 16\) and \(19, 4, 16\)"):
        ropelib.hf.apply_rotary_pos_emb_vision(q, k[1:], cos, sin)
