"""One process's address space as the ledger keeps it: disjoint intervals sorted by start, column-wise
in machine-word arrays, each pointing at the interned :class:`Origin` that created it (call site, stack,
pre-existing or not) and keeping its own birth time. :class:`~.ledger.OutstandingLedger` applies the
syscalls to these.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Origin:
    """Who created a piece of address space. Shared by all the pieces a region is later split into."""

    kind: str  # "anon" | "file" | "heap" | "shm" (SysV shmat) | "preexisting" | "reserve" (PROT_NONE anonymous)
    t_born: int = 0  # ns, CLOCK_MONOTONIC (the BPF seq)
    site: int = 0  # caller's return address at the syscall
    ip: int = 0  # syscall instruction address
    stack_id: int = -1
    tid: int = 0
    path: str = ""  # pre-existing mappings: the path /proc/PID/maps showed

    @property
    def preexisting(self) -> bool:
        return self.kind == "preexisting"

    @property
    def counted(self) -> bool:
        """Memory the ledger accounts: not what existed before attach, not a PROT_NONE reservation."""
        return self.kind not in ("preexisting", "reserve")


@dataclass(slots=True)
class Interval:
    start: int
    end: int
    origin: Origin

    @property
    def size(self) -> int:
        return self.end - self.start


class OriginTable:
    """Interned origins: one :class:`Origin` per call site (kind, site, ip, stack_id, path), with
    ``t_born`` and ``tid`` zeroed. Intervals keep only the index of theirs and their own ``t_born``, so a
    leak of many mappings from a few call sites costs a few machine words per mapping (the thread id of
    each mapping is not kept: nothing reads it)."""

    __slots__ = ("_ids", "origins")

    def __init__(self) -> None:
        self._ids: dict[tuple[str, int, int, int, str], int] = {}
        self.origins: list[Origin] = []

    def __len__(self) -> int:
        return len(self.origins)

    def intern(self, o: Origin) -> int:
        key = (o.kind, o.site, o.ip, o.stack_id, o.path)
        i = self._ids.get(key)
        if i is None:
            i = self._ids[key] = len(self.origins)
            self.origins.append(Origin(o.kind, site=o.site, ip=o.ip, stack_id=o.stack_id, path=o.path))
        return i

    def full(self, oid: int, t_born: int) -> Origin:
        """The interned origin of ``oid`` with a mapping's own birth time."""
        o = self.origins[oid]
        return o if t_born == 0 else Origin(o.kind, t_born, o.site, o.ip, o.stack_id, 0, o.path)


