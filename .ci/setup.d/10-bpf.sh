#!/usr/bin/env bash
# eBPF probe: BCC comes from .ci/setup.sh (bpfcc-tools, python3-bpfcc). Here: bpftrace, the
# benchmark's anchor (bench/bench_bpf.py). No kernel headers needed: leaktrace falls back to the stub
# tree in bpf/kheaders when /lib/modules/$(uname -r)/build is absent. Idempotent.
set -euo pipefail
REPO=${REPO:-$(cd "$(dirname "$0")/../.." && pwd)}
. "$REPO/.ci/apt.sh"
apt_ensure bpftrace || echo "[setup.d/10-bpf] bpftrace unavailable: the benchmark skips its anchor"
