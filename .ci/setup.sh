#!/usr/bin/env bash
# The demo's set-up on a fresh Debian 12 machine (as root): only what `leaktrace demo` needs — a compiler
# for the demo's native library, gdb, BCC from Debian (the PyPI package named bcc is unrelated), and
# .venv/ with leaktrace installed. `make test` adds the test targets on top (.ci/setup-test.sh).
# Idempotent and cached: a second run installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

APT_PKGS="gcc libc6-dev make gdb bpfcc-tools python3-bpfcc"
missing=""
for p in $APT_PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  echo "[setup] apt-get install$missing"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  "$PY" -m venv .venv
  .venv/bin/pip install -q --upgrade pip
fi
stamp=.venv/.leaktrace-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "[setup] pip install -e ."
  .venv/bin/pip install -q -e .
  touch "$stamp"
fi
