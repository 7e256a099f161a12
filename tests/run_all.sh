#!/usr/bin/env bash
# Every test of the project: lint, ropelib's tests and the chapters re-executed under nbval.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
"$BIN/ruff" check .
"$BIN/python" -m pytest -q tests book --nbval-lax --nbval-current-env --nbval-cell-timeout=300
