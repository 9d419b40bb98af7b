"""The session directory: the only thing probes and analysis share.

Layout::

    DIR/meta.json                         target, host, kernel, versions, start/end, redacted config
    DIR/tables/<table>/part-NNNNNN.parquet one complete Parquet file per flush (atomic rename)
    DIR/report.json, report.md, ...        written by reporters

Each flush writes whole Parquet files and renames them into place, so a writer killed with SIGKILL
leaves every earlier part readable (at most the last <1 s of rows is lost). ``close()`` compacts each
table's parts into one file.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from leaktrace import __version__
from leaktrace.errors import OutputNotWritable, SessionError

SESSION_SCHEMA = "leaktrace.session/1"
META = "meta.json"
TABLES = "tables"

# Known tables and their column types. Probes may add tables of their own (types then inferred), but
# a table listed here always reads back with these columns, even when empty.
#  t: seconds since hunt start (time.monotonic() - meta["t0_monotonic"]).
_I = pa.int64()
_U = pa.uint64()
_F = pa.float64()
_S = pa.string()
_B = pa.bool_()
SCHEMAS: dict[str, pa.Schema] = {
    # One row when a process is first seen and one when it is seen gone.
    "processes": pa.schema([("t", _F), ("pid", _I), ("ppid", _I), ("event", _S), ("comm", _S),
                            ("label", _S), ("cmdline", _S), ("exe", _S), ("root", _I)]),
    # /proc/PID/smaps_rollup every tick (bytes).
    "rollup": pa.schema([("t", _F), ("pid", _I), ("rss", _I), ("pss", _I), ("uss", _I), ("anon", _I),
                         ("swap", _I), ("shared", _I)]),
    # Full smaps every N ticks, summed by memory class (bytes).
    "class_usage": pa.schema([("t", _F), ("pid", _I), ("cls", _S), ("size", _I), ("rss", _I),
                              ("anon", _I), ("count", _I)]),
    # Region diffs between two full smaps: born, grown, shrunk, gone, moved.
    "region_events": pa.schema([("t", _F), ("pid", _I), ("event", _S), ("start", _U), ("end", _U),
                                ("size", _I), ("rss", _I), ("old_start", _U), ("old_size", _I),
                                ("old_rss", _I), ("perms", _S), ("path", _S), ("cls", _S)]),
    # The first and the last full smaps of each process (snapshot = "first" | "last").
    "regions": pa.schema([("t", _F), ("pid", _I), ("snapshot", _S), ("start", _U), ("end", _U),
                          ("size", _I), ("rss", _I), ("anon", _I), ("perms", _S), ("offset", _U),
                          ("path", _S), ("cls", _S)]),
}


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def host_facts() -> dict[str, Any]:
    import sys

    return {
        "hostname": socket.gethostname(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "python": sys.version.split()[0],
        "leaktrace": __version__,
    }


class SessionWriter:
    """Thread-safe, incremental writer. ``append`` buffers rows; a background thread flushes them
    every ``flush_interval`` seconds as new Parquet parts."""

    def __init__(self, path: str | os.PathLike[str], meta: dict[str, Any] | None = None,
                 flush_interval: float = 0.5) -> None:
        self.path = Path(path)
        try:
            (self.path / TABLES).mkdir(parents=True, exist_ok=True)
            probe = self.path / f".write-test-{os.getpid()}"
            probe.write_text("x")
            probe.unlink()
        except OSError as e:
            raise OutputNotWritable(f"cannot write session directory {self.path}: {e.strerror or e}") from e
        self._lock = threading.Lock()
        self._buffers: dict[str, list[dict[str, Any]]] = {}
        self._seq: dict[str, int] = {}
        self._rows_written: dict[str, int] = {}
        self.write_error: OSError | None = None
        now = time.time()
        self.meta: dict[str, Any] = {
            "schema": SESSION_SCHEMA,
            "id": uuid.uuid4().hex,
            "start_wall": now,
            "t0_monotonic": time.monotonic(),
            "end_wall": None,
            "complete": False,
            "host": host_facts(),
        }
        if meta:
            self.meta.update(meta)
        self._write_meta()
        self._stop = threading.Event()
        self._flush_interval = flush_interval
        self._thread = threading.Thread(target=self._flush_loop, name="session-flush", daemon=True)
        self._thread.start()

    # -- meta
    def _write_meta(self) -> None:
        _atomic_write_text(self.path / META, json.dumps(self.meta, indent=2, default=str))

    def update_meta(self, **fields: Any) -> None:
        with self._lock:
            self.meta.update(fields)
            self._write_meta()

    def now(self) -> float:
        """Seconds since the session started (the ``t`` column of every table)."""
        return time.monotonic() - self.meta["t0_monotonic"]

    # -- rows
    def append(self, table: str, rows: list[dict[str, Any]] | dict[str, Any]) -> None:
        if isinstance(rows, dict):
            rows = [rows]
        if not rows:
            return
        with self._lock:
            self._buffers.setdefault(table, []).extend(rows)

    def flush(self) -> None:
        with self._lock:
            buffers, self._buffers = self._buffers, {}
        for table, rows in buffers.items():
            try:
                self._write_part(table, rows)
            except OSError as e:  # disk full: keep what is on disk readable, report once
                self.write_error = e

    def _write_part(self, table: str, rows: list[dict[str, Any]]) -> None:
        d = self.path / TABLES / table
        d.mkdir(exist_ok=True)
        schema = SCHEMAS.get(table)
        if schema is not None:
            tbl = pa.Table.from_pylist([{k: r.get(k) for k in schema.names} for r in rows], schema=schema)
        else:
            tbl = pa.Table.from_pylist(rows)
        seq = self._seq.get(table, 0)
        self._seq[table] = seq + 1
        final = d / f"part-{seq:06d}.parquet"
        tmp = d / f".part-{seq:06d}.tmp"
        pq.write_table(tbl, tmp)
        os.replace(tmp, final)
        self._rows_written[table] = self._rows_written.get(table, 0) + len(rows)

    def _flush_loop(self) -> None:
        while not self._stop.wait(self._flush_interval):
            self.flush()

    def close(self, compact: bool = True, **final_meta: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.flush()
        if compact:
            for table in list(self._seq):
                try:
                    compact_table(self.path, table)
                except Exception:  # noqa: BLE001 - compaction is an optimisation; parts stay readable
                    pass
        self.update_meta(end_wall=time.time(), complete=True, rows=dict(self._rows_written), **final_meta)


def compact_table(path: Path, table: str) -> None:
    d = Path(path) / TABLES / table
    parts = sorted(d.glob("part-*.parquet"))
    if len(parts) <= 1:
        return
    frames = [pq.read_table(p) for p in parts]
    merged = pa.concat_tables(frames, promote_options="default")
    tmp = d / ".compact.tmp"
    pq.write_table(merged, tmp)
    # part 0 is replaced by the merged table in one rename, then the other parts go. Only a crash in
    # the middle of the unlinks can leave rows twice; the writer has finished by then.
    os.replace(tmp, parts[0])
    for p in parts[1:]:
        p.unlink(missing_ok=True)


class SessionReader:
    """Reads a session directory, complete or not (a hunt killed with SIGKILL)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        meta_path = self.path / META
        if not self.path.is_dir():
            raise SessionError(f"no session at {self.path}")
        try:
            self.meta: dict[str, Any] = json.loads(meta_path.read_text())
        except FileNotFoundError as e:
            raise SessionError(f"{self.path} has no {META}: not a leaktrace session") from e
        except PermissionError as e:
            raise SessionError(f"cannot read {meta_path}", "run as the user who wrote it, or as root") from e
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise SessionError(f"{meta_path} is corrupt ({e.__class__.__name__})") from e
        if not isinstance(self.meta, dict) or self.meta.get("schema") != SESSION_SCHEMA:
            raise SessionError(f"{meta_path} is not a {SESSION_SCHEMA} session")
        self.skipped_parts: list[str] = []
        self._cache: dict[str, pd.DataFrame] = {}

    @property
    def complete(self) -> bool:
        return bool(self.meta.get("complete"))

    def tables(self) -> list[str]:
        d = self.path / TABLES
        return sorted(p.name for p in d.iterdir() if p.is_dir()) if d.is_dir() else []

    def table(self, name: str) -> pd.DataFrame:
        if name in self._cache:
            return self._cache[name]
        d = self.path / TABLES / name
        frames: list[pa.Table] = []
        for p in sorted(d.glob("part-*.parquet")) if d.is_dir() else []:
            try:
                frames.append(pq.read_table(p))
            except Exception:  # noqa: BLE001 - a truncated or hand-edited part: skip it, say so
                self.skipped_parts.append(str(p.relative_to(self.path)))
        if frames:
            try:
                df = pa.concat_tables(frames, promote_options="default").to_pandas()
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                df = pd.concat([f.to_pandas() for f in frames], ignore_index=True)
        elif name in SCHEMAS:
            df = SCHEMAS[name].empty_table().to_pandas()
        else:
            df = pd.DataFrame()
        self._cache[name] = df
        return df
