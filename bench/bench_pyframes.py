"""What reading the Python stack adds to a gdb stop: the sampler's stop time with the thread's Python frames
read from the interpreter's memory (leaktrace/pyframes.py) against the same sampler with the read off, on the
same Python target in the same run, alternating, at two stack depths.

    .venv/bin/python bench/bench_pyframes.py [--seconds 4] [--rounds 2] [--json out.json]

The target (CPython, this venv's) calls the stripped fixture library through ctypes ~200 times a second at the
bottom of a Python recursion of the given depth; gdb samples its mmap syscalls (no pause budget). Reported per
depth: the median stop (µs) with and without the read, their ratio, and the read's own median (python_us)."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from unittest import mock

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from fixtures.build import build  # noqa: E402
from fixtures.gdb_target import LEAK_LIB  # noqa: E402

from leaktrace.probes.gdb import attach as gdb_attach  # noqa: E402
from leaktrace.probes.gdb.attach import sample_process  # noqa: E402
from leaktrace.probes.gdb.budget import PauseBudget  # noqa: E402

NO_BUDGET = PauseBudget(pause_fraction=1.0, floor_s=1e6, max_stops_per_s=1e9)
TARGET = r"""
import ctypes, os, sys, time
lib = ctypes.CDLL(sys.argv[1])
lib.gdbleak_pool_chunk.restype = ctypes.c_void_p
lib.gdbleak_pool_chunk.argtypes = [ctypes.c_ulong]
lib.gdbleak_pool_release.argtypes = [ctypes.c_void_p, ctypes.c_ulong]
def deep(n):
    if n:
        return deep(n - 1)
    while True:
        for _ in range(20):
            lib.gdbleak_pool_release(lib.gdbleak_pool_chunk(65536), 65536)
        time.sleep(0.1)
print("ready", os.getpid(), flush=True)
deep(int(sys.argv[2]))
"""


def one(pid: int, seconds: float, python: bool) -> tuple[list[float], list[float]]:
    off = {"error": "off (bench baseline)"}
    with mock.patch.object(gdb_attach, "frames_config", (lambda _pid: off) if not python else gdb_attach.frames_config):
        run = sample_process(pid, max_samples=0, max_seconds=seconds, budget=NO_BUDGET, libraries={LEAK_LIB},
                             stacks_on_munmap=False)
    recs = [r for r in run.sample_records if r.get("syscall") == "mmap"]
    if python:
        assert all(r.get("python_stack") for r in recs), "no Python stack read"
    return [float(r["stop_us"]) for r in recs], [float(r.get("python_us") or 0.0) for r in recs]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()
    lib = build(LEAK_LIB, ["gdb_leaklib.c"], cflags=["-fomit-frame-pointer"], ldflags=[f"-Wl,-soname,{LEAK_LIB}"],
                shared=True, strip=True)
    out = {}
    for depth in (5, 50):
        p = subprocess.Popen([sys.executable, "-c", TARGET, str(lib), str(depth)], stdout=subprocess.PIPE, text=True)
        try:
            assert p.stdout is not None and p.stdout.readline().startswith("ready")
            stops: dict[bool, list[float]] = {True: [], False: []}
            reads: list[float] = []
            for _ in range(args.rounds):
                for python in (False, True):
                    s, r = one(p.pid, args.seconds, python)
                    stops[python] += s
                    if python:
                        reads += r
        finally:
            p.kill()
            p.wait()
        with_, without = statistics.median(stops[True]), statistics.median(stops[False])
        out[depth] = {"stops": {"with": len(stops[True]), "without": len(stops[False])},
                      "stop_us_with": round(with_, 1), "stop_us_without": round(without, 1),
                      "ratio": round(with_ / without, 3), "python_us_median": round(statistics.median(reads), 1),
                      "python_us_p90": round(sorted(reads)[int(0.9 * len(reads))], 1)}
        print(f"depth {depth + 2} frames: stop {with_:.0f} µs with the read, {without:.0f} µs without "
              f"({with_ / without:.2f}x); the read {out[depth]['python_us_median']:.0f} µs median, "
              f"p90 {out[depth]['python_us_p90']:.0f} µs ({len(stops[True])}/{len(stops[False])} stops)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
