#!/usr/bin/env bash
# eBPF probe (issue 3): BCC comes from .ci/setup.sh (bpfcc-tools, python3-bpfcc). Here: bpftrace, the
# benchmark's anchor (bench/bench_bpf.py). No kernel headers needed: leaktrace falls back to the stub
# tree in bpf/kheaders when /lib/modules/$(uname -r)/build is absent. Idempotent.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
missing=""
for p in bpftrace; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  echo "[setup.d/10-bpf] apt-get install$missing"
  apt-get update -qq
  apt-get install -y -qq $missing >/dev/null || echo "[setup.d/10-bpf] bpftrace unavailable: the benchmark skips its anchor"
fi
