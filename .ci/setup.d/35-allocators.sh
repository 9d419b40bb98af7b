#!/usr/bin/env bash
# Allocators other than glibc's, preloaded by the tests that check leaktrace recognises them
# (tests/test_allocators.py): jemalloc and tcmalloc from Debian. Idempotent.
set -euo pipefail
REPO=${REPO:-$(cd "$(dirname "$0")/../.." && pwd)}
. "$REPO/.ci/apt.sh"
apt_ensure libjemalloc2 libtcmalloc-minimal4
