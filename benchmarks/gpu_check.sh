#!/usr/bin/env bash
# One command for a GPU machine: ropelib's CUDA tests, the GPU benchmark (with the kernel's
# tile sweep), then chapter 15's step kernels, each output written to the folder given.
#   bash benchmarks/gpu_check.sh OUTDIR            # on the GPU machine
#   bash benchmarks/gpu_check.sh --dry-run OUTDIR  # anywhere: the benchmark's code at tiny
#                                                  # shapes on the CPU (Triton's interpreter),
#                                                  # and the collection of the CUDA tests
# Needs torch (a CUDA build, which brings Triton), numpy, pytest, pytest-timeout and
# hypothesis; transformers for the tests that compare with it. Test modules whose imports
# are missing there (the book's Jupyter tooling) are reported and skipped, not fatal.
# Peers: ROPELIB_PEERS=DIR (made by benchmarks/get_peers.sh DIR, carried to the machine)
# puts Liger's wheel and flash-attn's Triton rotary on the benchmark's path.
# Time limits (seconds): TEST_SECONDS (default 240), BENCH_SECONDS (default 300),
# STEPS_SECONDS (default 120); TABLES (comma-separated, see bench_gpu.py --only) runs some
# tables only; WORKERS (pytest-xdist processes for the tests, default 1).
set -uo pipefail
dry=""
if [ "${1:-}" = "--dry-run" ]; then dry=1; shift; fi
out=${1:?usage: bash benchmarks/gpu_check.sh [--dry-run] OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
only=()
if [ -n "${TABLES:-}" ]; then only=(--only "$TABLES"); fi
if [ -n "$dry" ]; then
  "$PY" -m pytest -q --collect-only -k cuda -p no:randomly -o addopts="-p no:cacheprovider" \
    tests > "$out/cuda_tests_collected.txt" 2>&1
  echo "cuda tests collected: exit $? ($(grep -c '::' "$out/cuda_tests_collected.txt") cases)"
  timeout "${BENCH_SECONDS:-900}" "$PY" benchmarks/bench_gpu.py --dry-run --sweep "${only[@]}" \
    > "$out/bench_gpu_dry_run.txt" 2>&1
  status=$?
  echo "benchmark dry run: exit $status"
  "$PY" benchmarks/bench_gpu_steps.py --dry-run --out "$out/gpu_steps_dry_run.txt" \
    > /dev/null 2>&1
  steps=$?
  echo "step kernels dry run: exit $steps"
  exit $((status || steps))
fi
workers=()
if [ "${WORKERS:-1}" -gt 1 ]; then workers=(-n "$WORKERS"); fi
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  "$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  git log --oneline -1 2>/dev/null
} > "$out/machine.txt" 2>&1
timeout "${TEST_SECONDS:-240}" "$PY" -m pytest -q -k cuda --continue-on-collection-errors \
  -p no:randomly -o addopts="-p no:cacheprovider" --timeout 300 "${workers[@]}" tests \
  > "$out/cuda_tests.txt" 2>&1
echo "cuda tests: exit $?" | tee -a "$out/machine.txt"
timeout "${BENCH_SECONDS:-300}" "$PY" benchmarks/bench_gpu.py --sweep "${only[@]}" \
  > "$out/bench_gpu.txt" 2>&1
echo "benchmark: exit $?" | tee -a "$out/machine.txt"
timeout "${STEPS_SECONDS:-120}" "$PY" benchmarks/bench_gpu_steps.py --out "$out/gpu_steps.txt" \
  > "$out/gpu_steps_log.txt" 2>&1
echo "step kernels: exit $?" | tee -a "$out/machine.txt"
tail -n 3 "$out/cuda_tests.txt"
