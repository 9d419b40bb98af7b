"""The kernel half's region map, seen from user space: the regions the kernel owns (plain mmaps it keeps
and settles by itself), read per tgid into arrays; moving them into the ledger when a slow-path event
touches them ("absorbing" them, in timestamp order, so a region born after an unmap is never blamed on
it); and every outstanding region over both halves, reconciled with what the ledger holds.
"""

from __future__ import annotations

import bisect
import ctypes as ct
from array import array
from collections.abc import Iterator
from typing import Any

import numpy as np

from leaktrace.probes.bpf.addrspace import Origin
from leaktrace.probes.bpf.layout import ANON_FD, Event, Region, RegionKey
from leaktrace.probes.bpf.ledger import OutstandingLedger


def _kind(fd: int, prot: int) -> str:
    """An mmap's origin kind: a file, anonymous memory, or a PROT_NONE anonymous reservation."""
    if (fd & 0xFFFFFFFF) != ANON_FD:
        return "file"
    return "anon" if prot else "reserve"


class KernelRegions:
    """The kernel-owned regions of one process, sorted by start, column-wise in machine-word arrays
    (``oids`` index the probe's interned kernel origins; ``maxend[i]`` = max(ends[:i + 1]), for bisecting
    the first region that can overlap an address even if stale entries overlap)."""

    __slots__ = ("starts", "ends", "seqs", "oids", "maxend")

    def __init__(self, starts: array, ends: array, seqs: array, oids: array, maxend: array) -> None:
        self.starts, self.ends, self.seqs, self.oids, self.maxend = starts, ends, seqs, oids, maxend

    def __len__(self) -> int:
        return len(self.starts)

    def first_from(self, a: int) -> int:
        """Index of the first region whose end may lie above ``a``."""
        return bisect.bisect_right(self.maxend, a)

    def seen(self, start: int, seq: int) -> bool:
        i = bisect.bisect_left(self.starts, start)
        return i < len(self.starts) and self.starts[i] == start and self.seqs[i] == seq


