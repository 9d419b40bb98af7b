#!/usr/bin/env bash
# The test suite's set-up (as root, fresh Debian 12): the demo's set-up (.ci/setup.sh), the dev extra
# (pytest, ruff, build, notebook runner), then every fragment in .ci/setup.d/ — each probe or test target
# adds its own (bpftrace, UCX 1.20.1, NIXL, vLLM on CPU + a tiny model, Chromium, Ray), in order.
# Idempotent and cached: a second run installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
export DEBIAN_FRONTEND=noninteractive
bash .ci/setup.sh

APT_PKGS="binutils iproute2 util-linux"
missing=""
for p in $APT_PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  echo "[setup] apt-get install$missing"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
stamp=.venv/.leaktrace-dev-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "[setup] pip install -e .[dev]"
  .venv/bin/pip install -q -e ".[dev]"
  touch "$stamp"
fi

for frag in .ci/setup.d/*.sh; do
  [ -e "$frag" ] || continue
  REPO="$REPO" bash "$frag"
done
