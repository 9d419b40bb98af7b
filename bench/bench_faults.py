"""Page-fault probe overhead: a fault storm (fresh anonymous pages written, one byte per page: every write is a
first-touch fault), untraced vs traced by the default eBPF probes (ledger + page-fault probe) vs traced by the
ledger alone (the program built with LT_NO_FAULTS), in one run; and untraced rounds before any program is loaded (the filter's cost to processes not traced,
which pay for the program up to its tgid check). Both programs stay loaded; each round the
workload is the target of one of them or of none, rounds interleaved, so the machine's background load cancels
out in the per-pair ratios. Two clocks: wall time, and the workload's CPU time (user + system: the fault and the
probe run in the workload's context). Prints one JSON document.

    .venv/bin/python bench/bench_faults.py --runs 8 --mib 256 --maps 4

Goal: traced ≤ 1.15× untraced (CPU) with the default probes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from leaktrace.probes import HuntContext, HuntOptions, TargetSet  # noqa: E402
from leaktrace.probes.bpf.faults import DEFAULT_SAMPLE  # noqa: E402
from leaktrace.probes.bpf.probe import BpfProbe  # noqa: E402
from leaktrace.session import SessionWriter  # noqa: E402

# The storm, in its own process: per "go", MAPS times: map MIB MiB, write one byte per page, unmap.
STORM = r"""
import mmap, resource, sys, time
import numpy as np
mib, maps = int(sys.argv[1]), int(sys.argv[2])
print("ready", flush=True)
for line in sys.stdin:
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(maps):
        m = mmap.mmap(-1, mib << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        a = np.frombuffer(m, dtype=np.uint8)
        a[::4096] = 1
        del a
        m.close()
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    print(time.perf_counter() - t0, cpu, flush=True)
"""


class Storm:
    def __init__(self, mib: int, maps: int) -> None:
        self.p = subprocess.Popen([sys.executable, "-c", STORM, str(mib), str(maps)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        assert self.p.stdout is not None and self.p.stdout.readline().startswith("ready")
        self.pid = self.p.pid
        self.faults = maps * (mib << 20) // 4096

    def round(self) -> tuple[float, float]:
        """One round: (wall seconds, CPU seconds of the workload)."""
        assert self.p.stdin is not None and self.p.stdout is not None
        self.p.stdin.write("go\n")
        self.p.stdin.flush()
        wall, cpu = self.p.stdout.readline().split()
        return float(wall), float(cpu)

    def close(self) -> None:
        self.p.kill()
        self.p.wait()


class Tracer:
    """A loaded probe whose only possible target is the storm, traced or not per round."""

    def __init__(self, pid: int, d: Path, name: str, defines: dict[str, int] | None = None) -> None:
        self.session = SessionWriter(d / name)
        self.ctx = HuntContext(self.session, TargetSet(roots=[], pids={}), HuntOptions(), lambda s: None)
        self.probe = BpfProbe(defines=defines)
        self.probe.start(self.ctx)
        self.pid = pid
        self.probe.add_pid(pid)  # seeds the ledger with the storm's maps
        self.off()

    def on(self) -> None:
        self.probe.kernel.add_target(self.pid)

    def off(self) -> None:
        with self.probe.lock:
            self.probe.kernel.untarget_all()

    def tick(self) -> None:
        self.probe.tick(self.session.now())

    def close(self) -> dict[str, int]:
        stats = self.probe.faults.stats() if "LT_NO_FAULTS" not in self.probe.defines else {}
        self.probe.stop()
        self.session.close()
        return stats


def spread(values: list[float]) -> dict[str, float]:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {"min": min(values), "q1": q[0], "median": q[1], "q3": q[2], "max": max(values)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--maps", type=int, default=4)
    ap.add_argument("--sample", type=int, default=0, help="LT_FAULT_SAMPLE (0: the program's default)")
    ap.add_argument("--json")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print(json.dumps({"skipped": "needs root"}))
        return
    storm = Storm(args.mib, args.maps)
    wall: dict[str, list[float]] = {"untraced": [], "default": [], "ledger_only": []}
    cpu: dict[str, list[float]] = {k: [] for k in wall}
    ratios: dict[str, list[float]] = {"default": [], "ledger_only": []}
    cpu_ratios: dict[str, list[float]] = {"default": [], "ledger_only": []}
    storm.round()  # warm-up
    # Before any program is loaded and after both are unloaded: what every process pays for the loaded probe's
    # filter (its write faults run the program up to the tgid check) shows against this, in the untraced rounds.
    unloaded = [storm.round() for _ in range(max(2, args.runs // 2))]
    with tempfile.TemporaryDirectory() as d:
        full = Tracer(storm.pid, Path(d), "default", {"LT_FAULT_SAMPLE": args.sample} if args.sample else None)
        ledger = Tracer(storm.pid, Path(d), "ledger", {"LT_NO_FAULTS": 1})
        try:
            storm.round()  # warm-up
            for _ in range(args.runs):
                for name, tracer in (("default", full), ("ledger_only", ledger)):
                    uw, uc = storm.round()
                    tracer.on()
                    tw, tc = storm.round()
                    tracer.off()
                    tracer.tick()
                    wall["untraced"].append(uw)
                    cpu["untraced"].append(uc)
                    wall[name].append(tw)
                    cpu[name].append(tc)
                    ratios[name].append(tw / uw)
                    cpu_ratios[name].append(tc / uc)
        finally:
            stats = full.close()
            ledger.close()
    try:
        unloaded += [storm.round() for _ in range(max(2, args.runs // 2))]  # and after: drift shows
    finally:
        storm.close()
    res = {
        "runs": args.runs, "sample": args.sample or DEFAULT_SAMPLE, "mib": args.mib, "maps": args.maps, "faults_per_round": storm.faults,
        "untraced_s": statistics.median(wall["untraced"]), "untraced_cpu_s": statistics.median(cpu["untraced"]),
        "untraced_faults_per_s": storm.faults / statistics.median(wall["untraced"]),
        "unloaded_cpu_s": statistics.median(c for _, c in unloaded),
        "untraced_vs_unloaded_cpu_ratio": statistics.median(cpu["untraced"]) / statistics.median(c for _, c in unloaded),
        "default_vs_unloaded_cpu_ratio": statistics.median(cpu["default"]) / statistics.median(c for _, c in unloaded),
        "unloaded_cpu_s_each": [c for _, c in unloaded],
        "default_ratio": statistics.median(ratios["default"]),
        "default_cpu_ratio": statistics.median(cpu_ratios["default"]),
        "default_cpu_ratio_spread": spread(cpu_ratios["default"]),
        "ledger_only_ratio": statistics.median(ratios["ledger_only"]),
        "ledger_only_cpu_ratio": statistics.median(cpu_ratios["ledger_only"]),
        "ledger_only_cpu_ratio_spread": spread(cpu_ratios["ledger_only"]),
        "fault_stats": stats,
    }
    text = json.dumps(res, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text)


if __name__ == "__main__":
    main()
