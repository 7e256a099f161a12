"""Instructions the host runs per call, launches stubbed: ``bench_gpu.py``'s host cases counted
by valgrind's callgrind, a measure of ropelib's Python that a loaded machine does not move
(timings of the same call on this project's 2-core VM differ by up to 2x between runs, and
by 0.7-1.3x between two unchanged paths timed in turn).

    python benchmarks/host_instructions.py                     # every case, this checkout
    python benchmarks/host_instructions.py --base REV          # and commit REV's ropelib
    python benchmarks/host_instructions.py --cases "forward + backward, apply_rope"

Each case runs in a process of its own under ``valgrind --tool=callgrind`` with
instrumentation off until its calls begin (``callgrind_control -i on``): 50 warm-up calls,
a garbage collection, then ``--calls`` calls counted with the collector off (when a
collection falls in the window follows the process's history, not the call). With
``--base`` the same cases run against REV's ``ropelib`` (a temporary ``git worktree``; this
checkout's cases and stubs), and the table gives the ratio. Needs valgrind on the PATH;
each case takes about a minute (torch's import, mostly).
Counts are not times (a cache miss or a system call costs more than an instruction), but
two versions of the same Python path compare well by them.
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WARM_UP = 50


def worker(root: str, case: str, calls: int) -> None:
    """Runs in the counted process: ``case`` of ``bench_gpu.host_cases`` with ``root``'s
    ropelib, warmed up; says "ready", waits for a line, makes ``calls`` calls, says "done"."""
    sys.path[:0] = [root, str(HERE)]
    import bench_gpu

    fn = bench_gpu.host_cases()[case]
    with bench_gpu.gpu_route_stubbed():
        for _ in range(WARM_UP):
            fn()
        gc.collect()
        gc.disable()  # a collection's cost follows the process's history, not the call's
        print("ready", flush=True)
        sys.stdin.readline()
        for _ in range(calls):
            fn()
        print("done", flush=True)
        sys.stdin.readline()


def count(root: Path, case: str, calls: int) -> float:
    """Instructions per call of ``case`` with ``root``'s ropelib."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "callgrind.out"
        process = subprocess.Popen(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no",
             f"--callgrind-out-file={out}", sys.executable, __file__, "--worker", str(root),
             case, str(calls)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, env={**os.environ, "PYTHONHASHSEED": "0"})  # the same dict probes
        if not any(line.strip() == "ready" for line in process.stdout):  # after bench_gpu's
            raise RuntimeError(f"{case}: the worker failed")                # notes on peers
        control = ["callgrind_control", "-i"]
        subprocess.run([*control, "on", str(process.pid)], check=True, capture_output=True)
        process.stdin.write("go\n")
        process.stdin.flush()
        if process.stdout.readline().strip() != "done":
            raise RuntimeError(f"{case}: the calls failed")
        subprocess.run([*control, "off", str(process.pid)], check=True, capture_output=True)
        process.communicate("end\n")
        totals = re.search(r"^totals: (\d+)", out.read_text(), re.MULTILINE)
    return int(totals.group(1)) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", help="a git revision whose ropelib is counted too")
    parser.add_argument("--cases", nargs="*", help="names of bench_gpu.host_cases (all)")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        root, case, calls = args.worker
        worker(root, case, int(calls))
        return
    sys.path[:0] = [str(ROOT), str(HERE)]
    import bench_gpu

    cases = args.cases or list(bench_gpu.host_cases())
    with tempfile.TemporaryDirectory() as folder:
        roots = {"this checkout": ROOT}
        if args.base:
            subprocess.run(["git", "worktree", "add", "--detach", folder, args.base],
                           cwd=ROOT, check=True, capture_output=True)
            roots = {args.base: Path(folder), **roots}
        try:
            print(f"instructions per call ({args.calls} calls, launch stubbed): "
                  + ", ".join(roots) + (", ratio" if args.base else ""))
            for case in cases:
                counts = [count(root, case, args.calls) for root in roots.values()]
                cells = "".join(f"{c:12,.0f}" for c in counts)
                ratio = f"  x{counts[1] / counts[0]:.3f}" if args.base else ""
                print(f"  {case:<48}{cells}{ratio}", flush=True)
        finally:
            if args.base:
                subprocess.run(["git", "worktree", "remove", "--force", folder], cwd=ROOT,
                               check=True, capture_output=True)


if __name__ == "__main__":
    main()
