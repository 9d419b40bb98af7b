"""The Python-heap probe's cost per tick on a vLLM-sized frozen heap (issue 12, per-tick mends).

A Python target freezes N objects (gc.freeze(), as vLLM does after start-up: ~660k in its API server) and
keeps a few thousand tracked. Measured in the same run, each the median of --reps reads:
  ``tick``  read_python_heap(walk=False): what the probe does on every tick (GC counters, no list walk)
  ``walk``  read_python_heap(walk=True):  the periodic full read (every 30 ticks and at stop), which walks
            every GC list including the frozen one — what every tick cost before the frozen walk moved
Reported: both in ms and tick/walk (the baseline is the full walk of the same heap).

    .venv/bin/python bench/bench_pyheap.py --frozen 660000
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from leaktrace.probes.pyheap import read_python_heap  # noqa: E402

TARGET = """
import gc, sys
keep = [[i] for i in range(int(sys.argv[1]))]  # lists: always GC-tracked (small dicts are not)
gc.freeze()
live = [[i] for i in range(5000)]
print("ready", gc.get_freeze_count(), flush=True)
sys.stdin.read()
"""


def timed(pid: int, walk: bool, reps: int) -> tuple[float, dict]:
    times, st = [], {}
    for _ in range(reps):
        t0 = time.perf_counter()
        st = read_python_heap(pid, walk=walk)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), st


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frozen", type=int, default=660_000)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    p = subprocess.Popen([sys.executable, "-c", TARGET, str(args.frozen)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        frozen = int(p.stdout.readline().split()[1])  # type: ignore[union-attr]
        tick_s, tick = timed(p.pid, False, args.reps)
        walk_s, full = timed(p.pid, True, args.reps)
    finally:
        p.kill()
        p.wait()
    print(json.dumps({"frozen_objects": frozen, "tick_ms": round(tick_s * 1000, 3),
                      "walk_ms": round(walk_s * 1000, 1), "tick_over_walk": round(tick_s / walk_s, 5),
                      "frozen_seen_by_walk": full.get("frozen"), "frozen_in_tick": tick.get("frozen")}, indent=2))


if __name__ == "__main__":
    main()
