"""ropelib.book.gpu_runs: stored runs of chapter 15's step kernels (refused when the kernels'
source changed), the reader of bench_gpu.py's results, and the steps the chapter draws."""

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


def test_latest_step_run_is_the_newest_file_and_none_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="bench_gpu_steps.py"):
        gpu_runs.latest_step_run(tmp_path)
    for date in ("2026-12-01", "2026-11-30"):
        (tmp_path / f"{date}-nvidia-h200-gpu-steps.txt").write_text(
            gpu_runs.format_step_run(a_run(date=date)))
    assert gpu_runs.latest_step_run(tmp_path).meta["date"] == "2026-12-01"


def test_the_stored_h200_run_is_this_source_s_and_read_as_written():
    run = gpu_runs.read_step_run(gpu_runs.RESULTS / "2026-11-27-h200-gpu-steps.txt")
    assert run.meta["device"] == "cuda: NVIDIA H200"
    copy = run.find("copy_", "bfloat16")[0]
    assert copy.us == 68.608
    replay = run.find("decode: CUDA graph replay")[0]
    assert replay.us == 12.064 and math.isnan(replay.baseline_us)
    assert len(run.find(gpu_runs.STEP4, "float32", "interleaved")) == 12


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


def test_a_results_file_of_one_run_is_read_as_written():
    run = gpu_runs.read_bench_run("2026-11-27-h200-run4.txt")
    decode = run["decode step, 64 rows at their own positions, q 32 heads, k 8, half, "
                 "torch.bfloat16"]
    assert decode["ropelib apply_rope_qk positions out="] == [47.6, 9.28, 4.95]
    assert decode["HF eager"] == [169.9, 36.16, 28.01]
    module = run["attention module decode step, 64 rows, width 4096, GQA 32/8, "
                 "torch.bfloat16, cache of 4096 slots (cache_position)"]
    assert module["without RoPE"] == [564.9, 332.32, 324.05]
    assert run["forward + backward, half, torch.bfloat16, (4, 32, 4096, 128)"][
        "flash-attn apply_rotary"] == ["failed"]
    assert "" not in gpu_runs.read_bench_gpu()  # a file of runs has no run ""


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
