"""Cluster scale: what each node ships per hour of hunt, and what merging N node sessions costs the driver.

A real hunt of the leaker fixture (every probe: eBPF, gdb, watcher; raw-mmap churn, a slow leak and mremap
moves, so every table gets rows) is recorded for --record-s seconds, then stretched into a synthetic node
session of --hours: each table's rows are repeated with their times shifted, and the processes are
multiplied to --procs per node (a vLLM instance is an API server, an EngineCore, a worker and a resource
tracker). From that node session:

- ``ship_*``: the bytes a node sends the driver (its session packed as the node task packs it, tar.gz
  level 3, leaktrace/cluster/node.py) and the session's size on disk;
- ``render_one_s``: re-rendering that one session (``leaktrace report``), the baseline;
- for N in --nodes: the merged report from N node sessions, in a fresh process each (its peak RSS is the
  driver's memory): from the nodes' own report.json (``cluster hunt``'s merge) and re-rendered from every
  session (``cluster report --rerender``), with ratios against N × the one-session render.

    .venv/bin/python bench/bench_cluster_merge.py --hours 1 --nodes 1 8 32 64

Prints one JSON document (and writes it to --json).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from fixtures.build import build  # noqa: E402

from leaktrace.cluster.request import CLUSTER_META, CLUSTER_SCHEMA  # noqa: E402
from leaktrace.session import META, SessionReader  # noqa: E402

PID_STRIDE = 1_000_000  # the copies of a process get pid + k * PID_STRIDE (above any real pid_max)

MERGE_CHILD = """
import json, resource, sys, time
from leaktrace.cluster.merge import render_cluster
t0 = time.monotonic()
rep = render_cluster(sys.argv[1], rerender=sys.argv[2] == "1", formats=("json",))
print(json.dumps({"s": time.monotonic() - t0, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "nodes": len(rep["nodes"]), "culprits": len(rep["culprits"])}))
"""


def record(out: Path, seconds: float) -> None:
    """A real hunt of the leaker fixture, default probes."""
    leaker = build("leaker", ["leaker.c"])
    target = subprocess.Popen([str(leaker), "--churn-per-s", "300", "--leak-kib-per-s", "32", "--chunk-kib", "16",
                               "--mremap-kib-per-s", "8"], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert target.stdout is not None
    target.stdout.readline()
    try:
        r = subprocess.run([sys.executable, "-m", "leaktrace", "hunt", "--pid", str(target.pid), "--duration",
                            str(seconds), "--out", str(out), "--no-live", "--format", "json"],
                           cwd=REPO, capture_output=True, text=True, timeout=seconds + 300)
        if r.returncode != 0:
            raise SystemExit(f"recording hunt failed ({r.returncode}): {r.stderr[-400:]}")
    finally:
        os.killpg(target.pid, signal.SIGKILL)
        target.wait()


def stretch(template: Path, out: Path, hours: float, procs: int) -> dict[str, int]:
    """The template session repeated in time to ``hours`` and in processes to ``procs``; rows per table."""
    reader = SessionReader(template)
    meta = json.loads((template / META).read_text())
    span = float(meta.get("duration_s") or 0) or max(
        float(reader.table(t)["t"].max()) for t in reader.tables() if "t" in reader.table(t))
    copies_t = max(1, math.ceil(hours * 3600 / span))
    n_pids = len({int(p) for p in reader.table("processes")["pid"]}) if "processes" in reader.tables() else 1
    copies_p = max(1, math.ceil(procs / max(n_pids, 1)))
    rows: dict[str, int] = {}
    for name in reader.tables():
        src = pa.Table.from_pandas(reader.table(name), preserve_index=False)
        # Time series (a row per tick or per event) and the outstanding regions of a leak grow with the hunt;
        # snapshots (first/last smaps, processes seen, stacks) do not.
        tcol = next((c for c in ("t", "t_born") if c in src.column_names), None)
        series = tcol is not None and len(pc.unique(src.column(tcol))) > 3
        pieces = []
        for k in range(copies_t if series else 1):
            for j in range(copies_p):
                piece = src
                if k:
                    idx = piece.column_names.index(tcol)
                    piece = piece.set_column(idx, tcol, pc.add(piece.column(tcol), k * span))
                if "pid" in piece.column_names and j:
                    idx = piece.column_names.index("pid")
                    piece = piece.set_column(idx, "pid", pc.add(piece.column("pid"), j * PID_STRIDE))
                pieces.append(piece)
        table = pa.concat_tables(pieces)
        d = out / "tables" / name
        d.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, d / "part-000000.parquet")
        rows[name] = table.num_rows
    meta["duration_s"] = copies_t * span
    (out / META).write_text(json.dumps(meta))
    return rows


def packed_bytes(session: Path) -> int:
    """The session as the node task ships it (tar.gz, level 3)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=3) as tar:
        tar.add(session, arcname="session")
    return buf.tell()