class KernelSide:
    """The kernel-map half of :class:`~leaktrace.probes.bpf.probe.BpfProbe` (its base class): the probe
    owns the state these methods use, declared here."""

    prog: Any  # the loaded BCC program (its maps: regions, counters, stacks)
    _lib: Any  # libbcc (bpf_lookup_and_delete)
    ledger: OutstandingLedger
    _seen_kernel: dict[int, KernelRegions]
    _kernel_count: int
    _korigin_ids: dict[tuple[str, int, int, int], int]
    _korigins: list[Origin]
    _hook_callers: dict[tuple[int, int], Origin]  # (pid, tid) -> its last hooked malloc chunk's origin
    scanner: Any  # StackScanner

    def _scan_kernel(self) -> dict[int, KernelRegions]:
        """Kernel-owned regions per tgid, read straight into arrays (no object kept per region)."""
        cols = [array("Q") for _ in range(4)]  # tgid, start, end, seq
        oids = array("I")
        ids, origins = self._korigin_ids, self._korigins

        def fill(items: Any, cols: list[array], oids: array) -> None:
            tg, st, en, sq = cols
            for k, v in items:
                o = self._hook_caller_of(k.tgid, v)
                if o is not None:
                    key = (o.kind, o.site, o.ip, o.stack_id)  # a hooked malloc chunk sent without a window
                else:
                    key = (_kind(v.fd, v.prot), v.site, v.ip, v.stack_id)
                oid = ids.get(key)
                if oid is None:
                    oid = ids[key] = len(origins)
                    origins.append(Origin(key[0], site=v.site, ip=v.ip, stack_id=v.stack_id))
                tg.append(k.tgid)
                st.append(k.start)
                en.append(k.start + v.len)
                sq.append(v.seq)
                oids.append(oid)

        table = self.prog[b"regions"]
        try:
            fill(table.items_lookup_batch(), cols, oids)
        except Exception:  # noqa: BLE001 - batch ops missing (old kernels): slower walk
            for c in (*cols, oids):
                del c[:]
            fill(table.items(), cols, oids)
        out: dict[int, KernelRegions] = {}
        if not oids:
            return out
        tg, st, en, sq = (np.frombuffer(c, dtype=np.uint64) for c in cols)
        oi = np.frombuffer(oids, dtype=np.uint32)
        order = np.lexsort((st, tg))
        tg, st, en, sq, oi = tg[order], st[order], en[order], sq[order], oi[order]
        del cols, oids, order
        bounds = np.flatnonzero(np.diff(tg)) + 1
        for lo, hi in zip(np.concatenate(([0], bounds)), np.concatenate((bounds, [len(tg)])), strict=True):
            ends = en[lo:hi]
            out[int(tg[lo])] = KernelRegions(array("Q", st[lo:hi].tobytes()), array("Q", ends.tobytes()),
                                             array("Q", sq[lo:hi].tobytes()), array("I", oi[lo:hi].tobytes()),
                                             array("Q", np.maximum.accumulate(ends).tobytes()))
        return out

    def _kernel_regions(self) -> dict[int, list[tuple[int, int, int, Origin]]]:
        """Kernel-owned regions per tgid: sorted (start, end, seq, origin) (for tests and debugging)."""
        out: dict[int, list[tuple[int, int, int, Origin]]] = {}
        for tgid, kr in self._scan_kernel().items():
            out[tgid] = [(a, b, q, self._kernel_origin(k, q))
                         for a, b, q, k in zip(kr.starts, kr.ends, kr.seqs, kr.oids, strict=True)]
        return out

    def _kernel_origin(self, oid: int, seq: int) -> Origin:
        o = self._korigins[oid]
        return Origin(o.kind, t_born=seq, site=o.site, ip=o.ip, stack_id=o.stack_id)

    def _take(self, tgid: int, start: int) -> Region | None:
        """Atomically remove one kernel region (BPF_MAP_LOOKUP_AND_DELETE_ELEM)."""
        key = RegionKey(tgid, 0, start)
        val = Region()
        rc = self._lib.bpf_lookup_and_delete(self.prog[b"regions"].map_fd, ct.byref(key), ct.byref(val))
        return val if rc == 0 else None

    def _put_back(self, tgid: int, start: int, val: Region) -> None:
        self.prog[b"regions"][RegionKey(tgid, 0, start)] = val

    def _hook_caller_of(self, tgid: int, v: Region) -> Origin | None:
        """A malloc chunk mapped through a memory hook without a stack window (the kernel sends one per thread
        per few ms: bpf/leaktrace.bpf.c) is a kernel region with libc's site: the origin its thread's last window
        named (a thread's burst of chunks has one caller). None for any other region."""
        o = self._hook_callers.get((tgid, v.tid)) if self._hook_callers else None
        if o is not None and v.fd == ANON_FD and self.scanner.in_libc(tgid, v.site):
            return o
        return None

    def _kernel_region_origin(self, tgid: int, v: Region) -> Origin:
        """A kernel region's origin (a hooked malloc chunk's: see :meth:`_hook_caller_of`)."""
        o = self._hook_caller_of(tgid, v)
        if o is not None:
            return Origin(o.kind, t_born=v.seq, site=o.site, ip=o.ip, stack_id=o.stack_id, tid=v.tid)
        return self._origin_of(v)

    @staticmethod
    def _origin_of(v: Region | Event, kind: str | None = None) -> Origin:
        if kind is None:
            kind = _kind(v.fd, v.prot)
        return Origin(kind, t_born=v.seq, site=v.site, ip=v.ip, stack_id=v.stack_id, tid=v.tid)

    def _absorb(self, kmap: dict[int, KernelRegions], tgid: int, a: int, b: int,
                seq: int, taken: set[tuple[int, int]]) -> None:
        """Move kernel regions of ``tgid`` overlapping [a, b) and born before ``seq`` into the ledger."""
        kr = kmap.get(tgid)
        if kr is None:
            return
        starts, ends, seqs = kr.starts, kr.ends, kr.seqs
        for i in range(kr.first_from(a), len(starts)):
            start, end, rseq = starts[i], ends[i], seqs[i]
            if start >= b:
                break
            if end <= a or rseq >= seq or (tgid, start) in taken:
                continue
            val = self._take(tgid, start)
            if val is None:  # settled in the kernel meanwhile: nothing to absorb
                taken.add((tgid, start))
                continue
            if val.seq >= seq:  # a newer region at the same address: not ours to touch
                self._put_back(tgid, start, val)
                continue
            taken.add((tgid, start))
            self.ledger.mmap(tgid, start, val.len, self._kernel_region_origin(tgid, val))

    def _drop_kernel(self, kmap: dict[int, KernelRegions], tgid: int, seq: int,
                     taken: set[tuple[int, int]]) -> None:
        kr = kmap.get(tgid)
        if kr is None:
            return
        for start, rseq in zip(kr.starts, kr.seqs, strict=True):
            if rseq < seq and (tgid, start) not in taken:
                val = self._take(tgid, start)
                taken.add((tgid, start))
                if val is not None and val.seq >= seq:
                    self._put_back(tgid, start, val)

    def _outstanding(self) -> Iterator[tuple[int, int, int, Origin, int, bool]]:
        """Every outstanding region, both halves: (pid, start, end, origin, t_born, kernel_owned). The origin
        is the interned one of the call site (its own t_born is 0): the region's birth is ``t_born``."""
        kmap = self._scan_kernel()
        prev = self._seen_kernel
        for tgid, kr in kmap.items():
            sp = self.ledger.spaces.get(tgid)
            if sp is None or not len(sp):
                continue
            was = prev.get(tgid)
            for start, end, seq in zip(kr.starts, kr.ends, kr.seqs, strict=True):
                if was is None or not was.seen(start, seq):
                    # A region the kernel saw born after whatever the ledger holds there (a seed taken
                    # after attach, or a stale piece): the kernel's is the truth.
                    sp.remove(start, end)
        # Keep only what the next snapshot compares with.
        self._seen_kernel = {t: KernelRegions(kr.starts, array("Q"), kr.seqs, array("I"), array("Q"))
                             for t, kr in kmap.items()}
        self._kernel_count = sum(len(kr) for kr in kmap.values())
        return self._outstanding_rows(kmap)

    def _outstanding_rows(self, kmap: dict[int, KernelRegions]) -> Iterator[tuple[int, int, int, Origin, int, bool]]:
        korigins = self._korigins
        for tgid, kr in kmap.items():
            for start, end, seq, oid in zip(kr.starts, kr.ends, kr.seqs, kr.oids, strict=True):
                yield tgid, start, end, korigins[oid], seq, True
        for pid, sp in list(self.ledger.spaces.items()):
            for start, end, o, t_born in sp.rows():
                yield pid, start, end, o, t_born, False
