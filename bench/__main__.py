"""`python -m bench [NAME ...] [--FLAG ...]`: runs the main() of every bench/bench_*.py module (or only those
whose name contains one of NAME, e.g. `python -m bench gdb`), in name order. Arguments starting with `-`
are passed to each bench it runs (e.g. `python -m bench verdicts --json`); then the `=== name` lines go to
stderr, so a bench's last line on stdout stays its own (a JSON object, with --json)."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent


def main() -> None:
    flags = [a for a in sys.argv[1:] if a.startswith("-")]
    wanted = [a for a in sys.argv[1:] if not a.startswith("-")]
    banner = sys.stderr if flags else sys.stdout
    for path in sorted(BENCH.glob("bench_*.py")):
        name = path.stem
        if wanted and not any(w in name for w in wanted):
            continue
        spec = importlib.util.spec_from_file_location(f"bench.{name}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if not hasattr(module, "main"):
            continue
        print(f"=== {name}", file=banner, flush=True)
        t0 = time.monotonic()
        saved, sys.argv = sys.argv, [str(path), *flags]  # each benchmark parses its own arguments
        try:
            module.main()
        finally:
            sys.argv = saved
        print(f"=== {name} done in {time.monotonic() - t0:.1f} s", file=banner, flush=True)


if __name__ == "__main__":
    main()
