#!/usr/bin/env bash
# Build the book from scratch (`make book`): every chapter executed, warnings are errors.
# A build that fails because a kernel stopped answering (a cell or its outputs timed out,
# the kernel died) is retried once, from scratch, and says so; any other failure is final.
# book/_ext/kernel_watchdog.py already turns a lost execute reply into a short wait.
# Usage: scripts/build_book.sh BIN (the folder holding jupyter-book).
set -uo pipefail
BIN=${1:?usage: scripts/build_book.sh BIN}
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
for attempt in 1 2; do
  rm -rf _build/html _build/.jupyter_cache _build/jupyter_execute
  timeout 1800 "$BIN/jupyter-book" build . -W -n --keep-going 2>&1 | tee "$LOG"
  status=${PIPESTATUS[0]}
  if [ "$status" -eq 0 ]; then
    exit 0
  fi
  if [ "$attempt" -eq 1 ] && grep -qE "CellTimeoutError|DeadKernelError|Timeout waiting for" "$LOG"; then
    echo "=== book build: a kernel stopped answering (see above); retrying once from scratch ===" >&2
    continue
  fi
  exit "$status"
done
