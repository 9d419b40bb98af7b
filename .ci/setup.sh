#!/usr/bin/env bash
# The demo's set-up on a fresh Debian 12 machine (as root): only what `leaktrace demo` needs — a compiler
# for the demo's native library, gdb, BCC from Debian (the PyPI package named bcc is unrelated), and
# .venv/ with leaktrace installed. `make test` adds the test targets on top (.ci/setup-test.sh).
# Idempotent and cached: a second run installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."
. .ci/apt.sh
# libc6-dbg: glibc's debug information, where the malloc probe finds malloc's books (main_arena, mp_)
apt_ensure gcc libc6-dev libc6-dbg make gdb bpfcc-tools python3-bpfcc

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
