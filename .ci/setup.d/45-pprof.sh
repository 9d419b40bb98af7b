#!/usr/bin/env bash
# Formats (issue 31): Debian's golang-go for `go tool pprof`, with which the tests read back the pprof
# profile (outstanding.pb.gz) that `--format pprof` writes. Idempotent: installs nothing when it is there.
set -euo pipefail
REPO=${REPO:-$(cd "$(dirname "$0")/../.." && pwd)}
. "$REPO/.ci/apt.sh"
apt_ensure golang-go
