"""Incidents: the evidence the watch keeps, each a normal session directory under DIR/incidents/ that
`leaktrace report` and `compare` read.

- ``<UTC time>-<pid>/``: a confirmed leak's deep hunt, a plain `leaktrace hunt` of the process's tree (gdb
  stacks, heap walks, /metrics, the eBPF ledger) run as a child process for --deep-hunt-s, so a crash or a
  stall of the hunt never takes the watch down, and SIGTERM reaches it as it reaches any hunt (it still
  writes its session and report).
- ``<UTC time>-<pid>-exit/``: a growing process that ended: the watch's rolling history of it (growth,
  memory classes, regions, how it ended) written as a session, then its reports.

The disk bound deletes the oldest finished incidents first until DIR fits in --max-disk-mb.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from leaktrace.errors import LeaktraceError
from leaktrace.huntspec import HuntSpec
from leaktrace.procfs.exits import describe_exit

INCIDENTS = "incidents"
HUNT_STOP_GRACE_S = 60.0  # a deep hunt stopped by SIGTERM writes its report in this time, else is killed


def utc_stamp(t: float | None = None) -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if t is None else t))


def incident_dir(out: Path, pid: int, suffix: str = "") -> Path:
    base = out / INCIDENTS / f"{utc_stamp()}-{pid}{suffix}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}.{n}")
    return path


@dataclass
class Incident:
    kind: str  # "leak" (a deep hunt) or "exit"
    pid: int
    root: int
    path: Path
    t: float  # watch clock
    utc: str
    status: str = "running"  # running | done | failed
    verdict: str | None = None
    culprits: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    exit: dict[str, Any] | None = None
    proc: subprocess.Popen | None = None

    def as_dict(self) -> dict[str, Any]:
        top = self.culprits[0] if self.culprits else None
        return {"kind": self.kind, "pid": self.pid, "root": self.root, "path": str(self.path), "utc": self.utc,
                "t": round(self.t, 3), "status": self.status, "verdict": self.verdict, "error": self.error,
                "exit": self.exit,
                "top_culprit": None if top is None else {k: top.get(k) for k in
                                                          ("kind", "library", "pid", "mb_per_min",
                                                           "outstanding_bytes")}}

    def read_report(self) -> None:
        try:
            rep = json.loads((self.path / "report.json").read_text())
        except (OSError, ValueError) as e:
            self.status, self.error = "failed", f"no report.json: {e}"
            return
        self.status = "done"
        self.verdict = rep.get("verdict")
        self.culprits = [c for c in rep.get("culprits") or [] if isinstance(c, dict)][:20]


def start_deep_hunt(out: Path, pid: int, root: int, t: float, options: Any) -> Incident:
    """A normal `hunt` of the tree rooted at ``root`` (``pid`` leaks) for --deep-hunt-s, as a child process."""
    path = incident_dir(out, pid)
    path.parent.mkdir(parents=True, exist_ok=True)
    cmd = HuntSpec(pids=(root,), duration=options.deep_hunt_s, interval=min(1.0, options.interval), out=str(path),
                   live=False, quiet=True, formats=tuple(options.formats), no_bpf=not options.bpf,
                   no_gdb=not options.gdb, vllm=options.vllm).argv()
    inc = Incident("leak", pid, root, path, t, utc_stamp())
    log = open(path.parent / f".{path.name}.log", "w")  # the child holds it
    try:
        inc.proc = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError as e:
        inc.status, inc.error = "failed", f"cannot start the deep hunt: {e}"
    finally:
        log.close()
    return inc


def poll_deep_hunt(inc: Incident) -> bool:
    """True once the deep hunt ended (its report read, or its failure recorded)."""
    if inc.proc is None or inc.proc.poll() is None:
        return inc.proc is None
    rc = inc.proc.returncode
    inc.proc = None
    logf = inc.path.parent / f".{inc.path.name}.log"
    lines = logf.read_text(errors="replace").strip().splitlines() if logf.exists() else []
    logf.unlink(missing_ok=True)
    if rc == 0 or (inc.path / "report.json").exists():
        inc.read_report()  # a hunt that failed late may still have written its report
    if rc != 0:
        inc.status, inc.error = "failed", (lines[-1] if lines else f"hunt exited with status {rc}")
    return True


def stop_deep_hunt(inc: Incident) -> None:
    """SIGTERM (the hunt writes its session and report), then wait; killed only past the grace time."""
    if inc.proc is None:
        return
    try:
        os.killpg(inc.proc.pid, signal.SIGTERM)
        inc.proc.wait(timeout=HUNT_STOP_GRACE_S)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(inc.proc.pid, signal.SIGKILL)
        inc.proc.wait(timeout=10)
    poll_deep_hunt(inc)


def _rebased(rows: list[dict[str, Any]], t0: float) -> list[dict[str, Any]]:
    """Rows on the incident's clock (its first sample at 0); rows from before that dropped."""
    out = []
    for r in rows:
        r = dict(r)
        if "t" in r:
            r["t"] = float(r["t"]) - t0
            if r["t"] < 0:
                continue
        if r.get("t_born") is not None and r["t_born"] == r["t_born"]:  # NaN: mapped before the probe
            r["t_born"] = float(r["t_born"]) - t0
        out.append(r)
    return out


