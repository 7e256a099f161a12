#!/usr/bin/env bash
# Every test of the project: lint, ropelib's unit tests, the notebooks under nbval.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
$BIN/ruff check .
$BIN/python -m pytest -q tests
