#!/usr/bin/env bash
# The vintage P/D target (tests/targets/vintage_pd.py): vLLM 0.32 (.venv-vllm, from setup_vllm.sh) with
# NIXL 0.9.0, whose bundled UCX 1.20.0 still leaks (seed 002). Three pieces, each cached under .cache/
# with a stamp, so a second run does nothing:
#  * nixl 0.9.0 + nixl-cu12 0.9.0 in their own target dir, put first on PYTHONPATH of the vintage
#    servers only (.venv-vllm keeps nixl 1.5.1 for the other vLLM tests);
#  * a stub libcuda.so.1 (tests/targets/libcuda_stub.c): libplugin_UCX.so of nixl-cu12 0.9.0 needs it;
#  * a random-weight Llama with many thin layers (hidden 256, intermediate 704, 16 layers, vocab 8192,
#    ~29 MB): its per-layer tensors cross glibc's mmap threshold (4 KiB, set for the servers) every step
#    and a step is cheap, so the workers munmap like production ones (a 1024-hidden 4-layer model munmaps
#    ~50/s on 2 cores: too few for the leak to show in a minute).
set -euo pipefail
# pip warns about every local index folder a package is missing from; keep the real errors only.
quiet() { "$@" 2> >(grep -v "is ignored: it is neither" >&2); }
REPO=${REPO:-$(cd "$(dirname "$0")/../.." && pwd)}
V="$REPO/.venv-vllm"
[ -x "$V/bin/python" ] || { echo "[setup] no .venv-vllm: run tests/targets/setup_vllm.sh first" >&2; exit 1; }
N="$REPO/.cache/nixl-0.9.0"
if [ ! -f "$N/.complete" ]; then
  echo "[setup] nixl 0.9.0 (UCX 1.20.0) into .cache/nixl-0.9.0"
  rm -rf "$N"
  quiet "$REPO/.venv/bin/pip" install -q --disable-pip-version-check --no-deps --target "$N" \
      nixl==0.9.0 nixl-cu12==0.9.0
  touch "$N/.complete"
fi
SRC="$REPO/tests/targets/libcuda_stub.c"
LIB="$REPO/.cache/libcuda-stub/libcuda.so.1"
if [ ! -f "$LIB" ] || [ "$SRC" -nt "$LIB" ]; then
  mkdir -p "$(dirname "$LIB")"
  gcc -O2 -Wall -fPIC -shared -Wl,-soname,libcuda.so.1 "$SRC" -o "$LIB.tmp"
  mv "$LIB.tmp" "$LIB"
fi
MODEL="$REPO/.cache/llama-256x16"
if [ ! -f "$MODEL/.complete" ]; then
  echo "[setup] building the 16-layer random-weight model (~29 MB)"
  "$V/bin/python" "$REPO/tests/targets/build_tiny_model.py" "$MODEL" \
      --hidden 256 --intermediate 704 --layers 16 --vocab 8192
  touch "$MODEL/.complete"
fi
