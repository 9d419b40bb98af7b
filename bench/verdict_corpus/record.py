"""Records one split of the corpus: starts every generator of plan.plan(split), hunts them all with one real
`leaktrace hunt --pid ... --pid ...`, and stores under bench/verdict_corpus/data/<split>/ only what the
verdict reads (the session's tables, zstd Parquet), the generators' truth and their specs.

Usage (as root): python -m bench.verdict_corpus.record SPLIT [--duration S] [--keep-session DIR]"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from bench.verdict_corpus.plan import plan

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data"
FIXTURES = ROOT / "tests" / "fixtures"

# The tables the verdict reads. Left out: raw event streams (bpf_events, gdb), /metrics, fault sampling and
# the host's meminfo (another tenant's memory on a shared machine is no truth about these processes).
KEPT = ("processes", "rollup", "class_usage", "region_events", "regions", "ledger_snapshots", "ledger_regions",
        "ledger_exits", "bpf_stacks", "bpf_counters", "bpf_missed", "pyheap", "pyheap_types", "host_procs",
        "malloc_state", "held_files")


def build_generators() -> tuple[Path, Path]:
    sys.path.insert(0, str(FIXTURES))
    from build import build  # tests/fixtures/build.py

    lib = build("libcorpusleak.so", ["corpus_leak.c"], shared=True)
    gen = build("corpus_gen", ["corpus_gen.c"],
                ldflags=["-L", str(lib.parent), "-lcorpusleak", f"-Wl,-rpath,{lib.parent}", "-lm"])
    return lib, gen


def _argv(spec: dict, lib: Path, gen: Path, truth: Path) -> list[str]:
    args = [f"{k}={v}" for k, v in spec["args"].items()] + [f"truth={truth}"]
    if spec["kind"] == "py":
        return [sys.executable, str(FIXTURES / "corpus_pyheap.py"), str(lib), *args]
    return [str(gen), *args]


def _truth(path: Path, pid: int, t0: float) -> pd.DataFrame:
    rows = []
    for line in path.read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        t, leaked, held = line.split()
        rows.append((pid, float(t) - t0, int(float(leaked)), int(float(held))))
    return pd.DataFrame(rows, columns=["pid", "t", "leaked", "held"])


def _write(df: pd.DataFrame | pa.Table, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tbl = df if isinstance(df, pa.Table) else pa.Table.from_pandas(df, preserve_index=False)
    pq.write_table(tbl, path, compression="zstd", compression_level=19)


def compact(session: Path, out: Path, specs: list[dict], truth_dir: Path) -> None:
    from leaktrace.session import SessionReader

    reader = SessionReader(session)
    meta = dict(reader.meta)
    t0 = float(meta["t0_monotonic"])
    if out.exists():
        shutil.rmtree(out)
    for name in KEPT:
        if name not in reader.tables():
            continue
        df = reader.table(name)
        _write(df, out / "tables" / name / "part-0.parquet")
    (out / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True, default=str) + "\n")
    truth = pd.concat([_truth(truth_dir / f"{s['pid']}.txt", s["pid"], t0) for s in specs], ignore_index=True)
    _write(truth, out / "truth.parquet")
    (out / "specs.json").write_text(json.dumps(specs, indent=1, sort_keys=True) + "\n")


def record(split: str, duration: float, keep: Path | None) -> Path:
    lib, gen = build_generators()
    specs = plan(split, duration + 30)
    work = Path(tempfile.mkdtemp(prefix=f"corpus-{split}-"))
    procs = []
    for s in specs:
        truth = work / f"{s['name']}.txt"
        p = subprocess.Popen(_argv(s, lib, gen, truth), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        s["pid"] = p.pid
        procs.append((p, truth))
    time.sleep(1.0)
    session = keep or work / "session"
    cmd = [sys.executable, "-m", "leaktrace", "hunt", "--duration", str(duration), "--no-gdb", "--no-live",
           "--out", str(session), "--force", "--format", "json"]
    for s in specs:
        cmd += ["--pid", str(s["pid"])]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(cmd, check=True, env=env, cwd=ROOT)
    for p, _ in procs:
        p.terminate()
    for p, _ in procs:
        p.wait()
    tdir = work / "truth"
    tdir.mkdir()
    for s, (_, truth) in zip(specs, procs, strict=True):
        shutil.copy(truth, tdir / f"{s['pid']}.txt")
    out = DATA / split
    compact(session, out, specs, tdir)
    if keep is None:
        shutil.rmtree(work)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("split", choices=("tuning", "frozen"))
    ap.add_argument("--duration", type=float, default=420.0)
    ap.add_argument("--keep-session", type=Path, default=None)
    a = ap.parse_args()
    print(record(a.split, a.duration, a.keep_session))


if __name__ == "__main__":
    main()
