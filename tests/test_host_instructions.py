"""benchmarks/host_instructions.py counts instructions under valgrind, which CI does not
have: here its worker, the process valgrind runs, takes the protocol the counter speaks
(ready, a line, the calls, done) with a case of ``bench_gpu.host_cases`` on the stubbed
GPU route, and each of those cases makes its one stubbed launch there, replayed from the
second call (the public calls) or in its rotation (the operator, the training step)."""

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


def test_every_host_case_replays_its_launch_on_the_stubbed_route(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import bench_gpu

    from ropelib import replay, triton_rope

    launches = []
    replay.clear()  # no recipe of another test's calls of these shapes

    def launch(*args):
        launches.append("whole")
        return lambda pointers: launches.append("replay")

    cases = bench_gpu.host_cases()
    with bench_gpu.gpu_route_stubbed(), mock.patch.object(triton_rope, "_launch", launch):
        for name, fn in cases.items():
            launches.clear()
            for _ in range(3):
                fn()
            per_call = 0 if "floor" in name else 2 if "backward" in name else 1
            assert launches == ["whole"] * per_call + ["replay"] * 2 * per_call, name
    replay.clear()
