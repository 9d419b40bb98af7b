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
p99 latency, and the ratios hunted/baseline (goal: latency ≤ 1.05×).

The pair of tests/targets/vllm_servers.py (vLLM's default OpenMP thread binding, both servers on the same
two cores) completed ~2 requests a minute at ~50 s each here: too few to measure anything.

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


def start_hunt(ns: vintage_pd.NetNs, out: Path) -> subprocess.Popen:
    # In the pair's namespace: the hunt scrapes the servers' /metrics on 127.0.0.1 there.
    argv = [*ns.enter(), str(REPO / ".venv" / "bin" / "leaktrace"), "hunt", "--vllm", "--duration", "3600",
            "--out", str(out)]
    hunt = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=str(out.parent),
                            start_new_session=True)
    t0 = time.monotonic()
    for line in hunt.stderr:  # type: ignore[union-attr]
        if "attached" in line:
            threading.Thread(target=hunt.stderr.read, daemon=True).start()  # type: ignore[union-attr]
            print(f"  hunt attached in {time.monotonic() - t0:.1f} s", flush=True)
            return hunt
    raise RuntimeError(f"the hunt exited with {hunt.wait()} before attaching")


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
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    why = vintage_pd.available()
    if why:
        print(f"skipped: {why}")
        return
    if os.geteuid() != 0:
        print("skipped: a hunt with eBPF needs root")
        return
    pair = vintage_pd.start(vintage_pd.FIXED, prefill_port=8310, decode_port=8320, proxy_port=8330)
    ns, url = pair.ns, pair.proxy.url
    phases: dict[str, list[tuple[float, int]]] = {"baseline": [], "hunted": []}
    seconds = {"baseline": 0.0, "hunted": 0.0}
    rounds = []
    try:
        warm = drive(ns, url, 60, args.clients, args.max_tokens)  # the NIXL handshake, first transfers
        print(f"warm-up: {len(warm)} requests", flush=True)
        tmp = tempfile.mkdtemp(prefix="bench-serving-")  # removed after every hunt has stopped
        try:
            for r in range(args.rounds):
                row = {}
                for cond in ("baseline", "hunted"):
                    hunt = start_hunt(ns, Path(tmp) / f"h{r}") if cond == "hunted" else None
                    try:
                        got = drive(ns, url, args.phase_s, args.clients, args.max_tokens)
                    finally:
                        stop_s = stop_hunt(hunt) if hunt else 0.0
                    phases[cond] += got
                    seconds[cond] += args.phase_s
                    row[cond] = summarize(got, args.phase_s)
                    extra = f" (hunt stopped and reported in {stop_s:.1f} s)" if hunt else ""
                    print(f"round {r + 1} {cond:8s} {json.dumps(row[cond])}{extra}", flush=True)
                rounds.append(row)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    finally:
        pair.stop()
    total = {c: summarize(phases[c], seconds[c]) for c in phases}
    b, h = total["baseline"], total["hunted"]
    ratios = {}
    if b.get("requests") and h.get("requests"):
        ratios = {"latency_p50": round(h["p50_s"] / b["p50_s"], 3), "latency_p99": round(h["p99_s"] / b["p99_s"], 3),
                  "latency_mean": round(h["mean_s"] / b["mean_s"], 3),
                  "throughput_requests": round(h["requests_per_s"] / b["requests_per_s"], 3),
                  "throughput_tokens": round(h["output_tokens_per_s"] / b["output_tokens_per_s"], 3)}
    per_round = [round(x["hunted"]["mean_s"] / x["baseline"]["mean_s"], 3) for x in rounds
                 if x["baseline"].get("requests") and x["hunted"].get("requests")]
    result = {"baseline": b, "hunted": h, "ratios_hunted_over_baseline": ratios,
              "mean_latency_ratio_per_round": per_round, "clients": args.clients, "phase_s": args.phase_s}
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
