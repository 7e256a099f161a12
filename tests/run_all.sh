#!/usr/bin/env bash
# Every test of the project (run by `make test`, after `make book` has built _build/html):
# lint, ropelib's tests, the chapters re-executed under nbval, the book in headless Chromium.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
if ! command -v chromium >/dev/null; then
  echo "Installing Debian's chromium for the browser tests"
  SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi
"$BIN/ruff" check .
BOOK_HTML=_build/html timeout 3000 "$BIN/python" -m pytest -q tests book \
  --nbval-lax --nbval-current-env --nbval-cell-timeout=300
