"""Multi-axis RoPE (ropelib.multiaxis) against explicit float64 angles and Hugging Face's
Qwen2-VL M-RoPE, Qwen3-VL interleaved M-RoPE and the Qwen2-VL vision tower's axial RoPE.

HF computes inv_freq and the angles in float32 (an angle error of about t * 6e-8 rad, 3e-4 at
t = 5000), which would hide a wrong pair layout at large positions. So HF's own layout code
(``recomposition_frequencies``) is run on exact float64 angles and compared at rel 2e-6, and
its float32 forward is compared within the bound its rounding implies.
"""

from __future__ import annotations

import math

import pytest
import torch
from reference import assert_same, attention_module_reference, rope_by_pairs
from transformers.models.qwen2_vl.configuration_qwen2_vl import (
    Qwen2VLConfig,
    Qwen2VLTextConfig,
    Qwen2VLVisionConfig,
)
from transformers.models.qwen2_vl.modeling_qwen2_vl import (
    Qwen2VLModel,
    Qwen2VLRotaryEmbedding,
    Qwen2VLVisionRotaryEmbedding,
    apply_rotary_pos_emb,
)
from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding
from transformers.vision_utils import get_vision_position_ids

from ropelib import (
    KVCache,
    RoPEMixed,
    RotaryEmbedding,
    StandardAttentionWithRoPE,
    apply_rope,
    axis_frequencies,
    axis_tables,
    generate_rope_embeddings,
    mrope_positions,
)
from ropelib.multiaxis import axis_of_pairs, axis_rows

F64 = torch.float64
# Rows computed on a GPU and the CPU's tables: both float64 cos/sin rounded to float32, one
# float32 ulp (1.2e-7) apart where the two devices' float64 cos differ in the last bit and
# the rounding falls between them; bit-equal on the CPU
GPU_TABLES = {"rtol": 0, "atol": 5e-7}
QWEN2_SECTIONS, QWEN3_SECTIONS = [16, 24, 24], [24, 20, 20]


def explicit_w(head_dim, sections, base, spectrum, order):
    """W written from the definitions with Python floats, pair by pair."""
    half, k = head_dim // 2, len(sections)
    if order == "chunked":
        axes = [a for a, s in enumerate(sections) for _ in range(s)]
    else:
        axes = [0] * half
        for a in range(1, k):
            for i in range(a, k * sections[a], k):
                axes[i] = a
    W = torch.zeros(half, k, dtype=F64)
    seen = [0] * k
    for i, a in enumerate(axes):
        if spectrum == "shared":
            W[i, a] = base ** (-2.0 * i / head_dim)
        else:
            W[i, a] = base ** (-seen[a] / sections[a])
        seen[a] += 1
    return W


def exact_angles(positions, W):
    """sum_a p_a W[i, a], accumulated in Python floats (independent of matmul)."""
    p = positions.to(F64).reshape(-1, positions.shape[-1]).tolist()
    out = [[math.fsum(row[a] * float(W[i, a]) for a in range(len(row)))
            for i in range(W.shape[0])] for row in p]
    return torch.tensor(out, dtype=F64).reshape(*positions.shape[:-1], W.shape[0])


def hf_inv_freq(dim, base):
    """HF's default inv_freq formula, evaluated in float64."""
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=F64) / dim))


@pytest.mark.parametrize("head_dim, sections, spectrum, order", [
    (128, QWEN2_SECTIONS, "shared", "chunked"),
    (128, QWEN3_SECTIONS, "shared", "interleaved"),
    (80, [20, 20], "per_axis", "chunked"),
    (24, [4, 4, 4], "per_axis", "interleaved"),
    (16, [8], "shared", "chunked"),
])
def test_axis_frequencies_follow_the_definitions(head_dim, sections, spectrum, order):
    W = axis_frequencies(head_dim, sections, base=500.0, spectrum=spectrum, order=order)
    assert W.dtype == F64 and W.shape == (head_dim // 2, len(sections))
    torch.testing.assert_close(W, explicit_w(head_dim, sections, 500.0, spectrum, order),
                               rtol=1e-15, atol=0)
    assert ((W != 0).sum(1) == 1).all()  # every pair follows exactly one axis
    assert (W != 0).sum(0).tolist() == list(sections)


def test_qwen3_interleaving_is_the_one_of_its_code():
    axes = axis_of_pairs(128, QWEN3_SECTIONS, "interleaved").tolist()
    assert [i for i, a in enumerate(axes) if a == 1] == list(range(1, 60, 3))
    assert [i for i, a in enumerate(axes) if a == 2] == list(range(2, 60, 3))
    assert [i for i, a in enumerate(axes) if a == 0] == list(range(0, 60, 3)) + [60, 61, 62, 63]


def test_one_axis_is_1d_rope(device):
    W = axis_frequencies(64, [32], base=10000.0)
    positions = torch.arange(300, device=device)
    cos, sin = axis_tables(positions[:, None], W)
    cos1, sin1 = generate_rope_embeddings(300, 64, device=device)
    assert cos.device == device
    assert_same(cos, cos1, **GPU_TABLES)
    assert_same(sin, sin1, **GPU_TABLES)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float64, torch.float32])