class AddressSpace:
    """Disjoint intervals sorted by start, stored column-wise in machine-word arrays: start, end,
    interned origin id and birth time (32 bytes per interval instead of a few hundred for objects)."""

    __slots__ = ("_starts", "_ends", "_oids", "_born", "origins", "heap_start", "heap_end")

    def __init__(self, origins: OriginTable | None = None) -> None:
        self._starts = array("Q")
        self._ends = array("Q")
        self._oids = array("I")
        self._born = array("q")
        self.origins = origins if origins is not None else OriginTable()
        self.heap_start: int | None = None
        self.heap_end: int | None = None  # page-aligned end of [heap]

    def _interval(self, i: int) -> Interval:
        return Interval(self._starts[i], self._ends[i], self.origins.full(self._oids[i], self._born[i]))

    def __iter__(self) -> Iterator[Interval]:
        for i in range(len(self._starts)):
            yield self._interval(i)

    def __len__(self) -> int:
        return len(self._starts)

    def totals(self) -> list[tuple[Origin, int, int]]:
        """(interned origin, bytes, intervals) per origin held: a snapshot's sums with no Python step per
        interval (a vLLM process holds thousands, most of them mapped before attach)."""
        return sum_by_origin(self._oids, self._starts, self._ends, self.origins.origins)

    def columns(self) -> tuple[array, array, array, list[Origin]]:
        """(starts, ends, origin ids, origins): the intervals as the machine-word columns they are kept in."""
        return self._starts, self._ends, self._oids, self.origins.origins

    def rows(self) -> Iterator[tuple[int, int, Origin, int]]:
        """(start, end, interned origin, t_born) per interval: no object per interval."""
        origins = self.origins.origins
        return zip(self._starts, self._ends, (origins[k] for k in self._oids), self._born, strict=True)

    def _first_overlap(self, a: int) -> int:
        i = bisect.bisect_right(self._starts, a) - 1
        if i >= 0 and self._ends[i] > a:
            return i
        return i + 1

    def pieces(self, a: int, b: int) -> list[tuple[int, int, int, int]]:
        """The parts of intervals inside [a, b), as (start, end, origin id, t_born)."""
        i = self._first_overlap(a)
        out = []
        while i < len(self._starts) and self._starts[i] < b:
            out.append((max(self._starts[i], a), min(self._ends[i], b), self._oids[i], self._born[i]))
            i += 1
        return out

    def covering_most(self, a: int, b: int) -> Interval | None:
        """The interval covering more than half of [a, b), if one does (intervals are disjoint: at most one),
        found without an object for each of the others: a 2 MiB fault bucket in a vLLM process can overlap
        dozens of small mappings, and each tick asks for hundreds of buckets."""
        starts, ends, half = self._starts, self._ends, (b - a) // 2
        i = self._first_overlap(a)
        while i < len(starts) and starts[i] < b:
            if min(ends[i], b) - max(starts[i], a) > half:
                return self._interval(i)
            i += 1
        return None

    def interval_end(self, a: int) -> int:
        """The end of the interval holding ``a`` (the caller knows one does)."""
        return self._ends[self._first_overlap(a)]

    def cut(self, a: int, b: int) -> list[tuple[int, int, int, int]]:
        """Unmap [a, b); returns the removed pieces as (start, end, origin id, t_born)."""
        if b <= a:
            return []
        starts, ends, oids, born = self._starts, self._ends, self._oids, self._born
        i = self._first_overlap(a)
        j = i
        removed: list[tuple[int, int, int, int]] = []
        keep: list[tuple[int, int, int, int]] = []
        while j < len(starts) and starts[j] < b:
            s, e, k, t = starts[j], ends[j], oids[j], born[j]
            if s < a:
                keep.append((s, a, k, t))
            removed.append((max(s, a), min(e, b), k, t))
            if e > b:
                keep.append((b, e, k, t))
            j += 1
        if j > i and not keep:  # whole intervals unmapped: most munmaps of a churner
            del starts[i:j], ends[i:j], oids[i:j], born[i:j]
        elif j > i:
            starts[i:j] = array("Q", [r[0] for r in keep])
            ends[i:j] = array("Q", [r[1] for r in keep])
            oids[i:j] = array("I", [r[2] for r in keep])
            born[i:j] = array("q", [r[3] for r in keep])
        return removed

    def remove(self, a: int, b: int) -> list[Interval]:
        """Unmap [a, b): cut every interval there, keeping what lies outside. Returns the removed pieces."""
        full = self.origins.full
        return [Interval(s, e, full(k, t)) for s, e, k, t in self.cut(a, b)]

    def put(self, a: int, b: int, oid: int, t_born: int) -> None:
        """Map [a, b) to the interned origin ``oid`` born at ``t_born``, replacing whatever was there."""
        if b <= a:
            return
        self.cut(a, b)
        i = bisect.bisect_left(self._starts, a)
        self._starts.insert(i, a)
        self._ends.insert(i, b)
        self._oids.insert(i, oid)
        self._born.insert(i, t_born)

    def grow(self, a: int, b: int, origin: Origin) -> None:
        """Map [a, b) like :meth:`insert`, but extend the interval ending at ``a`` when it has the same
        origin (a heap growing page by page stays one interval, born at its first growth)."""
        if b <= a:
            return
        oid = self.origins.intern(origin)
        self.cut(a, b)
        i = bisect.bisect_left(self._starts, a)
        if i > 0 and self._ends[i - 1] == a and self._oids[i - 1] == oid:
            self._ends[i - 1] = b
        else:
            self.put(a, b, oid, origin.t_born)

    def insert(self, a: int, b: int, origin: Origin) -> None:
        """Map [a, b): whatever was there is replaced (MAP_FIXED semantics)."""
        if b <= a:
            return
        self.put(a, b, self.origins.intern(origin), origin.t_born)

    def clear(self) -> None:
        for arr in (self._starts, self._ends, self._oids, self._born):
            del arr[:]
        self.heap_start = self.heap_end = None


def sum_by_id(oids: array, starts: array, ends: array) -> list[tuple[int, int, int]]:
    """(origin id, bytes, intervals) per origin id in ``oids`` (machine-word columns of one process's intervals)."""
    if not oids:
        return []
    ids = np.frombuffer(oids, dtype=np.uint32)
    sizes = np.frombuffer(ends, dtype=np.uint64) - np.frombuffer(starts, dtype=np.uint64)
    counts = np.bincount(ids)
    nbytes = np.zeros(len(counts), dtype=np.uint64)
    np.add.at(nbytes, ids, sizes)  # exact: a float bincount would round sums past 2**53
    return [(int(i), int(nbytes[i]), int(counts[i])) for i in np.flatnonzero(counts)]


def sum_by_origin(oids: array, starts: array, ends: array, origins: list[Origin]) -> list[tuple[Origin, int, int]]:
    """(origin, bytes, intervals) per origin id in ``oids`` (machine-word columns of one process's intervals)."""
    return [(origins[i], nbytes, n) for i, nbytes, n in sum_by_id(oids, starts, ends)]
