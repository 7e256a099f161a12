"""ropelib.book.triton_probe: the interpreter's memory trace and the PTX load counts that
chapter 15 shows, checked on kernels whose accesses are known by construction."""

from __future__ import annotations

import pytest
import torch

from ropelib.book import gpu_steps, triton_probe
from ropelib.tables import generate_rope_embeddings


def test_trace_records_each_programs_tile_of_step_1():
    """Step 1 on x (2, 3, 10, 8), 4 tokens a program: program (t, r) touches tokens
    4t .. 4t + 3 (cut at 10) of row r = b * 3 + h, every channel, and those tokens' rows of
    cos and sin."""
    x = torch.randn(2, 3, 10, 8)
    cos, sin = generate_rope_embeddings(10, 8)
    with triton_probe.trace_memory() as trace:
        out = gpu_steps.per_head(x, cos, sin, block_s=4)
    assert sorted(trace.programs()) == [(t, r, 0) for t in range(3) for r in range(6)]
    for t, r, _ in trace.programs():
        tokens = torch.zeros(10, dtype=torch.bool)
        tokens[4 * t:4 * t + 4] = True
        want = torch.zeros(2, 3, 10, 8, dtype=torch.bool)
        want[r // 3, r % 3, tokens] = True
        assert torch.equal(trace.touched(x, (t, r, 0), "load"), want)
        assert torch.equal(trace.touched(out, (t, r, 0), "store"), want)
        assert not trace.touched(out, (t, r, 0), "load").any()
        assert torch.equal(trace.touched(cos, (t, r, 0)), tokens[:, None].expand(10, 4))
    assert trace.bytes(x, "load") == x.nbytes and trace.bytes(x, "store") == 0
    assert trace.bytes(out) == out.nbytes
    assert trace.bytes(sin) == 6 * sin.nbytes  # once per (batch, head) row
    owner = trace.owners(out)
    assert owner.shape == (2, 3, 10) and (owner >= 0).all()
    assert owner.unique().numel() == 18


def test_trace_sees_nothing_outside_its_block_and_unwraps_afterwards():
    from triton.runtime.interpreter import interpreter_builder

    x = torch.randn(1, 1, 4, 8)
    cos, sin = generate_rope_embeddings(4, 8)
    gpu_steps.per_head(x, cos, sin)  # before: not recorded
    with triton_probe.trace_memory() as trace:
        pass
    assert trace.programs() == []
    assert "create_masked_load" not in vars(interpreter_builder)
    gpu_steps.per_head(x, cos, sin)  # after: still runs


def test_owners_refuses_overlapping_tiles():
    x = torch.randn(1, 2, 4, 8)
    cos, sin = generate_rope_embeddings(4, 8)
    with triton_probe.trace_memory() as trace:
        gpu_steps.per_head(x, cos, sin)
    with pytest.raises(ValueError, match="accessed rows another program accessed"):
        trace.owners(cos, "load")  # every head's program reads the same table rows
    with pytest.raises(ValueError, match="contiguous"):
        trace.bytes(x.transpose(1, 2))


def test_ptx_counts_scalar_loads_for_stride_2_and_vectors_for_split_rows():
    """bfloat16, 16 tokens x 128 channels a program, 4 warps: 16 elements of x per thread;
    stride 2 loads them one at a time (2 bytes), split rows in 2 loads of 16 bytes; the
    float32 table block (2 x 16 x 64) is 4 loads of 16 bytes per thread in both."""
    signature = {"X": "*bf16", "OUT": "*bf16", "COS": "*fp32", "SIN": "*fp32", "SEQ": "i32"}
    counts = {s: triton_probe.ptx_loads(gpu_steps.COMPILED["kernel_interleaved"], signature,
                                        {"HEAD_DIM": 128, "BLOCK_S": 16, "STRIDED": s})
              for s in (True, False)}
    assert counts[True] == {"ld.global.b16": 16, "st.global.b16": 16, "ld.global.v4.b32": 4}
    assert counts[False] == {"ld.global.v4.b32": 6, "st.global.v4.b32": 2}


def test_ptx_loads_names_a_missing_or_unknown_argument():
    with pytest.raises(ValueError, match="missing .*SEQ"):
        triton_probe.ptx_loads(gpu_steps.COMPILED["kernel_per_head"],
                               {"X": "*bf16", "OUT": "*bf16", "COS": "*fp32", "SIN": "*fp32"},
                               {"HEAD_DIM": 128, "BLOCK_S": 16})
    with pytest.raises(ValueError, match=r"unknown \['O'\]"):
        triton_probe.ptx_loads(gpu_steps.COMPILED["kernel_per_head"],
                               {"X": "*bf16", "O": "*bf16", "OUT": "*bf16", "COS": "*fp32",
                                "SIN": "*fp32", "SEQ": "i32"},
                               {"HEAD_DIM": 128, "BLOCK_S": 16})


def test_resources_match_the_registers_the_disassembly_names():
    """The register count read from the binary covers every register its SASS names (the
    disassembly by nvdisasm, a second tool): at least the highest Rn + 1, and at most 4
    more (the assembler reserves a few, and a 64-bit pair names only its first register).
    The stride-2 kernel holds a layout conversion in shared memory, the split one none;
    both need more registers for a taller tile."""
    import re
    import subprocess
    import tempfile
    from pathlib import Path

    import triton

    kernel = gpu_steps.COMPILED["kernel_interleaved"]
    signature = {"X": "*bf16", "OUT": "*bf16", "COS": "*fp32", "SIN": "*fp32", "SEQ": "i32"}
    nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    for strided in (True, False):
        registers = []
        for block_s in (8, 64):
            constants = {"HEAD_DIM": 128, "BLOCK_S": block_s, "STRIDED": strided}
            found = triton_probe.resources(kernel, signature, constants)
            binary = triton_probe._compile(kernel, signature, constants, 4).asm["cubin"]
            with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
                file.write(binary)
                file.flush()
                sass = subprocess.run([str(nvdisasm), file.name], check=True,
                                      capture_output=True, text=True).stdout
            highest = max(int(n) for n in re.findall(r"\bR(\d+)\b", sass))
            assert highest + 1 <= found["registers"] <= highest + 5, (found, highest)
            assert (found["shared"] > 0) == strided, found
            registers.append(found["registers"])
        assert registers[0] < registers[1]


def test_resources_names_a_missing_argument():
    with pytest.raises(ValueError, match="missing .*SEQ"):
        triton_probe.resources(gpu_steps.COMPILED["kernel_per_head"],
                               {"X": "*bf16", "OUT": "*bf16", "COS": "*fp32", "SIN": "*fp32"},
                               {"HEAD_DIM": 128, "BLOCK_S": 16})
