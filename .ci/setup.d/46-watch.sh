#!/usr/bin/env bash
# watch (issue 30): promtool, to check docs/prometheus/leaktrace-alerts.yml in tests/test_watch.py. Debian's
# prometheus package ships it; the daemon it also installs is never started here (policy-rc.d refuses).
# Idempotent: installs nothing when promtool is already there.
set -euo pipefail
REPO=${REPO:-$(cd "$(dirname "$0")/../.." && pwd)}
. "$REPO/.ci/apt.sh"
if ! command -v promtool >/dev/null 2>&1; then
  restore=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && restore=1
  fi
  apt_ensure prometheus
  [ -z "$restore" ] || rm -f /usr/sbin/policy-rc.d
fi
