#!/usr/bin/env bash
# Every test of the project (run by `make test`, after `make book` has built _build/html):
# lint, ropelib's tests, the chapters re-executed under nbval, the book in headless Chromium.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
bash tests/apt_need.sh chromium chromium
"$BIN/ruff" check .
BOOK_HTML=_build/html timeout 3000 "$BIN/python" -m pytest -q tests book \
  --nbval-lax --nbval-current-env --nbval-cell-timeout=300 --durations=20
