"""What `leaktrace hunt --vllm` costs real serving: a real vLLM 0.32 (CPU) P/D pair over NIXL with its proxy
(the vintage pair of tests/targets/vintage_pd.py, in its private network namespace, with the remedy on:
UCX_RCACHE_MAX_UNRELEASED=1024, so the pair does not leak and only the hunt's cost is measured), driven by a
closed-loop client, in alternating phases without and with a hunt attached (`leaktrace hunt --vllm`, no
other flags: eBPF, gdb sampler, watcher, pyheap, /metrics).

Each phase sends completions for --phase-s seconds through the proxy (--clients concurrent clients, each
one request at a time, distinct prompts so nothing hits the prefix cache) and records every request's
latency and output tokens. A hunted phase starts once the hunt has attached (its "attached" line) and
the hunt is stopped with Ctrl-C after the phase (its report written outside the measured window: the
cost measured is that of a hunt running, not of writing its report). Phases alternate (off, on, off, on…)
so the machine's drift falls on both sides; reported per condition: requests/s, output tokens/s, p50 and
p99 latency, the ratios hunted/baseline (goal: latency ≤ 1.05×), and the CPU seconds the hunt's process
tree (leaktrace, its Python-heap walker, gdb) used per second of the measured phase, and the time its eBPF
programs ran in the kernel (charged to the processes making the syscalls, not to the hunt: read from the
programs' fdinfo with kernel.bpf_stats_enabled on for the run).

``--variant NAME=FLAGS`` (repeatable) hunts with extra flags as its own condition, in the same rotation
(e.g. ``--variant nogdb=--no-gdb --variant nopyheap=--no-pyheap``): which part of the hunt costs what.
``--watch`` adds the condition ``watched``: `leaktrace watch --vllm` with its defaults, the phase starting once it
follows the servers (goal: latency ≤ 1.01×).

Not the pair of tests/targets/vllm_servers.py (vLLM's default OpenMP thread binding, both servers on the
same two cores): it completes ~2 requests a minute at ~50 s each on a 2-core machine, too few to measure.

    .venv/bin/python bench/bench_vllm_serving.py --rounds 2 --phase-s 60
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "targets"))

import vintage_pd  # noqa: E402
import vllm_servers  # noqa: E402


def drive(ns: vintage_pd.NetNs, url: str, seconds: float, clients: int, max_tokens: int) -> list[tuple[float, int]]:
    """(latency s, output tokens) of every request completed within ``seconds`` (clients inside ``ns``)."""
    done: list[tuple[float, int]] = []
    lock = threading.Lock()
    t_end = time.monotonic() + seconds

    def client(k: int) -> None:
        ns.join_thread()
        i = 0
        while time.monotonic() < t_end:
            prompt = vintage_pd.prompt(k * 100000 + i)
            t0 = time.monotonic()
            try:
                r = vllm_servers.complete(url, prompt, max_tokens, timeout=120, model=vintage_pd.MODEL)
            except OSError:
                continue
            finally:
                i += 1
            if time.monotonic() <= t_end:
                with lock:
                    done.append((time.monotonic() - t0, int(r.get("usage", {}).get("completion_tokens", 0))))

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=seconds + 150)
    return done


def _started(ns: vintage_pd.NetNs, out: Path, args: list[str], ready: str, what: str) -> subprocess.Popen:
    """`leaktrace ARGS` in the pair's namespace, returned once its stderr says ``ready`` (the rest of its stderr
    read in the background)."""
    argv = [*ns.enter(), str(REPO / ".venv" / "bin" / "leaktrace"), *args, "--out", str(out)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=str(out.parent),
                            start_new_session=True)
    t0 = time.monotonic()
    for line in proc.stderr:  # type: ignore[union-attr]
        if ready in line:
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # type: ignore[union-attr]
            print(f"  {what} in {time.monotonic() - t0:.1f} s", flush=True)
            return proc
    raise RuntimeError(f"`leaktrace {args[0]}` exited with {proc.wait()} before it was {what}")


def start_hunt(ns: vintage_pd.NetNs, out: Path, flags: list[str] | None = None) -> subprocess.Popen:
    # In the pair's namespace: the hunt scrapes the servers' /metrics on 127.0.0.1 there.
    return _started(ns, out, ["hunt", "--vllm", "--duration", "3600", *(flags or [])], "attached", "hunt attached")


def start_watch(ns: vintage_pd.NetNs, out: Path) -> subprocess.Popen:
    """`leaktrace watch --vllm` with its defaults, returned once it follows a server."""
    return _started(ns, out, ["watch", "--vllm"], "following pid", "watch following")


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by ``pid`` and its live descendants."""
    import psutil

    total = 0.0
    try:
        top = psutil.Process(pid)
        procs = [top, *top.children(recursive=True)]
    except psutil.Error:
        return total
    for p in procs:
        try:
            c = p.cpu_times()
            total += c.user + c.system + c.children_user + c.children_system
        except psutil.Error:
            pass
    return total


