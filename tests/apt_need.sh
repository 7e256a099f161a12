#!/usr/bin/env bash
# Usage: tests/apt_need.sh COMMAND PACKAGE — install Debian's PACKAGE unless COMMAND is found.
# Used by the Makefile's venv step, which both README commands run (a C compiler for ropelib's
# compiled kernel, which the book and the tests run), and by tests/run_all.sh (Chromium for the
# browser tests).
set -euo pipefail
command -v "$1" >/dev/null && exit 0
echo "Installing Debian's $2 (no $1 on this machine)"
SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$2" >/dev/null
