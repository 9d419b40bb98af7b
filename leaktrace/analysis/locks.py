"""Who locks the pages a process keeps locked: the eBPF layer's lock calls, replayed.

``bpf_events`` holds every mlock/mlock2 (pages locked: addr, len), munlock, mlockall (flags = MCL_*) and
munlockall of the hunted processes, each with its call site's ``stack_key`` (``bpf_stacks`` gives its library
and frames). Replayed in order with the process's munmaps and mremaps (an unmap unlocks; a move carries the
lock along), what is still locked at the end is apportioned to the call sites that locked it. A process whose
VmLck grows is then named by the call path of what it keeps locked, even where the pages were mapped long
before (a pool locked slice by slice) and nothing in the ledger grows.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import pandas as pd

from leaktrace.analysis.ledger import stack_frames
from leaktrace.session import TableSource

LOCK_TYPES = ("mlock", "munlock", "mlockall", "munlockall")
MCL_CURRENT, MCL_FUTURE, MCL_ONFAULT = 1, 2, 4


@dataclass
class LockSite:
    """A call site of lock calls in one process and what of the pages it locked is still locked."""

    stack_key: str
    library: str
    frames: list[str]
    locked_bytes: int = 0
    calls: int = 0


@dataclass
class ProcessLocks:
    """One process's lock calls: its sites, most locked first, and its mlockall calls (flags, stack_key)."""

    sites: list[LockSite] = field(default_factory=list)
    lockall: list[tuple[int, str]] = field(default_factory=list)


class LockedRanges:
    """Disjoint locked ranges [start, end) of one address space, each labelled with the call that locked it."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.keys: list[str] = []

    def remove(self, a: int, b: int) -> list[tuple[int, int, str]]:
        """Unlock [a, b); the pieces removed, as (start, end, key)."""
        i = bisect.bisect_right(self.ends, a)
        removed: list[tuple[int, int, str]] = []
        keep: list[tuple[int, int, str]] = []
        j = i
        while j < len(self.starts) and self.starts[j] < b:
            s, e, k = self.starts[j], self.ends[j], self.keys[j]
            removed.append((max(s, a), min(e, b), k))
            if s < a:
                keep.append((s, a, k))
            if e > b:
                keep.append((b, e, k))
            j += 1
        self.starts[i:j] = [s for s, _, _ in keep]
        self.ends[i:j] = [e for _, e, _ in keep]
        self.keys[i:j] = [k for _, _, k in keep]
        return removed

    def add(self, a: int, b: int, key: str) -> None:
        """Lock [a, b) by ``key`` (pages locked again are the latest call's)."""
        if b <= a:
            return
        self.remove(a, b)
        i = bisect.bisect_left(self.starts, a)
        self.starts.insert(i, a)
        self.ends.insert(i, b)
        self.keys.insert(i, key)

    def by_key(self, held: list[tuple[int, int]] | None = None) -> dict[str, int]:
        """Bytes locked per key; only of what lies in ``held`` (disjoint ranges sorted by start) when given."""
        out: dict[str, int] = {}
        hs = [a for a, _ in held] if held is not None else []
        for s, e, k in zip(self.starts, self.ends, self.keys, strict=True):
            n = e - s
            if held is not None:
                n = 0
                i = max(bisect.bisect_right(hs, s) - 1, 0)
                while i < len(held) and held[i][0] < e:
                    n += max(0, min(e, held[i][1]) - max(s, held[i][0]))
                    i += 1
            if n:
                out[k] = out.get(k, 0) + n
        return out


def replay(events: pd.DataFrame, held: list[tuple[int, int]] | None = None
           ) -> tuple[dict[str, int], dict[str, int], list[tuple[int, str]]]:
    """One process's events in order: (bytes still locked per stack_key, lock calls per stack_key,
    mlockall calls as (flags, stack_key)). ``held``: what the process still maps at the end (the ledger's
    regions at stop): an munmap the kernel settled without an event unlocked what it unmapped."""
    ranges = LockedRanges()
    calls: dict[str, int] = {}
    lockall: list[tuple[int, str]] = []
    for e in events.itertuples(index=False):
        a, n = int(e.addr), int(e.len)
        if e.type == "mlock":
            ranges.add(a, a + n, str(e.stack_key))
            calls[str(e.stack_key)] = calls.get(str(e.stack_key), 0) + 1
        elif e.type in ("munlock", "munmap"):
            ranges.remove(a, a + n)
        elif e.type == "mremap":
            moved = ranges.remove(a, a + n)
            shift = int(e.new_addr) - a
            for s, t, k in moved:  # the lock follows the pages; pages cut off by a shrink are unmapped
                ranges.add(s + shift, min(t + shift, int(e.new_addr) + int(e.new_len)), k)
        elif e.type == "mlockall":
            lockall.append((int(e.flags), str(e.stack_key)))
            calls[str(e.stack_key)] = calls.get(str(e.stack_key), 0) + 1
        elif e.type == "munlockall":
            ranges = LockedRanges()
        elif e.type in ("exec", "exit"):
            ranges = LockedRanges()
            lockall = []
    return ranges.by_key(held), calls, lockall


def _held(reader: TableSource) -> dict[int, list[tuple[int, int]]]:
    """pid -> the ranges it maps at stop (the ledger's regions, pre-existing ones included), merged, sorted."""
    if "ledger_regions" not in reader.tables():
        return {}
    lr = reader.table("ledger_regions")
    if lr.empty:
        return {}
    if "at_exit" in lr:
        lr = lr[~lr["at_exit"].fillna(False).astype(bool)]
    out: dict[int, list[tuple[int, int]]] = {}
    for pid, rows in lr.groupby("pid"):
        merged: list[tuple[int, int]] = []
        for a, b in sorted(zip(rows["start"].astype("int64"), rows["end"].astype("int64"), strict=True)):
            if merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], int(b)))
            else:
                merged.append((int(a), int(b)))
        out[int(pid)] = merged
    return out


