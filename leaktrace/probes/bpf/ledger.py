"""The user-space half of the BPF ledger: outstanding mappings per address space.

:class:`OutstandingLedger` keeps, per process, a sorted set of disjoint intervals, each pointing at
the :class:`Origin` that created it (call site, stack, time, pre-existing or not). It applies what
the kernel could not settle by one key lookup: partial unmaps (head, tail, middle), unmaps spanning
regions, mremap grow/shrink/move, MAP_FIXED overlays, brk moves, exec and exit. It is pure Python
over integers, so it is unit-tested without a kernel (tests/test_ledger.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from leaktrace.probes.bpf.addrspace import AddressSpace, Interval, Origin, OriginTable

PAGE = 4096
RESERVE = Origin("reserve")  # address space reserved PROT_NONE: no memory until committed
# How /proc/PID/maps names a shared anonymous mapping (MAP_SHARED | MAP_ANONYMOUS).
SHARED_ANON = "/dev/zero (deleted)"
SYSV_PREFIX = "/SYSV"  # how /proc/PID/maps names a SysV segment's mapping ("/SYSV%08x (deleted)", the key)


def page_up(n: int) -> int:
    return (n + PAGE - 1) & ~(PAGE - 1)


@dataclass
class LedgerTotals:
    outstanding_bytes: int = 0
    regions: int = 0


class OutstandingLedger:
    """Outstanding mappings of every traced process (pid = tgid: one address space per process)."""

    def __init__(self) -> None:
        self.spaces: dict[int, AddressSpace] = {}
        self.origins = OriginTable()  # shared by every address space: a call site is one entry
        self.exited: dict[int, int] = {}  # pid -> seq of exit
        self.execs: dict[int, int] = {}  # pid -> number of execs seen (symbol caches key on it)
        # pid -> {attach address: page-rounded size} of the SysV segments attached since tracing began:
        # shmdt names only the address, and detaches exactly the segment attached there
        self.shm_segments: dict[int, dict[int, int]] = {}

    def space(self, pid: int) -> AddressSpace:
        sp = self.spaces.get(pid)
        if sp is None:
            sp = self.spaces[pid] = AddressSpace(self.origins)
        return sp

    # -- seeding
    def seed(self, pid: int, mappings: Iterable[tuple[int, int, str]], heap_start: int | None = None,
             t: int = 0, reserved: Iterable[tuple[int, int]] = ()) -> None:
        """Mappings that existed before tracing began: (start, end, path) from /proc/PID/maps.
        They are accounted, marked pre-existing, and never blamed. ``reserved``: the anonymous PROT_NONE
        ones among them (heap reservations, guard pages), kept as reservations that an mprotect commits."""
        sp = self.space(pid)
        for start, end, path in mappings:
            sp.insert(start, end, Origin("preexisting", t_born=t, path=path))
            if path == "[heap]":
                sp.heap_start = heap_start if heap_start is not None else start
                sp.heap_end = end
        for start, end in reserved:
            sp.insert(start, end, RESERVE)
        if sp.heap_start is None and heap_start:
            sp.heap_start = sp.heap_end = heap_start

    # -- syscalls
    def mmap(self, pid: int, start: int, length: int, origin: Origin) -> None:
        self._forget_segments(pid, start, start + page_up(length))
        self.space(pid).insert(start, start + page_up(length), origin)

    def munmap(self, pid: int, start: int, length: int) -> None:
        # cut, not remove: what it unmapped is not wanted here, and remove builds an Interval and an Origin for
        # each piece (a churner's every munmap)
        self._forget_segments(pid, start, start + page_up(length))
        self.space(pid).cut(start, start + page_up(length))

    def shmat(self, pid: int, start: int, length: int, origin: Origin) -> None:
        """A SysV segment of ``length`` bytes attached at ``start``: mapped like an mmap (SHM_REMAP replaces
        what was there), and remembered by its address for the shmdt that will name only that address.
        IPC_RMID changes nothing here: the mapping stays until detached (or unmapped, or the process ends)."""
        size = page_up(length)
        self._forget_segments(pid, start, start + size)
        self.space(pid).insert(start, start + size, origin)
        self.shm_segments.setdefault(pid, {})[start] = size

    def shmdt(self, pid: int, addr: int) -> list[Interval]:
        """Detach the segment attached at ``addr``. The kernel unmaps that segment's mappings within
        [addr, addr + its size) and nothing else, so only shm pieces there go (a mapping placed inside the
        range since, after a munmap of part of the segment, stays). A segment attached before tracing is
        known by its pre-existing /SYSV mapping starting at ``addr``. The kernel detaches only where a segment
        was attached (a piece whose offset into its segment is its distance from ``addr``): a segment attached
        since, at another address, stays attached even where a piece of it starts at ``addr`` (its head
        unmapped). Returns the removed pieces."""
        sp = self.spaces.get(pid)
        if sp is None:
            return []
        kinds = self.origins.origins
        size = self.shm_segments.get(pid, {}).pop(addr, None)
        if size is None:
            first = sp.pieces(addr, addr + 1)
            if not first or first[0][0] != addr or not _is_preexisting_sysv(kinds[first[0][2]]):
                return []  # nothing attached there: the kernel's shmdt fails too
            size = sp.interval_end(addr) - addr  # seeded from one maps line: the whole VMA
        removed: list[Interval] = []
        for s, e, oid, _t in sp.pieces(addr, addr + size):
            if _is_sysv(kinds[oid]):
                removed += sp.remove(s, e)
        return removed

    def _move_segment(self, pid: int, old: int, old_len: int, new: int, new_len: int, dontunmap: bool) -> None:
        """A SysV segment moved whole by mremap is detached at its new address (shmdt finds it there)."""
        segs = self.shm_segments.get(pid)
        if not segs:
            return
        size = segs.get(old)
        if size is None or dontunmap or old_len < size:  # not a whole segment moving
            self._forget_segments(pid, new, new + new_len)
            return
        del segs[old]
        self._forget_segments(pid, new, new + new_len)
        segs[new] = size

    def _forget_segments(self, pid: int, a: int, b: int) -> None:
        """Attachments wholly inside [a, b) are gone (unmapped, or mapped over): a later shmdt there fails."""
        segs = self.shm_segments.get(pid)
        if segs:
            for start in [s for s, n in segs.items() if a <= s and s + n <= b]:
                del segs[start]

    def mremap(self, pid: int, old: int, old_len: int, new: int, new_len: int, dontunmap: bool = False,
               origin: Origin | None = None) -> None:
        """Move/resize [old, old+old_len) to [new, new+new_len). Pieces keep their origin; growth is
        attributed to the origin of the region's last piece (the mapping that grew), else ``origin`` —
        also when that piece existed before attach (its growth since is not pre-existing)."""
        sp = self.space(pid)
        old_len, new_len = page_up(old_len), page_up(new_len)
        self._move_segment(pid, old, old_len, new, new_len, dontunmap)
        if dontunmap:
            pieces = sp.pieces(old, old + old_len)
        else:
            pieces = sp.cut(old, old + old_len)
        sp.cut(new, new + new_len)
        delta = new - old
        for s, e, k, t in pieces:
            a, b = s + delta, min(e + delta, new + new_len)
            if b > a:
                sp.put(a, b, k, t)
        if new_len > old_len:
            last = self.origins.origins[pieces[-1][2]] if pieces else None
            if last is not None and not (last.preexisting and origin is not None):
                sp.put(new + old_len, new + new_len, pieces[-1][2], pieces[-1][3])
            elif origin is not None:
                # A region mapped before attach grew after it: the growth is new memory, the caller's.
                sp.insert(new + old_len, new + new_len, origin)

    def brk(self, pid: int, new_brk: int, origin: Origin) -> None:
        sp = self.space(pid)
        new_end = page_up(new_brk)
        if sp.heap_start is None:
            # First sight of the break with no [heap] known: the heap starts (empty) here.
            sp.heap_start = sp.heap_end = new_end
            return
        cur = sp.heap_end if sp.heap_end is not None else sp.heap_start
        new_end = max(new_end, sp.heap_start)
        if new_end > cur:
            sp.insert(cur, new_end, origin)
        elif new_end < cur:
            sp.remove(new_end, cur)
        sp.heap_end = new_end

    def mprotect(self, pid: int, start: int, length: int, prot: int, origin: Origin) -> int:
        """Protection of [start, start+length) changed. Made accessible, the reserved (PROT_NONE
        anonymous) pieces there become ``origin``'s: a heap committing its reservation (glibc arenas grow
        this way). Made PROT_NONE, counted anonymous or heap pieces become reservations. Other pieces keep
        their origin. Returns the bytes committed (negative: decommitted)."""
        sp = self.space(pid)
        a, b = start, start + page_up(length)
        kinds = self.origins.origins
        moved = 0
        for s, e, oid, t in sp.pieces(a, b):
            kind = kinds[oid].kind
            if prot and kind == "reserve":
                sp.grow(s, e, origin)
                moved += e - s
            elif not prot and kind in ("anon", "heap"):
                sp.put(s, e, self.origins.intern(RESERVE), t)
                moved -= e - s
        return moved

    def relabel(self, pid: int, start: int, end: int, origin: Origin) -> None:
        """The pre-existing pieces held in [start, end) that can be what is left of ``origin``'s mapping take its
        origin: anonymous ones for an anonymous mapping, file-backed ones for a file's (a piece of another kind
        was mapped there since). Reservations stay so, and a piece that is not one was committed since when
        ``origin`` is a reservation. The extent held does not change."""
        sp = self.space(pid)
        kinds = self.origins.origins
        anon = origin.kind != "file"
        if origin.kind == "reserve":
            origin = Origin("anon", origin.t_born, origin.site, origin.ip, origin.stack_id, origin.tid)
        oid = self.origins.intern(origin)
        for s, e, k, _t in sp.pieces(start, end):
            o = kinds[k]
            if o.preexisting and (o.path in ("", SHARED_ANON)) == anon and not o.path.startswith("["):
                sp.put(s, e, oid, origin.t_born)

    def origin_before(self, pid: int, addr: int) -> Origin | None:
        """The origin of counted memory ending right at ``addr`` (what a heap growing from there continues)."""
        sp = self.spaces.get(pid)
        pieces = sp.pieces(addr - 1, addr) if sp is not None and addr else []
        if not pieces:
            return None
        o = self.origins.origins[pieces[0][2]]
        return o if o.kind in ("heap", "anon") else None

    def exec(self, pid: int) -> None:
        """The address space was replaced: everything before is gone."""
        self.space(pid).clear()
        self.shm_segments.pop(pid, None)
        self.execs[pid] = self.execs.get(pid, 0) + 1

    def exit(self, pid: int, seq: int = 0) -> None:
        """The process is gone: all its mappings are released."""
        sp = self.spaces.pop(pid, None)
        if sp is not None:
            sp.clear()
        self.shm_segments.pop(pid, None)
        self.exited[pid] = seq

    def release(self, pid: int) -> None:
        """The process is no longer traced (it lives on): the books forget it, with no exit recorded."""
        sp = self.spaces.pop(pid, None)
        if sp is not None:
            sp.clear()
        self.shm_segments.pop(pid, None)

    # -- queries
    def intervals(self, pid: int) -> list[Interval]:
        sp = self.spaces.get(pid)
        return list(sp) if sp else []

    def totals(self, pid: int | None = None, include_preexisting: bool = False) -> LedgerTotals:
        tot = LedgerTotals()
        for p, sp in self.spaces.items():
            if pid is not None and p != pid:
                continue
            for start, end, o, _t in sp.rows():
                if o.kind == "reserve" or (o.preexisting and not include_preexisting):
                    continue
                tot.outstanding_bytes += end - start
                tot.regions += 1
        return tot


def _is_preexisting_sysv(o: Origin) -> bool:
    return o.preexisting and o.path.startswith(SYSV_PREFIX)


def _is_sysv(o: Origin) -> bool:
    """A piece of a SysV segment: attached since tracing began, or seeded from a /SYSV mapping."""
    return o.kind == "shm" or (o.preexisting and o.path.startswith(SYSV_PREFIX))
