"""Does the gdb sampler inflate what it measures?

gdb stops a thread at its mmap/munmap syscalls, possibly inside malloc with the thread's arena locked. If
that made other threads' mallocs fall back to new arenas, or the heaps fragment more, a multithreaded
malloc workload would grow more RSS under ``hunt`` (gdb on) than under ``hunt --no-gdb``.

Identical multithreaded churners (tests/fixtures/frag_churn.c, same seed) run side by side: one not
hunted, one hunted with ``--no-gdb``, one hunted with the default probes (gdb on). Per condition: RSS at
the hunt's start and end, the malloc arenas (64 MiB-aligned anonymous heaps in /proc/PID/maps) and
their mapped MB at the end, the mappings count, and gdb's stops. Workloads: heaps only (every block in
the arenas); a fixed 128 KiB mmap threshold (every block above it mmapped and munmapped inside
malloc/free: the most gdb stops, each with the thread's arena lock held); the same with 32 threads (more
than the arena limit on a small machine: arenas shared). Prints one JSON document.

    .venv/bin/python bench/bench_gdb_inflation.py --duration 60

Inflation would show as the gdb condition ending with more RSS or more arenas than the other two of the
same run; compare conditions within a run, never across runs (runs differ by more than the conditions do).
The sampler runs in non-stop mode: only the thread at the syscall stops, and glibc makes a thread
that finds its arena locked wait, not take a new one (new arenas go to new threads, or past a failed
allocation).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from fixtures.build import build  # noqa: E402

HEAP_ALIGN = 64 << 20  # glibc's HEAP_MAX_SIZE on 64-bit: every non-main arena heap is aligned to it
WORKLOADS = {
    "heaps-only": ["--ops-per-s", "60", "--max-kib", "1024"],
    "mmap-128k": ["--ops-per-s", "200", "--max-kib", "1024", "--mmap-threshold-kib", "128"],
    # more threads than malloc's arena limit (8 per core): threads share arenas and wait on each other's
    # locks, the case where a thread stopped with its arena locked could push others to new arenas
    "mmap-128k-32-threads": ["--threads", "32", "--ops-per-s", "50", "--max-kib", "1024",
                             "--mmap-threshold-kib", "128"],
}


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def arenas(pid: int) -> dict[str, float]:
    """Non-main malloc arenas: anonymous mappings starting on a 64 MiB boundary (a heap and its PROT_NONE
    reserve are two mappings from one aligned start)."""
    starts: dict[int, int] = {}
    maps = 0
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = line.split()
        maps += 1
        if len(parts) > 5:  # a path: not an arena
            continue
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        base = lo - lo % HEAP_ALIGN
        if lo % HEAP_ALIGN == 0 or base in starts:
            if "r" in parts[1]:
                starts[base] = starts.get(base, 0) + (hi - lo)
    return {"arenas": len(starts), "arena_mapped_mb": round(sum(starts.values()) / 2**20, 1), "maps": maps}


def run_workload(bin_path: Path, args: list[str], duration: float, out: Path) -> dict[str, dict]:
    conds = ("no-hunt", "hunt --no-gdb", "hunt (gdb on)")
    procs = {c: subprocess.Popen([str(bin_path), *args], stdout=subprocess.PIPE, text=True,
                                 start_new_session=True) for c in conds}
    try:
        for p in procs.values():
            assert p.stdout is not None and p.stdout.readline().startswith("ready")
        start = {c: rss_mb(p.pid) for c, p in procs.items()}
        results: dict[str, subprocess.CompletedProcess] = {}

        def hunt(cond: str, extra: list[str]) -> None:
            results[cond] = subprocess.run(
                [sys.executable, "-m", "leaktrace", "hunt", "--pid", str(procs[cond].pid), "--duration",
                 str(duration), "--format", "json", "--out", str(out / cond.replace(" ", "_")), *extra],
                capture_output=True, text=True, cwd=str(REPO), env={**os.environ, "PYTHONPATH": str(REPO)})

        ths = [threading.Thread(target=hunt, args=("hunt --no-gdb", ["--no-gdb"])),
               threading.Thread(target=hunt, args=("hunt (gdb on)", []))]
        t0 = time.monotonic()
        for th in ths:
            th.start()
        for th in ths:
            th.join()
        elapsed = time.monotonic() - t0
        rows = {}
        for c, p in procs.items():
            row = {"rss_start_mb": round(start[c], 1), "rss_end_mb": round(rss_mb(p.pid), 1), **arenas(p.pid)}
            row["rss_growth_mb"] = round(row["rss_end_mb"] - row["rss_start_mb"], 1)
            if c in results:
                d = out / c.replace(" ", "_")
                rep = json.loads((d / "report.json").read_text()) if (d / "report.json").exists() else {}
                row["verdict"] = rep.get("verdict")
                row["hunt_rc"] = results[c].returncode
                runs = d / "tables"
                if c == "hunt (gdb on)" and runs.exists():
                    from leaktrace.session import SessionReader

                    gr = SessionReader(d).table("gdb_runs")
                    if not gr.empty:
                        row["gdb_stops"] = int(gr["stops"].sum())
                        row["gdb_paused_ms"] = round(float(gr["paused_s"].sum()) * 1000, 1)
            rows[c] = row
        rows["_elapsed_s"] = round(elapsed, 1)  # type: ignore[assignment]
        return rows
    finally:
        for p in procs.values():
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--workload", choices=sorted(WORKLOADS), action="append")
    a = ap.parse_args()
    bin_path = build("frag_churn", ["frag_churn.c"], ldflags=["-lpthread", "-lm"])
    out: dict[str, object] = {"duration_s": a.duration}
    with tempfile.TemporaryDirectory(prefix="lt-gdb-inflation-") as tmp:
        for name in a.workload or sorted(WORKLOADS):
            out[name] = run_workload(bin_path, WORKLOADS[name], a.duration, Path(tmp) / name)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
