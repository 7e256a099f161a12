"""ropelib.book.gpu_runs: stored runs of chapter 15's step kernels (refused when the kernels'
source changed), the readers of the H200 measurements made before the step kernels existed,
and the steps the chapter draws from either."""

from __future__ import annotations

import math

import pytest
import torch

from ropelib.book import gpu_runs, gpu_steps


def a_run(**meta) -> gpu_runs.StepRun:
    header = {"date": "2026-12-01", "device": "cuda: NVIDIA H200", "torch": "2.13.0",
              "triton": "3.9.0", "commit": "abc1234", "kernels-sha256": gpu_steps.source_hash(),
              "shape": "(4, 32, 4096, 128)", "qk heads": "(32, 8)", "decode rows": "64",
              "timer": "do_bench"} | meta
    tuned = gpu_runs.config_text(16, 4, 8)
    timings = [gpu_runs.Timing("copy_", "bfloat16", "", "", 68.0, 68.0, 0.0)]
    for block_s, ratio in ((8, 2.0), (16, 2.1)):
        timings.append(gpu_runs.Timing("step 1: tables per head", "bfloat16", "half",
                                       gpu_runs.config_text(block_s, None, 4), 68.0 * ratio,
                                       68.0, 0.01))
    timings.append(gpu_runs.Timing(gpu_runs.STEP4, "bfloat16", "half", tuned, 72.0, 68.0, 0.01))
    timings.append(gpu_runs.Timing(gpu_runs.STEP4, "bfloat16", "half",
                                   gpu_runs.config_text(32, 2, 4), 80.0, 68.0, 0.01))
    timings.append(gpu_runs.Timing(gpu_runs.STEP4, "bfloat16", "interleaved", "x failed: E",
                                   math.nan, 68.0, math.nan))
    return gpu_runs.StepRun(header, timings)


def test_a_run_survives_its_text():
    run = a_run()
    back = gpu_runs.parse_step_run(gpu_runs.format_step_run(run))
    assert back.meta == run.meta
    assert len(back.timings) == len(run.timings)
    for a, b in zip(back.timings, run.timings, strict=True):
        assert (a.case, a.dtype, a.layout, a.config) == (b.case, b.dtype, b.layout, b.config)
        assert a.us == pytest.approx(b.us, nan_ok=True)
    assert back.find("step 1: tables per head", "bfloat16")[1].ratio == pytest.approx(2.1)


def test_a_stored_run_of_other_kernels_is_refused(tmp_path):
    good = tmp_path / "2026-12-01-nvidia-h200-gpu-steps.txt"
    good.write_text(gpu_runs.format_step_run(a_run()))
    assert gpu_runs.read_step_run(good).meta["commit"] == "abc1234"
    assert len(gpu_runs.step_runs(tmp_path)) == 1
    stale = tmp_path / "2026-11-30-nvidia-h200-gpu-steps.txt"
    stale.write_text(gpu_runs.format_step_run(a_run(**{"kernels-sha256": "0123456789abcdef"})))
    with pytest.raises(ValueError, match="0123456789abcdef.*rerun benchmarks/bench_gpu_steps"):
        gpu_runs.read_step_run(stale)
    with pytest.raises(ValueError, match="belong to other code"):
        gpu_runs.step_runs(tmp_path)
    dry = tmp_path / "dry.txt"
    dry.write_text(gpu_runs.format_step_run(a_run(device="cpu (Triton's interpreter)")))
    with pytest.raises(ValueError, match="dry run is no measurement"):
        gpu_runs.read_step_run(dry)


@pytest.mark.parametrize("text, match", [
    ("# date 2026\n", "'# key: value'"),
    ("# date: 2026\na,b\n", "expected the columns"),
    ("# date: 2026\n" + ",".join(gpu_runs.COLUMNS) + "\ncopy_,bfloat16\n", "7 comma-separated"),
    ("# date: 2026\n", "no table"),
])
def test_a_malformed_run_is_refused_with_the_line(text, match):
    with pytest.raises(ValueError, match=match):
        gpu_runs.parse_step_run(text)


def test_run_steps_takes_the_tuned_launch_for_step_4_and_medians_elsewhere():
    points = {(p.step, p.layout): p for p in gpu_runs.run_steps(a_run())}
    step1 = points["step 1: tables per head", "half"]
    assert step1.measured == (2.0, 2.1) and step1.shown == pytest.approx(2.05)
    assert step1.predicted == 2.0
    step4 = points[gpu_runs.STEP4, "half"]
    assert step4.shown == pytest.approx(72 / 68) and len(step4.measured) == 2
    assert step4.predicted == 1.25
    assert (gpu_runs.STEP4, "interleaved") not in points  # failed: no point


