"""Chapter 15's step kernels (ropelib.book.gpu_steps) in Triton's interpreter, against the
float64 rotation of tests/reference.py, and their byte model against a trace of what their
programs load and store (ropelib.book.triton_probe).

The interpreter rounds float32 to bfloat16 by truncation: one unit in the last place, not
half of one, hence the bfloat16 tolerance.
"""

from __future__ import annotations

import math

import pytest
import torch
from reference import angles, rope_by_pairs, thetas

from ropelib.book import gpu_steps, triton_probe
from ropelib.tables import generate_rope_embeddings

F64 = torch.float64
TOLERANCE = {torch.float32: (1e-6, 1e-6), torch.bfloat16: (2 ** -7, 1e-6),
             torch.float16: (2 ** -10, 1e-6)}


def tables(seq: int, d: int, positions=None):
    cos, sin = generate_rope_embeddings(seq, d, positions=positions)
    return cos.contiguous(), sin.contiguous()


def expected(x: torch.Tensor, layout: str, positions=None, sign: float = 1.0) -> torch.Tensor:
    seq, d = x.shape[-2:]
    positions = torch.arange(seq) if positions is None else positions
    return rope_by_pairs(x, sign * angles(positions, thetas(d)), layout)


def close(result: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype) -> None:
    assert result.dtype == dtype
    rtol, atol = TOLERANCE[dtype]
    torch.testing.assert_close(result.to(F64), reference, rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_step1_per_head_is_the_half_layout_rotation(dtype):
    """19 tokens: the last block of 8 is cut by the mask."""
    x = torch.randn(2, 3, 19, 16).to(dtype)
    cos, sin = tables(19, 16)
    close(gpu_steps.per_head(x, cos, sin, block_s=8), expected(x, "half"), dtype)


@pytest.mark.parametrize("strided", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_step2_both_loads_are_the_interleaved_rotation(strided, dtype):
    x = torch.randn(1, 2, 13, 8).to(dtype)
    cos, sin = tables(13, 8)
    close(gpu_steps.interleaved(x, cos, sin, strided=strided, block_s=4),
          expected(x, "interleaved"), dtype)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("heads_per_program", [None, 1, 3, 4])
def test_step3_rotates_q_and_k_of_different_head_counts_in_one_launch(layout, heads_per_program):
    """3 + 2 heads cut into groups of 1, 3 (a group straddling q and k), 4 (a last group past
    the last head) or all of them."""
    q = torch.randn(2, 3, 11, 8)
    k = torch.randn(2, 2, 11, 8)
    cos, sin = tables(11, 8)
    q_out, k_out = gpu_steps.blocks(q, k, cos, sin, layout=layout,
                                    heads_per_program=heads_per_program, block_s=4)
    close(q_out, expected(q, layout), torch.float32)
    close(k_out, expected(k, layout), torch.float32)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_step3_inverse_is_the_rotation_by_minus_theta_and_undoes_the_forward(layout):
    x = torch.randn(1, 2, 9, 16)
    cos, sin = tables(9, 16)
    back, none = gpu_steps.blocks(x, None, cos, sin, layout=layout, inverse=True)
    assert none is None
    close(back, expected(x, layout, sign=-1.0), torch.float32)
    forward, _ = gpu_steps.blocks(x, None, cos, sin, layout=layout)
    roundtrip, _ = gpu_steps.blocks(forward, None, cos, sin, layout=layout, inverse=True)
    torch.testing.assert_close(roundtrip, x, rtol=0, atol=1e-5)


def test_step3_reads_rows_of_each_batch_entrys_own_positions():
    """Decode: tables (batch, 1, d/2) gathered at each row's position (TABLE_B > 0)."""
    positions = torch.tensor([3, 40, 17])
    q = torch.randn(3, 4, 1, 8, dtype=torch.bfloat16)
    k = torch.randn(3, 2, 1, 8, dtype=torch.bfloat16)
    cos, sin = tables(64, 8)
    rows = cos[positions][:, None].contiguous(), sin[positions][:, None].contiguous()
    q_out, k_out = gpu_steps.blocks(q, k, *rows, layout="half")
    for b, m in enumerate(positions.tolist()):
        close(q_out[b], expected(q[b], "half", positions=torch.tensor([m])), torch.bfloat16)
        close(k_out[b], expected(k[b], "half", positions=torch.tensor([m])), torch.bfloat16)


def test_step3_writes_in_place_into_out():
    q = torch.randn(1, 2, 5, 8)
    k = torch.randn(1, 1, 5, 8)
    q_work, k_work = q.clone(), k.clone()
    cos, sin = tables(5, 8)
    q_out, k_out = gpu_steps.blocks(q_work, k_work, cos, sin, layout="interleaved",
                                    out=(q_work, k_work))
    assert q_out is q_work and k_out is k_work
    close(q_work, expected(q, "interleaved"), torch.float32)
    close(k_work, expected(k, "interleaved"), torch.float32)


def bytes_asked(trace, *tensors) -> int:
    return sum(trace.bytes(t) for t in tensors)


@pytest.mark.parametrize("heads_per_program", [None, 1, 2, 4])
def test_the_byte_model_is_what_the_programs_load_and_store(heads_per_program):
    """The trace counts every element a program loads or stores: x and the result once, and
    the tables once per program that needs them; the model must say the same."""
    q = torch.randn(2, 3, 12, 8, dtype=torch.bfloat16)
    k = torch.randn(2, 2, 12, 8, dtype=torch.bfloat16)
    cos, sin = tables(12, 8)
    with triton_probe.trace_memory() as trace:
        q_out, k_out = gpu_steps.blocks(q, k, cos, sin, layout="half",
                                        heads_per_program=heads_per_program, block_s=4)
    groups = 1 if heads_per_program is None else math.ceil(5 / heads_per_program)
    batch = q.shape[0]  # each batch entry's programs read the rows again
    by_hand = 2 * (q.numel() + k.numel()) * 2 + 2 * batch * groups * cos.numel() * 4
    assert bytes_asked(trace, q, k, q_out, k_out, cos, sin) == by_hand
    assert by_hand == gpu_steps.predicted_bytes("per block", 2, 5, 12, 8, 2,
                                                heads_per_program=heads_per_program)
    with triton_probe.trace_memory() as trace:
        out = gpu_steps.per_head(q, cos, sin, block_s=4)
    per_head = 2 * q.numel() * 2 + 2 * batch * 3 * cos.numel() * 4
    assert bytes_asked(trace, q, out, cos, sin) == per_head
    assert per_head == gpu_steps.predicted_bytes("per head", 2, 3, 12, 8, 2)


def test_predicted_bytes_gives_the_chapters_ratios():
    copy = gpu_steps.predicted_bytes("copy", 4, 32, 4096, 128, 2)
    assert copy == 2 * 4 * 32 * 4096 * 128 * 2
    assert gpu_steps.predicted_bytes("per head", 4, 32, 4096, 128, 2) == 2 * copy
    assert gpu_steps.predicted_bytes("per head", 4, 32, 4096, 128, 4) == 1.5 * 2 * copy
    assert gpu_steps.predicted_bytes("per block", 4, 32, 4096, 128, 2, 4) == 1.25 * copy
    with pytest.raises(ValueError, match="design"):
        gpu_steps.predicted_bytes("per token", 1, 1, 1, 2, 2)


def test_source_hash_names_the_kernels_source(monkeypatch):
    first = gpu_steps.source_hash()
    assert len(first) == 16 and int(first, 16) >= 0
    assert gpu_steps.source_hash() == first

    def other(X):
        pass

    monkeypatch.setattr(gpu_steps, "KERNELS", gpu_steps.KERNELS[:2] + (other,))
    assert gpu_steps.source_hash() != first


@pytest.mark.parametrize("call, error, match", [
    (lambda x, c: gpu_steps.per_head(x.view(6, 6, 8), c, c), ValueError, "batch, heads"),
    (lambda x, c: gpu_steps.per_head(x.double(), c, c), TypeError, "float32, bfloat16"),
    (lambda x, c: gpu_steps.per_head(x.transpose(1, 2), c, c), ValueError, "contiguous"),
    (lambda x, c: gpu_steps.per_head(x, c.double(), c), ValueError, "cos must be a contiguous"),
    (lambda x, c: gpu_steps.per_head(x, c[:3], c), ValueError, r"\(6, 4\)"),
    (lambda x, c: gpu_steps.per_head(x, c, c, block_s=6), ValueError, "block_s"),
    (lambda x, c: gpu_steps.per_head(x[..., :6].contiguous(), c[:, :3].contiguous(), c),
     ValueError, "power of two"),
    (lambda x, c: gpu_steps.per_head("x", c, c), TypeError, "torch.Tensor"),
    (lambda x, c: gpu_steps.blocks(x, x[:, :, :5].contiguous(), c, c, layout="half"),
     ValueError, "k must be"),
    (lambda x, c: gpu_steps.blocks(x, None, c, c, layout="neox"), ValueError, "layout"),
    (lambda x, c: gpu_steps.blocks(x, None, c, c, layout="half", heads_per_program=0),
     ValueError, "heads_per_program"),
    (lambda x, c: gpu_steps.blocks(x, None, c, c, layout="half",
                                   out=(torch.empty(1), None)), ValueError, r"out\[0\]"),
])
def test_bad_arguments_raise_naming_the_argument(call, error, match):
    x = torch.randn(2, 3, 6, 8)
    cos = tables(6, 8)[0]
    with pytest.raises(error, match=match):
        call(x, cos)
