"""Time chapter 15's step kernels (ropelib/book/gpu_steps.py) on a GPU and store the run.

    python benchmarks/bench_gpu_steps.py                 # on a GPU: writes
        benchmarks/results/<date>-<card>-gpu-steps.txt    # the file chapter 15 reads
    python benchmarks/bench_gpu_steps.py --dry-run       # no GPU: every code path once in
                                                         # Triton's interpreter, tiny shapes

Every case is timed against ``copy_`` of the same bytes in the same process (medians of
``triton.testing.do_bench``: CUDA events, L2 flushed), at x = (4, 32, 4096, 128) in bfloat16
and float32: step 1 (tables per head), step 2 (stride-2 loads; rows split in registers),
step 3 (tables once per block, all heads a program), step 4's tile sweep, q (32 heads) and
k (8) in one launch and in two, the backward (step 3 with -theta), ``torch.compile`` of the
Hugging Face and GPT-J formulas, and a decode step (64 rows at their own positions), eager
and replayed in a CUDA graph. The file's header records the card, torch, Triton, the commit
and the SHA-256 of the step kernels' source; chapter 15 refuses a file whose hash differs
from its kernels'. A dry run prints to stdout (or --out) and is never read as a measurement.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ropelib.book import gpu_runs  # noqa: E402

DRY_RUN = {"shape": (1, 3, 24, 16), "qk_heads": (3, 2), "decode_rows": 2,
           "dtypes": (torch.bfloat16, torch.float32),
           "sweep": {"block_s": (8,), "heads_per_program": (2,), "num_warps": (4,)},
           "compiled": False}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true",
                        help="run every case once on the CPU in Triton's interpreter")
    parser.add_argument("--out", type=Path, help="where to write the run (default: "
                        "benchmarks/results/<date>-<card>-gpu-steps.txt; stdout for --dry-run)")
    parser.add_argument("--no-compile", action="store_true",
                        help="leave out the torch.compile'd formulas")
    args = parser.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        parser.error("no CUDA GPU here: use --dry-run to check the script on the CPU")

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    if args.dry_run:
        run = gpu_runs.measure("cpu", log=log, **DRY_RUN)
    else:
        run = gpu_runs.measure("cuda", compiled=not args.no_compile, log=log)
    text = gpu_runs.format_step_run(run)
    out = args.out
    if out is None and not args.dry_run:
        card = re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name().lower()).strip("-")
        out = gpu_runs.RESULTS / f"{run.meta['date']}-{card}-gpu-steps.txt"
    if out is None:
        sys.stdout.write(text)
    else:
        out.write_text(text)
        print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
