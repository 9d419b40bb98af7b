"""Soak of `leaktrace watch`: its own RSS, disk and CPU share over time, against churning fixture processes
(tests/fixtures/watch_target.c) that start and end all the time, some growing before they end (each leaves
an exit incident: a session and its reports).

    .venv/bin/python bench/bench_watch_soak.py [--real-s 180] [--sim-s 240] [--sim-interval 0.2] [--json F]

Two phases, each a real `leaktrace watch --match` child process sampled every few seconds:
  real: the default 10 s interval over --procs steady processes for --real-s: CPU share of one core
        (target ≤ 1%), measured after the start-up (imports) so it is the steady cost.
  sim:  a fast interval (--sim-interval) for --sim-s = many ticks, i.e. hours of simulated time at the
        default interval, over 4 long-lived processes (their rolling histories fill up) while others churn
        (a new one every --churn-every s, each living a few seconds, every 4th one growing then exiting) and --max-disk-mb is small: RSS must stay flat (ratio of the
        last quarter's median to the second quarter's), disk under the bound, CPU per tick stated and
        extrapolated to the default interval.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from fixtures.build import build  # noqa: E402

CLK = os.sysconf("SC_CLK_TCK")


def target_bin() -> Path:
    lib = build("libwatchleak.so", ["watch_lib.c"], cflags=["-fomit-frame-pointer"], shared=True, strip=True)
    return build("watch_target", ["watch_target.c"],
                 ldflags=[f"-L{lib.parent}", "-lwatchleak", f"-Wl,-rpath,{lib.parent}"])


def proc_figures(pid: int) -> tuple[float, int]:
    """(CPU seconds, RSS bytes) of ``pid`` (itself, not its children)."""
    if "VmRSS:" not in Path(f"/proc/{pid}/status").read_text():
        raise RuntimeError(f"the watch (pid {pid}) ended early")
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(stat[11]) + int(stat[12])) / CLK
    rss = next(int(ln.split()[1]) * 1024 for ln in Path(f"/proc/{pid}/status").read_text().splitlines()
               if ln.startswith("VmRSS:"))
    return cpu, rss


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def start(tag: str, out: Path, interval: float, extra: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "leaktrace", "watch", "--match", f"watch_target {tag}",
                             "--interval", str(interval), "--out", str(out), "-q", *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=str(REPO))


def stop(p: subprocess.Popen) -> tuple[int, str]:
    p.send_signal(signal.SIGTERM)
    _out, err = p.communicate(timeout=120)
    return p.returncode, err


def phase_real(exe: Path, work: Path, seconds: float, procs: int) -> dict:
    tag = f"soakreal{os.getpid()}"
    kids = [subprocess.Popen([str(exe), tag, "--churn-kib-per-s", "1024"], stdout=subprocess.DEVNULL)
            for _ in range(procs)]
    out = work / "real"
    w = start(tag, out, 10.0, ["--confirm-s", "120"])
    try:
        time.sleep(15)  # imports and the first ticks: start-up, not the steady cost
        c0, r0 = proc_figures(w.pid)
        t0 = time.monotonic()
        samples = []
        while time.monotonic() - t0 < seconds:
            time.sleep(10)
            c, r = proc_figures(w.pid)
            samples.append((round(time.monotonic() - t0, 1), round(c - c0, 3), r))
        c1, r1 = proc_figures(w.pid)
        wall = time.monotonic() - t0
        rc, err = stop(w)
    finally:
        for k in kids:
            k.terminate()
            k.wait()
    state = json.loads((out / "watch.json").read_text())
    return {"interval_s": 10.0, "processes": procs, "ebpf": state.get("ebpf"), "wall_s": round(wall, 1), "ticks": state["ticks"],
            "cpu_share_of_core": round((c1 - c0) / wall, 5), "rss_start_mb": round(r0 / 2**20, 1),
            "rss_end_mb": round(r1 / 2**20, 1), "disk_kb": round(dir_bytes(out) / 1024, 1),
            "exit_code": rc, "samples": samples, "stderr_tail": err.strip().splitlines()[-3:]}


def phase_sim(exe: Path, work: Path, seconds: float, interval: float, churn_every: float, max_disk_mb: float) -> dict:
    tag = f"soaksim{os.getpid()}"
    rng = random.Random(30)
    out = work / "sim"
    w = start(tag, out, interval, ["--confirm-s", "100000", "--max-disk-mb", str(max_disk_mb),
                                   "--format", "json"])
    # Long-lived processes too: their rolling histories fill up during the phase, so a flat RSS means bounded.
    steady = [subprocess.Popen([str(exe), tag, "--churn-kib-per-s", "512"], stdout=subprocess.DEVNULL)
              for _ in range(4)]
    kids: list[subprocess.Popen] = []
    started = grown = 0
    try:
        time.sleep(5)
        c0, _ = proc_figures(w.pid)
        t0 = time.monotonic()
        next_spawn = t0
        samples = []
        next_sample = t0
        while time.monotonic() - t0 < seconds:
            now = time.monotonic()
            if now >= next_spawn:
                grow = started % 4 == 3
                life = rng.uniform(12, 20) if grow else rng.uniform(2, 8)
                args = [str(exe), tag, "--exit-after", f"{life:.1f}"]
                args += ["--leak-kib-per-s", "512"] if grow else ["--churn-kib-per-s", "512"]
                kids.append(subprocess.Popen(args, stdout=subprocess.DEVNULL))
                started += 1
                grown += grow
                next_spawn += churn_every
            kids = [k for k in kids if k.poll() is None]  # reaped here: the watch reads their exit
            if now >= next_sample:
                c, r = proc_figures(w.pid)
                samples.append((round(now - t0, 1), round(c - c0, 3), r, dir_bytes(out)))
                next_sample += 10
            time.sleep(0.05)
        c1, _ = proc_figures(w.pid)
        wall = time.monotonic() - t0
        rc, err = stop(w)
    except RuntimeError:
        print(w.communicate(timeout=60)[1], file=sys.stderr)
        raise
    finally:
        for k in kids + steady:
            k.kill()
            k.wait()
    state = json.loads((out / "watch.json").read_text())
    rss = [s[2] for s in samples]
    q = max(1, len(rss) // 4)
    ticks = state["ticks"]
    cpu_per_tick = (c1 - c0) / max(1, ticks)
    return {"interval_s": interval, "ebpf": state.get("ebpf"), "wall_s": round(wall, 1), "ticks": ticks,
            "simulated_hours_at_10s": round(ticks * 10 / 3600, 2), "processes_started": started,
            "processes_grown_then_exited": grown, "incidents_total": state["incidents_total"],
            "incidents_on_disk": len(list((out / "incidents").glob("*"))) if (out / "incidents").is_dir() else 0,
            "cpu_s": round(c1 - c0, 2), "cpu_ms_per_tick": round(cpu_per_tick * 1000, 2),
            "rss_mb_first": round(rss[0] / 2**20, 1), "rss_mb_max": round(max(rss) / 2**20, 1),
            "rss_mb_last": round(rss[-1] / 2**20, 1),
            "rss_flat_ratio_q4_over_q2": round(statistics.median(rss[-q:]) / statistics.median(rss[q:2 * q]), 3),
            "disk_mb_max": round(max(s[3] for s in samples) / 2**20, 2), "max_disk_mb": max_disk_mb,
            "exit_code": rc, "samples": [(t, c, round(r / 2**20, 1), round(d / 2**20, 2)) for t, c, r, d in samples],
            "stderr_tail": err.strip().splitlines()[-3:]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--real-s", type=float, default=180.0)
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("--sim-s", type=float, default=240.0)
    ap.add_argument("--sim-interval", type=float, default=0.2)
    ap.add_argument("--churn-every", type=float, default=1.0)
    ap.add_argument("--max-disk-mb", type=float, default=0.5)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    exe = target_bin()
    work = Path(tempfile.mkdtemp(prefix="bench-watch-soak-"))
    try:
        res = {"real": phase_real(exe, work, a.real_s, a.procs),
               "sim": phase_sim(exe, work, a.sim_s, a.sim_interval, a.churn_every, a.max_disk_mb)}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    r, s = res["real"], res["sim"]
    print(f"eBPF ledger: real {r['ebpf']}, sim {s['ebpf']}")
    print(f"real: {r['processes']} processes at a {r['interval_s']:.0f} s interval for {r['wall_s']:.0f} s: "
          f"{100 * r['cpu_share_of_core']:.3f}% of a core (target ≤ 1%), RSS {r['rss_start_mb']} → "
          f"{r['rss_end_mb']} MB, disk {r['disk_kb']} KB, exit {r['exit_code']}")
    print(f"sim: {s['ticks']} ticks at {s['interval_s']} s (= {s['simulated_hours_at_10s']} h at 10 s), "
          f"{s['processes_started']} processes started ({s['processes_grown_then_exited']} grew then exited), "
          f"{s['incidents_total']} incidents, {s['incidents_on_disk']} kept on disk; "
          f"CPU {s['cpu_ms_per_tick']} ms/tick incl. incidents; RSS {s['rss_mb_first']} → max {s['rss_mb_max']} → "
          f"{s['rss_mb_last']} MB (last quarter / second quarter {s['rss_flat_ratio_q4_over_q2']}); disk max "
          f"{s['disk_mb_max']} MB (bound {s['max_disk_mb']} MB), exit {s['exit_code']}")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
