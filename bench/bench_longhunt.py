"""Long-hunt benchmark: leaktrace's own memory and session size over a long hunt on a churning target.

Starts the leaker fixture (raw-mmap churn + a slow leak + mremap moves, so every table gets rows), runs
``leaktrace hunt`` on it as a separate process, and samples the hunt process's RSS, the number of part
files and the session size every --sample seconds. Prints one JSON document (and writes it to --json).

    .venv/bin/python bench/bench_longhunt.py --duration 1800 --json /tmp/longhunt.json

Read it as: ``rss_mb`` over time should flatten after warm-up (bounded memory); ``parts`` should stay
bounded (compaction of older parts); ``report_s`` is what re-rendering the long session costs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from fixtures.build import build  # noqa: E402


def status_kb(pid: int, key: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def session_stats(out: Path) -> tuple[int, int]:
    parts = size = 0
    for p in out.rglob("*"):
        if p.is_file():
            size += p.stat().st_size
            if p.suffix == ".parquet":
                parts += 1
    return parts, size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=1800.0)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--sample", type=float, default=15.0, help="seconds between RSS samples")
    ap.add_argument("--churn-per-s", type=float, default=300.0)
    ap.add_argument("--leak-kib-per-s", type=float, default=32.0)
    ap.add_argument("--out", default=None, help="session directory (default: a temporary one)")
    ap.add_argument("--json", default=None, help="also write the result here")
    ap.add_argument("hunt_args", nargs="*", help="extra `leaktrace hunt` arguments (after --)")
    a = ap.parse_args()

    leaker = build("leaker", ["leaker.c"])
    target = subprocess.Popen(
        [
            str(leaker),
            "--churn-per-s",
            str(a.churn_per_s),
            "--leak-kib-per-s",
            str(a.leak_kib_per_s),
            "--chunk-kib",
            "16",
            "--mremap-kib-per-s",
            "8",
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert target.stdout is not None
    target.stdout.readline()
    out = Path(a.out or tempfile.mkdtemp(prefix="leaktrace-longhunt-")) / "session"
    cmd = [
        sys.executable,
        "-m",
        "leaktrace",
        "hunt",
        "--pid",
        str(target.pid),
        "--duration",
        str(a.duration),
        "--interval",
        str(a.interval),
        "--out",
        str(out),
        "--no-live",
        "--format",
        "json",
        *a.hunt_args,
    ]
    t0 = time.monotonic()
    hunt = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    samples = []
    try:
        while hunt.poll() is None:
            time.sleep(a.sample)
            rss = status_kb(hunt.pid, "VmRSS")
            if not rss:
                break
            parts, size = session_stats(out)
            samples.append(
                {
                    "t": round(time.monotonic() - t0, 1),
                    "rss_mb": round(rss / 1024, 1),
                    "hwm_mb": round(status_kb(hunt.pid, "VmHWM") / 1024, 1),
                    "parts": parts,
                    "session_mb": round(size / 2**20, 2),
                }
            )
            print(json.dumps(samples[-1]), file=sys.stderr, flush=True)
        stdout, stderr = hunt.communicate(timeout=600)
    finally:
        os.killpg(target.pid, signal.SIGKILL)
        target.wait()
    t_report = time.monotonic()
    rep = subprocess.run(
        [sys.executable, "-m", "leaktrace", "report", str(out), "--format", "json"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    report_s = time.monotonic() - t_report
    parts, size = session_stats(out)
    warm_samples = [s for s in samples if s["t"] >= min(300.0, a.duration / 4)]
    warm = [s["rss_mb"] for s in warm_samples]
    slope = 0.0
    if len(warm_samples) >= 3:  # least squares: MB per hour of leaktrace's own RSS after warm-up
        import numpy as np

        slope = float(np.polyfit([s["t"] for s in warm_samples], warm, 1)[0]) * 3600
    result = {
        "duration_s": a.duration,
        "interval_s": a.interval,
        "hunt_rc": hunt.returncode,
        "hunt_args": a.hunt_args,
        "churn_per_s": a.churn_per_s,
        "leak_kib_per_s": a.leak_kib_per_s,
        "rss_mb_first": samples[0]["rss_mb"] if samples else None,
        "rss_mb_after_warmup_min": min(warm) if warm else None,
        "rss_mb_after_warmup_max": max(warm) if warm else None,
        "rss_mb_last": samples[-1]["rss_mb"] if samples else None,
        "rss_mb_per_hour_after_warmup": round(slope, 2),
        "hwm_mb": max((s["hwm_mb"] for s in samples), default=None),
        "final_parts": parts,
        "final_session_mb": round(size / 2**20, 2),
        "max_parts_during": max((s["parts"] for s in samples), default=None),
        "report_rc": rep.returncode,
        "report_s": round(report_s, 2),
        "hunt_stderr_tail": stderr[-600:],
        "samples": samples,
    }
    text = json.dumps(result, indent=1)
    print(text)
    if a.json:
        Path(a.json).write_text(text)


if __name__ == "__main__":
    main()
