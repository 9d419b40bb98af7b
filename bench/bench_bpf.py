"""eBPF probe overhead: 200k raw mmap+munmap pairs of 4 KiB, untraced vs traced by leaktrace vs the
bpftrace anchor (a user stack per mmap aggregated in the kernel, bench/bpftrace_anchor.bt), plus the
cost on an unrelated process while leaktrace traces another. Untraced and traced rounds alternate, all
in one process of the workload (same page-cache and CPU state); each condition's figure is the median of
the per-pair ratios, with their spread (min, quartiles, max). Two clocks: wall time, and the workload's
CPU time — the probe runs in the workload's context, so its cost is CPU time of the workload, and that
figure does not move with the load of a shared machine the way wall time does. Prints one JSON document.

    .venv/bin/python bench/bench_bpf.py --runs 6 --pairs 200000

Goals: traced ≤ 1.3× untraced with 0 lost events and an exact ledger; unrelated ≤ 1.1×.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from fixtures.build import build  # noqa: E402

from leaktrace.probes import HuntContext, HuntOptions, TargetSet  # noqa: E402
from leaktrace.probes.bpf.probe import BpfProbe  # noqa: E402
from leaktrace.session import SessionWriter  # noqa: E402

ANCHOR = Path(__file__).resolve().parent / "bpftrace_anchor.bt"


class Workload:
    def __init__(self, pairs: int, size: int) -> None:
        exe = build("bpf_pairs", ["bpf_pairs.c"])
        self.p = subprocess.Popen([str(exe), str(pairs), str(size)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True)
        assert self.p.stdout is not None and self.p.stdout.readline().startswith("ready")
        self.pid = self.p.pid

    def round(self) -> tuple[float, float]:
        """One round: (wall seconds, CPU seconds of the workload)."""
        assert self.p.stdin is not None and self.p.stdout is not None
        self.p.stdin.write("go\n")
        self.p.stdin.flush()
        wall, cpu = self.p.stdout.readline().split()
        return float(wall), float(cpu)

    def median(self, runs: int) -> tuple[float, float]:
        self.round()  # warm-up
        rounds = [self.round() for _ in range(runs)]
        return statistics.median(w for w, _ in rounds), statistics.median(c for _, c in rounds)

    def close(self) -> None:
        self.p.kill()
        self.p.wait()


def traced(target_pid: int, work: Workload, runs: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        session = SessionWriter(Path(d) / "s")
        ctx = HuntContext(session, TargetSet(roots=[target_pid], pids={target_pid: 0}), HuntOptions(),
                          lambda s: None)
        probe = BpfProbe()
        probe.start(ctx)
        t0 = time.monotonic()
        med, cpu = work.median(runs)
        wall = time.monotonic() - t0
        probe.tick(session.now())
        summary = probe.summary()
        probe.stop()
        session.close()
    return {"median_s": med, "cpu_s": cpu, "wall_s": wall, **{k: summary[k] for k in ("events", "lost_events",
                                                                         "outstanding_bytes", "slow_events",
                                                                         "settled_in_kernel")}}


def bpftrace(work: Workload, runs: int) -> tuple[float, float] | None:
    if not ANCHOR.exists() or subprocess.run(["which", "bpftrace"], capture_output=True).returncode:
        return None
    bt = subprocess.Popen(["bpftrace", str(ANCHOR), str(work.pid)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    assert bt.stdout is not None
    for _ in range(5):  # "Attaching N probes...", maybe after a RLIMIT_MEMLOCK warning
        if "Attaching" in bt.stdout.readline():
            break
    else:
        bt.kill()
        return None
    time.sleep(0.5)
    try:
        return work.median(runs)
    finally:
        bt.terminate()
        try:
            bt.wait(timeout=60)  # bpftrace detaches slowly on a loaded machine
        except subprocess.TimeoutExpired:
            bt.kill()
            bt.wait()


def spread(values: list[float]) -> dict[str, float]:
    """min, quartiles and max of a list of ratios (how far one run can be from the median)."""
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {"min": min(values), "q1": q[0], "median": q[1], "q3": q[2], "max": max(values)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--pairs", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--json")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print(json.dumps({"skipped": "needs root"}))
        return
    work = Workload(args.pairs, args.size)
    idle = subprocess.Popen(["sleep", "600"])
    # The machine is shared: interleave untraced and traced rounds and take the median of the
    # per-pair ratios, so drift in the background load cancels out.
    ratios: dict[str, list[float]] = {"leaktrace": [], "unrelated": []}
    cpu_ratios: dict[str, list[float]] = {"leaktrace": [], "unrelated": []}
    secs: dict[str, list[float]] = {"untraced": [], "leaktrace": [], "unrelated": []}
    lt: dict = {}
    try:
        work.round()  # warm-up
        for _ in range(args.runs):
            for name, pid in (("leaktrace", work.pid), ("unrelated", idle.pid)):
                u, ucpu = work.round()
                r = traced(pid, work, 1)
                secs["untraced"].append(u)
                secs[name].append(r["median_s"])
                ratios[name].append(r["median_s"] / u)
                cpu_ratios[name].append(r["cpu_s"] / ucpu)
                if name == "leaktrace":
                    lt = {k: lt.get(k, 0) + r[k] for k in ("events", "lost_events", "slow_events",
                                                             "settled_in_kernel")}
                    lt["outstanding_bytes"] = r["outstanding_bytes"]
        before = work.median(max(2, args.runs // 2))
        anchor = bpftrace(work, max(2, args.runs // 2))
        after = work.median(max(2, args.runs // 2))
    finally:
        work.close()
        idle.kill()
        idle.wait()
    med = {k: statistics.median(v) for k, v in secs.items()}
    calls = 2 * args.pairs
    res = {
        "pairs": args.pairs, "size": args.size, "runs": args.runs,
        "untraced_s": med["untraced"],
        "leaktrace_s": med["leaktrace"], "leaktrace_ratio": statistics.median(ratios["leaktrace"]),
        "leaktrace_ratio_spread": spread(ratios["leaktrace"]),
        "leaktrace_cpu_ratio": statistics.median(cpu_ratios["leaktrace"]),
        "leaktrace_cpu_ratio_spread": spread(cpu_ratios["leaktrace"]),
        "leaktrace_ratios": ratios["leaktrace"],
        "leaktrace_events_per_s": calls / med["leaktrace"],
        "leaktrace_events": lt["events"], "leaktrace_lost_events": lt["lost_events"],
        "leaktrace_slow_events": lt["slow_events"], "leaktrace_settled_in_kernel": lt["settled_in_kernel"],
        "leaktrace_outstanding_bytes_after": lt["outstanding_bytes"],
        "unrelated_s": med["unrelated"], "unrelated_ratio": statistics.median(ratios["unrelated"]),
        "unrelated_cpu_ratio": statistics.median(cpu_ratios["unrelated"]),
        "unrelated_cpu_ratio_spread": spread(cpu_ratios["unrelated"]),
        "bpftrace_s": anchor[0] if anchor else None,
        "bpftrace_ratio": anchor[0] / min(before[0], after[0]) if anchor else None,
        "bpftrace_cpu_ratio": anchor[1] / min(before[1], after[1]) if anchor else None,
        "bpftrace_bracket_untraced_s": [before[0], after[0]],
    }
    text = json.dumps(res, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text)


if __name__ == "__main__":
    main()
