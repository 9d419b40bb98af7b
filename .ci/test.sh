#!/usr/bin/env bash
# The README's test command (after .ci/setup.sh): lint, then the suite on real processes, in two phases
# (tests/conftest.py, ALONE_MODULES): the heavy and timing-sensitive modules one test at a time, then the
# others two at a time (pytest-xdist). Both phases always run; the exit status is the first failure's.
# The extended module (a second real vLLM pair, across two Ray nodes: marker `extended`) runs with
# `make test-extended` (LEAKTRACE_EXTENDED=1), not here.
set -uo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check leaktrace tests bench || exit 1
pytest=(.venv/bin/python -m pytest -ra --durations=30 -p no:cacheprovider)
if [ "${LEAKTRACE_EXTENDED:-0}" = "1" ]; then
  "${pytest[@]}" -m extended "$@"
  exit $?
fi
"${pytest[@]}" -m "alone and not extended" "$@"
alone=$?
"${pytest[@]}" -m "not alone and not extended" -n 2 "$@"
pairs=$?
# 5: nothing selected in that phase (arguments naming only tests of the other one)
for rc in "$alone" "$pairs"; do
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then exit "$rc"; fi
done
exit 0
