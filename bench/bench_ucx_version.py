"""The UCX version lookup of the ucx probe: every few ticks, for every process
that maps UCX. Where no wheel dist-info names the version (nixl's wheels: libucp-HASH.so in
nixl_cu12.libs/), the answer is a search of the whole libucp file. Measured in the same run, medians of
--reps: ``first`` (a lookup the cache cannot answer: read and search the file) and ``cached`` (a lookup it
answers: one stat). Reported: both in ms and cached/first.

    .venv/bin/python bench/bench_ucx_version.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from leaktrace.vllm import ucx  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default=None, help="a libucp (default: nixl 1.5.1's, from .cache/)")
    ap.add_argument("--reps", type=int, default=9)
    args = ap.parse_args()
    lib = args.lib or next(iter(sorted((REPO / ".cache" / "nixl-1.5.1").glob("nixl_cu12.libs/libucp-*.so*"))), None)
    if lib is None:
        print(json.dumps({"skipped": "no libucp: run tests/targets/setup_ucx.sh"}))
        return
    first, cached, version = [], [], None
    for _ in range(args.reps):
        ucx._version_near_cached.cache_clear()
        t0 = time.perf_counter()
        version = ucx._version_near(str(lib))
        first.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        ucx._version_near(str(lib))
        cached.append(time.perf_counter() - t0)
    f, c = statistics.median(first), statistics.median(cached)
    print(json.dumps({"lib": Path(lib).name, "size_mb": round(Path(lib).stat().st_size / 2**20, 2), "version": version,
                      "first_ms": round(f * 1000, 3), "cached_ms": round(c * 1000, 4),
                      "cached_over_first": round(c / f, 5)}, indent=2))


if __name__ == "__main__":
    main()
