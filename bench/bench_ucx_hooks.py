"""eBPF probe cost on a process whose every mmap goes through UCX's memory hook (bistro mode: libc's mmap
jumps into libucm, which makes the raw syscall). The kernel half blames such an mmap on the code that called
the hooked function: it reads the trampoline's caller and the hooked function's caller at stack offsets user
space learned from a few windows (bpf/leaktrace.h, struct lt_hook), and the region stays on the fast path.

The workload is the real UCX 1.20.1 target (tests/targets/ucx_munmap_leak.c, .cache/ by
tests/targets/setup_ucx.sh): --munmaps mmap+munmap pairs of 8 KiB at --rate a second (5,000: ~5x what a
vLLM worker with MALLOC_MMAP_THRESHOLD_=4096 and chunked prefill does), one fresh process per round
(ucp_init, then a start signal). Conditions alternate round by round in one invocation: untraced, traced as
shipped, and traced without the hook's attribution (no `hooks` entry: every hooked mmap keeps libucm's
site). Reported per traced condition (medians): the target's CPU time over the
untraced rounds' (the kernel half runs in its context), leaktrace's own CPU time, events sent to user space,
hook windows, lost events. Prints one JSON document.

    .venv/bin/python bench/bench_ucx_hooks.py --rounds 4 --munmaps 50000 --rate 5000
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
sys.path.insert(0, str(REPO))

from leaktrace.probes import HuntContext, HuntOptions, TargetSet  # noqa: E402
from leaktrace.probes.bpf.probe import BpfProbe  # noqa: E402
from leaktrace.session import SessionWriter  # noqa: E402

LEAK_BIN = REPO / ".cache" / "ucx_munmap_leak"
UCX_ENV = {"UCX_NET_DEVICES": "lo", "UCX_MODULES": "^ib*,rdmacm", "UCX_RCACHE_MAX_UNRELEASED": "1024"}


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


class _NoHookProbe(BpfProbe):
    """The probe without the hook's attribution: the kernel is never told where libucm is."""

    def __init__(self) -> None:
        super().__init__()
        self.seeds._set_hook_code = lambda pid, maps: None  # type: ignore[method-assign]


def one_round(munmaps: int, rate: int, probe_class: type[BpfProbe] | None) -> dict:
    """One fresh target, traced by ``probe_class`` (None: untraced): its CPU seconds for the munmaps."""
    with tempfile.TemporaryDirectory() as d:
        go = Path(d) / "go"
        p = subprocess.Popen([str(LEAK_BIN), str(rate), "0", str(munmaps)], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, **UCX_ENV, "UCX_MUNMAP_LEAK_GO": str(go)})
        assert p.stdout is not None and p.stdout.readline().startswith("ready")
        probe = session = None
        try:
            if probe_class is not None:
                session = SessionWriter(Path(d) / "s")
                ctx = HuntContext(session, TargetSet(roots=[p.pid], pids={p.pid: 0}), HuntOptions(), lambda s: None)
                probe = probe_class()
                probe.start(ctx)
            t0, cpu0, target0 = time.monotonic(), time.process_time(), _cpu_s(p.pid)
            go.touch()
            line = p.stdout.readline()
            wall = time.monotonic() - t0
            assert line.split() == ["done", str(munmaps)], line
            out = {"wall_s": wall, "target_cpu_s": _cpu_s(p.pid) - target0}
            if probe is not None and session is not None:
                time.sleep(0.5)
                probe.tick(session.now())
                # leaktrace's own CPU (the probe runs in this process): the user-space half's cost
                out["tracer_cpu_s"] = time.process_time() - cpu0
                s = probe.summary()
                out.update({k: s[k] for k in ("events", "slow_events", "lost_events")})
                out["hook_windows"] = s["memory_hook"]["windows"]
            return out
        finally:
            if probe is not None:
                probe.stop()
            if session is not None:
                session.close()
            p.kill()
            p.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--munmaps", type=int, default=50_000)
    ap.add_argument("--rate", type=int, default=5000)
    args = ap.parse_args()
    if not LEAK_BIN.exists():
        print(json.dumps({"skipped": "no .cache/ucx_munmap_leak: run tests/targets/setup_ucx.sh"}))
        return
    conditions: dict[str, type[BpfProbe] | None] = {"untraced": None, "traced": BpfProbe,
                                                    "traced_no_hook_attribution": _NoHookProbe}
    runs: dict[str, list[dict]] = {k: [] for k in conditions}
    for _ in range(args.rounds):
        for name, defines in conditions.items():
            runs[name].append(one_round(args.munmaps, args.rate, defines))
    base = [r["target_cpu_s"] for r in runs["untraced"]]
    result: dict = {"munmaps": args.munmaps, "rate": args.rate, "rounds": args.rounds,
                    "untraced_target_cpu_s": round(statistics.median(base), 3)}
    for name in ("traced", "traced_no_hook_attribution"):
        rs = runs[name]
        ratios = [r["target_cpu_s"] / max(b, 0.01) for r, b in zip(rs, base, strict=True)]
        slow = statistics.median(r["slow_events"] for r in rs)
        cpu = statistics.median(r["tracer_cpu_s"] for r in rs)
        result[name] = {"target_cpu_ratio": round(statistics.median(ratios), 3),
                        "tracer_cpu_s": round(cpu, 3), "ratios": [round(x, 3) for x in ratios],
                        "hook_windows": statistics.median(r["hook_windows"] for r in rs),
                        "slow_events": slow, "lost_events": max(r["lost_events"] for r in rs)}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