# The tables of a process kept by the watch: the watcher's, and the eBPF probe's when it ran.
TABLES = ("processes", "rollup", "class_usage", "region_events", "regions", "ledger_snapshots", "ledger_exits",
          "ledger_regions", "bpf_stacks", "bpf_counters")


# How long the child writing an exit incident's session and reports may take before it is killed.
EXIT_WRITE_TIMEOUT_S = 180.0


def _write_exit_session(path: Path, pid: int, root: int, ex: dict[str, Any], t: float, t0: float, oom: bool,
                        tables: dict[str, list[dict[str, Any]]], watch_meta: dict[str, Any],
                        formats: tuple[str, ...]) -> None:
    from leaktrace.report import render_session
    from leaktrace.session import SessionWriter

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = SessionWriter(path, meta={"target": {"pids": [pid], "processes": [{"pid": pid}]},
                                       "attach_s": 0.0, "watch": {**watch_meta, "exit": ex, "root": root}})
    for table in TABLES:
        rows = _rebased(tables.get(table) or [], t0)
        if table == "processes" and oom:
            rows = [{**r, "exit_code": 9} if r.get("event") == "exit" else r for r in rows]
        writer.append(table, rows)
    end = max(t - t0, 0.0)
    writer.close(stop_reason=f"target exited ({ex['how']})", duration_s=end, exited={str(pid): end},
                 warnings=[], labels={})
    render_session(path, formats=formats)


def _exit_writer_child(conn: Connection, *args: Any) -> None:
    """The child's body: the session and its reports, then None (done) or the error's line to the watch."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C of the watch lets the incident finish
    try:
        _write_exit_session(*args)
        conn.send(None)
    except Exception as e:  # a session that cannot be written or read is a failed incident
        conn.send(str(e) if isinstance(e, LeaktraceError) else f"{type(e).__name__}: {e}")
    finally:
        conn.close()


def write_exit_incident(out: Path, pid: int, root: int, t: float, tables: dict[str, list[dict[str, Any]]],
                        exit_code: int | None, oom: bool, watch_meta: dict[str, Any],
                        formats: tuple[str, ...]) -> Incident:
    """The session of a growing process that ended: what the watch held of it, on the clock of its first
    sample, then its reports. Written by a short-lived child process: the session writer and the reporters
    need pandas and pyarrow (~70 MB), which would otherwise stay in the watch's RSS for the rest of its life."""
    path = incident_dir(out, pid, "-exit")
    inc = Incident("exit", pid, root, path, t, utc_stamp())
    ex = describe_exit(exit_code, oom=oom, source="proc" if exit_code is not None or oom else None)
    inc.exit = ex
    rollup = tables.get("rollup") or []
    t0 = float(rollup[0]["t"]) if rollup else t
    ctx = multiprocessing.get_context("spawn")  # never fork a process holding the probe's threads
    recv, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_exit_writer_child, daemon=True, name=f"leaktrace-exit-{pid}",
                        args=(send, path, pid, root, ex, t, t0, oom, tables, watch_meta, formats))
    try:
        child.start()
        send.close()
        error = recv.recv() if recv.poll(EXIT_WRITE_TIMEOUT_S) else f"not written in {EXIT_WRITE_TIMEOUT_S:.0f} s"
    except (OSError, EOFError) as e:  # the child died before it answered
        error = f"the incident's writer ended ({child.exitcode}): {e}"
    finally:
        recv.close()
        if child.is_alive():
            child.kill()
        child.join(10)
    if error is None:
        inc.read_report()
    else:
        inc.status, inc.error = "failed", error
    return inc


def dir_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def enforce_disk(out: Path, max_bytes: float, busy: set[Path]) -> list[Path]:
    """Delete the oldest incidents (never one being written) until ``out`` fits; returns those deleted."""
    deleted: list[Path] = []
    d = out / INCIDENTS
    if not d.is_dir():
        return deleted
    size = dir_bytes(out)
    for inc in sorted((p for p in d.iterdir() if p.is_dir() and p not in busy), key=lambda p: p.name):
        if size <= max_bytes:
            break
        freed = dir_bytes(inc)
        shutil.rmtree(inc, ignore_errors=True)
        (d / f".{inc.name}.log").unlink(missing_ok=True)
        size -= freed
        deleted.append(inc)
    return deleted
