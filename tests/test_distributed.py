"""ropelib with a real process group (issue 38, item 3): torch.distributed with the gloo
backend, 2 processes on the CPU started here, each case of ``distributed_cases.py``
compared there with the single-process float64 result: DTensor x over heads, batch and
sequence, context-parallel positions and rotation, FSDP2's ``fully_shard`` of attention
layers (with meta-device initialization). The processes run all cases once (about 15 s on
2 loaded cores), bounded by a timeout; each test reads its case's outcome on both ranks."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist
from distributed_cases import CASES

WORLD_SIZE = 2
TIMEOUT_S = 240
SCRIPT = Path(__file__).resolve().parent / "distributed_cases.py"

needs_gloo = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="this torch build has no torch.distributed with gloo")


def free_port() -> int:
    """A TCP port nobody listens on now (the OS picks it), for the store of rank 0."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> list[dict[str, str]]:
    """Runs the 2 ranks once; ``[rank 0's, rank 1's]`` ``{case: "ok" or traceback}``."""
    folder = tmp_path_factory.mktemp("distributed")
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(SCRIPT.parent.parent),
                                          os.environ.get("PYTHONPATH", "")])}
    logs = [(folder / f"rank{r}.log").open("w") for r in range(WORLD_SIZE)]
    procs = [subprocess.Popen([sys.executable, str(SCRIPT), str(r), str(WORLD_SIZE), str(port),
                               str(folder / f"rank{r}.json")], env=env, stdout=logs[r],
                              stderr=subprocess.STDOUT) for r in range(WORLD_SIZE)]
    try:
        for proc in procs:
            proc.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pass
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for log in logs:
            log.close()
    results = []
    for r, proc in enumerate(procs):
        path = folder / f"rank{r}.json"
        if proc.returncode != 0 or not path.exists():
            log = (folder / f"rank{r}.log").read_text()[-4000:]
            pytest.fail(f"rank {r} exited with {proc.returncode} (killed after {TIMEOUT_S} s if "
                        f"negative) before writing its results; its output:\n{log}")
        results.append(json.loads(path.read_text()))
    return results


@needs_gloo
@pytest.mark.parametrize("case", list(CASES))
def test_case_on_both_ranks(outcomes, case):
    for rank, result in enumerate(outcomes):
        assert result[case] == "ok", f"rank {rank}, case {case}:\n{result[case]}"


def test_core_does_not_need_torch_distributed_tensor():
    """``import ropelib`` leaves ``torch.distributed.tensor`` (about a second) unimported,
    and apply_rope works where it cannot be imported at all, also with a table that is a
    tensor subclass (a Parameter, which takes the DTensor check)."""
    code = (
        "import sys, torch\n"
        "import ropelib\n"
        "assert 'torch.distributed.tensor' not in sys.modules\n"
        "sys.modules['torch.distributed.tensor'] = None  # any import of it now fails\n"
        "cos, sin = ropelib.generate_rope_embeddings(4, 8)\n"
        "x = torch.randn(2, 4, 8)\n"
        "y = ropelib.apply_rope(x, torch.nn.Parameter(cos), sin)\n"
        "assert torch.equal(y, ropelib.apply_rope(x, cos, sin))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SCRIPT.parent.parent),
                                                        os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
