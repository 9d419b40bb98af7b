#!/usr/bin/env bash
# Real UCX for the tests: UCX 1.20.1 from PyPI (libucx-cu12, no deps: 29 MB, no network use at run time)
# and the C program that leaks through it (tests/targets/ucx_munmap_leak.c), built against its headers.
# Idempotent and cached under .cache/.
set -euo pipefail
# pip warns about every local index folder a package is missing from; keep the real errors only.
quiet() { "$@" 2> >(grep -v "is ignored: it is neither" >&2); }
REPO=${REPO:-$(cd "$(dirname "$0")/../.." && pwd)}
PIP="$REPO/.venv/bin/pip"
U="$REPO/.cache/ucx-1.20.1"
if [ ! -f "$U/.complete" ]; then
  echo "[setup] libucx-cu12 1.20.1 into .cache/ucx-1.20.1"
  rm -rf "$U"
  quiet "$PIP" install -q --disable-pip-version-check --no-deps --target "$U" libucx-cu12==1.20.1
  touch "$U/.complete"
fi
SRC="$REPO/tests/targets/ucx_munmap_leak.c"
BIN="$REPO/.cache/ucx_munmap_leak"
if [ ! -x "$BIN" ] || [ "$SRC" -nt "$BIN" ]; then
  gcc -O2 -g -Wall -I"$U/libucx/include" "$SRC" -o "$BIN.tmp" -L"$U/libucx/lib" -lucp -lucs \
      -Wl,-rpath,"$U/libucx/lib"
  mv "$BIN.tmp" "$BIN"
fi
# NIXL 1.5.1 (UCX 1.23 inside) for the two-agent DRAM transfer target, in its own target dir: the
# nixl meta package's dependencies would pull CUDA torch, so --no-deps and numpy from the main venv.
N="$REPO/.cache/nixl-1.5.1"
if [ ! -f "$N/.complete" ]; then
  echo "[setup] nixl 1.5.1 into .cache/nixl-1.5.1"
  rm -rf "$N"
  quiet "$PIP" install -q --disable-pip-version-check --no-deps --target "$N" nixl==1.5.1 nixl-cu12==1.5.1
  touch "$N/.complete"
fi
