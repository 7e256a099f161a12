#!/usr/bin/env bash
# Gathers the peers bench_gpu.py compares with, for a GPU machine that has no network:
#   bash benchmarks/get_peers.sh DIR                 # Liger's wheel (pure Python), from PyPI,
#                                                    # unpacked into DIR/site
#   FLASH_ATTN_SRC=PATH bash benchmarks/get_peers.sh DIR
#                          # also flash-attn's Triton rotary (flash_attn/ops/triton/rotary.py
#                          # of a checkout at PATH; it imports only torch and triton)
# Then carry DIR to the machine and set ROPELIB_PEERS=DIR for benchmarks/gpu_check.sh.
# Neither peer is a dependency of ropelib; nothing here is committed.
set -euo pipefail
dir=${1:?usage: bash benchmarks/get_peers.sh DIR}
mkdir -p "$dir"
PY=${PYTHON:-python3}
"$PY" -m pip download --no-deps --only-binary :all: -d "$dir" liger-kernel
for wheel in "$dir"/*.whl; do  # unpacked: zipimport has no namespace packages
  "$PY" -m zipfile -e "$wheel" "$dir/site"
done
if [ -n "${FLASH_ATTN_SRC:-}" ]; then
  cp "$FLASH_ATTN_SRC/flash_attn/ops/triton/rotary.py" "$dir/flash_attn_rotary.py"
fi
ls -l "$dir"
