"""The transformers-5 rope types and keys, against transformers' own ROPE_INIT_FUNCTIONS.

Every config is built here from scratch (no download): a LlamaConfig / Phi3Config /
Gemma4TextConfig with ``rope_parameters``, exactly what a model of that family carries. The
same dict goes to ropelib as it is. transformers computes in float32, ropelib in float64:
frequencies agree to rel 1e-6, tables to float32 rounding of the angles.
"""

from __future__ import annotations

import logging
import math

import pytest
import torch
from reference import angles, attention_module_reference, thetas

from ropelib import (
    RotaryEmbedding,
    StandardAttentionWithRoPE,
    generate_rope_embeddings,
    rope_frequencies,
    scaled_frequencies,
)
from ropelib.scaling import depends_on_length, rotated_dim

transformers = pytest.importorskip("transformers")
from transformers import Gemma4TextConfig, LlamaConfig, Phi3Config  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.gemma4.modeling_gemma4 import Gemma4TextRotaryEmbedding  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402
from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding  # noqa: E402

F64 = torch.float64
HEAD_DIM, L0, MAX_POS = 32, 64, 256
# LongRoPE factors as Phi-3 stores them: one per rotated pair, short ones near 1, long ones growing
SHORT = [1.0 + 0.01 * i for i in range(HEAD_DIM // 2)]
LONG = [1.0 + 1.5 * i for i in range(HEAD_DIM // 2)]

logging.getLogger("transformers").setLevel(logging.ERROR)  # HF's advice on key choices


def hf_config(params: dict, cls=LlamaConfig, **kw):
    """A model config from scratch carrying ``params`` as its ``rope_parameters``."""
    kw = {"hidden_size": 4 * HEAD_DIM, "num_attention_heads": 4, "head_dim": HEAD_DIM,
          "max_position_embeddings": MAX_POS, **kw}
    if cls is Phi3Config:
        kw.pop("head_dim")
    return cls(rope_parameters=dict(params), **kw)


def hf_frequencies(params: dict, seq_len=None, cls=LlamaConfig, **kw):
    config = hf_config(params, cls, **kw)
    kind = config.rope_parameters["rope_type"]
    if kind == "default":
        init = (Phi3RotaryEmbedding if cls is Phi3Config else LlamaRotaryEmbedding
                ).compute_default_rope_parameters
        inv, attention = init(config)
    else:
        inv, attention = ROPE_INIT_FUNCTIONS[kind](config, None, seq_len=seq_len)
    return inv.to(F64), float(attention)


def assert_same(params: dict, ours: dict | None = None, seq_len=None, cls=LlamaConfig, **kw):
    """ropelib (the dict ``ours``, default ``params``) equals transformers, rel <= 1e-6."""
    expected, expected_attention = hf_frequencies(params, seq_len, cls, **kw)
    inv, attention = scaled_frequencies(HEAD_DIM, None, params if ours is None else ours,
                                        seq_len=seq_len)
    assert inv.shape == expected.shape
    torch.testing.assert_close(inv, expected, rtol=1e-6, atol=0)
    assert math.isclose(attention, expected_attention, rel_tol=1e-6)
    return inv, attention


# --------------------------------------------------------------------------- every rope type

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": L0,
        "rope_theta": 10000.0}

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": L0, "rope_theta": 5e5}

CASES = {
    "default": {"rope_type": "default", "rope_theta": 5e5},
    "linear": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e4},
    "llama3": LLAMA3,
    "yarn": YARN,
    "yarn betas": {**YARN, "beta_fast": 16.0, "beta_slow": 2.0},
    # DeepSeek V3: mscale and mscale_all_dim equal, so the attention factor cancels to 1
    "yarn deepseek mscale": {**YARN, "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                             "beta_fast": 32, "beta_slow": 1},
    "yarn mscale ratio": {**YARN, "mscale": 1.0, "mscale_all_dim": 0.5},
    # gpt-oss: theta 150000, factor 32, no truncation of the correction range
    "yarn gpt-oss truncate": {**YARN, "factor": 32.0, "rope_theta": 150000.0,
                              "truncate": False},
    "yarn attention_factor": {**YARN, "attention_factor": 0.8},
    "proportional gemma4": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                            "rope_theta": 1e6},
    "proportional factor": {"rope_type": "proportional", "partial_rotary_factor": 0.5,
                            "factor": 8.0, "rope_theta": 1e4},
    "proportional odd pair count": {"rope_type": "proportional", "partial_rotary_factor": 0.3},
    "proportional p=1": {"rope_type": "proportional", "partial_rotary_factor": 1.0},
    "partial default": {"rope_type": "default", "partial_rotary_factor": 0.5,
                        "rope_theta": 1e4},
    "partial linear": {"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.75},
    "partial yarn": {**YARN, "partial_rotary_factor": 0.5, "truncate": False},
    "partial llama3": {**LLAMA3, "partial_rotary_factor": 0.5},
}


@pytest.mark.parametrize("case", list(CASES))
def test_rope_type_equals_transformers(case):
    params = CASES[case]
    cls = Phi3Config if case == "partial default" else LlamaConfig  # Llama ignores p there
    assert_same(params, cls=cls)


def test_the_cases_cover_every_transformers_rope_type():
    covered = {CASES[c]["rope_type"] for c in CASES} | {"dynamic", "longrope"}
    assert set(ROPE_INIT_FUNCTIONS) <= covered


def test_yarn_key_set_changes_what_it_should():
    """Each YaRN key changes the result (so the comparisons above test it)."""
    base_inv, base_att = scaled_frequencies(HEAD_DIM, config=YARN)
    for case in ("yarn betas", "yarn gpt-oss truncate", "partial yarn"):
        inv = scaled_frequencies(HEAD_DIM, config=CASES[case])[0]
        assert inv.shape != base_inv.shape or not torch.equal(inv, base_inv), case
    assert scaled_frequencies(HEAD_DIM, config=CASES["yarn deepseek mscale"])[1] == 1.0
    ratio = scaled_frequencies(HEAD_DIM, config=CASES["yarn mscale ratio"])[1]
    assert math.isclose(ratio, (0.1 * math.log(4) + 1) / (0.05 * math.log(4) + 1), rel_tol=1e-12)
    assert scaled_frequencies(HEAD_DIM, config=CASES["yarn attention_factor"])[1] == 0.8
    assert base_att == pytest.approx(0.1 * math.log(4) + 1)


# --------------------------------------------------------------------------- the length switches

@pytest.mark.parametrize("seq_len", [None, 1, MAX_POS, MAX_POS + 1, 3 * MAX_POS])
def test_dynamic_both_sides_of_the_switch(seq_len):
    """HF's dynamic NTK takes the trained length from config.max_position_embeddings; ropelib's
    dict says it as original_max_position_embeddings."""
    hf = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}
    inv, _ = assert_same(hf, {**hf, "original_max_position_embeddings": MAX_POS}, seq_len)
    if seq_len is not None and seq_len > MAX_POS:
        assert (inv[1:] < thetas(HEAD_DIM)[1:]).all()
    else:
        torch.testing.assert_close(inv, thetas(HEAD_DIM), rtol=1e-12, atol=0)


def test_dynamic_as_transformers_5_stores_it_takes_l0_from_max_position_embeddings():
    """LlamaConfig(rope_parameters={"rope_type": "dynamic", "factor": 2.0}) stores no
    original_max_position_embeddings: the dict goes in as it is, with the model's
    max_position_embeddings, and the tables follow LlamaRotaryEmbedding's switches."""
    config = hf_config({"rope_type": "dynamic", "factor": 2.0})
    params = config.rope_parameters
    assert "original_max_position_embeddings" not in params
    for seq_len in (None, MAX_POS, MAX_POS + 1, 3 * MAX_POS):
        expected, _ = ROPE_INIT_FUNCTIONS["dynamic"](config, None, seq_len=seq_len)
        inv, attention = scaled_frequencies(HEAD_DIM, config=params, seq_len=seq_len,
                                            max_position_embeddings=MAX_POS)
        torch.testing.assert_close(inv, expected.to(F64), rtol=1e-6, atol=0)
        assert attention == 1.0
    hf = LlamaRotaryEmbedding(config)
    ours = RotaryEmbedding(HEAD_DIM, scaling=params, max_position_embeddings=MAX_POS)
    for n in (10, MAX_POS + 1, 3 * MAX_POS, 2 * MAX_POS, 20):  # grow, keep, reset as HF
        hf_cos, hf_sin = hf(torch.zeros(1), torch.arange(n)[None])
        cos, sin = ours(n)
        for table, hf_table in ((cos, hf_cos), (sin, hf_sin)):  # HF: float32 angles
            torch.testing.assert_close(table.to(F64), hf_table[0, :, :HEAD_DIM // 2].to(F64),
                                       rtol=0, atol=1.5e-7 * n + 1e-6)
    module = StandardAttentionWithRoPE(4 * HEAD_DIM, 4, scaling=params,
                                       max_position_embeddings=MAX_POS)
    assert module.rotary.dynamic
    with pytest.raises(ValueError, match=r"'dynamic' has no 'original_max_position_embeddings'"
                                         r".*pass max_position_embeddings="):
        RotaryEmbedding(HEAD_DIM, scaling=params)


LONGROPE = {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG,
            "original_max_position_embeddings": L0, "rope_theta": 1e4}


@pytest.mark.parametrize("seq_len", [None, 1, L0, L0 + 1, 10 * L0])
@pytest.mark.parametrize("extra", [{"factor": 4.0}, {"factor": 4.0, "attention_factor": 1.3},
                                   {"factor": 1.0}])
def test_longrope_both_sides_of_the_switch(seq_len, extra):
    params = {**LONGROPE, **extra}
    inv, attention = assert_same(params, seq_len=seq_len)
    ext = LONG if seq_len is not None and seq_len > L0 else SHORT
    torch.testing.assert_close(inv, thetas(HEAD_DIM) / torch.tensor(ext, dtype=F64),
                               rtol=1e-12, atol=0)
    factor = extra["factor"]
    expected = extra.get("attention_factor",
                         math.sqrt(1 + math.log(factor) / math.log(L0)) if factor > 1 else 1.0)
    assert math.isclose(attention, expected, rel_tol=1e-12)


@pytest.mark.parametrize("seq_len", [L0, L0 + 1])
def test_longrope_without_factor_takes_max_position_embeddings_over_l0(seq_len):
    """Phi-3's configs store no factor: transformers takes max_position_embeddings / L0."""
    expected, expected_attention = hf_frequencies(LONGROPE, seq_len)
    inv, attention = scaled_frequencies(HEAD_DIM, config=LONGROPE, seq_len=seq_len,
                                        max_position_embeddings=MAX_POS)
    torch.testing.assert_close(inv, expected, rtol=1e-6, atol=0)
    assert math.isclose(attention, expected_attention, rel_tol=1e-6)
    assert math.isclose(attention, math.sqrt(1 + math.log(MAX_POS / L0) / math.log(L0)),
                        rel_tol=1e-12)
    with pytest.raises(ValueError, match=r"'longrope' has no 'factor'.*max_position_embeddings"):
        scaled_frequencies(HEAD_DIM, config=LONGROPE)


@pytest.mark.parametrize("seq_len", [L0, L0 + 1])
def test_phi4_mini_style_partial_longrope(seq_len):
    """Phi-4-mini: LongRoPE on the first 3/4 of the head (Phi3Config, partial_rotary_factor)."""
    pairs = int(0.75 * HEAD_DIM) // 2
    params = {**LONGROPE, "short_factor": SHORT[:pairs], "long_factor": LONG[:pairs],
              "partial_rotary_factor": 0.75}
    config = hf_config(params, Phi3Config, original_max_position_embeddings=L0,
                       partial_rotary_factor=0.75)
    expected, attention = ROPE_INIT_FUNCTIONS["longrope"](config, None, seq_len=seq_len)
    ours = dict(config.rope_parameters)  # as transformers standardized it
    inv, ours_attention = scaled_frequencies(HEAD_DIM, config=ours, seq_len=seq_len,
                                             max_position_embeddings=MAX_POS)
    assert inv.shape == (pairs,) and rotated_dim(HEAD_DIM, ours) == 2 * pairs
    torch.testing.assert_close(inv, expected.to(F64), rtol=1e-6, atol=0)
    assert math.isclose(ours_attention, attention, rel_tol=1e-6)


def test_length_dependent_types():
    assert depends_on_length(LONGROPE) and depends_on_length(
        {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 8})
    assert not any(depends_on_length(CASES[c]) for c in CASES)


# --------------------------------------------------------------------------- p-RoPE vs partial

def test_proportional_spectrum_against_the_formula():
    """Barbero et al.: the fastest floor(p d / 2) pairs keep base^(-2i/d), d the whole head."""
    d, p, base = 512, 0.25, 1e6
    inv, _ = scaled_frequencies(d, config={"rope_type": "proportional",
                                           "partial_rotary_factor": p, "rope_theta": base})
    assert inv.shape == (d // 2,)
    kept = int(p * d / 2)
    torch.testing.assert_close(inv[:kept], thetas(d, base)[:kept], rtol=1e-12, atol=0)
    assert (inv[kept:] == 0).all()
    # partial rotation squeezes a spectrum into p d channels instead: base^(-2i/(p d))
    partial, _ = scaled_frequencies(d, config={"rope_type": "default",
                                               "partial_rotary_factor": p, "rope_theta": base})
    torch.testing.assert_close(partial, thetas(int(p * d), base), rtol=1e-12, atol=0)
    assert (partial[1:] < inv[1:kept]).all()  # the squeezed spectrum is slower pair by pair


def test_proportional_tables_cover_the_whole_head_with_identity_pairs():
    cos, sin = generate_rope_embeddings(50, 16, scaling={"rope_type": "proportional",
                                                         "partial_rotary_factor": 0.5},
                                        dtype=F64)
    assert cos.shape == (50, 8)
    torch.testing.assert_close(cos[:, :4], angles(torch.arange(50), thetas(16)[:4]).cos(),
                               rtol=0, atol=1e-12)
    assert (cos[:, 4:] == 1).all() and (sin[:, 4:] == 0).all()


# --------------------------------------------------------------------------- modules, per layer type

def gemma4_tables(layer_type: str, n: int):
    config = Gemma4TextConfig()
    rotary = Gemma4TextRotaryEmbedding(config)
    cos, sin = rotary(torch.zeros(1), torch.arange(n)[None], layer_type)
    return config, cos[0].to(F64), sin[0].to(F64)


@pytest.mark.parametrize("layer_type,head_dim", [("sliding_attention", 256),
                                                  ("full_attention", 512)])
def test_gemma4_per_layer_type_rotary_embedding(layer_type, head_dim):
    n = 300
    config, hf_cos, hf_sin = gemma4_tables(layer_type, n)
    rot = RotaryEmbedding(head_dim, scaling=config.rope_parameters, layer_type=layer_type)
    cos, sin = rot(n)
    assert hf_cos.shape == (n, head_dim)  # half layout: cat(freqs, freqs)
    # HF's angles are float32 products: about n * 6e-8 rad off at most
    torch.testing.assert_close(cos.to(F64), hf_cos[:, :head_dim // 2], rtol=0, atol=5e-5)
    torch.testing.assert_close(sin.to(F64), hf_sin[:, :head_dim // 2], rtol=0, atol=5e-5)
    theta = config.rope_parameters[layer_type]["rope_theta"]
    expected = rope_frequencies(head_dim, theta, scaling=config.rope_parameters[layer_type],
                                dtype=F64)
    torch.testing.assert_close(cos.to(F64), angles(torch.arange(n), expected).cos(),
                               rtol=0, atol=1e-6)


def test_per_layer_type_attention_module():
    config = Gemma4TextConfig()
    params = config.rope_parameters
    attn = StandardAttentionWithRoPE(1024, 2, bias=False, layout="half", scaling=params,
                                     layer_type="full_attention").double()
    assert attn.rotary_dim == 512 and attn.rotary.base == 1e6
    x = torch.randn(1, 12, 1024, dtype=F64)
    inv = thetas(512, 1e6)
    inv[64:] = 0.0  # p-RoPE: 64 of 256 pairs rotate
    a = angles(torch.arange(12), inv)
    expected, _ = attention_module_reference(attn, x, x, x, a, a)
    torch.testing.assert_close(attn(x, x, x), expected, rtol=1e-10, atol=1e-10)
    sliding = StandardAttentionWithRoPE(512, 2, scaling=params, layer_type="sliding_attention")
    assert sliding.rotary.base == 1e4 and sliding.rotary_dim == 256
    with pytest.raises(ValueError, match=r"one rope config per layer type \['full_attention', "
                                         r"'sliding_attention'\]; pass layer_type="):
        StandardAttentionWithRoPE(512, 2, scaling=params)
    with pytest.raises(ValueError, match=r"layer_type must be one of .*got 'global'"):
        RotaryEmbedding(256, scaling=params, layer_type="global")


def test_partial_rotary_factor_sets_the_module_rotary_dim():
    params = {"rope_type": "default", "partial_rotary_factor": 0.25, "rope_theta": 1e4}
    attn = StandardAttentionWithRoPE(64, 2, bias=False, layout="half", scaling=params).double()
    assert attn.rotary_dim == 8  # int(0.25 * 32)
    x = torch.randn(2, 7, 64, dtype=F64)
    a = angles(torch.arange(7), thetas(8))
    expected, _ = attention_module_reference(attn, x, x, x, a, a)
    torch.testing.assert_close(attn(x, x, x), expected, rtol=1e-10, atol=1e-10)
    assert StandardAttentionWithRoPE(64, 2, scaling=params, rotary_dim=8).rotary_dim == 8
    with pytest.raises(ValueError, match=r"rotary_dim=16 differs from the 8 channels"):
        StandardAttentionWithRoPE(64, 2, scaling=params, rotary_dim=16)


def test_phi3_longrope_rotary_embedding_switches_with_the_length():
    """ropelib's RotaryEmbedding and HF's Phi3RotaryEmbedding at lengths below, at and past L0,
    and back below: the tables switch factor sets (and back) the same way."""
    config = hf_config({k: v for k, v in LONGROPE.items()
                        if k != "original_max_position_embeddings"}, Phi3Config,
                       original_max_position_embeddings=L0)
    hf = Phi3RotaryEmbedding(config)
    ours = RotaryEmbedding(HEAD_DIM, scaling=config.rope_parameters, max_position_embeddings=MAX_POS)
    for n in (10, L0, L0 + 1, 3 * L0, 20):
        hf_cos, hf_sin = hf(torch.zeros(1), torch.arange(n)[None])
        cos, sin = ours(n)
        torch.testing.assert_close(cos.to(F64), hf_cos[0, :, :HEAD_DIM // 2].to(F64),
                                   rtol=0, atol=1e-5)
        torch.testing.assert_close(sin.to(F64), hf_sin[0, :, :HEAD_DIM // 2].to(F64),
                                   rtol=0, atol=1e-5)
        ext = torch.tensor(LONG if n > L0 else SHORT, dtype=F64)
        attention = math.sqrt(1 + math.log(MAX_POS / L0) / math.log(L0))
        torch.testing.assert_close(cos.to(F64), attention * angles(torch.arange(n),
                                                                   thetas(HEAD_DIM) / ext).cos(),
                                   rtol=0, atol=1e-6)


# --------------------------------------------------------------------------- rope_theta and base

def test_rope_parameters_dict_as_transformers_stores_it():
    """LlamaConfig's standardized rope_parameters (with rope_theta) go in as they are."""
    config = hf_config({"rope_type": "yarn", "factor": 4.0, "rope_theta": 5e5})
    params = config.rope_parameters
    assert params["rope_theta"] == 5e5 and params["original_max_position_embeddings"] == MAX_POS
    cos, _ = generate_rope_embeddings(20, HEAD_DIM, scaling=params, dtype=F64)
    inv, attention = hf_frequencies(params)
    torch.testing.assert_close(cos, attention * angles(torch.arange(20), inv).cos(),
                               rtol=0, atol=1e-6)
    assert RotaryEmbedding(HEAD_DIM, scaling=params).base == 5e5
    assert RotaryEmbedding(HEAD_DIM, 5e5, scaling=params).base == 5e5  # the same base is fine
    assert RotaryEmbedding(HEAD_DIM, scaling={"rope_type": "default"}).base == 10000.0


@pytest.mark.parametrize("call", [
    lambda p: scaled_frequencies(8, 1e4, p),
    lambda p: rope_frequencies(8, 1e4, scaling=p),
    lambda p: generate_rope_embeddings(3, 8, 1e4, scaling=p),
    lambda p: RotaryEmbedding(8, 1e4, scaling=p),
    lambda p: StandardAttentionWithRoPE(16, 2, base=1e4, scaling=p),
])
def test_a_base_that_differs_from_rope_theta_is_an_error(call):
    with pytest.raises(ValueError, match=r"base=10000.0 and scaling\['rope_theta'\]=500000.0 "
                                         "differ"):
        call({"rope_type": "default", "rope_theta": 5e5})
