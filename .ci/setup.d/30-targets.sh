#!/usr/bin/env bash
# Real targets: UCX 1.20.1 + its leaking program, NIXL 1.5.1, vLLM (CPU) + a tiny model,
# and the vintage P/D target (NIXL 0.9.0 / UCX 1.20.0, a stub libcuda, a larger model).
# LEAKTRACE_SKIP_VLLM=1 skips the vLLM venv (the vLLM tests then skip, saying so).
set -euo pipefail
REPO=${REPO:-$(cd "$(dirname "$0")/../.." && pwd)}
bash "$REPO/tests/targets/setup_ucx.sh"
if [ "${LEAKTRACE_SKIP_VLLM:-0}" != "1" ]; then
  bash "$REPO/tests/targets/setup_vllm.sh"
  bash "$REPO/tests/targets/setup_vllm_vintage.sh"
fi
