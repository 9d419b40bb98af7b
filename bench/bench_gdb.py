"""gdb sampler benchmark: how long the target is stopped per catchpoint stop, in-gdb Python vs driving
every stop over MI, and the throughput drop of a fixture doing 1,000 mmaps/s while sampled.

    .venv/bin/python bench/bench_gdb.py [--seconds 5] [--json out.json]

The target (tests/fixtures/gdb_target.c) times each of its own mmap calls (through the hook library and
the stripped library down to the raw syscall) and reports once a second. Each mmap costs 2 stops (entry,
exit), so the pause per stop seen by the target is (mean call time while sampled − unsampled) / 2. The
budget is switched off here to measure the raw cost; the default budget's effect is reported apart
(how long sampling lasts on a 1,000 mmaps/s target before the budget ends it). Goal: ≤1 ms per stop.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from fixtures.gdb_target import build_gdb_target  # noqa: E402

from leaktrace.probes.gdb.attach import sample_process  # noqa: E402
from leaktrace.probes.gdb.budget import PauseBudget  # noqa: E402
from leaktrace.probes.gdb.checks import SCRIPTS_DIR, find_gdb  # noqa: E402

NO_BUDGET = PauseBudget(pause_fraction=1.0, floor_s=1e6, max_stops_per_s=1e9)

# The MI baseline drives each stop from this process: the protocol commands it needs, in one place.
MI_SOURCE_SETTINGS = '-interpreter-exec console "source {path}"'
MI_ASYNC = "-gdb-set mi-async on"
MI_ATTACH = "-target-attach {pid}"
MI_CATCH = '-interpreter-exec console "catch syscall mmap munmap mremap"'
MI_CONTINUE_ALL = "-exec-continue --all"
MI_FRAMES = "-stack-list-frames --thread {thread}"
MI_CONTINUE_THREAD = "-exec-continue --thread {thread}"
MI_DETACH = "-target-detach"


class Target:
    """The fixture, with its once-a-second "rate N avg_us X" lines collected in the background."""

    def __init__(self, threads: int, per_thread_per_s: float, chunk_kib: int = 4) -> None:
        self.proc = subprocess.Popen([str(build_gdb_target()), "--threads", str(threads), "--per-thread-per-s",
                                      str(per_thread_per_s), "--chunk-kib", str(chunk_kib), "--report", "1"],
                                     stdout=subprocess.PIPE, text=True, start_new_session=True)
        assert self.proc.stdout.readline().startswith("ready")
        self.pid = self.proc.pid
        self.reports: list[tuple[float, int, float]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            parts = line.split()
            if len(parts) == 4 and parts[0] == "rate":
                self.reports.append((time.monotonic(), int(parts[1]), float(parts[3])))

    def window(self, t0: float, t1: float) -> dict[str, float]:
        # A report at time t covers [t-1, t): keep those wholly inside the window.
        rows = [r for r in self.reports if t0 + 1.0 <= r[0] <= t1 + 0.05]
        if not rows:
            return {"mmaps_per_s": 0.0, "call_us": 0.0, "seconds": 0}
        calls = sum(r[1] for r in rows)
        return {"mmaps_per_s": calls / len(rows),
                "call_us": sum(r[1] * r[2] for r in rows) / max(1, calls), "seconds": len(rows)}

    def measure(self, seconds: float) -> dict[str, float]:
        t0 = time.monotonic()
        time.sleep(seconds + 1.1)
        return self.window(t0, time.monotonic())

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def sample_in_gdb(target: Target, seconds: float) -> dict[str, float]:
    box: dict[str, object] = {}
    th = threading.Thread(target=lambda: box.setdefault("run", sample_process(
        target.pid, max_samples=0, max_seconds=seconds + 1.5, budget=NO_BUDGET)))
    th.start()
    # Skip the attach (it stops the whole process once) before measuring.
    while target.pid and not _traced(target.pid):
        time.sleep(0.01)
    time.sleep(0.3)
    t0 = time.monotonic()
    time.sleep(seconds)
    th.join()
    run = box["run"]
    out = target.window(t0, time.monotonic())
    out.update(stops=run.stops, samples=run.samples, handler_us_per_stop=run.handler_s / max(1, run.stops) * 1e6,
               attach_s=run.attach_s, reason=run.reason)
    return out


def _traced(pid: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("TracerPid:"):
            return line.split()[1] != "0"
    return False


def sample_over_mi(target: Target, seconds: float) -> dict[str, float]:
    """Every stop handled by this process over MI: read *stopped, list frames at syscall exits, continue."""
    from pygdbmi.gdbcontroller import GdbController

    g = GdbController(command=[find_gdb(), "--nx", "--quiet", "--interpreter=mi3"],
                      time_to_check_for_additional_output_sec=1e-4)  # return once records are read
    for cmd in (MI_SOURCE_SETTINGS.format(path=SCRIPTS_DIR / "sampler_settings.gdb"), MI_ASYNC):
        g.write(cmd, timeout_sec=20)
    g.write(MI_ATTACH.format(pid=target.pid), timeout_sec=60)
    g.write(MI_CATCH, timeout_sec=20)
    g.write(MI_CONTINUE_ALL, read_response=False)
    time.sleep(0.3)
    t0 = time.monotonic()
    stops = 0
    handle: list[float] = []
    end = t0 + seconds
    pending: list[dict] = []
    while time.monotonic() < end:
        records = pending or g.get_gdb_response(timeout_sec=0.05, raise_error_on_timeout=False)
        pending = []
        for i, r in enumerate(records):
            if r.get("type") != "notify" or r.get("message") != "stopped":
                continue
            t_seen = time.perf_counter()
            payload = r.get("payload") or {}
            thread = payload.get("thread-id")
            if thread is None:
                continue
            stops += 1
            if payload.get("reason") == "syscall-return":
                # A real MI sampler needs the stack before resuming: wait for the frames' result record.
                g.write(MI_FRAMES.format(thread=thread), read_response=False)
                got = False
                while not got:
                    more = g.get_gdb_response(timeout_sec=5, raise_error_on_timeout=False)
                    got = any(m.get("type") == "result" for m in more)
                    pending += [m for m in more if m.get("type") == "notify"]
            g.write(MI_CONTINUE_THREAD.format(thread=thread), read_response=False)
            handle.append(time.perf_counter() - t_seen)
            pending += records[i + 1:]
            break
    out = target.window(t0, time.monotonic())
    g.write(MI_DETACH, timeout_sec=20, raise_error_on_timeout=False)
    g.exit()
    out.update(stops=stops, handler_us_per_stop=statistics.mean(handle) * 1e6 if handle else 0.0)
    return out


def per_stop_pause_us(base: dict[str, float], sampled: dict[str, float]) -> float:
    return max(0.0, sampled["call_us"] - base["call_us"]) / 2.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="measuring window of each phase")
    ap.add_argument("--json", default=None, help="also write the result here")
    args = ap.parse_args()
    if not find_gdb():
        print("gdb not found: nothing to measure")
        return
    result: dict[str, object] = {}

    # 1. Per-stop pause: one thread, 200 mmaps/s (light enough that neither method saturates).
    t = Target(threads=1, per_thread_per_s=200)
    try:
        base = t.measure(args.seconds)
        ingdb = sample_in_gdb(t, args.seconds)
        mi = sample_over_mi(t, args.seconds)
    finally:
        t.stop()
    result["per_stop"] = {"unsampled": base, "in_gdb": ingdb, "over_mi": mi,
                          "in_gdb_pause_us": per_stop_pause_us(base, ingdb),
                          "over_mi_pause_us": per_stop_pause_us(base, mi)}

    # 2. Throughput: 4 threads × 250 = 1,000 mmaps/s, unsampled then sampled in gdb (budget off).
    t = Target(threads=4, per_thread_per_s=250)
    try:
        base = t.measure(args.seconds)
        ingdb = sample_in_gdb(t, args.seconds)
        after = t.measure(min(args.seconds, 3.0))
        # 3. The default budget on the same target: how long until it ends sampling, and why.
        t_start = time.monotonic()
        run = sample_process(t.pid, max_samples=0, max_seconds=30)
        default_budget = {"lasted_s": time.monotonic() - t_start, "reason": run.reason, "samples": run.samples,
                          "paused_ms": run.paused_s * 1e3, "attach_ms": run.attach_s * 1e3}
    finally:
        t.stop()
    result["throughput_1000_per_s"] = {
        "unsampled": base, "sampled_in_gdb": ingdb, "after_detach": after,
        "drop": 1.0 - ingdb["mmaps_per_s"] / base["mmaps_per_s"] if base["mmaps_per_s"] else None,
        "in_gdb_pause_us": per_stop_pause_us(base, ingdb), "default_budget": default_budget}

    ps = result["per_stop"]
    tp = result["throughput_1000_per_s"]
    print(f"per-stop pause seen by the target: in-gdb {ps['in_gdb_pause_us']:.0f} µs "
          f"(handler {ps['in_gdb']['handler_us_per_stop']:.0f} µs), over MI {ps['over_mi_pause_us']:.0f} µs "
          f"(driver {ps['over_mi']['handler_us_per_stop']:.0f} µs); goal ≤1000 µs")
    print(f"1,000 mmaps/s target: {tp['unsampled']['mmaps_per_s']:.0f}/s unsampled, "
          f"{tp['sampled_in_gdb']['mmaps_per_s']:.0f}/s sampled in gdb (drop {tp['drop']:.1%}), "
          f"{tp['after_detach']['mmaps_per_s']:.0f}/s after detach; pause {tp['in_gdb_pause_us']:.0f} µs/stop")
    print(f"default budget on it: ended after {tp['default_budget']['lasted_s']:.2f} s "
          f"({tp['default_budget']['reason']}), {tp['default_budget']['samples']} stacks")
    print(json.dumps(result, indent=2, default=str))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