def bpf_run_ns(pid: int) -> tuple[int, int]:
    """(run_time_ns, run_cnt) summed over the eBPF programs held open by ``pid``'s process tree."""
    import psutil

    total = runs = 0
    try:
        top = psutil.Process(pid)
        pids = [top.pid, *(c.pid for c in top.children(recursive=True))]
    except psutil.Error:
        return 0, 0
    for p in pids:
        for f in Path(f"/proc/{p}/fdinfo").glob("*"):
            try:
                text = f.read_text()
            except OSError:
                continue
            if "prog_type:" in text:
                fields = dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)
                total += int(fields.get("run_time_ns", 0))
                runs += int(fields.get("run_cnt", 0))
    return total, runs


def tick_costs(out: Path) -> str:
    """Where a hunt's CPU went (its report's tick_costs): per probe, CPU s over wall s of its ticks."""
    try:
        tc = json.loads((out / "report.json").read_text()).get("tick_costs") or {}
    except (OSError, ValueError):
        return "no report"
    probes = ", ".join(f"{k} {d['cpu_s']:.1f}/{d['wall_s']:.1f}" for k, d in sorted(
        (tc.get("probes") or {}).items(), key=lambda kv: -kv[1]["cpu_s"]))
    return (f"leaktrace CPU {tc.get('process_cpu_s')} s ({tc.get('attach_cpu_s')} s until attached), helpers "
            f"{tc.get('children_cpu_s')} s; ticks "
            f"{tc.get('ticks')} ({tc.get('late_ticks')} late, max {tc.get('max_late_s')} s); CPU/wall s: {probes}")


