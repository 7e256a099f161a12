#!/usr/bin/env bash
# One command for a GPU machine: ropelib's CUDA tests, then the GPU benchmark (with the
# kernel's tile sweep), each output written to the folder given.
#   bash benchmarks/gpu_check.sh OUTDIR
# Needs torch (a CUDA build, which brings Triton), numpy, pytest, pytest-timeout and
# hypothesis; transformers for the tests that compare with it. Test modules whose imports
# are missing there (the book's Jupyter tooling) are reported and skipped, not fatal.
set -uo pipefail
out=${1:?usage: bash benchmarks/gpu_check.sh OUTDIR}
mkdir -p "$out"
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  "$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} > "$out/machine.txt" 2>&1
timeout "${TEST_SECONDS:-240}" "$PY" -m pytest -q -k cuda --continue-on-collection-errors \
  -p no:randomly -o addopts="-p no:cacheprovider" --timeout 300 tests > "$out/cuda_tests.txt" 2>&1
echo "cuda tests: exit $?" | tee -a "$out/machine.txt"
timeout "${BENCH_SECONDS:-300}" "$PY" benchmarks/bench_gpu.py --sweep > "$out/bench_gpu.txt" 2>&1
echo "benchmark: exit $?" | tee -a "$out/machine.txt"
tail -n 3 "$out/cuda_tests.txt"