def disk_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file())


def merge(cluster: Path, rerender: bool) -> dict:
    r = subprocess.run([sys.executable, "-c", MERGE_CHILD, str(cluster), "1" if rerender else "0"], cwd=REPO,
                       capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        raise SystemExit(f"merge failed: {r.stderr[-600:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def cluster_dir(root: Path, node_session: Path, n: int) -> Path:
    """A cluster session of ``n`` nodes, each node's session a link to the same synthetic one."""
    c = root / f"cluster-{n}"
    (c / "nodes").mkdir(parents=True)
    entries = []
    for i in range(n):
        host = f"node-{i:03d}"
        (c / "nodes" / host).symlink_to(node_session, target_is_directory=True)
        entries.append({"node_id": f"{i:056x}", "hostname": host, "ip": f"10.0.{i // 250}.{i % 250 + 1}",
                        "status": "ok", "session": f"nodes/{host}"})
    (c / CLUSTER_META).write_text(json.dumps({"schema": CLUSTER_SCHEMA, "address": "bench", "nodes": entries}))
    return c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record-s", type=float, default=30.0, help="seconds of real hunt to record as the template")
    ap.add_argument("--hours", type=float, default=1.0, help="length of each synthetic node session")
    ap.add_argument("--procs", type=int, default=4, help="traced processes per node")
    ap.add_argument("--nodes", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--rerender-max", type=int, default=64,
                    help="re-render from the sessions only up to this many nodes (it costs N one-session renders)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if os.geteuid() != 0:
        print(json.dumps({"skipped": "needs root (the template is a real eBPF hunt)"}))
        return
    with tempfile.TemporaryDirectory(prefix="leaktrace-bench-cluster-") as tmp:
        root = Path(tmp)
        record(root / "template", a.record_s)
        node = root / "node"
        rows = stretch(root / "template", node, a.hours, a.procs)
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "leaktrace", "report", str(node), "--format", "json"], cwd=REPO,
                           capture_output=True, text=True, timeout=3600)
        render_one = time.monotonic() - t0
        if r.returncode != 0:
            raise SystemExit(f"report of the node session failed: {r.stderr[-600:]}")
        hours = json.loads((node / META).read_text())["duration_s"] / 3600
        result = {
            "record_s": a.record_s, "node_hours": round(hours, 3), "procs_per_node": a.procs, "rows": rows,
            "ship_bytes_per_node": packed_bytes(node), "disk_bytes_per_node": disk_bytes(node),
            "render_one_s": round(render_one, 2), "merge": [],
        }
        result["ship_mb_per_node_hour"] = round(result["ship_bytes_per_node"] / 2**20 / hours, 2)
        for n in a.nodes:
            c = cluster_dir(root, node, n)
            from_reports = merge(c, rerender=False)
            row = {"nodes": n, "from_reports_s": round(from_reports["s"], 3),
                   "from_reports_peak_rss_mb": round(from_reports["peak_rss_mb"], 1),
                   "shipped_mb_total": round(n * result["ship_bytes_per_node"] / 2**20, 1)}
            if n <= a.rerender_max:
                rerendered = merge(c, rerender=True)
                row.update({"rerender_s": round(rerendered["s"], 2),
                            "rerender_peak_rss_mb": round(rerendered["peak_rss_mb"], 1),
                            "rerender_vs_n_single_renders": round(rerendered["s"] / (n * render_one), 3)})
            result["merge"].append(row)
            print(json.dumps(result["merge"][-1]), file=sys.stderr, flush=True)
    text = json.dumps(result, indent=1)
    print(text)
    if a.json:
        Path(a.json).write_text(text)


if __name__ == "__main__":
    main()
