"""The hunt's tick lag while the pyheap probe walks a big Python heap on a CPU-starved machine: the walk in a
thread of the hunt (``PyHeapProbe.IN_PROCESS``) against the walk in the walker process (the default), in
the same run.

A Python target holds ~700k GC-tracked objects (--frozen lists frozen by gc.freeze(), as vLLM freezes its
start-up heap, and --live more it keeps replacing), one busy-loop hog per CPU keeps every core busy, and a
real hunt (watcher + pyheap, no eBPF, no gdb) runs for --seconds per mode. Measured:
  ``tick``   the hunt's tick thread: each tick's start against its schedule (lag: max, p99) and the
             longest gap between two ticks
  ``drain``  a thread waking every 50 ms as the eBPF ring's consumer does (bpf-poll): how late it woke
             (max, p99) while the hunt ticked, and the max over attach and stop too: what a GIL held by a
             walk costs the ring's draining
  ``walks``  walks done, their cost (median, max walk_ms as the walker measured it), type rows written
The walks run back to back (--gap 1 s, no duty limit): the worst case, as one long walk is.

    .venv/bin/python bench/bench_pyheap_ticklag.py --seconds 30

On a shared 2-core machine (load average 14-20 besides the two hogs; ~700k tracked objects, 0.5 s ticks,
30 s per mode), walks in the hunt's thread hold the GIL against everything else: ticks seconds late, the
50 ms poller late by seconds, every walk cut at its 5 s budget (no types). With the walks in the walker
process both stay around 15 ms late at most while the hunt ticks (hundreds of times less), and the walks
finish (the frozen set kept between them). The walker runs at nice 10, not 19: at nice 19 it finishes no
walk in 30 s next to the hogs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from leaktrace.hunt import run_hunt  # noqa: E402
from leaktrace.probes import HuntOptions  # noqa: E402
from leaktrace.probes.pyheap.probe import PyHeapProbe  # noqa: E402
from leaktrace.session import SessionReader  # noqa: E402

TARGET = """
import gc, sys, time
keep = [[i] for i in range(int(sys.argv[1]))]  # lists: always GC-tracked
gc.freeze()
live = [(i, [i]) for i in range(int(sys.argv[2]) // 2)]
print("ready", gc.get_freeze_count(), len(gc.get_objects()), flush=True)
i = 0
while True:
    live[i % len(live)] = (i, [i])
    i += 1
    if i % 20000 == 0:
        time.sleep(0.01)
"""
HOG = "while True: pass"


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0


class Drain(threading.Thread):
    """Wakes every 50 ms (the bpf-poll thread's interval) and records how late."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.late: list[tuple[float, float]] = []  # (woke at, late by)
        self.stop = threading.Event()

    def run(self) -> None:
        nxt = time.monotonic() + 0.05
        while not self.stop.is_set():
            time.sleep(max(0.0, nxt - time.monotonic()))
            now = time.monotonic()
            self.late.append((now, now - nxt))
            nxt = max(nxt + 0.05, time.monotonic())


def hunt_once(pid: int, in_process: bool, seconds: float, interval: float, gap: float) -> dict:
    PyHeapProbe.IN_PROCESS = in_process
    PyHeapProbe.MIN_WALK_GAP_S, PyHeapProbe.WALK_DUTY = gap, 1.0
    ticks: list[float] = []
    mono: list[float] = []
    drain = Drain()
    drain.start()
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "h"
        opts = HuntOptions(duration=seconds, interval=interval, bpf=False, gdb=False, pyheap=True, live=False)
        t0 = time.monotonic()
        run_hunt([pid], opts, out, write_reports=False, on_tick=lambda _ctx, now: (ticks.append(now), mono.append(time.monotonic())))
        stop_s = time.monotonic() - t0 - seconds
        drain.stop.set()
        drain.join()
        rdr = SessionReader(out)
        ph = rdr.table("pyheap")
        walks = ph[ph["walk_ms"].notna()] if "walk_ms" in ph else ph.iloc[0:0]
        types = rdr.table("pyheap_types")
    lags = [t - (ticks[0] + i * interval) for i, t in enumerate(ticks)]
    gaps = [b - a for a, b in zip(ticks, ticks[1:], strict=False)]
    late = [x for t, x in drain.late if mono[0] <= t <= mono[-1]]  # while the hunt ticked
    late_all = [x for _t, x in drain.late]  # attach and stop too
    wm = list(walks["walk_ms"]) if len(walks) else []
    return {
        "ticks": len(ticks),
        "tick_lag_max_s": round(max(lags), 3), "tick_lag_p99_s": round(pct(lags, 0.99), 3),
        "tick_gap_max_s": round(max(gaps), 3),
        "drain_late_max_s": round(max(late), 3), "drain_late_p99_s": round(pct(late, 0.99), 3),
        "drain_late_max_with_attach_stop_s": round(max(late_all), 3),
        "walks": len(wm), "walk_ms_median": round(statistics.median(wm), 1) if wm else None,
        "walk_ms_max": round(max(wm), 1) if wm else None,
        "frozen_seen": int(walks["frozen"].max()) if len(walks) else None,
        "type_rows": len(types), "stop_s": round(stop_s, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frozen", type=int, default=600_000)
    ap.add_argument("--live", type=int, default=100_000, help="young objects the target keeps (and replaces)")
    ap.add_argument("--seconds", type=float, default=30.0, help="per mode")
    ap.add_argument("--interval", type=float, default=0.5, help="the hunt's tick interval")
    ap.add_argument("--gap", type=float, default=1.0, help="least seconds between two walks of the target")
    ap.add_argument("--hogs", type=int, default=os.cpu_count() or 2, help="busy-loop processes (0: no load)")
    args = ap.parse_args()
    saved = (PyHeapProbe.IN_PROCESS, PyHeapProbe.MIN_WALK_GAP_S, PyHeapProbe.WALK_DUTY)
    target = subprocess.Popen([sys.executable, "-c", TARGET, str(args.frozen), str(args.live)],
                              stdout=subprocess.PIPE, text=True)
    hogs: list[subprocess.Popen] = []
    try:
        ready = target.stdout.readline().split()  # type: ignore[union-attr]
        hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(args.hogs)]
        time.sleep(1.0)
        res = {}
        for name, in_process in (("old_in_thread", True), ("new_walker_process", False)):
            res[name] = hunt_once(target.pid, in_process, args.seconds, args.interval, args.gap)
    finally:
        PyHeapProbe.IN_PROCESS, PyHeapProbe.MIN_WALK_GAP_S, PyHeapProbe.WALK_DUTY = saved
        for p in [target, *hogs]:
            p.kill()
            p.wait()
    old, new = res["old_in_thread"], res["new_walker_process"]

    def ratio(k: str) -> float | None:
        return round(old[k] / new[k], 1) if new[k] else None

    print(json.dumps({
        "target_frozen": int(ready[1]), "target_tracked": int(ready[2]), "hogs": args.hogs,
        "cpus": os.cpu_count(), "interval_s": args.interval, "seconds": args.seconds, **res,
        "ratios_old_over_new": {k: ratio(k) for k in ("tick_lag_max_s", "tick_lag_p99_s", "tick_gap_max_s",
                                                       "drain_late_max_s", "drain_late_p99_s")},
        "loadavg": os.getloadavg(),
    }, indent=2))


if __name__ == "__main__":
    main()
