"""The watch's in-memory session: the watcher probe writes its rows here as into a session directory, and
each process keeps a bounded rolling history, so memory stays flat over days. A process's rows become a
real session directory (leaktrace.session.SessionWriter) only when it leaves an incident."""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

import numpy as np

# Rows kept per process and table. rollup: one a tick (720 = 2 h at the default 10 s interval); the
# full-smaps tables grow by a snapshot every smaps_every ticks.
# The eBPF probe's: ledger_snapshots a row per (library, kind) a tick; ledger_regions and bpf_stacks come
# whole at a process's exit (its regions and their call sites), kept until its incident is written.
LIMITS = {"rollup": 720, "class_usage": 600, "region_events": 2000, "processes": 16, "ledger_snapshots": 1500,
          "ledger_regions": 50_000, "bpf_stacks": 5000, "ledger_exits": 4, "bpf_counters": 200}
DEFAULT_LIMIT = 500


class RingSession:
    """A :class:`leaktrace.probes.SessionSink` that keeps rows in memory, bounded per process and table."""

    path = None  # no session directory

    def __init__(self, rollup_rows: int | None = None) -> None:
        self.meta: dict[str, Any] = {"t0_monotonic": time.monotonic(), "attach_s": 0.0}
        self._limits = {**LIMITS, **({"rollup": rollup_rows} if rollup_rows else {})}
        self._rows: dict[int, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def now(self) -> float:
        return time.monotonic() - self.meta["t0_monotonic"]

    def update_meta(self, **fields: Any) -> None:
        self.meta.update(fields)

    def append(self, table: str, rows: list[dict[str, Any]] | dict[str, Any]) -> None:
        if isinstance(rows, dict):
            rows = [rows]
        with self._lock:
            for r in rows:
                per = self._rows.setdefault(int(r.get("pid", -1)), {})
                if table == "regions":
                    # Whole snapshots: the first one kept, the last one replaced.
                    key = f"regions_{r.get('snapshot', 'first')}"
                    batch = per.setdefault("_batch", {})
                    batch.setdefault(key, []).append(r)
                    continue
                dq = per.get(table)
                if dq is None:
                    dq = per[table] = deque(maxlen=self._limits.get(table, DEFAULT_LIMIT))
                dq.append(r)
            for per in self._rows.values():
                for key, batch in per.pop("_batch", {}).items():
                    if key == "regions_first" and key in per:
                        continue
                    per[key] = batch

    def append_columns(self, table: str, columns: dict[str, Any]) -> None:
        """Rows given column by column: as :meth:`append` of them all, but only the rows each process keeps
        (its last ones, up to the table's limit) are made into dicts: a busy process gives thousands a second."""
        n = len(next(iter(columns.values()), ()))
        if not n:
            return
        if table == "regions":  # whole snapshots (see append)
            keep = np.arange(n)
        else:
            pids = np.asarray(columns["pid"]) if "pid" in columns else np.full(n, -1)
            limit = self._limits.get(table, DEFAULT_LIMIT)
            keep = np.sort(np.concatenate([np.flatnonzero(pids == p)[-limit:] for p in np.unique(pids)]))
        cols = {k: (v[keep] if isinstance(v, np.ndarray) else np.asarray(v, dtype=object)[keep]).tolist()
                for k, v in columns.items()}
        self.append(table, [dict(zip(cols, vals, strict=True)) for vals in zip(*cols.values(), strict=True)])

    def flush(self) -> None:
        """Nothing to flush: rows live in memory."""

    def latest(self, table: str, pid: int) -> list[dict[str, Any]]:
        """The rows of ``pid``'s last snapshot in ``table`` (those with the last row's t)."""
        with self._lock:
            dq = self._rows.get(pid, {}).get(table)
            if not dq:
                return []
            t = dq[-1]["t"]
            out = []
            for r in reversed(dq):
                if r["t"] != t:
                    break
                out.append(r)
        return out

    def since(self, table: str, pid: int, t0: float) -> list[dict[str, Any]]:
        """``pid``'s rows of ``table`` from time ``t0`` on, oldest first."""
        with self._lock:
            return [r for r in self._rows.get(pid, {}).get(table, ()) if r["t"] >= t0]

    def pids(self) -> list[int]:
        with self._lock:
            return sorted(self._rows)

    def rollup(self, pid: int, since: float | None = None) -> list[dict[str, Any]]:
        with self._lock:
            rows = list(self._rows.get(pid, {}).get("rollup", ()))
        return rows if since is None else [r for r in rows if r["t"] >= since]

    def tables(self, pid: int) -> dict[str, list[dict[str, Any]]]:
        """Every row kept of ``pid``, by session table (regions: the first and last snapshots)."""
        with self._lock:
            per = self._rows.get(pid, {})
            out = {k: list(v) for k, v in per.items() if not k.startswith("regions_")}
            out["regions"] = list(per.get("regions_first", [])) + list(per.get("regions_last", []))
        return out

    def forget(self, pid: int) -> None:
        with self._lock:
            self._rows.pop(pid, None)
