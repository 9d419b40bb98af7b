#!/usr/bin/env bash
# Cluster hunt: Ray into the repo's .venv, pinned to the version the cluster tests are written against;
# unshare/nsenter (util-linux) and ip (iproute2) come with the base image / .ci/setup.sh.
# Idempotent: nothing is installed when the pinned Ray is already there.
set -euo pipefail
REPO=${REPO:-$(cd "$(dirname "$0")/../.." && pwd)}
PY="$REPO/.venv/bin/python"
RAY_VERSION=2.60.0
have=$("$PY" -c 'import importlib.metadata as m; print(m.version("ray"))' 2>/dev/null || true)
if [ "$have" != "$RAY_VERSION" ]; then
  echo "[setup] pip install ray==$RAY_VERSION (cluster hunt)"
  "$PY" -m pip install -q "ray==$RAY_VERSION"
fi
for tool in unshare nsenter setsid; do
  command -v "$tool" >/dev/null || { echo "[setup] missing $tool (apt-get install util-linux)" >&2; exit 1; }
done
