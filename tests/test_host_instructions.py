"""benchmarks/host_instructions.py counts instructions under valgrind, which CI does not
have: here its worker, the process valgrind runs, takes the protocol the counter speaks
(ready, a line, the calls, done) with a case of ``bench_gpu.host_cases`` on the stubbed
GPU route, and each of those cases makes its stubbed launches there: one a call, two a
training step (forward and backward), none for the floor. Also
the decode table's rows of the launch alone (``bench_gpu.recorded_launch``) and of the same
launch through Inductor's static launcher (``bench_gpu.statically_launched``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "host_instructions.py"


def test_the_worker_speaks_the_counters_protocol():
    case = "apply_rope_qk positions out= (decode)"
    result = subprocess.run([sys.executable, str(SCRIPT), "--worker", str(ROOT), case, "3"],
                            input="go\nend\n", capture_output=True, text=True, timeout=300,
                            check=True)
    lines = [line for line in result.stdout.splitlines() if not line.startswith("  (")]
    assert lines == ["ready", "done"]


def test_every_host_case_launches_on_the_stubbed_route(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import bench_gpu

    from ropelib import triton_rope

    launches = []
    cases = bench_gpu.host_cases()
    with bench_gpu.gpu_route_stubbed(), mock.patch.object(
            triton_rope, "_launch", lambda *args: launches.append(1)):
        for name, fn in cases.items():
            launches.clear()
            for _ in range(3):
                fn()
            per_call = 0 if "floor" in name else 2 if "backward" in name else 1
            assert len(launches) == 3 * per_call, name


def test_the_recorded_launch_is_the_calls_one_launch_with_its_pointers(monkeypatch):
    """bench_gpu's row of the launch alone repeats the one launch a decode call makes, with
    that call's tensors (q's among them)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import bench_gpu
    import torch

    from ropelib import apply_rope_qk, generate_rope_embeddings, triton_rope

    seen = []

    def launch(x, plan, tensors):
        seen.append([t.data_ptr() for t in tensors])

    q, k = torch.randn(4, 8, 1, 64), torch.randn(4, 2, 1, 64)
    cos, sin = generate_rope_embeddings(32, 64)
    positions = torch.randint(0, 32, (4, 1))
    with bench_gpu.gpu_route_stubbed(), mock.patch.object(triton_rope, "_launch", launch):
        alone = bench_gpu.recorded_launch(
            lambda: apply_rope_qk(q, k, cos, sin, layout="half", positions=positions))
        assert not seen and alone is not None  # the step's launch recorded, not made
        alone()
        alone()
        assert bench_gpu.recorded_launch(lambda: None) is None  # no launch: no row
    assert len(seen) == 2 and seen[1] == seen[0]
    assert q.data_ptr() in seen[0] and k.data_ptr() in seen[0]


def test_the_static_launchers_row_leaves_the_kernel_as_it_was(monkeypatch):
    """bench_gpu.statically_launched swaps Triton's compiled kernel for a recording one while
    its step runs; on the CPU (the interpreter: nothing compiled, nothing recorded) it
    raises, and the kernel and its launchers are left as they were."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    pytest.importorskip("torch._inductor.runtime.static_triton_launcher")
    import bench_gpu
    import torch

    from ropelib import apply_rope, generate_rope_embeddings, triton_rope

    x = torch.randn(1, 2, 8, 16)
    cos, sin = generate_rope_embeddings(8, 16)
    compiled, launchers = triton_rope._compiled, dict(triton_rope._launchers)
    monkeypatch.setenv("ROPELIB_BACKEND", "triton")
    with pytest.raises(ValueError, match="not enough values"):
        bench_gpu.statically_launched(lambda: apply_rope(x, cos, sin), [x])
    assert triton_rope._compiled is compiled and triton_rope._launchers == launchers
