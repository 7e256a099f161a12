"""ropelib.book.bench: every candidate it times computes what its name says, and the timer's rules.

The reference for every formulation is the explicit rotation in float64 (tests/reference.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from reference import angles, rope_by_pairs, thetas

from ropelib import native
from ropelib.book import bench

ROOT = Path(__file__).resolve().parent.parent

F64 = torch.float64
LAYOUTS = ["interleaved", "half"]


def expected_rotation(x: torch.Tensor, layout: str) -> torch.Tensor:
    seq, dim = x.shape[-2:]
    return rope_by_pairs(x.to(F64), angles(torch.arange(seq), thetas(dim)), layout)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_forward_candidates_rotate_or_copy(layout):
    x = torch.randn(2, 3, 16, 8)
    cases = bench.forward_candidates(x, layout)
    assert {"clone", "copy_", "ropelib", "ropelib out=", *bench.PEERS[layout]} <= set(cases)
    expected = expected_rotation(x, layout)
    for name, fn in cases.items():
        if name.startswith("clone") or name == "copy_":
            assert torch.equal(fn(), x), name
        elif name != "ropelib in place":  # rotates its own scratch copy again on every call
            torch.testing.assert_close(fn().to(F64), expected, rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_backward_and_training_forward_candidates(layout):
    """Training forwards record autograd, every forward + backward runs, and the gradient
    through ropelib and each peer is the inverse rotation of the incoming gradient."""
    x = torch.randn(2, 3, 16, 8)
    forwards = bench.training_forward_candidates(x, layout)
    steps = bench.backward_candidates(x, layout)
    names = ["clone", "autograd floor", "ropelib", *bench.PEERS[layout]]
    assert set(forwards) == {f"{n} fwd" for n in names}
    assert set(steps) == {f"{n} fwd+bwd" for n in names}
    for name in names:
        y = forwards[f"{name} fwd"]()
        assert y.requires_grad and y.shape == x.shape, name
        steps[f"{name} fwd+bwd"]()
    grad = torch.randn_like(x)
    leaf, fns = bench._grad_forwards(x, layout)
    fns["autograd floor"]().backward(grad)
    assert leaf.grad.shape == x.shape  # the floor's gradient is uninitialized memory
    seq, dim = x.shape[-2:]
    inverse = rope_by_pairs(grad.to(F64), -angles(torch.arange(seq), thetas(dim)), layout)
    for name in names[2:]:
        leaf, fns = bench._grad_forwards(x, layout)
        fns[name]().backward(grad)
        torch.testing.assert_close(leaf.grad.to(F64), inverse, rtol=1e-5, atol=1e-5, msg=name)


def test_time_round_robin_medians_and_arguments():
    calls = {"a": 0, "b": 0}

    def count(name):
        def fn():
            calls[name] += 1
        return fn

    medians = bench.time_round_robin({"a": count("a"), "b": count("b")}, torch.device("cpu"),
                                     repeats=3, warmup=1, min_sample_s=0)
    assert set(medians) == {"a", "b"} and all(t > 0 for t in medians.values())
    # warm-up, the sizing call, then per sample an untimed call and one timed call
    assert calls == {"a": 1 + 1 + 3 * 2, "b": 1 + 1 + 3 * 2}
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        bench.time_round_robin({"a": count("a")}, torch.device("cpu"), repeats=0)


def test_bytes_moved_is_a_read_and_a_write():
    assert bench.bytes_moved(torch.zeros(4, 8)) == 2 * 32 * 4
    assert bench.bytes_moved(torch.zeros(4, 8, dtype=torch.bfloat16)) == 2 * 32 * 2


def test_mrope_candidates_rotate_by_the_multi_axis_angles():
    """ropelib's M-RoPE (rows read in the loop, gathered first, or given) and the
    written-out HF peer rotate x by sum_a p_a W[i, a] (float64 reference), and the peer is
    what transformers computes."""
    from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig
    from transformers.models.qwen2_vl.modeling_qwen2_vl import (
        Qwen2VLRotaryEmbedding,
        apply_rotary_pos_emb,
    )

    from ropelib.multiaxis import axis_frequencies, mrope_positions

    sections, base = [2, 3, 3], 1e6
    positions = mrope_positions([3, (1, 4, 6), 2, (2, 2, 2)], spatial_merge_size=2) + 1000
    x = torch.randn(1, 2, positions.shape[0], 16)
    cases = bench.mrope_candidates(x, positions, sections, base=base)
    assert set(cases) == {"clone", "copy_", "ropelib M-RoPE", "ropelib M-RoPE, rows first",
                          "ropelib M-RoPE, rows given", "hf_mrope"}
    W = axis_frequencies(16, sections, base=base)
    expected = rope_by_pairs(x.to(F64), positions.to(F64) @ W.T, "half")
    for name, fn in cases.items():
        if name in ("clone", "copy_"):
            assert torch.equal(fn(), x), name
        elif name == "hf_mrope":  # float32 angles near t = 1000: about 1e-4 off
            torch.testing.assert_close(fn().to(F64), expected, rtol=0, atol=1e-3, msg=name)
        else:
            torch.testing.assert_close(fn().to(F64), expected, rtol=1e-5, atol=1e-5, msg=name)
    config = Qwen2VLTextConfig(hidden_size=32, num_attention_heads=2, num_key_value_heads=2,
                               num_hidden_layers=1, intermediate_size=8, vocab_size=8,
                               bos_token_id=None, eos_token_id=None, pad_token_id=None,
                               rope_parameters={"rope_type": "default", "rope_theta": base,
                                                "mrope_section": sections})
    hf = Qwen2VLRotaryEmbedding(config)
    cos, sin = hf(x, positions.T[:, None, :])
    hf_q, _ = apply_rotary_pos_emb(x, x, cos, sin)
    torch.testing.assert_close(cases["hf_mrope"](), hf_q, rtol=0, atol=1e-6)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_eager_candidates_run_without_the_compiled_loop(layout, monkeypatch):
    """ropelib's paths with the loop switched off rotate like the reference, the loop is
    really off while they run (a native.rotate call would fail), and on again after."""
    x = torch.randn(2, 3, 16, 8)
    cases = bench.eager_candidates(x, layout)
    assert list(cases) == [f"{p} (eager)" for p in bench.ROPELIB_PATHS]
    was_on = native.set_enabled(True)

    def refuse(*args, **kwargs):
        raise AssertionError("the compiled loop ran")

    monkeypatch.setattr(native, "run", refuse)
    expected = expected_rotation(x, layout)
    for name in ("ropelib (eager)", "ropelib out= (eager)"):
        torch.testing.assert_close(cases[name]().to(F64), expected, rtol=1e-5, atol=1e-5)
    assert native.set_enabled(was_on) is True    # restored after each call


def test_fused_loop_bytes_is_a_copy_plus_float32_half_tables():
    for dtype, e in ((torch.float32, 4), (torch.bfloat16, 2)):
        x = torch.zeros(2, 3, 10, 8, dtype=dtype)
        assert bench.fused_loop_bytes(x) == 2 * 480 * e + 2 * 10 * 4 * 4


def test_stored_tables_read_runs_titles_and_rows(tmp_path):
    text = ("# a comment\n\n## Run 1 (commit abc)\nforward, half\n"
            "formulation                           median us       / copy_    GB/s\n"
            "copy_                                      68.1          1.00    3942\n"
            "HF eager (rotate_half)                    783.5         11.51     343\n"
            "\n## Run 2\nforward, half\nformulation   median us  / copy_  GB/s\n"
            "copy_     60.0   1.00   4000\n  RoPE's share: 6.6%\n")
    path = tmp_path / "results.txt"
    path.write_text(text)
    tables = bench.stored_tables(path)
    assert tables == {("Run 1", "forward, half"): {"copy_": (68.1, 1.0),
                                                    "HF eager (rotate_half)": (783.5, 11.51)},
                      ("Run 2", "forward, half"): {"copy_": (60.0, 1.0)}}
    path.write_text("no tables\n")
    with pytest.raises(ValueError, match="no table found"):
        bench.stored_tables(path)


def test_stored_tables_read_the_h200_file():
    tables = bench.stored_tables(ROOT / "benchmarks" / "results" / "2026-11-26-h200.txt")
    row = tables[("Run 4", "forward, half, torch.bfloat16, (4, 32, 4096, 128) stored as "
                           "(B, H, S, D)")]
    assert row["copy_"] == (68.0, 1.0) and row["HF compiled"] == (69.1, 1.02)
