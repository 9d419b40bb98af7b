#!/usr/bin/env bash
# Reports: Debian's chromium for the test that renders report.html headless and checks its
# plots. Idempotent: installs nothing when chromium is already there.
set -euo pipefail
REPO=${REPO:-$(cd "$(dirname "$0")/../.." && pwd)}
. "$REPO/.ci/apt.sh"
command -v chromium >/dev/null 2>&1 || apt_ensure chromium fonts-dejavu-core