def test_the_design_files_are_read_as_written():
    designs = gpu_runs.read_designs()
    assert len(designs) == 116
    first = designs[0]
    assert (first.design, first.dtype, first.layout, first.settings, first.storage,
            first.us, first.ratio) == ("1-per-head-tables", "bfloat16", "half",
                                       (("BM", 8),), "BHSD", 144.6, 2.02)
    bshd = [t for t in designs if t.design == "1-per-head-tables" and t.storage == "BSHD"]
    assert [(t.layout, t.dtype, t.ratio) for t in bshd] == [
        ("half", "bfloat16", 1.91), ("interleaved", "bfloat16", 16.35),
        ("half", "float32", 1.45), ("interleaved", "float32", 8.56)]
    two = [t for t in designs if t.design == "2-tables-once-per-block"
           and t.settings == (("BM", 64), ("warps", 8)) and t.dtype == "bfloat16"
           and t.layout == "interleaved"]
    assert [(t.storage, t.us, t.ratio) for t in two] == [("BHSD", 101.3, 1.36),
                                                          ("BSHD", 99.1, 1.33)]
    assert gpu_runs.read_design_decode() == {"eager launch": 42.4, "graph replay": 14.9,
                                             "rotations in one graph": 32.0,
                                             "each in one graph": 2.36}


def test_the_bench_gpu_results_are_read_as_written():
    runs = gpu_runs.read_bench_gpu()
    assert list(runs) == ["Run 1", "Run 2", "Run 4", "Run 5"]
    run4 = runs["Run 4"]
    table = run4["forward, half, torch.bfloat16, (4, 32, 4096, 128) stored as (B, H, S, D)"]
    assert table["copy_"] == [68.0, 1.0, 3946.0]
    assert table["kernel alone (no Python checks)"] == [72.2, 1.06, 3717.0]
    decode = run4["decode step, 64 rows at their own positions, q 32 heads, k 8, half, "
                  "torch.bfloat16"]
    assert decode["ropelib apply_rope_qk"] == [167.6, 18.11]
    layer = run4["attention layer forward, width 4096, GQA 32/8, causal, 4096 tokens, "
                 "torch.bfloat16"]
    assert set(layer) == {"module, RoPE", "module, no RoPE", "module compiled, RoPE",
                          "HF LlamaAttention (SDPA), RoPE"}
    failed = runs["Run 2"]["decode step, 64 rows at their own positions, q 32 heads, k 8, "
                           "half, torch.bfloat16"]["ropelib apply_rope_qk"]
    assert failed[0] == 440.3 and failed[1].startswith("capture failed: RuntimeError")
    sweep = runs["Run 1"]["sweep"]["bfloat16 interleaved"]
    assert sweep["default"] == ("(32, 32, 4)", 1.44)
    assert sweep["best"][0] == ("(16, 4, 8)", 1.05) and len(sweep["best"]) == 4


def test_pre_kernel_steps_label_their_sources():
    points = gpu_runs.pre_kernel_steps(gpu_runs.read_designs(), gpu_runs.read_bench_gpu())
    by = {(p.step, p.dtype, p.layout): p for p in points}
    step1 = by["step 1: tables per head", "bfloat16", "half"]
    assert step1.measured == (2.02, 2.04, 2.05, 1.95) and step1.predicted == 2.0
    assert "source not kept" in step1.source
    stride = by["step 2: stride-2 loads", "float32", "interleaved"]
    assert stride.measured == (2.33, 4.33, 8.98, 9.11) and stride.predicted == 1.5
    assert not any(p.step == "step 2: rows split in registers" for p in points)
    step4 = by[gpu_runs.STEP4, "float32", "interleaved"]
    assert step4.measured == (1.10,) and "ropelib/triton_rope.py" in step4.source
    assert step4.predicted == 1.125


def test_predicted_ratio_is_one_plus_two_over_h_e():
    for dtype, e in (("bfloat16", 2), ("float32", 4)):
        for h in (1, 2, 4, 8):
            assert gpu_runs.predicted_ratio("per block", 8, dtype, h) == pytest.approx(
                1 + 2 / (h * e))
        assert gpu_runs.predicted_ratio("per head", 8, dtype) == 1 + 2 / e


def test_the_compiled_formulas_rotate_like_the_kernels(monkeypatch):
    """The formulas the benchmark compiles on a GPU, run here uncompiled on the CPU."""
    monkeypatch.setattr(torch, "compile", lambda fn: fn)
    x = torch.randn(1, 2, 8, 16, dtype=torch.bfloat16)
    cos, sin = gpu_runs.generate_rope_embeddings(8, 16)
    for case, layout, _, fn in gpu_runs._compiled_cases(x, cos, sin):
        expected = gpu_runs.apply_rope(x.double(), cos.double(), sin.double(), layout=layout)
        torch.testing.assert_close(fn().double(), expected, rtol=2 ** -7, atol=2 ** -7)
        assert case in gpu_runs.CASES


def test_measure_refuses_a_device_it_cannot_time():
    with pytest.raises(ValueError, match="device must be"):
        gpu_runs.measure("mps")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="needs a CUDA GPU"):
            gpu_runs.measure("cuda")
