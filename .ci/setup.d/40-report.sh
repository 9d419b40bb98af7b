#!/usr/bin/env bash
# Reports (issue 6): Debian's chromium for the test that renders report.html headless and checks its
# plots. Idempotent: installs nothing when chromium is already there.
set -euo pipefail
if ! command -v chromium >/dev/null 2>&1; then
  echo "[setup] apt-get install chromium"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
fi