def test_axis_tables_are_the_rounded_float64_angles(dtype, device):
    W = axis_frequencies(128, QWEN2_SECTIONS, base=1e6)
    g = torch.Generator().manual_seed(0)
    positions = torch.randint(0, 6000, (2, 7, 3), generator=g).to(dtype)
    cos, sin = axis_tables(positions.to(device), W)
    assert cos.dtype == torch.float32 and cos.shape == (2, 7, 64) and cos.device == device
    ref = exact_angles(positions, W)
    # float32 of the exact values: within half an ulp (6e-8 relative) of them
    torch.testing.assert_close(cos.cpu().to(F64), ref.cos(), rtol=6e-8, atol=1e-12)
    torch.testing.assert_close(sin.cpu().to(F64), ref.sin(), rtol=6e-8, atol=1e-12)
    cos64, _ = axis_tables(positions.to(device), W, dtype=F64)
    torch.testing.assert_close(cos64.cpu(), ref.cos(), rtol=1e-12, atol=1e-12)


def test_mixed_frequencies_and_fractional_positions(device):
    W = torch.randn(8, 2, dtype=F64)
    positions = torch.rand(5, 2, dtype=F64) * 10 - 5
    cos, sin = axis_tables(positions.to(device), W.to(device), dtype=F64)
    ref = exact_angles(positions, W)
    torch.testing.assert_close(cos.cpu(), ref.cos(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(sin.cpu(), ref.sin(), rtol=1e-12, atol=1e-12)


def test_the_score_depends_only_on_the_offset_for_any_w():
    """<R(p) q, R(p') k> = q^T R(p' - p) k, for a random (mixed) W and random positions."""
    g = torch.Generator().manual_seed(1)
    W = torch.randn(8, 3, dtype=F64, generator=g)
    q, k = torch.randn(16, dtype=F64, generator=g), torch.randn(16, dtype=F64, generator=g)
    p = torch.randint(-50, 50, (20, 3), generator=g)
    p2 = torch.randint(-50, 50, (20, 3), generator=g)

    def rotate(v, pos):
        return rope_by_pairs(v.expand(pos.shape[0], 16), exact_angles(pos, W))

    scores = (rotate(q, p) * rotate(k, p2)).sum(-1)
    relative = (q * rotate(k, p2 - p)).sum(-1)
    torch.testing.assert_close(scores, relative, rtol=1e-10, atol=1e-10)


# --------------------------------------------------------------------------- Hugging Face


def hf_text_rotary(cls, config_cls, sections, base, **extra):
    config = config_cls(hidden_size=256, num_attention_heads=2, num_key_value_heads=1,
                        num_hidden_layers=1, intermediate_size=32, vocab_size=64,
                        bos_token_id=None, eos_token_id=None, pad_token_id=None,
                        rope_parameters={"rope_type": "default", "rope_theta": base,
                                         "mrope_section": sections, **extra})
    return cls(config)


def large_positions(seq: int, seed: int) -> torch.Tensor:
    """(seq, 3) positions with t in the thousands: a text stretch, then an image-like grid."""
    g = torch.Generator().manual_seed(seed)
    start = 4800
    text = start + torch.arange(seq // 2)[:, None].expand(-1, 3)
    grid = start + seq // 2 + torch.randint(0, 40, (seq - seq // 2, 3), generator=g)
    grid[:, 0] += 300  # the temporal axis runs further (a video)
    return torch.cat([text, grid])


CASES = {
    "qwen2-vl": (Qwen2VLRotaryEmbedding, Qwen2VLTextConfig, QWEN2_SECTIONS, 1e6, "chunked", {}),
    "qwen3-vl": (Qwen3VLTextRotaryEmbedding, Qwen3VLTextConfig, QWEN3_SECTIONS, 5e6,
                 "interleaved", {"mrope_interleaved": True}),
}


@pytest.mark.parametrize("case", CASES)
def test_m_rope_equals_hf_layout_on_exact_angles(case, device):
    cls, config_cls, sections, base, order, extra = CASES[case]
    hf = hf_text_rotary(cls, config_cls, sections, base, **extra)
    positions = large_positions(40, 0)  # t up to about 5200
    W = axis_frequencies(128, sections, base=base, order=order)
    cos, sin = (t.cpu() for t in axis_tables(positions.to(device), W))
    # HF's recomposition on exact float64 angles, position_ids (3, batch, seq)
    freqs = positions.T[:, None, :, None].to(F64) * hf_inv_freq(128, base)
    hf_cos = hf.recomposition_frequencies(freqs.cos().clone())[0]
    hf_sin = hf.recomposition_frequencies(freqs.sin().clone())[0]
    torch.testing.assert_close(torch.cat([cos, cos], -1).to(F64), hf_cos, rtol=2e-6, atol=2e-7)
    torch.testing.assert_close(torch.cat([sin, sin], -1).to(F64), hf_sin, rtol=2e-6, atol=2e-7)
    # a wrong layout would not pass: the other model's layout differs by far more
    other = (axis_frequencies(128, QWEN3_SECTIONS, base=base, order="interleaved")
             if order == "chunked" else axis_frequencies(128, QWEN2_SECTIONS, base=base))
    assert (axis_tables(positions, other)[0].to(F64) - hf_cos[..., :64]).abs().max() > 0.1


@pytest.mark.parametrize("case", CASES)
def test_m_rope_equals_hf_float32_forward_within_its_rounding(case, device):
    cls, config_cls, sections, base, order, extra = CASES[case]
    hf = hf_text_rotary(cls, config_cls, sections, base, **extra)
    positions = large_positions(40, 1)
    x = torch.zeros(1, 40, 256)
    hf_cos, hf_sin = hf(x, positions.T[:, None, :])
    W = axis_frequencies(128, sections, base=base, order=order)
    cos, sin = (t.cpu() for t in axis_tables(positions.to(device), W))
    exact = exact_angles(positions, axis_frequencies(128, sections, base=base, order=order))
    # float32 angles: error up to |angle| * 2 * 2^-24 (inv_freq and product rounded) + cos's own
    bound = float(exact.abs().max()) * 2 * 2.0 ** -24 + 1e-6
    assert (torch.cat([cos, cos], -1) - hf_cos[0]).abs().max() <= bound
    assert (torch.cat([sin, sin], -1) - hf_sin[0]).abs().max() <= bound
    # and ropelib is the closer of the two to the exact angles
    ours = (cos.to(F64) - exact.cos()).abs().max()
    theirs = (hf_cos[0, :, :64].to(F64) - exact.cos()).abs().max()
    assert ours < 1e-7 < theirs


@pytest.mark.parametrize("case", CASES)
def test_rotated_queries_equal_hf_apply_rotary_pos_emb(case, device):
    cls, config_cls, sections, base, order, extra = CASES[case]
    hf = hf_text_rotary(cls, config_cls, sections, base, **extra)
    positions = large_positions(24, 2)
    freqs = positions.T[:, None, :, None].to(F64) * hf_inv_freq(128, base)
    hf_cos = hf.recomposition_frequencies(freqs.cos().clone())
    hf_sin = hf.recomposition_frequencies(freqs.sin().clone())
    q, k = torch.randn(1, 2, 24, 128, dtype=F64), torch.randn(1, 1, 24, 128, dtype=F64)
    hf_q, hf_k = apply_rotary_pos_emb(q, k, hf_cos, hf_sin)
    rotary = RotaryEmbedding(128, frequencies=axis_frequencies(128, sections, base=base,
                                                                order=order)).double().to(device)
    cos, sin = rotary(positions=positions.to(device))
    our_q = apply_rope(q.to(device), cos[None, None], sin[None, None], layout="half")
    our_k = apply_rope(k.to(device), cos[None, None], sin[None, None], layout="half")
    assert our_q.device == device
    torch.testing.assert_close(our_q.cpu(), hf_q, rtol=2e-6, atol=1e-9)
    torch.testing.assert_close(our_k.cpu(), hf_k, rtol=2e-6, atol=1e-9)


def test_axial_rope_equals_the_qwen2_vl_vision_tower(device):
    # the real tower: embed_dim 1280, 16 heads, head_dim 80, spatial merge 2
    config = Qwen2VLVisionConfig(depth=1, embed_dim=1280, num_heads=16, hidden_size=64)
    hf = Qwen2VLVisionRotaryEmbedding(config)
    grid = torch.tensor([[1, 64, 80], [2, 4, 6]])
    positions = get_vision_position_ids(grid, config.spatial_merge_size)  # (N, 2): (h, w)
    positions = positions + torch.tensor([1000, 2000])  # far from the origin
    W = axis_frequencies(80, [20, 20], base=10000.0, spectrum="per_axis")
    cos, sin = (t.cpu() for t in axis_tables(positions.to(device), W))
    freqs = positions[:, :, None].to(F64) * hf_inv_freq(40, 10000.0)  # (N, 2, 20)
    torch.testing.assert_close(torch.cat([cos, cos], -1).to(F64),
                               hf.recomposition_frequencies(freqs.cos()), rtol=2e-6, atol=2e-7)
    torch.testing.assert_close(torch.cat([sin, sin], -1).to(F64),
                               hf.recomposition_frequencies(freqs.sin()), rtol=2e-6, atol=2e-7)
    hf_cos, _ = hf(torch.zeros(1), positions)
    bound = float(exact_angles(positions, W).abs().max()) * 2 * 2.0 ** -24 + 1e-6
    assert (torch.cat([cos, cos], -1) - hf_cos).abs().max() <= bound


# --------------------------------------------------------------------------- positions


def tiny_qwen2_vl():
    config = Qwen2VLConfig(
        text_config={"hidden_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1,
                     "num_hidden_layers": 1, "intermediate_size": 32, "vocab_size": 64,
                     "bos_token_id": None, "eos_token_id": None, "pad_token_id": None,
                     "rope_parameters": {"rope_type": "default", "rope_theta": 1e6,
                                         "mrope_section": [4, 6, 6]}},
        vision_config={"depth": 1, "embed_dim": 32, "num_heads": 2, "hidden_size": 64,
                       "mlp_ratio": 1, "spatial_merge_size": 2})
    return Qwen2VLModel(config)


def hf_rope_index(model, segments, merge=2):
    types, images, videos = [], [], []
    for segment in segments:
        if isinstance(segment, int):
            types += [0] * segment
        else:
            t, h, w = segment
            kind = 1 if t == 1 else 2
            (images if kind == 1 else videos).append(segment)
            types += [kind] * (t * (h // merge) * (w // merge))
    types = torch.tensor([types])
    position_ids, _ = model.get_rope_index(
        torch.zeros_like(types), types,
        image_grid_thw=torch.tensor(images) if images else None,
        video_grid_thw=torch.tensor(videos) if videos else None)
    return position_ids[:, 0].T  # (seq, 3)


def test_mrope_positions_equal_hf_get_rope_index_on_a_mixed_sequence():
    model = tiny_qwen2_vl()
    segments = [5, (1, 8, 12), 3, (2, 8, 8), 4, (1, 4, 4), 2]
    ours = mrope_positions(segments, spatial_merge_size=2)
    assert ours.dtype == torch.int64
    assert torch.equal(ours, hf_rope_index(model, segments))
    # the rule, spelled out: text on the diagonal, the image at the text's end, text after it
    # from the image's largest position + 1
    assert ours[:5].tolist() == [[i, i, i] for i in range(5)]
    image = ours[5:5 + 24]
    assert image[:, 0].tolist() == [5] * 24
    assert image[:, 1].tolist() == [5 + r for r in range(4) for _ in range(6)]
    assert image[:, 2].tolist() == [5 + c for _ in range(4) for c in range(6)]
    assert ours[29].tolist() == [11, 11, 11]


def test_a_video_longer_than_wide_continues_after_its_last_frame():
    """t = 6 frames of a 2 x 2 grid: the text after it starts at the largest position + 1
    (Qwen2-VL's rule, "the max vision position ids plus 1"); transformers 5.x advances by
    max(h, w) only, so its text would reuse temporal positions 2..5 of the video."""
    ours = mrope_positions([2, (6, 4, 4), 1], spatial_merge_size=2)
    assert ours[2:26, 0].max() == 2 + 5
    assert ours[-1].tolist() == [8, 8, 8]
    hf = hf_rope_index(tiny_qwen2_vl(), [2, (6, 4, 4), 1])
    assert torch.equal(hf[:-1], ours[:-1]) and hf[-1].tolist() == [4, 4, 4]


def test_mrope_positions_without_merge_and_empty_text():
    p = mrope_positions([0, (1, 2, 3)])
    assert p.tolist() == [[0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 1, 0], [0, 1, 1], [0, 1, 2]]
    assert mrope_positions([]).shape == (0, 3)


# --------------------------------------------------------------------------- modules


def test_rotary_embedding_gathers_what_axis_tables_computes(device):
    W = axis_frequencies(128, QWEN3_SECTIONS, base=5e6, order="interleaved")
    rotary = RotaryEmbedding(128, frequencies=W, max_position_embeddings=16).to(device)
    positions = large_positions(50, 3).reshape(2, 25, 3).to(device)
    cos, sin = rotary(positions=positions)
    ref_cos, ref_sin = axis_tables(positions, W)
    assert cos.shape == (2, 25, 64)
    assert_same(cos, ref_cos, **GPU_TABLES)
    assert_same(sin, ref_sin, **GPU_TABLES)
    if device.type == "cpu":
        assert rotary.cached_len >= int(positions.max()) + 1  # grew on demand
    else:  # no largest position read back from a GPU: rows computed from W, no growth
        assert rotary.cached_len == 16


def test_axis_rows_read_each_pair_from_its_axis_row():
    """Pair i of token n is column i of table row positions[n, pair_axes[i]] (written out
    element by element here), for float32 and float64 tables, pairs whose axes come in any
    order, batched and empty positions; a coordinate or an axis out of range is a ValueError
    naming both ranges."""
    torch.manual_seed(0)
    positions = torch.randint(0, 500, (300, 4))
    pair_axes = torch.tensor([3, 0, 0, 1, 2, 3, 1, 1, 0, 2, 2, 3], dtype=torch.int32)
    for dtype in (torch.float32, F64):
        cos, sin = torch.randn(500, 12, dtype=dtype), torch.randn(500, 12, dtype=dtype)
        rows = axis_rows(cos, sin, positions, pair_axes)
        for table, got in zip((cos, sin), rows, strict=True):
            expected = torch.tensor([[float(table[positions[n, pair_axes[i]], i])
                                      for i in range(12)] for n in range(300)], dtype=dtype)
            assert torch.equal(got, expected)
        batched = axis_rows(cos, sin, positions.reshape(3, 100, 4), pair_axes)
        assert all(torch.equal(b, r.reshape(3, 100, 12)) for b, r in zip(batched, rows, strict=True))
    empty = axis_rows(cos, sin, positions[:0], pair_axes)
    assert empty[0].shape == (0, 12) and empty[1].shape == (0, 12)
    for bad_positions, bad_axes in ((positions.clamp_max(499) + (positions == 7) * 493,
                                     pair_axes),
                                    (positions.clamp_min(1) - (positions == 9) * 10, pair_axes),
                                    (positions, pair_axes.clone().fill_(4))):
        with pytest.raises(ValueError, match=r"positions must be in \[0, 500\) \(the table's "
                                             r"rows\) and pair_axes in \[0, 4\)"):
            axis_rows(cos, sin, bad_positions, bad_axes)


@pytest.mark.parametrize("order", ["chunked", "interleaved"])
def test_module_rows_equal_the_exact_angles_compiled_and_exported(order):
    """The module's rows of multi-axis positions on the CPU (gathered from its tables by
    ``axis_rows``) equal the float64 angles' cos and sin to 1e-12 after double(), and
    ``axis_rows`` compiled (one graph) and exported gives the eager rows and asserts that
    every pair's axis is one of the positions' axes."""
    W = axis_frequencies(64, [12, 10, 10], base=1e6, order=order)
    positions = large_positions(90, 3).reshape(3, 30, 3)
    rotary = RotaryEmbedding(64, frequencies=W)
    cos64, sin64 = rotary.double()(positions=positions)
    assert cos64.dtype == F64
    torch.testing.assert_close(cos64, exact_angles(positions, W).cos(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(sin64, exact_angles(positions, W).sin(), rtol=1e-12, atol=1e-12)
    tables = (*rotary.float().tables(int(positions.max()) + 1), positions, rotary.pair_axes)
    eager = axis_rows(*tables)

    class Rows(torch.nn.Module):
        def forward(self, cos, sin, positions, pair_axes):
            return axis_rows(cos, sin, positions, pair_axes)

    compiled = torch.compile(axis_rows, fullgraph=True, backend="aot_eager")
    exported = torch.export.export(Rows(), tables).module()
    for graph in (compiled, exported):
        got = graph(*tables)
        assert torch.equal(got[0], eager[0]) and torch.equal(got[1], eager[1])
        with pytest.raises(RuntimeError, match=r"pair_axes must be in \[0, 3\)"):
            graph(*tables[:3], tables[3].clone().fill_(3))


@pytest.mark.parametrize("order", ["chunked", "interleaved"])
def test_apply_rope_with_axes_reads_the_rows_of_each_pair(order):
    """``apply_rope(x, cos, sin, positions=p, axes=)`` rotates pair i by p[axes[i]] * theta_i:
    bit for bit the rotation of the rows gathered first, with the compiled CPU loop (which
    gathers the rows, then rotates) and without it, into out= and in place, for (seq, k) and
    (batch, seq, k) positions. CPU only: it switches the compiled loop off and on."""
    from ropelib import native
    W = axis_frequencies(64, [12, 10, 10], base=1e6, order=order)
    rotary = RotaryEmbedding(64, frequencies=W)
    positions = large_positions(60, 3).reshape(2, 30, 3)
    cos, sin = rotary.tables(int(positions.max()) + 1)
    axes = rotary.pair_axes
    assert torch.equal(axes, axis_of_pairs(64, [12, 10, 10], order))
    x = torch.randn(2, 4, 30, 64)
    for p in (positions[0], positions):
        rows = rotary(positions=p)
        rows = (rows[0][None, None], rows[1][None, None]) if p.ndim == 2 else (
            rows[0][:, None], rows[1][:, None])
        previous = native.set_enabled(False)
        try:  # the eager paths: rows gathered by torch, then rotated
            assert torch.equal(apply_rope(x, cos, sin, positions=p, axes=axes, layout="half"),
                               apply_rope(x, *rows, layout="half"))
        finally:
            native.set_enabled(previous)
        expected = apply_rope(x, *rows, layout="half")
        assert torch.equal(apply_rope(x, cos, sin, positions=p, axes=axes, layout="half"),
                           expected)
        out = torch.empty_like(x)
        apply_rope(x, cos, sin, positions=p, axes=axes, layout="half", out=out)
        in_place = x.clone()
        apply_rope(in_place, cos, sin, positions=p, axes=axes, layout="half", out=in_place)
        assert torch.equal(out, expected) and torch.equal(in_place, expected)


@pytest.mark.parametrize("order", ["chunked", "interleaved"])
def test_apply_rope_with_axes_equals_the_float64_angles(order, device):
    """Pair i turned by p[axes[i]] * theta_i from double tables, to 1e-12 of exact angles."""
    W = axis_frequencies(64, [12, 10, 10], base=1e6, order=order)
    rotary = RotaryEmbedding(64, frequencies=W).double().to(device)
    positions = large_positions(60, 3).reshape(2, 30, 3)
    cos64, sin64 = rotary.tables(int(positions.max()) + 1)
    x64 = torch.randn(2, 4, 30, 64, dtype=F64)
    exact = exact_angles(positions, W)[:, None].expand(2, 4, 30, 32)
    got = apply_rope(x64.to(device), cos64, sin64, positions=positions.to(device),
                     axes=rotary.pair_axes.to(device), layout="interleaved")
    assert got.device == device
    torch.testing.assert_close(got.cpu(), rope_by_pairs(x64, exact, "interleaved"),
                               rtol=1e-12, atol=1e-12)


def test_apply_rope_with_axes_is_differentiable(device):
    """Gradients of the rotation through positions and axes: gradcheck in float64 for x and
    the tables (the table grads add up in the rows the pairs were read from), the eager
    training step equal to the rows gathered first, a torch.func grad, and one compiled
    graph equal to eager."""
    torch.manual_seed(3)
    axes = torch.tensor([0, 1, 1, 2, 0, 2], device=device)
    positions = torch.randint(0, 9, (2, 5, 3)).to(device)
    x = torch.randn(2, 2, 5, 14, dtype=F64).to(device).requires_grad_(True)
    cos = torch.randn(9, 6, dtype=F64).to(device).requires_grad_(True)
    sin = torch.randn(9, 6, dtype=F64).to(device).requires_grad_(True)

    def fused(x, cos, sin):
        return apply_rope(x, cos, sin, positions=positions, axes=axes, rotary_dim=12)

    def gathered(x, cos, sin):
        index = positions.index_select(-1, axes)[:, None]
        pair = torch.arange(6, device=device)
        return apply_rope(x, cos[index, pair], sin[index, pair], rotary_dim=12)

    assert torch.autograd.gradcheck(fused, (x, cos, sin))
    g = torch.randn(2, 2, 5, 14, dtype=F64).to(device)
    for inputs in ((x, cos, sin), (x, cos.detach(), sin.detach())):
        got = torch.autograd.grad(fused(*inputs), [t for t in inputs if t.requires_grad], g)
        want = torch.autograd.grad(gathered(*inputs), [t for t in inputs if t.requires_grad], g)
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    func_grad = torch.func.grad(lambda t: (fused(t, cos, sin) * g).sum())(x.detach())
    torch.testing.assert_close(func_grad, torch.autograd.grad(fused(x, cos, sin), x, g)[0])
    x32, cos32, sin32 = x.detach().float(), cos.detach().float(), sin.detach().float()
    compiled = torch.compile(fused, fullgraph=True)
    torch.testing.assert_close(compiled(x32, cos32, sin32), fused(x32, cos32, sin32))


def test_apply_rope_with_axes_repeat_last_clamps_each_coordinate():
    """CPU only: the ValueError for a position past the table is read on the host (on a GPU
    it is a device-side assert)."""
    cos, sin = generate_rope_embeddings(10, 8)
    positions = torch.tensor([[3, 12, 9], [15, 2, 11]])
    axes = torch.tensor([0, 1, 2, 2])
    x = torch.randn(1, 2, 2, 8)
    clamped = apply_rope(x, cos, sin, positions=positions.clamp_max(9), axes=axes)
    assert torch.equal(apply_rope(x, cos, sin, positions=positions, axes=axes,
                                  short_table="repeat_last"), clamped)
    with pytest.raises(ValueError, match=r"positions go up to 15 but the cos/sin table has "
                                         r"only 10 rows"):
        apply_rope(x, cos, sin, positions=positions, axes=axes)


def test_rotary_embedding_computes_rows_of_mixed_frequencies(device):
    W = torch.randn(4, 2, dtype=F64)
    rotary = RotaryEmbedding(8, frequencies=W).to(device)
    positions = torch.randint(0, 30, (6, 2))
    cos, sin = rotary(positions=positions.to(device))
    assert cos.device == device
    torch.testing.assert_close(cos.cpu().to(F64), exact_angles(positions, W).cos(), rtol=1e-6,
                               atol=1e-7)
    # the diagonal cache turns each pair by sum_a W[i, a]
    diag_cos, _ = rotary(seq_len=5)
    torch.testing.assert_close(diag_cos.cpu().to(F64), exact_angles(
        torch.arange(5)[:, None].expand(5, 2), W).cos(), rtol=1e-6, atol=1e-7)


def test_text_on_the_diagonal_is_1d_rope_exactly(device):
    """M-RoPE with t = h = w = m is 1D RoPE: the module equals the 1D module bit for bit (on
    a GPU within float32 rounding: the gathered rows and the offset may take other kernels)."""
    torch.manual_seed(0)
    mrope = StandardAttentionWithRoPE(256, 2, layout="half", bias=False,
                                      frequencies=axis_frequencies(128, QWEN2_SECTIONS, base=1e6))
    plain = StandardAttentionWithRoPE(256, 2, layout="half", bias=False, base=1e6)
    plain.load_state_dict(mrope.state_dict())
    mrope, plain = mrope.to(device), plain.to(device)
    x = torch.randn(2, 12, 256).to(device)
    diagonal = (3000 + torch.arange(12, device=device))[:, None].expand(12, 3)
    assert_same(mrope(x, x, x, positions=diagonal), plain(x, x, x, offset=3000))
    assert_same(mrope(x, x, x), plain(x, x, x))  # default positions: the diagonal


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_attention_with_multi_axis_positions_equals_the_float64_reference(layout, device):
    torch.manual_seed(1)
    W = axis_frequencies(16, [2, 3, 3], base=100.0)
    module = StandardAttentionWithRoPE(32, 2, num_kv_heads=1, layout=layout,
                                       frequencies=W).to(device)
    positions = mrope_positions([2, (2, 2, 4), 3])
    n = positions.shape[0]
    x = torch.randn(2, n, 32).to(device)
    out = module(x, x, x, positions=positions.to(device), is_causal=True)
    assert out.device == device
    angles = exact_angles(positions, W)
    ref, _ = attention_module_reference(module, x, x, x, angles, angles, causal=True)
    torch.testing.assert_close(out.cpu().to(F64), ref, rtol=1e-5, atol=1e-5)
    # per-batch positions (B, N, 3)
    shifted = torch.stack([positions, positions + 7])
    out_b = module(x, x, x, positions=shifted.to(device))
    ref_b, _ = attention_module_reference(module, x, x, x, exact_angles(shifted, W),
                                          exact_angles(shifted, W))
    torch.testing.assert_close(out_b.cpu().to(F64), ref_b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_kv_cache_decoding_with_multi_axis_positions_equals_the_full_forward(layout, device):
    torch.manual_seed(2)
    W = axis_frequencies(16, [4, 2, 2], base=100.0, order="interleaved")
    module = StandardAttentionWithRoPE(64, 4, num_kv_heads=2, layout=layout,
                                       frequencies=W).double().to(device)
    positions = mrope_positions([3, (1, 2, 4), 2, (2, 2, 2), 3]).to(device)
    n, prefill = positions.shape[0], 6
    x = torch.randn(1, n, 64, dtype=F64).to(device)
    full = module(x, x, x, positions=positions, is_causal=True)
    cache = KVCache()
    steps = [module(x[:, :prefill], x[:, :prefill], x[:, :prefill],
                    positions=positions[:prefill], kv_cache=cache, is_causal=True)]
    for t in range(prefill, n):
        xt = x[:, t:t + 1]
        steps.append(module(xt, xt, xt, positions=positions[t:t + 1], kv_cache=cache,
                            is_causal=True))
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------- RoPE-Mixed


def test_rope_mixed_without_rotation_is_axial_rope():
    mixed = RoPEMixed(32, 3, base=10.0, rotate=False)
    axial = axis_frequencies(32, [8, 8], base=10.0, spectrum="per_axis")
    assert mixed.frequencies.shape == (3, 16, 2)
    for head in mixed.frequencies:
        assert torch.equal(head.detach().to(F64), axial.float().to(F64))


def test_rope_mixed_init_turns_the_axial_directions_per_head():
    mixed = RoPEMixed(16, 4, generator=torch.Generator().manual_seed(0))
    W = mixed.frequencies.detach().to(F64)
    magnitude = axis_frequencies(16, [4, 4], base=10.0, spectrum="per_axis").sum(1)
    torch.testing.assert_close(W.norm(dim=-1), magnitude.expand(4, 8), rtol=1e-6, atol=0)
    direction = torch.atan2(W[..., 1], W[..., 0])  # from the y axis
    # first half along phi, second half along phi + pi/2
    turn = torch.remainder(direction[:, 4:] - direction[:, :4], 2 * math.pi)
    torch.testing.assert_close(turn, torch.full_like(turn, math.pi / 2), rtol=0, atol=1e-6)
    again = RoPEMixed(16, 4, generator=torch.Generator().manual_seed(0))
    assert torch.equal(again.frequencies, mixed.frequencies)


def test_rope_mixed_tables_and_gradcheck_reach_w(device):
    mixed = RoPEMixed(8, 2, generator=torch.Generator().manual_seed(3)).double().to(device)
    positions = torch.tensor([[0, 0], [1, 2], [3, 1], [2, 5]], device=device)
    cos, sin = mixed(positions)
    assert cos.shape == (1, 2, 4, 4) and cos.dtype == F64 and cos.device == device
    for h in range(2):
        ref = exact_angles(positions.cpu(), mixed.frequencies[h].detach().cpu())
        torch.testing.assert_close(cos[0, h].cpu(), ref.cos(), rtol=1e-12, atol=1e-12)
    x = torch.randn(1, 2, 4, 8, dtype=F64).to(device)

    def rotated(W):
        cos, sin = torch.func.functional_call(mixed, {"frequencies": W}, (positions,))
        return apply_rope(x, cos, sin)

    W0 = mixed.frequencies.detach().clone().requires_grad_(True)
    assert torch.autograd.gradcheck(rotated, (W0,))
    loss = apply_rope(x, *mixed(positions)).square().sum()
    loss.backward()
    assert mixed.frequencies.grad is not None and mixed.frequencies.grad.abs().sum() > 0


def test_rope_mixed_batched_positions(device):
    mixed = RoPEMixed(8, 2).to(device)
    positions = torch.randint(0, 9, (3, 5, 2)).to(device)
    cos, _ = mixed(positions)
    assert cos.shape == (3, 2, 5, 4)
    assert_same(cos[1], mixed(positions[1])[0][0], rtol=0, atol=1e-7)


# --------------------------------------------------------------------------- bad input


BAD = {
    "sections sum": (lambda: axis_frequencies(128, [16, 24, 20]), ValueError,
                     r"sections must sum to head_dim // 2 = 64.*\[16, 24, 20\] \(sum 60\)"),
    "sections not ints": (lambda: axis_frequencies(8, [2.0, 2.0]), ValueError,
                          r"sections must be a non-empty list of positive ints"),
    "sections empty": (lambda: axis_frequencies(8, []), ValueError, r"sections"),
    "sections a number": (lambda: axis_frequencies(8, 4), TypeError, r"sections must be"),
    "interleave overflow": (lambda: axis_frequencies(16, [2, 6], order="interleaved"),
                            ValueError, r"sections \[2, 6\] do not interleave.*sections\[1\]"),
    "spectrum": (lambda: axis_frequencies(8, [4], spectrum="axial"), ValueError,
                 r"spectrum must be one of \('shared', 'per_axis'\), got 'axial'"),
    "order": (lambda: axis_frequencies(8, [4], order="mixed"), ValueError,
              r"order must be one of"),
    "odd head_dim": (lambda: axis_frequencies(7, [3]), ValueError, r"head_dim"),
    "positions last dim": (lambda: axis_tables(torch.zeros(5, 2), torch.ones(4, 3)), ValueError,
                           r"positions must have shape \(\.\.\., seq, k\) with k = 3.*\(5, 2\)"),
    "positions 1-D": (lambda: axis_tables(torch.zeros(5), torch.ones(4, 1)), ValueError,
                      r"positions must have shape"),
    "positions bool": (lambda: axis_tables(torch.zeros(5, 1, dtype=torch.bool), torch.ones(4, 1)),
                       TypeError, r"positions must hold"),
    "frequencies 1-D": (lambda: axis_tables(torch.zeros(5, 1), torch.ones(4)), ValueError,
                        r"frequencies must be a \(head_dim // 2, k\) tensor"),
    "tables dtype": (lambda: axis_tables(torch.zeros(5, 1), torch.ones(4, 1),
                                         dtype=torch.bfloat16), ValueError, r"dtype must be"),
    "module frequencies shape": (lambda: RotaryEmbedding(16, frequencies=torch.ones(4, 2)),
                                 ValueError, r"frequencies must have shape \(8, k\).*\(4, 2\)"),
    "module frequencies nan": (lambda: RotaryEmbedding(4, frequencies=torch.tensor(
        [[1.0], [float("nan")]])), ValueError, r"frequencies must be finite"),
    "module frequencies and scaling": (
        lambda: RotaryEmbedding(8, frequencies=torch.ones(4, 2),
                                scaling={"rope_type": "linear", "factor": 2.0}),
        ValueError, r"either frequencies \(multi-axis\) or scaling"),
    "module float positions": (
        lambda: RotaryEmbedding(8, frequencies=torch.ones(4, 2))(positions=torch.zeros(3, 2)),
        TypeError, r"positions must hold integer coordinates"),
    "module negative positions": (
        lambda: RotaryEmbedding(8, frequencies=torch.eye(4, 2))(
            positions=torch.tensor([[0, -1]])), ValueError, r"positions must be >= 0"),
    "module 1-D positions": (
        lambda: RotaryEmbedding(8, frequencies=torch.eye(4, 2))(positions=torch.arange(3)),
        ValueError, r"with k = 2 axes"),
    "attention positions length": (
        lambda: StandardAttentionWithRoPE(16, 2, frequencies=torch.eye(4, 2))(
            torch.zeros(1, 3, 16), torch.zeros(1, 3, 16), torch.zeros(1, 3, 16),
            positions=torch.zeros(4, 2, dtype=torch.long)),
        ValueError, r"positions must have shape \(3, 2\) or \(batch, 3, 2\).*\(4, 2\)"),
    "attention without rope": (
        lambda: StandardAttentionWithRoPE(16, 2, rope=False, frequencies=torch.eye(4, 2)),
        ValueError, r"frequencies \(multi-axis RoPE\) need rope=True"),
    "axes shape": (lambda: apply_rope(torch.zeros(1, 3, 8), *generate_rope_embeddings(4, 8),
                                      positions=torch.zeros(3, 2, dtype=torch.long),
                                      axes=torch.zeros(3, dtype=torch.long)),
                   ValueError, r"axes must have shape \(4,\).*got \(3,\)"),
    "axes range": (lambda: apply_rope(torch.zeros(1, 3, 8), *generate_rope_embeddings(4, 8),
                                      positions=torch.zeros(3, 2, dtype=torch.long),
                                      axes=torch.tensor([0, 1, 2, 0])),
                   ValueError, r"axes must be in \[0, 2\).*got values in \[0, 2\]"),
    "axes float": (lambda: apply_rope(torch.zeros(1, 3, 8), *generate_rope_embeddings(4, 8),
                                      positions=torch.zeros(3, 2, dtype=torch.long),
                                      axes=torch.zeros(4)), TypeError, r"axes"),
    "axes without positions": (
        lambda: apply_rope(torch.zeros(1, 3, 8), *generate_rope_embeddings(4, 8),
                           axes=torch.zeros(4, dtype=torch.long)),
        ValueError, r"axes needs multi-axis positions of shape \(3, k\)"),
    "axes positions shape": (
        lambda: apply_rope(torch.zeros(1, 3, 8), *generate_rope_embeddings(4, 8),
                           positions=torch.zeros(3, dtype=torch.long),
                           axes=torch.zeros(4, dtype=torch.long)),
        ValueError, r"positions with axes must have shape \(seq_len, k\) = \(3, k\).*\(3,\)"),
    "axes positions batch": (
        lambda: apply_rope(torch.zeros(2, 1, 3, 8), *generate_rope_embeddings(4, 8),
                           positions=torch.zeros(3, 3, 2, dtype=torch.long),
                           axes=torch.zeros(4, dtype=torch.long)),
        ValueError, r"\(batch, seq_len, k\) = \(2, 3, k\), got \(3, 3, 2\)"),
    "axes negative position": (
        lambda: apply_rope(torch.zeros(1, 3, 8), *generate_rope_embeddings(4, 8),
                           positions=-torch.ones(3, 2, dtype=torch.long),
                           axes=torch.zeros(4, dtype=torch.long)),
        ValueError, r"positions must be >= 0, got min -1"),
    "axes and offset": (
        lambda: apply_rope(torch.zeros(1, 3, 8), *generate_rope_embeddings(4, 8),
                           positions=torch.zeros(3, 2, dtype=torch.long), offset=1,
                           axes=torch.zeros(4, dtype=torch.long)),
        ValueError, r"pass either positions or offset"),
    "axes gathered rows": (
        lambda: apply_rope(torch.zeros(1, 3, 8), torch.ones(1, 3, 4), torch.ones(1, 3, 4),
                           positions=torch.zeros(3, 2, dtype=torch.long),
                           axes=torch.zeros(4, dtype=torch.long)),
        ValueError, r"axes selects rows of 2-D tables \(table_len, 4\)"),
    "mixed head_dim": (lambda: RoPEMixed(6), ValueError, r"head_dim must be a multiple of 4"),
    "mixed positions": (lambda: RoPEMixed(8)(torch.zeros(3, 3)), ValueError, r"k = 2 axes"),
    "segments grid": (lambda: mrope_positions([(1, 3, 4)], spatial_merge_size=2), ValueError,
                      r"h and w must be multiples of spatial_merge_size=2"),
    "segments bad": (lambda: mrope_positions([(1, 2)]), ValueError, r"\(t, h, w\) tuple"),
    "segments negative": (lambda: mrope_positions([-1]), ValueError, r"length >= 0"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_named(case):
    """CPU only: the messages do not depend on the device, and a bad position on a GPU is a
    device-side assert, not a ValueError."""
    fn, error, match = BAD[case]
    with pytest.raises(error, match=match):
        fn()


def test_one_d_behaviour_is_unchanged(device):
    rotary = RotaryEmbedding(16).to(device)
    assert rotary.num_axes == 1 and rotary.frequencies is None
    cos, _ = rotary(positions=torch.tensor([3, 1], device=device))
    assert_same(cos, generate_rope_embeddings(4, 16, device=device)[0][[3, 1]], **GPU_TABLES)
