"""Watcher cost on a process with 10,000 mappings, as ratios to `cat /proc/PID/smaps > /dev/null` timed
in the same run (the kernel's own cost of producing the text; this machine is shared and noisy).

    .venv/bin/python bench/bench_watcher.py [--maps 10000] [--reps 15]

Reports (medians of CPU time, user+sys of this process): smaps_rollup read+parse, full smaps
read+parse+classify+diff, and the watcher's duty cycle at a 1 s tick with rollup every tick and a
full smaps every 10 ticks (goal: < 2% of one core).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from fixtures.build import build  # noqa: E402

from leaktrace import procfs  # noqa: E402
from leaktrace.probes.watcher import diff_regions, read_regions, regions_from_smaps  # noqa: E402


def cpu() -> float:
    t = os.times()
    return t.user + t.system


def children_cpu() -> float:
    t = os.times()
    return t.children_user + t.children_system


def median_cost(fn, reps: int, clock=cpu) -> float:
    out = []
    for _ in range(reps):
        c0 = clock()
        w0 = time.perf_counter()
        fn()
        # os.times() ticks at 10 ms: fall back to wall time for short calls (single-threaded, so close)
        dc = clock() - c0
        dw = time.perf_counter() - w0
        out.append(dc if dc >= 0.02 else dw)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--maps", type=int, default=10000)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    exe = build("many_maps", ["many_maps.c"])
    p = subprocess.Popen([str(exe), str(a.maps)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().startswith("ready")
        pid = p.pid
        nmaps = len(procfs.read_maps(pid))
        cat = median_cost(lambda: subprocess.run(["cat", f"/proc/{pid}/smaps"], stdout=subprocess.DEVNULL,
                                                 check=True), a.reps, clock=lambda: time.perf_counter())
        read_only = median_cost(lambda: procfs.read_proc_bytes(pid, "smaps"), a.reps)
        rollup = median_cost(lambda: procfs.parse_smaps_rollup(procfs.read_proc_text(pid, "smaps_rollup")), a.reps)
        prev = regions_from_smaps(procfs.read_smaps(pid))

        def full_generic():
            diff_regions(prev, regions_from_smaps(procfs.read_smaps(pid)))

        def full():
            diff_regions(prev, read_regions(pid))

        generic_cost = median_cost(full_generic, a.reps)
        full_cost = median_cost(full, a.reps)
        duty = (rollup + full_cost / 10) / 1.0
        res = {
            "mappings": nmaps,
            "cat_smaps_s": cat,
            "read_smaps_s": read_only,
            "rollup_s": rollup,
            "full_smaps_parse_classify_diff_s": full_cost,
            "full_smaps_generic_parser_s": generic_cost,
            "ratio_full_to_cat": full_cost / cat,
            "ratio_generic_full_to_cat": generic_cost / cat,
            "ratio_rollup_to_cat": rollup / cat,
            "duty_cycle_pct_of_core_1s_tick": 100 * duty,
            "goal_pct": 2.0,
        }
        for k, v in res.items():
            print(f"{k:>36}: {v:.4g}" if isinstance(v, float) else f"{k:>36}: {v}")
        if a.json:
            Path(a.json).write_text(json.dumps(res, indent=2))
    finally:
        p.kill()
        p.wait()


if __name__ == "__main__":
    main()
