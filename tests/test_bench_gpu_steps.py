"""benchmarks/bench_gpu_steps.py must not crash on the GPU it was written for: its dry run
executes every case once on the CPU, in Triton's interpreter (the CUDA graph replay needs a
GPU and is the one part left out), and writes a file the chapter's reader parses."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

from ropelib.book import gpu_runs, gpu_steps

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_gpu_steps.py"


def load_script():
    spec = importlib.util.spec_from_file_location("bench_gpu_steps", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dry_run_runs_every_case_and_writes_a_readable_run(tmp_path):
    out = tmp_path / "dry.txt"
    assert load_script().main(["--dry-run", "--out", str(out)]) == 0
    run = gpu_runs.parse_step_run(out.read_text())
    assert run.meta["kernels-sha256"] == gpu_steps.source_hash()
    assert run.meta["device"].startswith("cpu")
    failed = [t for t in run.timings if "failed" in t.case or "failed" in t.config]
    assert not failed, failed
    seen = {t.case for t in run.timings}
    on_a_gpu_only = {"HF formula compiled", "GPT-J stack compiled", "decode: CUDA graph replay"}
    assert seen == set(gpu_runs.CASES) - on_a_gpu_only
    for t in run.timings:
        assert t.us > 0
        if t.dtype == "float32":
            assert t.max_err < 1e-5, t
        elif not math.isnan(t.max_err):
            assert t.max_err < 0.05, t  # bfloat16 rows of values up to about 4
    with pytest.raises(ValueError, match="dry run"):
        gpu_runs.read_step_run(out)


def test_without_a_gpu_the_script_asks_for_a_dry_run(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(SystemExit):
        load_script().main([])
    assert "--dry-run" in capsys.readouterr().err
