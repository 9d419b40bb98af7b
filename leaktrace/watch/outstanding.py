"""Outstanding bytes by process, library and kind, for the watch's /metrics: what its own eBPF ledger traces
(since it attached) where it runs, else the ledger of a process's deep hunt (what was mapped during that
hunt)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import Any

Key = tuple[str, str, str]  # (pid, library, kind)


def outstanding_by_library(tracked: Collection[int], holds: Callable[[int], bool],
                           latest: Callable[[str, int], Iterable[dict[str, Any]]],
                           incidents: Iterable[Any]) -> tuple[dict[Key, float], dict[Key, float]]:
    """(outstanding bytes, of those resident) by key over the ``tracked`` processes: ``holds(pid)`` says whether
    the ledger traces ``pid`` now, ``latest(table, pid)`` gives its newest ledger snapshot rows, ``incidents``
    the watch's incidents (their deep hunts' culprits)."""
    outstanding: dict[tuple[str, str, str], float] = {}
    resident: dict[tuple[str, str, str], float] = {}  # of those, present in RAM (pagemap; when read)
    live_ledger = set()
    for pid in tracked:
        if not holds(pid):
            continue  # rows of a process let go are history, not what it holds now
        for r in latest("ledger_snapshots", pid):
            key = (str(pid), str(r["library"]), str(r["kind"]))
            outstanding[key] = float(r["outstanding_bytes"])
            if r.get("resident_bytes") is not None:
                resident[key] = float(r["resident_bytes"])
            live_ledger.add(pid)
    for inc in incidents:
        if inc.status == "deleted":
            continue
        for c in inc.culprits:
            # What a live process holds: a process that ended holds nothing any more.
            pid = c.get("pid")
            if c.get("library") and pid in tracked and pid not in live_ledger:
                key = (str(pid), str(c["library"]), str(c.get("kind")))
                outstanding[key] = float(c.get("outstanding_bytes") or 0)
                if c.get("outstanding_resident_bytes") is not None:
                    resident[key] = float(c["outstanding_resident_bytes"])
    return outstanding, resident
