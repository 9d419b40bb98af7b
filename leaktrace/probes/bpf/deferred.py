"""Heap growth whose caller is named only if it outlives a tick, for the C runtime's mmaps that come as slow events
(the kernel keeps most with their windows: :mod:`.keptwindows`; these are the ones its window map had no room for).

Every anonymous mmap made by the C runtime comes with a stack window, and naming malloc's caller from it
(:meth:`~.origins.GrowthOrigins.growth_origin`) is most of the Python work per event. Under allocator churn
(torch at glibc's mmap threshold of 4096: thousands of mmap/munmap pairs a second per worker) nearly all of those
chunks are unmapped within milliseconds, and only what is still held when the books are read can be blamed. So
the ledger takes such a mapping at once, with its extent exact, under a provisional origin (the syscall's own
site: libc's), and keeps its window beside it; the window is scanned when the books are read (every tick, the
stop, a target's exit), or before a call that moves the mapping or continues it (mremap, an mprotect committing
the pages just above it). A chunk unmapped whole before then is never scanned.

A pending mapping is known in the ledger by its provisional origin id and its birth seq, so its pieces are found
again wherever a partial munmap, an overlay or a kernel region's absorption left them: each piece still carrying
both takes the named origin, and pieces gone need nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from leaktrace.probes.bpf.addrspace import Origin
from leaktrace.probes.bpf.layout import EV_MMAP, Event, WindowEvent
from leaktrace.probes.bpf.ledger import OutstandingLedger, page_up
from leaktrace.probes.bpf.origins import GrowthOrigins, origin_of


@dataclass(slots=True)
class PendingMapping:
    start: int
    end: int
    event: WindowEvent
    provisional: int  # the interned id of the origin the ledger holds it under until it is named


class DeferredOrigins:
    """The libc anonymous mmaps held in ``ledger`` under a provisional origin, their windows not yet scanned by
    ``origins``: per process, by birth seq."""

    def __init__(self, ledger: OutstandingLedger, origins: GrowthOrigins) -> None:
        self.ledger = ledger
        self.origins = origins
        self._pending: dict[int, dict[int, PendingMapping]] = {}  # pid -> born seq -> mapping
        self.scanned = 0  # windows scanned when the books were read (or before a move)
        self.skipped = 0  # windows never scanned: the mapping was unmapped whole first

    def mmap_origin(self, e: Event) -> Origin:
        """The origin an anonymous mmap is put in the ledger under: named now (a hooked chunk, whose caller the
        thread's next chunks take at once; no window), or provisional and pending until the books are read."""
        pid = e.tgid
        if (not isinstance(e, WindowEvent) or not e.win_len or e.type != EV_MMAP or e.aux_pid
                or e.seq in self._pending.get(pid, ())):
            return self.origins.growth_origin(e, None)
        o = origin_of(e, "anon")
        self._pending.setdefault(pid, {})[e.seq] = PendingMapping(e.addr, e.addr + page_up(e.len), e,
                                                                  self.ledger.origins.intern(o))
        return o

    def unmapping(self, pid: int, a: int, b: int) -> None:
        """[a, b) is about to be unmapped or mapped over: pending mappings wholly inside it need no name."""
        pending = self._pending.get(pid)
        sp = self.ledger.spaces.get(pid)
        if not pending or sp is None:
            return
        for _s, _e, _oid, born in sp.pieces(a, b):
            m = pending.get(born)
            if m is not None and a <= m.start and m.end <= b:
                del pending[born]
                self.skipped += 1

    def settle(self, pid: int, a: int, b: int) -> None:
        """Name the pending mappings with a piece in [a, b) (before a call that moves it or continues it)."""
        pending = self._pending.get(pid)
        sp = self.ledger.spaces.get(pid)
        if not pending or sp is None:
            return
        for born in {born for _s, _e, _oid, born in sp.pieces(a, b) if born in pending}:
            self._name(pid, pending.pop(born))

    def settle_pid(self, pid: int) -> None:
        for m in self._pending.pop(pid, {}).values():
            self._name(pid, m)

    def settle_all(self) -> None:
        """Name every pending mapping: the books are about to be read."""
        for pid in list(self._pending):
            self.settle_pid(pid)

    def forget(self, pid: int) -> None:
        """The address space is gone (exec) or no longer traced: nothing of it is pending."""
        self.skipped += len(self._pending.pop(pid, ()))

    def _name(self, pid: int, m: PendingMapping) -> None:
        sp = self.ledger.spaces.get(pid)
        pieces = [p for p in sp.pieces(m.start, m.end) if p[2] == m.provisional and p[3] == m.event.seq] if sp else []
        if not pieces:
            self.skipped += 1
            return
        self.scanned += 1
        oid = self.ledger.origins.intern(self.origins.growth_origin(m.event, None))
        if oid != m.provisional:
            for s, e, _k, born in pieces:
                sp.put(s, e, oid, born)
