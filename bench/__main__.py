"""`python -m bench [NAME ...]`: runs the main() of every bench/bench_*.py module (or only those whose
name contains one of NAME, e.g. `python -m bench gdb`), each with its default arguments, in name order."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent


def main() -> None:
    wanted = sys.argv[1:]
    for path in sorted(BENCH.glob("bench_*.py")):
        name = path.stem
        if wanted and not any(w in name for w in wanted):
            continue
        spec = importlib.util.spec_from_file_location(f"bench.{name}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if not hasattr(module, "main"):
            continue
        print(f"=== {name}", flush=True)
        t0 = time.monotonic()
        saved, sys.argv = sys.argv, [str(path)]  # each benchmark parses its own (default) arguments
        try:
            module.main()
        finally:
            sys.argv = saved
        print(f"=== {name} done in {time.monotonic() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
