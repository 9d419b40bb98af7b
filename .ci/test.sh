#!/usr/bin/env bash
# The README's test command (after .ci/setup.sh): lint, then the whole suite on real processes.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check leaktrace tests bench
exec .venv/bin/python -m pytest -ra --durations=30 -p no:cacheprovider "$@"
