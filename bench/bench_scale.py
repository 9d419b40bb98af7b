"""What `hunt` and `watch` cost as the node grows: N ∈ {1, 4, 12, 24} processes shaped like vLLM workers
(tests/fixtures/torch_worker.py: real Python processes that import torch and churn tensors at a worker's
munmap rate, glibc's mmap threshold at 4096), one of them leaking.

    .venv/bin/python bench/bench_scale.py [--ns 1,4,12,24] [--hunt-s 30] [--watch-s 120] [--json F]
    .venv/bin/python bench/bench_scale.py --ns 24 --hunt-s 60 --watch-s 0 --rounds 2 --repo /tmp/old --repo .

--repo (repeatable): the checkouts to run from, alternated within each round over the same workers, for
before/after figures from one run on a noisy machine; --watch-s 0 runs no watch.

Per N: one `leaktrace hunt --pid …×N --duration HUNT_S` — attach_s, ticks late, its CPU (itself and its
helpers, from the kernel's accounting of the child tree) as a share of one core over its wall time, its peak
RSS, the wall past the window (stop and report), first_named_s of the leak; then one `leaktrace watch --pid
…×N --duration WATCH_S` — its CPU share after start-up and its steady RSS. The output ends with the fit of each
cost against N (intercept + slope per target): a cost that grows faster than N shows as a poor fit or a
large slope. The targets' own load makes the machine's: figures are ratios to the same run's N = 1."""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parent.parent
WORKER = REPO / "tests" / "fixtures" / "torch_worker.py"
VLLM_PY = REPO / ".venv-vllm" / "bin" / "python"
LEAKTRACE = [sys.executable, "-m", "leaktrace"]
LEAK_MB_MIN = 30.0


