"""The session directory: the only thing probes and analysis share.

Layout::

    DIR/meta.json                         target, host, kernel, versions, start/end, redacted config
    DIR/tables/<table>/part-NNNNNN.parquet one complete Parquet file per flush (atomic rename)
    DIR/report.json, report.md, ...        written by reporters

Each flush writes whole Parquet files and renames them into place, so a writer killed with SIGKILL
leaves every earlier part readable (at most the last ``FLUSH_INTERVAL_S`` of rows is lost).

Compaction keeps long hunts at a bounded number of files: older parts are merged into a range file
``part-AAAAAA-BBBBBB.parquet`` (holding parts A..B), written under a hidden name and renamed into place
before the parts it replaces are unlinked. A SIGKILL at any point leaves either the parts or the range
file plus leftovers of the parts; the reader skips parts covered by a readable range file, so no row
is read twice or lost. The flush thread compacts every ``COMPACT_FANOUT`` parts (then every
``COMPACT_FANOUT`` range files of one level, up to ``COMPACT_MAX_BYTES``); ``close()`` merges each
table into one file.

Every table a hunt writes is declared, with its columns, types and version, in
:mod:`leaktrace.session.tables`: the writer and the reader hold each table to it.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Protocol

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from leaktrace import __version__, outdir
from leaktrace.atomic import atomic_write_text
from leaktrace.errors import OutputNotWritable, SessionError
from leaktrace.session import parts
from leaktrace.session.parts import TABLES, compact_table, part_files
from leaktrace.session.tables import (
    SCHEMAS,
    TableSchemaError,
    check_columns,
    check_rows,
    columns_to_arrow,
    conform,
    to_arrow,
)

SESSION_SCHEMA = "leaktrace.session/1"
META = "meta.json"
# Seconds between flushes: each writes one Parquet part per table with new rows (~1 ms of CPU each, ~6 ms a
# flush on a vLLM node); a SIGKILL loses at most this much, a signal or an error nothing (close() flushes).
FLUSH_INTERVAL_S = 2.0


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
    """Thread-safe, incremental writer. ``append`` buffers rows (``append_columns``, rows given column by
    column); a background thread flushes them every ``flush_interval`` seconds as new Parquet parts."""

    def __init__(self, path: str | os.PathLike[str], meta: dict[str, Any] | None = None,
                 flush_interval: float = FLUSH_INTERVAL_S, replace: bool = False) -> None:
        # Absolute before the flush thread starts: libbcc moves the process's working directory while it
        # compiles (leaktrace.outdir). The CLI passes absolute paths already; library callers may not.
        final = outdir.absolute(path)
        # A directory holding a session is never written into (refused), or, with ``replace``, the new
        # session is built beside it and swapped in once its meta.json exists: the old one stays whole
        # until then.
        outdir.check_out(final, force=replace)
        staging = final.with_name(f".{final.name}.new-{uuid.uuid4().hex[:8]}") if outdir.holds_session(final) else None
        self.path = staging or final
        try:
            (self.path / TABLES).mkdir(parents=True, exist_ok=True)
            probe = self.path / f".write-test-{os.getpid()}"
            probe.write_text("x")
            probe.unlink()
        except OSError as e:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
            raise OutputNotWritable(f"cannot write session directory {self.path}: {e.strerror or e}") from e
        self._lock = threading.Lock()
        self._buffers: dict[str, list[dict[str, Any]]] = {}
        self._columns: dict[str, list[dict[str, Any]]] = {}  # table -> batches appended column by column
        self._seq: dict[str, int] = {}
        self._rows_written: dict[str, int] = {}
        self._parts_since_compact: dict[str, int] = {}
        self._io_lock = threading.RLock()  # one writer of part files at a time (flush thread, close)
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
        if staging is not None:
            self.path = _swap_in(staging, final)
        self._stop = threading.Event()
        self._flush_interval = flush_interval
        self._thread = threading.Thread(target=self._flush_loop, name="session-flush", daemon=True)
        self._thread.start()

    # -- meta
    def _write_meta(self) -> None:
        atomic_write_text(self.path / META, json.dumps(self.meta, indent=2, default=str))

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
        check_rows(table, rows)  # here, in the probe's thread: the flush thread must not fail on them
        with self._lock:
            self._buffers.setdefault(table, []).extend(rows)

    def append_columns(self, table: str, columns: dict[str, Any]) -> None:
        """Rows of a declared table given column by column (sequences of one length; a declared column left out
        takes its default): for a probe writing thousands of rows a second, where a dict per row costs."""
        check_columns(table, columns)
        with self._lock:
            self._columns.setdefault(table, []).append(columns)

    def flush(self) -> None:
        with self._io_lock:
            with self._lock:
                buffers, self._buffers = self._buffers, {}
                columns, self._columns = self._columns, {}
            for table in dict.fromkeys([*buffers, *columns]):
                try:
                    self._write_part(table, buffers.get(table, []), columns.get(table, []))
                except OSError as e:  # disk full: keep what is on disk readable, report once
                    self.write_error = e
            for table, n in list(self._parts_since_compact.items()):
                if n >= parts.COMPACT_FANOUT:
                    self._parts_since_compact[table] = 0
                    self._compact(table, final=False)

    def _write_part(self, table: str, rows: list[dict[str, Any]], batches: list[dict[str, Any]]) -> None:
        """One part: ``rows`` appended as dicts, then ``batches`` appended column by column."""
        d = self.path / TABLES / table
        d.mkdir(exist_ok=True)
        parts = [columns_to_arrow(table, b) for b in batches]
        if rows:
            try:
                parts.insert(0, to_arrow(table, rows))
            except UnicodeEncodeError:
                # A name read from /proc with surrogateescape (a file or process name that is not UTF-8):
                # Arrow strings are UTF-8, so its undecodable bytes are written as \xNN escapes.
                parts.insert(0, to_arrow(table, [{k: _utf8(v) for k, v in r.items()} for r in rows]))
        tbl = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
        seq = self._seq.get(table, 0)
        self._seq[table] = seq + 1
        final = d / f"part-{seq:06d}.parquet"
        tmp = d / f".part-{seq:06d}.tmp"
        try:
            pq.write_table(tbl, tmp)
        except OSError:
            tmp.unlink(missing_ok=True)  # a half-written part would only waste the space left
            raise
        os.replace(tmp, final)
        self._rows_written[table] = self._rows_written.get(table, 0) + tbl.num_rows
        self._parts_since_compact[table] = self._parts_since_compact.get(table, 0) + 1

    def _compact(self, table: str, final: bool) -> None:
        try:
            compact_table(self.path, table, final=final)
        except OSError as e:  # no space for the merged file: the parts stay as they are
            self.write_error = e
        except Exception:  # compaction is an optimisation; parts stay readable
            pass

    def _flush_loop(self) -> None:
        while not self._stop.wait(self._flush_interval):
            self.flush()

    def close(self, compact: bool = True, **final_meta: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.flush()
        if compact:
            with self._io_lock:
                for table in list(self._seq):
                    self._compact(table, final=True)
        try:
            self.update_meta(end_wall=time.time(), complete=True, rows=dict(self._rows_written), **final_meta)
        except OSError as e:  # disk full: meta.json keeps its last complete version (atomic rename)
            self.write_error = e


def _utf8(v: Any) -> Any:
    if isinstance(v, str):
        return v.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return v


def _swap_in(staging: Path, final: Path) -> Path:
    """Replace the session in ``final`` by the one in ``staging``: two renames (the old session moves
    aside whole, the new one takes its name), then the old one is deleted."""
    aside = final.with_name(f".{final.name}.old-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(final, aside)
        os.rename(staging, final)
    except OSError as e:
        if aside.exists() and not final.exists():
            os.rename(aside, final)  # put the old session back: nothing lost
        shutil.rmtree(staging, ignore_errors=True)
        raise OutputNotWritable(f"cannot replace the session in {final}: {e.strerror or e}") from e
    shutil.rmtree(aside, ignore_errors=True)
    return final


_NUM = (int, float)
_META_TYPES: dict[str, tuple[type, ...]] = {
    **{k: (*_NUM, type(None)) for k in ("start_wall", "t0_monotonic", "end_wall", "attach_s", "duration_s")},
    **{k: (dict, type(None)) for k in ("target", "options", "host", "exited", "labels", "probe_summaries",
                                       "rows")},
    **{k: (list, type(None)) for k in ("warnings", "probes")},
    "stop_reason": (str, type(None)), "complete": (bool,),
}


class TableSource(Protocol):
    """What the analysis and the reporters read a session through: :class:`SessionReader`, or a view of
    one (analysis/first_named.PrefixReader: the session cut at a time)."""

    path: Path
    meta: dict[str, Any]
    skipped_parts: list[str]

    @property
    def complete(self) -> bool: ...

    def tables(self) -> list[str]: ...

    def table(self, name: str) -> pd.DataFrame: ...


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
        bad = [k for k, types in _META_TYPES.items()
               if k in self.meta and not isinstance(self.meta[k], types)]
        if bad:
            # A hand-edited meta.json: say which fields, rather than fail somewhere in the analysis.
            raise SessionError(f"{meta_path} is corrupt: field(s) {', '.join(bad)} have the wrong type",
                               "restore meta.json (a hunt rewrites it atomically; it was edited by hand)")
        self.skipped_parts: list[str] = []
        self._cache: dict[str, pd.DataFrame] = {}

    @property
    def complete(self) -> bool:
        return bool(self.meta.get("complete"))

    def tables(self) -> list[str]:
        d = self.path / TABLES
        return sorted(p.name for p in d.iterdir() if p.is_dir()) if d.is_dir() else []

    def _read_parts(self, name: str, final: bool) -> list[pa.Table]:
        d = self.path / TABLES / name
        frames: list[pa.Table] = []
        skipped: list[str] = []
        covered = -1
        for first, last, p in part_files(d):
            if first <= covered:
                continue  # merged into a range file already read (a compaction was interrupted)
            try:
                tbl = pq.read_table(p)
                frames.append(conform(name, tbl, str(p.relative_to(self.path))) if name in SCHEMAS else tbl)
            except TableSchemaError:
                raise  # columns that disagree with the declaration: the session is not what the analysis reads
            except FileNotFoundError:
                if not final:
                    raise
                skipped.append(str(p.relative_to(self.path)))
                continue
            except Exception:  # a truncated or hand-edited part: skip it, say so
                if not final and not p.exists():
                    # Gone while we read it (a live hunt compacted it away): list again.
                    raise FileNotFoundError(p) from None
                # An unreadable range file covers nothing: leftovers of its parts are read instead.
                skipped.append(str(p.relative_to(self.path)))
                continue
            covered = last
        self.skipped_parts.extend(skipped)
        return frames

    def table(self, name: str) -> pd.DataFrame:
        if name in self._cache:
            return self._cache[name]
        attempts = 8
        for attempt in range(attempts):
            try:
                frames = self._read_parts(name, final=attempt == attempts - 1)
                break
            except FileNotFoundError:
                # A live hunt compacted parts while we listed them: list again (a loaded machine can
                # lose a few races in a row).
                time.sleep(0.01 * attempt)
                continue
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
