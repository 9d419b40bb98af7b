"""What a hunt costs a busy node: seconds until it is live, ticks on time, its CPU, how soon it ends.

A synthetic stand-in for a vLLM P/D pair: a tree of --procs Python processes (the root and its children),
each holding --objects GC-tracked objects frozen by gc.freeze() (as vLLM freezes its start-up heap), a
young set it keeps replacing, --maps separate anonymous mappings (vLLM processes hold thousands), and a
slow mmap leak; one busy-loop hog per CPU keeps every core busy. ``leaktrace hunt`` runs on the tree as
its own process, with every default probe (eBPF, gdb, pyheap, ucx), once per --repo (a checkout: the
one under test by default; e.g. an older commit cloned to /tmp to compare, run with PYTHONPATH=REPO).

Measured per run:
  ``attach_s``       meta.json's attach_s (seconds until every probe was live) and ``probe_attach_s``
                     (each probe's own start, when the checkout records it)
  ``late_ticks``     ticks started more than one interval late, of all ticks (``late_fraction``), and
                     the worst lateness
  ``cpu_cores``      CPU seconds of the hunt and its helpers (gdb, the heap walker: wait4's rusage of the
                     hunt process) over its wall time from spawn to exit
  ``over_window_s``  seconds from the end of the hunt's window (its attach + --duration) until the hunt
                     process exited (stop, the last reads, the reports)

    .venv/bin/python bench/bench_attach_ticks.py --duration 60
    .venv/bin/python bench/bench_attach_ticks.py --repo /tmp/old --repo .   # before/after in one run

Seen on the shared 2-core machine (6 processes x 150k frozen objects x 2,000 mappings, every one leaking
1 MiB now and then, 2 hogs, load average 3-7 from CI beside it, 90 s hunts, gdb on), before / after:
attach_s 7.2 s / 3.0 s (bpf live 2.6 s after the hunt's start, its compile 1.4 s of it; watcher 0.06 s;
pyheap 0.01 s: its walks start after attach); ticks late 0 / 0 of 91; CPU 0.151 / 0.161 of a core from spawn
to exit (hunt 8.6 / 10.6 s, helpers 6.4 / 4.2 s: the heap walker held to 3% of a core; every process here
grows, so no full smaps read is skipped, and the watcher's ticks cost as much as before: 3.5 / 4.5 s, within
this machine's run-to-run spread); window end to exit 9.8 / 7.4 s (pyheap's stop walks 2.2 s, bpf 1.3 s,
watcher 0.3 s, reports 1.8 s). Under heavier load (load average 5-10): attach_s 18.6 s / 4.6 s.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

TARGET = r"""
import ctypes, gc, mmap, os, subprocess, sys, time
role, objects, nmaps, kids = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
children = [subprocess.Popen([sys.executable, "-c", sys.argv[0] if False else SRC, "child", str(objects),
                              str(nmaps), "0"]) for _ in range(kids)] if role == "root" else []
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
for i in range(nmaps):  # separate VMAs: alternating protections keep neighbours from merging
    p = libc.mmap(None, 8192, 1 | (2 if i % 2 else 0), 0x22, -1, 0)
    if i % 2:
        ctypes.memset(p, 1, 1)
keep = [[i] for i in range(objects)]
gc.freeze()
live = [(i, [i]) for i in range(20000)]
leak = []
if role == "root":
    print("ready", flush=True)
i = 0
while True:
    live[i % len(live)] = (i, [i])
    i += 1
    if i % 5000 == 0:
        time.sleep(0.05)
    if i % 100000 == 0:
        m = mmap.mmap(-1, 1 << 20)
        m.write(b"x" * (1 << 20))
        leak.append(m)