def process_locks(reader: TableSource) -> dict[int, ProcessLocks]:
    """pid -> its lock calls' sites (most still locked first) and mlockall calls, for every process that made
    a lock call."""
    if "bpf_events" not in reader.tables():
        return {}
    ev = reader.table("bpf_events")
    if ev.empty or not ev["type"].isin(LOCK_TYPES).any():
        return {}
    pids = ev.loc[ev["type"].isin(LOCK_TYPES), "pid"].unique()
    mine = ev[ev["pid"].isin(pids) & ev["type"].isin((*LOCK_TYPES, "munmap", "mremap", "exec", "exit"))]
    stacks = reader.table("bpf_stacks") if "bpf_stacks" in reader.tables() else pd.DataFrame()
    libs = dict(zip(stacks["stack_key"].astype(str), stacks["library"].astype(str), strict=True)) \
        if not stacks.empty else {}
    frames = stack_frames(reader)
    held = _held(reader)
    out: dict[int, ProcessLocks] = {}
    for pid, rows in mine.sort_values("t", kind="stable").groupby("pid"):
        locked, calls, lockall = replay(rows, held.get(int(pid)))
        sites = [LockSite(k, libs.get(k, "?"), frames.get(k, []), locked.get(k, 0), n) for k, n in calls.items()]
        sites.sort(key=lambda s: (-s.locked_bytes, -s.calls))
        out[int(pid)] = ProcessLocks(sites, lockall)
    return out


def lockall_words(flags: int) -> str:
    names = [n for bit, n in ((MCL_CURRENT, "MCL_CURRENT"), (MCL_FUTURE, "MCL_FUTURE"), (MCL_ONFAULT, "MCL_ONFAULT"))
             if flags & bit]
    return " | ".join(names) or "0"