def spawn_workers(n: int, tensors_per_s: float) -> list[subprocess.Popen]:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "4096", "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([str(VLLM_PY), str(WORKER), "--tensors-per-s", str(tensors_per_s)]
                              + (["--leak-mb-min", str(LEAK_MB_MIN)] if i == 0 else []),
                              stdout=subprocess.PIPE, text=True, env=env) for i in range(n)]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return procs


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss(pid: int) -> int:
    try:
        for ln in Path(f"/proc/{pid}/status").read_text().splitlines():
            if ln.startswith("VmRSS:"):
                return int(ln.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _env(repo: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(repo)}


def run_hunt(pids: list[int], seconds: float, out: Path, repo: Path = REPO) -> dict:
    cpu0, t0 = _children_cpu(), time.monotonic()
    args = [a for p in pids for a in ("--pid", str(p))]
    h = subprocess.Popen([*LEAKTRACE, "hunt", *args, "--duration", str(seconds), "--no-live", "--format", "json",
                          "--out", str(out), "--force"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         cwd=repo, env=_env(repo))
    peak = 0
    while h.poll() is None:  # the hunt's own RSS (its helpers are short-lived)
        peak = max(peak, _rss(h.pid))
        time.sleep(1.0)
    err = h.stderr.read() if h.stderr else ""
    wall, cpu = time.monotonic() - t0, _children_cpu() - cpu0
    if h.returncode != 0:
        raise RuntimeError(err[-2000:])
    rep = json.loads((out / "report.json").read_text())
    meta = json.loads((out / "meta.json").read_text())
    tc = rep.get("tick_costs") or {}
    walks = ((meta.get("probe_summaries") or {}).get("pyheap") or {}).get("walks") or {}
    events = ((meta.get("probe_summaries") or {}).get("bpf") or {}).get("events")
    leak = next((c for c in rep["culprits"] if c["pid"] == pids[0]), None)
    return {"attach_s": rep.get("attach_s"), "ticks": tc.get("ticks"), "late_ticks": tc.get("late_ticks"),
            "cpu_s": round(cpu, 2), "core_share": round(cpu / wall, 4), "wall_past_window_s": round(wall - seconds, 1),
            "peak_rss_mb": round(peak / 2**20, 1),
            "verdict": rep["verdict"], "leak_named": leak is not None,
            "leak_mb_per_min": leak and leak["mb_per_min"], "first_named_s": leak and leak.get("first_named_s"),
            "false_culprits": sum(1 for c in rep["culprits"] if c["pid"] != pids[0]),
            "hunt_cpu_s": tc.get("process_cpu_s"), "helpers_cpu_s": tc.get("children_cpu_s"),
            "events_per_s": events and round(events / seconds), "stop_s": tc.get("stop_s"), "walks": walks.get("count"), "walk_s": walks.get("seconds"),
            "tick_cpu_s": {k: v.get("cpu_s") for k, v in (tc.get("probes") or {}).items()}}


def run_watch(pids: list[int], seconds: float, out: Path, settle_s: float = 20.0, repo: Path = REPO) -> dict:
    """The watch's steady CPU share and RSS, and what it made of the leaker (pids[0]): the states it passed
    through, the library its eBPF ledger named (so the RSS is that of a watch tracing a leak), and whether
    any other target was ever more than "ok" or "growing"."""
    args = [a for p in pids for a in ("--pid", str(p))]
    port = _free_port()  # its /metrics: the eBPF ledger's events and lost events (a ring too small loses them)
    w = subprocess.Popen([*LEAKTRACE, "watch", *args, "--duration", str(seconds), "--out", str(out),
                          "--prometheus-port", str(port)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=repo, env=_env(repo))
    time.sleep(settle_s)  # imports and the probe's compile: not the steady cost

    def cpu() -> float:
        f = Path(f"/proc/{w.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

    states: set[str] = set()
    libraries: set[str] = set()
    others: set[int] = set()
    ebpf = False

    def look() -> None:
        nonlocal ebpf
        try:
            st = json.loads((out / "watch.json").read_text())
        except (OSError, ValueError):
            return
        ebpf = ebpf or bool(st.get("ebpf"))
        for t in st.get("targets", []):
            if t["pid"] == pids[0]:
                states.add(t["state"])
                if t.get("suspect"):
                    libraries.add(str(t["suspect"].get("library")))
            elif t["state"] in ("leaking", "confirmed"):
                others.add(t["pid"])

    counters: dict[str, float] = {}

    def scrape() -> None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return
        for fam in text_string_to_metric_families(text):
            if fam.name in ("leaktrace_ledger_events", "leaktrace_ledger_lost_events") and fam.samples:
                counters[fam.name] = float(fam.samples[0].value)

    c0, t0, rss = cpu(), time.monotonic(), []
    while w.poll() is None and time.monotonic() - t0 < seconds - settle_s - 2:
        time.sleep(5)
        rss.append(_rss(w.pid))
        look()
        scrape()
    c1, t1 = cpu(), time.monotonic()
    w.wait()
    return {"core_share": round((c1 - c0) / (t1 - t0), 4), "rss_mb": round(float(np.median(rss[len(rss) // 2:])) / 2**20, 1)
            if rss else None, "ebpf": ebpf, "leaker_states": sorted(states), "leaker_libraries": sorted(libraries),
            "others_leaking": len(others), "ledger_events": counters.get("leaktrace_ledger_events"),
            "lost_events": counters.get("leaktrace_ledger_lost_events")}


def fit(ns: list[int], ys: list[float]) -> dict:
    if len(set(ns)) < 2:
        return {}
    slope, icpt = np.polyfit(ns, ys, 1)
    pred = np.polyval([slope, icpt], ns)
    ss = float(np.sum((np.array(ys) - np.mean(ys)) ** 2))
    return {"intercept": round(float(icpt), 4), "per_target": round(float(slope), 5),
            "r2": round(1 - float(np.sum((np.array(ys) - pred) ** 2)) / ss, 3) if ss > 0 else 1.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ns", default="1,4,12,24")
    ap.add_argument("--hunt-s", type=float, default=30.0)
    ap.add_argument("--watch-s", type=float, default=120.0)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--repo", action="append", type=Path, help="checkout to run from (repeatable)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--tensors-per-s", type=float, default=300.0,
                    help="each worker's tensors a second, each a mmap and a munmap (300: a worker's munmap rate)")
    a = ap.parse_args()
    repos = [r.resolve() for r in (a.repo or [REPO])]
    rows = []
    for n in (int(x) for x in a.ns.split(",")):
        procs = spawn_workers(n, a.tensors_per_s)
        try:
            for rnd in range(a.rounds):
                for repo in repos:
                    with tempfile.TemporaryDirectory() as d:
                        h = run_hunt([p.pid for p in procs], a.hunt_s, Path(d) / "hunt", repo)
                        w = run_watch([p.pid for p in procs], a.watch_s, Path(d) / "watch", repo=repo) \
                            if a.watch_s > 0 else None
                    rows.append({"n": n, "repo": str(repo), "round": rnd, "hunt": h, "watch": w})
                    print(_line(n, repo, h, w), flush=True)
        finally:
            for p in procs:
                p.kill()
                p.wait()
    out: dict = {"rows": rows}
    for repo in repos:
        mine = [r for r in rows if r["repo"] == str(repo)]
        ns = [r["n"] for r in mine]
        fits = {"hunt_core_share": fit(ns, [r["hunt"]["core_share"] for r in mine]),
                "hunt_attach_s": fit(ns, [r["hunt"]["attach_s"] or 0.0 for r in mine])}
        if a.watch_s > 0:
            fits |= {"watch_core_share": fit(ns, [r["watch"]["core_share"] for r in mine]),
                     "watch_rss_mb": fit(ns, [r["watch"]["rss_mb"] or 0.0 for r in mine])}
        print(f"fits against N ({repo}):", json.dumps(fits))
        out.setdefault("fits", {})[str(repo)] = fits
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    print(json.dumps(out))


def _line(n: int, repo: Path, h: dict, w: dict | None) -> str:
    line = (f"N={n:3d} {repo.name or repo} hunt: attach {h['attach_s']:.2f} s, late {h['late_ticks']}/{h['ticks']}, "
            f"{h['events_per_s']} events/s, {h['core_share']:.3f} core (hunt {h['hunt_cpu_s']} s, helpers {h['helpers_cpu_s']} s, {h['walks']} "
            f"walks {h['walk_s']} s), peak RSS {h['peak_rss_mb']:.0f} MB, +{h['wall_past_window_s']} s past the "
            f"window, leak named {h['leak_named']} at {h['first_named_s']} s, {h['false_culprits']} false culprit(s)")
    if w is not None:
        line += (f" | watch: {w['core_share']:.4f} core, RSS {w['rss_mb']} MB, eBPF {w['ebpf']}, leaker "
                 f"{'/'.join(w['leaker_states'])} named {w['leaker_libraries']}, {w['others_leaking']} other(s) "
                 f"leaking, eBPF events {w['ledger_events']} (lost {w['lost_events']})")
    return line


if __name__ == "__main__":
    main()
