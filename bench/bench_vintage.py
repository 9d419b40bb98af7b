"""How `leaktrace hunt --vllm` rates the real seed-002 leak, and how `leaktrace compare` judges its remedy: the
calibration run behind the real-pair tests (tests/test_vllm_pd.py holds the tool to what must be right on one
hunt; the figures here are what a slow or a quiet machine makes of it).

Two real vLLM 0.32 P/D pairs over NIXL 0.9.0's own UCX 1.20.0 (tests/targets/vintage_pd.py, each in a private
network namespace), one after the other: the leak (UCX_RCACHE_MAX_UNRELEASED=inf) and the control (=1024, the
remedy). Each is warmed up under four clients, then hunted as a user types it (`hunt --vllm --duration N`, no
tuning flags) while the load goes on until the hunt exits. Per pair: the prefill's requests a minute, attach
and hunt wall time, the verdict, UCX's culprits (rate, first_named_s), and two truths over the window the hunt
rated each worker's ledger on: the 148 KiB chunks UCX mapped in it and still holds at its end, and the
worker's RSS slope from /proc (sampled once a second, independent of leaktrace). Then `compare` both ways
(leak -> control: fixed; control -> leak: regressed).

    .venv/bin/python bench/bench_vintage.py [--hunt-s 90] [--warmup-s 60] [--keep DIR]

About 12 minutes on 2 cores. Needs root (network namespaces, eBPF) and tests/targets/setup_vllm_vintage.sh.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "targets"))

import vintage_pd  # noqa: E402

from leaktrace.session import SessionReader  # noqa: E402

CHUNK = 151552  # one mpool chunk of UCX's rcache invalidation queue (148 KiB), mapped by UCM's raw mmap
UCX_LIB = re.compile(r"(?:^|/)libuc[ms](?:-[0-9a-f]{8})?\.so")
LEAKTRACE = [sys.executable, "-m", "leaktrace"]


def worker_figures(out: Path, pid: int, sampler: vintage_pd.RssSampler) -> dict:
    reader = SessionReader(out)
    snaps = reader.table("ledger_snapshots")
    t = snaps.loc[snaps["pid"] == pid, "t"]
    if t.empty:
        return {"pid": pid, "ledger": False}
    a, b = float(t.min()), float(t.max())
    reg = reader.table("ledger_regions")
    chunks = reg[(reg["pid"] == pid) & reg["library"].fillna("").str.contains(UCX_LIB)
                 & ~reg["preexisting"].astype(bool) & (reg["size"] == CHUNK) & (reg["t_born"] > a)]
    t0 = float(reader.meta["t0_monotonic"])
    window_min = max(b - a, 1e-9) / 60
    return {"pid": pid, "window_s": round(b - a, 1), "chunks_born_and_held": len(chunks),
            "chunks_mb_per_min": round(len(chunks) * CHUNK / 2**20 / window_min, 3),
            "proc_mb_per_min": _finite(sampler.mb_per_min(pid, t0 + a, t0 + b))}


def _finite(x: float) -> float | None:
    return None if math.isnan(x) else round(x, 3)


def hunt_pair(setting: str, out: Path, hunt_s: int, warmup_s: int) -> dict:
    pair = vintage_pd.start(setting)
    try:
        workers = {"prefill": vintage_pd.workers(pair.prefill.pid)[0], "decode": vintage_pd.workers(pair.decode.pid)[0]}
        load = vintage_pd.Load(pair.ns, pair.proxy.url)
        load.start()
        started = time.monotonic()
        while (load.ok < 4 or time.monotonic() - started < warmup_s) and time.monotonic() - started < 300:
            time.sleep(1)
        sampler = vintage_pd.RssSampler(list(workers.values()))
        sampler.start()
        ok0, t0 = load.ok, time.monotonic()
        hunt = subprocess.run([*pair.ns.enter(), *LEAKTRACE, "hunt", "--vllm", "--duration", str(hunt_s),
                               "--out", str(out)], capture_output=True, text=True, cwd=str(REPO),
                              timeout=hunt_s + 900)
        wall = time.monotonic() - t0
        sampler.stop_event.set()
        load.stop()
        if hunt.returncode != 0:
            return {"setting": setting, "error": hunt.stderr[-2000:]}
        rep = json.loads((out / "report.json").read_text())
        mine = set(workers.values())
        ucx = [{"pid": c["pid"], "library": c["library"], "mb_per_min": c["mb_per_min"],
                "first_named_s": c.get("first_named_s")}
               for c in rep["culprits"] if c["pid"] in mine and UCX_LIB.search(c.get("library") or "")]
        per_min = 60 * (load.ok - ok0) / wall
        figures = {role: worker_figures(out, pid, sampler) for role, pid in workers.items()}
        for role, f in figures.items():
            rate = sum(c["mb_per_min"] for c in ucx if c["pid"] == workers[role])
            f["ucx_mb_per_min"] = rate
            if rate and f.get("chunks_mb_per_min"):
                f["ucx_over_chunks"] = round(rate / f["chunks_mb_per_min"], 3)
            if rate and f.get("proc_mb_per_min"):
                f["ucx_over_proc"] = round(rate / f["proc_mb_per_min"], 3)
        return {"setting": setting, "requests_per_min": round(per_min, 1), "hunt_wall_s": round(wall, 1),
                "attach_s": rep.get("attach_s"), "verdict": rep["verdict"], "ucx_culprits": ucx,
                "other_culprits": [(c["pid"], c.get("library"), c["mb_per_min"]) for c in rep["culprits"]
                                   if c["pid"] in mine and not UCX_LIB.search(c.get("library") or "")],
                "workers": figures}
    finally:
        pair.stop()


def compare(before: Path, after: Path, out: Path) -> dict:
    r = subprocess.run([*LEAKTRACE, "compare", str(before), str(after), "--out", str(out)], capture_output=True,
                       text=True, cwd=str(REPO), timeout=300)
    if r.returncode != 0:
        return {"error": r.stderr[-1000:]}
    cmp = json.loads((out / "compare.json").read_text())
    return {"verdict": cmp["verdict"], "reason": cmp["verdict_reason"],
            "ucx": [(c["library"], c["status"]) for c in cmp["culprits"] if UCX_LIB.search(c["library"] or "")]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hunt-s", type=int, default=90)
    ap.add_argument("--warmup-s", type=int, default=60)
    ap.add_argument("--keep", type=Path, help="keep both sessions here")
    args = ap.parse_args()
    why = vintage_pd.available()
    if why:
        print(f"skipped: {why}")
        return
    root = args.keep or Path(tempfile.mkdtemp(prefix="bench-vintage-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        runs = {name: hunt_pair(setting, root / name, args.hunt_s, args.warmup_s)
                for name, setting in (("leak", vintage_pd.LEAK), ("fixed", vintage_pd.FIXED))}
        result = {"runs": runs}
        if not any("error" in r for r in runs.values()):
            result["compare"] = {"leak->fixed": compare(root / "leak", root / "fixed", root / "cmp-fixed"),
                                 "fixed->leak": compare(root / "fixed", root / "leak", root / "cmp-regressed")}
        print(json.dumps(result, indent=1))
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