"""
HOG = "while True: pass"


def start_tree(procs: int, objects: int, maps: int) -> subprocess.Popen:
    src = "SRC = " + repr(TARGET) + "\n" + TARGET
    root = subprocess.Popen([sys.executable, "-c", src, "root", str(objects), str(maps), str(procs - 1)],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert root.stdout is not None and root.stdout.readline().startswith("ready")
    time.sleep(3.0)  # the children build their heaps too
    return root


def hunt(repo: Path, pid: int, duration: float, interval: float, gdb: bool) -> dict:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "h"
        env = {**os.environ, "PYTHONPATH": str(repo)}
        cmd = [sys.executable, "-m", "leaktrace", "hunt", "--pid", str(pid), "--duration", str(duration),
               "--interval", str(interval), "--out", str(out), "--format", "json"] + ([] if gdb else ["--no-gdb"])
        t0 = time.monotonic()
        p = subprocess.Popen(cmd, env=env, cwd=str(repo), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True)
        _pid, status, ru = os.wait4(p.pid, 0)
        t_exit = time.monotonic()
        p.returncode = os.waitstatus_to_exitcode(status)
        err = p.stderr.read() if p.stderr else ""
        if p.returncode != 0:
            return {"error": f"exit {p.returncode}: {err[-800:]}"}
        meta = json.loads((out / "meta.json").read_text())
    tc = meta.get("tick_costs") or {}
    attach = float(meta.get("attach_s") or 0.0)
    window_end = float(meta["t0_monotonic"]) + attach + duration
    cpu = ru.ru_utime + ru.ru_stime
    wall = t_exit - t0
    ticks = int(tc.get("ticks", 0))
    return {
        "attach_s": round(attach, 2),
        "probe_attach_s": meta.get("probe_attach_s"),
        "startup_s": round(float(meta["t0_monotonic"]) - t0, 2),
        "ticks": ticks, "late_ticks": tc.get("late_ticks"),
        "late_fraction": round(tc.get("late_ticks", 0) / ticks, 3) if ticks else None,
        "max_late_s": tc.get("max_late_s"),
        "tick_wall_s": {k: v.get("wall_s") for k, v in (tc.get("probes") or {}).items()},
        "tick_cpu_s": {k: v.get("cpu_s") for k, v in (tc.get("probes") or {}).items()},
        "tick_max_wall_s": {k: v.get("max_wall_s") for k, v in (tc.get("probes") or {}).items()},
        "stop_s": tc.get("stop_s"), "report_s": round(t_exit - float(meta["t0_monotonic"]) - float(meta["end_wall"])
                                                       + float(meta["start_wall"]), 1),
        "walks": (meta.get("probe_summaries") or {}).get("pyheap", {}).get("walks"),
        "bpf_compile_s": ((meta.get("probe_summaries") or {}).get("bpf") or {}).get("compile_s"),
        "smaps": {k: v for k, v in ((meta.get("probe_summaries") or {}).get("watcher") or {}).items()
                  if k in ("smaps_reads", "smaps_skipped")},
        "gdb": {k: v for k, v in ((meta.get("probe_summaries") or {}).get("gdb") or {}).items()
                if k in ("runs", "samples", "paused_s", "attach_s")},
        "cpu_s": round(cpu, 2), "hunt_cpu_s": tc.get("process_cpu_s"), "helpers_cpu_s": tc.get("children_cpu_s"),
        "wall_s": round(wall, 1), "cpu_cores": round(cpu / wall, 3),
        "over_window_s": round(t_exit - window_end, 1),
        "stop_reason": meta.get("stop_reason"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", action="append", type=Path, help="checkout to run the hunt from (repeatable)")
    ap.add_argument("--procs", type=int, default=6, help="processes in the target tree")
    ap.add_argument("--objects", type=int, default=150_000, help="frozen GC-tracked objects per process")
    ap.add_argument("--maps", type=int, default=2000, help="separate mappings per process")
    ap.add_argument("--duration", type=float, default=40.0)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--hogs", type=int, default=os.cpu_count() or 2, help="busy-loop processes (0: no load)")
    ap.add_argument("--no-gdb", action="store_true")
    args = ap.parse_args()
    repos = args.repo or [REPO]
    root = start_tree(args.procs, args.objects, args.maps)
    hogs: list[subprocess.Popen] = []
    res: dict[str, dict] = {}
    try:
        hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(args.hogs)]
        time.sleep(1.0)
        for repo in repos:
            res[str(repo)] = hunt(repo.resolve(), root.pid, args.duration, args.interval, not args.no_gdb)
    finally:
        for p in hogs:
            p.kill()
            p.wait()
        os.killpg(root.pid, 9)
        root.wait()
    print(json.dumps({"procs": args.procs, "objects": args.objects, "maps": args.maps, "hogs": args.hogs,
                      "cpus": os.cpu_count(), "duration_s": args.duration, "interval_s": args.interval,
                      "runs": res, "loadavg": os.getloadavg()}, indent=2))


if __name__ == "__main__":
    main()