def stop_hunt(hunt: subprocess.Popen) -> float:
    t0 = time.monotonic()
    hunt.send_signal(signal.SIGINT)
    try:
        hunt.wait(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(hunt.pid, signal.SIGKILL)
        hunt.wait()
    return time.monotonic() - t0


def summarize(samples: list[tuple[float, int]], seconds: float) -> dict[str, float]:
    lat = sorted(s[0] for s in samples)
    if not lat:
        return {"requests": 0}
    p99 = lat[min(len(lat) - 1, int(round(0.99 * (len(lat) - 1))))]
    return {"requests": len(lat), "requests_per_s": round(len(lat) / seconds, 3),
            "output_tokens_per_s": round(sum(s[1] for s in samples) / seconds, 2),
            "p50_s": round(statistics.median(lat), 3), "p99_s": round(p99, 3), "mean_s": round(statistics.mean(lat), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2, help="pairs of (baseline, hunted) phases")
    ap.add_argument("--phase-s", type=float, default=60.0)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=FLAGS",
                    help="a hunt with extra flags as its own condition (repeatable)")
    ap.add_argument("--watch", action="store_true", help="also a condition under `leaktrace watch --vllm`")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    variants: dict[str, list[str] | None] = {"hunted": []}
    for v in args.variant:
        name, _, flags = v.partition("=")
        variants[name] = flags.split()
    if args.watch:
        variants["watched"] = None  # not a hunt: the watch daemon
    why = vintage_pd.available()
    if why:
        print(f"skipped: {why}")
        return
    if os.geteuid() != 0:
        print("skipped: a hunt with eBPF needs root")
        return
    pair = vintage_pd.start(vintage_pd.FIXED, prefill_port=8310, decode_port=8320, proxy_port=8330)
    ns, url = pair.ns, pair.proxy.url
    conds = ["baseline", *variants]
    phases: dict[str, list[tuple[float, int]]] = {c: [] for c in conds}
    seconds = dict.fromkeys(conds, 0.0)
    cpu = dict.fromkeys(conds, 0.0)
    bpf_s = dict.fromkeys(conds, 0.0)
    stats_knob = Path("/proc/sys/kernel/bpf_stats_enabled")
    stats_before = stats_knob.read_text().strip() if stats_knob.exists() else None
    if stats_before is not None:
        stats_knob.write_text("1")  # run time per eBPF program; restored below
    rounds = []
    try:
        warm = drive(ns, url, 60, args.clients, args.max_tokens)  # the NIXL handshake, first transfers
        print(f"warm-up: {len(warm)} requests", flush=True)
        tmp = tempfile.mkdtemp(prefix="bench-serving-")  # removed after every hunt has stopped
        try:
            for r in range(args.rounds):
                row = {}
                for cond in conds:
                    out = Path(tmp) / f"{cond}{r}"
                    flags = variants.get(cond, [])
                    hunt = (None if cond == "baseline" else start_watch(ns, out) if flags is None
                            else start_hunt(ns, out, flags))
                    cpu0 = tree_cpu_s(hunt.pid) if hunt else 0.0
                    bpf0 = bpf_run_ns(hunt.pid) if hunt else (0, 0)
                    try:
                        got = drive(ns, url, args.phase_s, args.clients, args.max_tokens)
                    finally:
                        used = tree_cpu_s(hunt.pid) - cpu0 if hunt else 0.0
                        bpf1 = bpf_run_ns(hunt.pid) if hunt else (0, 0)
                        bpf_s[cond] += (bpf1[0] - bpf0[0]) / 1e9
                        stop_s = stop_hunt(hunt) if hunt else 0.0
                    phases[cond] += got
                    seconds[cond] += args.phase_s
                    cpu[cond] += used
                    row[cond] = summarize(got, args.phase_s)
                    extra = (f" (hunt CPU {used / args.phase_s:.3f} s/s, eBPF in the kernel "
                             f"{(bpf1[0] - bpf0[0]) / 1e9 / args.phase_s:.4f} s/s over {bpf1[1] - bpf0[1]} runs; "
                             f"stopped and reported in {stop_s:.1f} s)" if hunt else "")
                    if hunt and flags is not None:
                        extra += "\n    " + tick_costs(out)
                    print(f"round {r + 1} {cond:8s} {json.dumps(row[cond])}{extra}", flush=True)
                rounds.append(row)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    finally:
        pair.stop()
        if stats_before is not None:
            stats_knob.write_text(stats_before)
    total = {c: summarize(phases[c], seconds[c]) for c in conds}
    b = total["baseline"]
    ratios: dict[str, dict[str, float]] = {}
    for c in variants:
        h = total[c]
        if b.get("requests") and h.get("requests"):
            ratios[c] = {"latency_p50": round(h["p50_s"] / b["p50_s"], 3), "latency_p99": round(h["p99_s"] / b["p99_s"], 3),
                         "latency_mean": round(h["mean_s"] / b["mean_s"], 3),
                         "throughput_requests": round(h["requests_per_s"] / b["requests_per_s"], 3),
                         "throughput_tokens": round(h["output_tokens_per_s"] / b["output_tokens_per_s"], 3),
                         "hunt_cpu_s_per_s": round(cpu[c] / seconds[c], 3),
                         "bpf_kernel_s_per_s": round(bpf_s[c] / seconds[c], 4)}
    per_round = {c: [round(x[c]["mean_s"] / x["baseline"]["mean_s"], 3) for x in rounds
                     if x["baseline"].get("requests") and x[c].get("requests")] for c in variants}
    result = {**total, "ratios_over_baseline": ratios, "mean_latency_ratio_per_round": per_round,
              "variants": {c: "watch --vllm" if f is None else " ".join(f) for c, f in variants.items()},
              "clients": args.clients, "phase_s": args.phase_s}
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
