# The two commands of the README. Both do all set-up (apt + .venv/) on a fresh machine first.
.PHONY: setup demo test bench lint

setup:
	bash .ci/setup.sh

demo: setup
	.venv/bin/leaktrace demo --out leaktrace-demo

test: setup
	bash .ci/test.sh

bench: setup
	.venv/bin/python -m bench

lint: setup
	.venv/bin/ruff check leaktrace tests bench
