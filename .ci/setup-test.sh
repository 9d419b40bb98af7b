#!/usr/bin/env bash
# The test suite's set-up (as root, fresh Debian 12): the demo's set-up (.ci/setup.sh), the dev extra
# (pytest, ruff, build, notebook runner), then every fragment in .ci/setup.d/ — each probe or test target
# adds its own (bpftrace, UCX 1.20.1, NIXL, vLLM on CPU + a tiny model, Chromium, Ray), in order.
# Idempotent and cached: a second run installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
bash .ci/setup.sh
. .ci/apt.sh
apt_ensure binutils iproute2 util-linux
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
