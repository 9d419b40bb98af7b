"""The Python-heap probe's cost (on by default for Python targets): leaktrace's time per tick
and the target's slowdown, measured in the same run.

A Python target freezes N objects (gc.freeze(), as vLLM does after start-up: ~660k in its API server), keeps
--live tracked objects, and runs a fixed workload (make an object of its own class, keep it in a bounded
ring, small malloc churn) while it counts its iterations per 0.5 s window. Measured in the same run:
  ``tick``      read_python_heap(walk=False): what the probe does on every tick (GC counters, no walk)
  ``walk``      read_python_heap(walk=True):  the periodic walk of every GC list with objects counted by
                type (every ≥5 s and at most 2% of leaktrace's time; at start and at stop)
  ``per_tick``  leaktrace's average cost per 1 s tick at the hunt's schedule (tick + the walk's share)
  ``item_objects_seen``  the walk's count of the target's class (it holds --live of them, replacing
                them as fast as it can: the count's accuracy under the worst churn; objects living
                milliseconds are freed ahead of the walk and appended behind it: 0.5-2.4x measured)
  slowdown      (target and probe pinned to two different CPUs when there are two) the target's throughput with no probe over its throughput with the probe reading it, in
                alternating phases (none, probe at the hunt schedule, none, probe walking back to back):
                ``ratio_hunt`` (what a hunt costs the target) and ``ratio_worst`` (walks back to back).

    .venv/bin/python bench/bench_pyheap.py --frozen 660000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from leaktrace.probes.pyheap.interpreter import locate, read_python_heap  # noqa: E402
from leaktrace.probes.pyheap.probe import PyHeapProbe  # noqa: E402

TARGET = """
import gc, sys, time
class Item:
    __slots__ = ("v", "buf")
    def __init__(self, v):
        self.v = [v]
        self.buf = bytes(64 + v % 512)
keep = [[i] for i in range(int(sys.argv[1]))]  # lists: always GC-tracked (small dicts are not)
gc.freeze()
live = [Item(i) for i in range(int(sys.argv[2]))]
print("ready", gc.get_freeze_count(), flush=True)
i, n, t_end = 0, 0, time.monotonic() + 0.5
while True:
    live[i % len(live)] = Item(i)
    i += 1
    n += 1
    if n % 256 == 0 and time.monotonic() >= t_end:
        print(n, flush=True)
        n, t_end = 0, t_end + 0.5
"""


def timed(pid: int, walk: bool, reps: int) -> tuple[float, dict]:
    times, st = [], {}
    where = locate(pid)  # once per process, as the probe does
    for _ in range(reps):
        t0 = time.perf_counter()
        st = read_python_heap(pid, walk=walk, where=where)  # type: ignore[arg-type]
        times.append(time.perf_counter() - t0)
    return statistics.median(times), st


class Reader(threading.Thread):
    """The target's iterations per 0.5 s window, tagged with the phase running when it arrived."""

    def __init__(self, proc: subprocess.Popen) -> None:
        super().__init__(daemon=True)
        self.proc, self.phase, self.rows = proc, "warmup", []  # type: ignore[var-annotated]

    def run(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            self.rows.append((self.phase, int(line)))


def phase(reader: Reader, name: str, seconds: float, pid: int, mode: str) -> None:
    reader.phase = name
    where = locate(pid)
    t_end = time.monotonic() + seconds
    last_walk, cost = float("-inf"), 0.0
    while time.monotonic() < t_end:
        t0 = time.monotonic()
        if mode == "worst":
            read_python_heap(pid, walk=True, where=where)  # type: ignore[arg-type]
            continue
        if mode == "hunt":  # the probe's schedule: counters every 1 s tick, walks by their cost
            due = t0 - last_walk >= max(PyHeapProbe.MIN_WALK_GAP_S, cost / PyHeapProbe.WALK_DUTY)
            st = read_python_heap(pid, walk=due, where=where)  # type: ignore[arg-type]
            if due:
                last_walk, cost = time.monotonic(), st.get("walk_ms", 0.0) / 1000
        time.sleep(max(0.0, t0 + 1.0 - time.monotonic()))
    reader.phase = "gap"
    time.sleep(1.0)  # the window in flight when the phase ended is not counted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frozen", type=int, default=660_000)
    ap.add_argument("--live", type=int, default=50_000, help="tracked objects the target keeps")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--phase-s", type=float, default=15.0, help="seconds per slowdown phase")
    args = ap.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    p = subprocess.Popen([sys.executable, "-c", TARGET, str(args.frozen), str(args.live)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    if len(cpus) >= 2:  # the target on one CPU, the probe on another: what a hunt on an idle core costs
        os.sched_setaffinity(p.pid, {cpus[0]})
        os.sched_setaffinity(0, {cpus[1]})
    try:
        frozen = int(p.stdout.readline().split()[1])  # type: ignore[union-attr]
        reader = Reader(p)
        reader.start()
        read_python_heap(p.pid, walk=False)  # structure offsets found once (gdb on the file), not timed
        tick_s, tick = timed(p.pid, False, args.reps)
        walk_s, full = timed(p.pid, True, args.reps)
        time.sleep(2.0)
        for name, mode in (("none", "none"), ("hunt", "hunt"), ("none", "none"), ("worst", "worst"),
                           ("none", "none"), ("hunt", "hunt")):
            phase(reader, name, args.phase_s, p.pid, mode)
    finally:
        p.kill()
        p.wait()
    thr = {k: statistics.median([n for ph, n in reader.rows if ph == k]) * 2 for k in ("none", "hunt", "worst")}
    walk_every = max(PyHeapProbe.MIN_WALK_GAP_S, walk_s / PyHeapProbe.WALK_DUTY)
    objects = (full.get("tracked") or 0) + (full.get("frozen") or 0)
    print(json.dumps({
        "frozen_objects": frozen, "objects_walked": objects,
        "tick_ms": round(tick_s * 1000, 3), "walk_ms": round(walk_s * 1000, 1),
        "walk_us_per_object": round(walk_s / max(objects, 1) * 1e6, 3),
        "walk_every_s": round(walk_every, 1),
        "per_tick_ms": round((tick_s + walk_s / walk_every) * 1000, 3),
        "types_counted": len(full.get("types") or {}), "frozen_seen_by_walk": full.get("frozen"),
        # the target replaces ~1.5M Items a second: the walk's count of a type under that churn
        "item_objects_seen": (full.get("types") or {}).get("Item", (None,))[0], "item_objects_held": args.live,
        "target_iterations_per_s": {k: round(v) for k, v in thr.items()},
        "slowdown_ratio_hunt": round(thr["none"] / thr["hunt"], 3),  # 1.0: no slowdown
        "slowdown_ratio_worst": round(thr["none"] / thr["worst"], 3),
        "cpus": len(cpus), "loadavg": os.getloadavg(),
    }, indent=2))


if __name__ == "__main__":
    main()
