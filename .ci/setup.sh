#!/usr/bin/env bash
# All set-up on a fresh Debian 12 machine (as root): apt packages, the .venv/ with leaktrace, then
# every fragment in .ci/setup.d/ (each probe or test target adds its own, in order).
# Idempotent and cached: a second run installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
export DEBIAN_FRONTEND=noninteractive

APT_PKGS="gcc make gdb binutils iproute2 bpfcc-tools python3-bpfcc"
missing=""
for p in $APT_PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  echo "[setup] apt-get install$missing"
  apt-get update -qq
  apt-get install -y -qq $missing >/dev/null
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  "$PY" -m venv .venv
  .venv/bin/pip install -q --upgrade pip
fi
stamp=.venv/.leaktrace-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "[setup] pip install -e .[dev]"
  .venv/bin/pip install -q -e ".[dev]"
  touch "$stamp"
fi

for frag in .ci/setup.d/*.sh; do
  [ -e "$frag" ] || continue
  REPO="$REPO" bash "$frag"
done
