# The two commands of the README. Both do their own set-up (apt + .venv/) on a fresh machine first:
# `make demo` only what the demo needs, `make test` everything the suite runs against.
.PHONY: setup setup-test demo test test-extended bench lint

setup:
	bash .ci/setup.sh

setup-test:
	bash .ci/setup-test.sh

# --force: a second `make demo` replaces the previous demo session (atomically) instead of refusing it.
demo: setup
	.venv/bin/leaktrace demo --out leaktrace-demo --force

test: setup-test
	bash .ci/test.sh

# The extended module: a real vLLM P/D pair across two Ray nodes (~10 min on 2 cores).
test-extended: setup-test
	LEAKTRACE_EXTENDED=1 bash .ci/test.sh

bench: setup-test
	.venv/bin/python -m bench

lint: setup-test
	.venv/bin/ruff check leaktrace tests bench
