"""malloc's books of a process under confirmation, and the hunt's rule on them (analysis/retention.py,
``in_use_flat``): RSS that grows while nothing the process holds does — malloc's memory in use
(analysis/inuse.py) and the mappings outside malloc's heap that the eBPF ledger traces — is pages of memory
malloc already holds being touched, or free memory it keeps. A churner's RSS climbs that way for minutes
after it starts; with the books it is held back from confirmation, as the hunt calls it no leak.

The same reads confirm a fast leak early (``held_growth``): RSS growing at --fast-confirm-mb-per-min or more
while what the process holds grows with it is a leak without waiting --confirm-s, as an allocator's first touch
or free memory it keeps never makes what it holds grow.

The books are read (leaktrace/probes/mallocstate) once a tick while a process is judged leaking, or growing
when early confirmation is on. A
Python interpreter is left out (its objects live in arenas mapped outside malloc's books: the hunt's Python
heap probe judges them), and so is a process when the eBPF ledger did not trace it over the span the books
cover (what it maps outside the heap is then unknown), or whose malloc is not glibc's."""

from __future__ import annotations

from typing import Any

import numpy as np

from leaktrace import procfs
from leaktrace.analysis.inuse import (
    BOOKS_MIN_COVER,
    BOOKS_MIN_READS,
    in_use_grows,
    kept_in_use,
    untouched_line,
)
from leaktrace.errors import LeaktraceError
from leaktrace.slope import theil_sen
from leaktrace.vllm.labels import is_python

MB = 1024 * 1024
# The heap's kinds in the ledger's snapshots: what malloc's books already count.
HEAP_KINDS = ("heap",)
# A leak growing at least --fast-confirm-mb-per-min is confirmed early (watch.FAST_CONFIRM_S) when what the process
# holds grows at least FAST_HELD_SHARE of its RSS's rate (read FAST_MIN_READS times at least, since it was last
# judged growing).
FAST_HELD_SHARE = 0.5
FAST_MIN_READS = 3


def not_held(books: list[dict[str, Any]], ledger: list[dict[str, Any]], rss_mb_per_min: float,
             anon_mb_per_min: float, span_s: float, leak_mb_per_min: float) -> str | None:
    """The hunt's in_use_flat rule over a span of ``span_s`` seconds: the line why the growth is no leak, or
    None. ``books``: the reads of malloc's books (``t``, ``uordblks``, ``hblkhd``, ``complete``); ``ledger``:
    the eBPF ledger's snapshots (``t``, ``kind``, ``outstanding_bytes``) over the same span."""
    rows = _complete(books)
    if len(rows) < BOOKS_MIN_READS:
        return None
    grows = max(rss_mb_per_min, anon_mb_per_min)
    if grows < leak_mb_per_min or rss_mb_per_min - anon_mb_per_min >= leak_mb_per_min:
        return None  # shared or file memory grows: outside malloc's books
    live = _kept(rows)
    if live.span_s < BOOKS_MIN_COVER * span_s or in_use_grows(live, leak_mb_per_min):
        return None
    other = other_growth(ledger)
    if other >= leak_mb_per_min:
        return None
    return untouched_line(grows, live, len(rows), other)


def other_growth(ledger: list[dict[str, Any]], heap: bool = False, min_reads: int = 3) -> float:
    """MB/min of the ledger's outstanding bytes outside malloc's heap (``heap``: with it; summed per snapshot); 0
    from fewer than ``min_reads`` snapshots."""
    per_t: dict[float, float] = {}
    for r in ledger:
        if heap or str(r["kind"]) not in HEAP_KINDS:
            per_t[float(r["t"])] = per_t.get(float(r["t"]), 0.0) + float(r["outstanding_bytes"])
    if len(per_t) < min_reads:
        return 0.0
    t = np.array(sorted(per_t))
    return float(theil_sen(t, np.array([per_t[x] for x in t]))[0]) * 60.0 / MB


def held_growth(books: list[dict[str, Any]], ledger: list[dict[str, Any]]) -> float | None:
    """MB/min that what a process holds grows at: malloc's memory in use that it keeps (``books``, its reads)
    plus the eBPF ledger's mappings outside malloc's heap (``ledger``, its snapshots); without books (a Python
    interpreter, another allocator), the ledger's mappings the heap's included. None: too few reads of
    either."""
    rows = _complete(books)
    snaps = len({float(r["t"]) for r in ledger})
    if len(rows) < FAST_MIN_READS and snaps < FAST_MIN_READS:
        return None
    grows = other_growth(ledger, heap=not rows, min_reads=FAST_MIN_READS)
    if len(rows) >= FAST_MIN_READS:
        grows += _kept(rows).per_s * 60.0 / MB
    return grows


def _complete(books: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The complete reads of malloc's books, oldest first."""
    return sorted((r for r in books if r.get("complete", True)), key=lambda r: r["t"])


def _kept(rows: list[dict[str, Any]]) -> Any:
    """The rate of the memory in use the process keeps over ``rows`` (analysis/inuse.py kept_in_use)."""
    t = np.fromiter((r["t"] for r in rows), dtype=float, count=len(rows))
    in_use = np.fromiter((r["uordblks"] + r["hblkhd"] for r in rows), dtype=float, count=len(rows))
    return kept_in_use(t, in_use)[0]


def held_line(grows_mb_per_min: float, held_mb_per_min: float | None, fast_mb_per_min: float) -> str | None:
    """Why a leak judged by its RSS (or anonymous memory: ``grows_mb_per_min``, the faster) is confirmed before
    --confirm-s (None: it is not): it grows at least ``fast_mb_per_min`` and what it holds grows with it."""
    if fast_mb_per_min <= 0 or grows_mb_per_min < fast_mb_per_min or held_mb_per_min is None:
        return None
    if held_mb_per_min < FAST_HELD_SHARE * grows_mb_per_min:
        return None
    return (f"it grows {grows_mb_per_min:.1f} MB/min and what it holds (malloc's memory in use, the eBPF "
            f"ledger's mappings) {held_mb_per_min:.1f} MB/min")


class HeapBooks:
    """Reads of glibc malloc's books, per process (where they are, found once)."""

    def __init__(self) -> None:
        self._where: dict[int, Any] = {}  # pid -> GlibcMalloc, or the line why its books cannot be read

    def read(self, pid: int, now: float) -> dict[str, Any] | None:
        """One read (a ``malloc_state`` row on the watch's clock), or None: a Python interpreter, another
        allocator, no debug information for libc, or the process gone."""
        from leaktrace.probes.mallocstate.glibc import read_malloc_state
        from leaktrace.probes.mallocstate.probe import locate_books

        try:
            where = self._where.get(pid)
            if where is None:
                if is_python(procfs.exe_path(pid), procfs.read_comm(pid)):
                    where = "a Python interpreter"
                else:
                    where = locate_books(pid)[0]
                self._where[pid] = where
            if isinstance(where, str):
                return None
            st = read_malloc_state(pid, where)
        except (LeaktraceError, OSError):
            return None
        return {"t": now, "pid": pid, **st}

    def forget(self, pid: int) -> None:
        self._where.pop(pid, None)
