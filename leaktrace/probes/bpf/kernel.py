"""The kernel half, seen from user space (:class:`KernelSide`): the loaded BPF program, its ring and the
maps user space writes (targets, runtime code, counters, stacks); the regions the kernel owns (plain mmaps
it keeps and settles by itself), read per tgid into arrays; moving them into the ledger when a slow-path
event touches them ("absorbing" them, in timestamp order, so a region born after an unmap is never blamed
on it); and every outstanding region over both halves, reconciled with what the ledger holds.
"""

from __future__ import annotations

import bisect
import ctypes as ct
import time
from array import array
from collections.abc import Iterator
from typing import Any

import numpy as np

from leaktrace.errors import BpfUnavailable, LeaktraceError
from leaktrace.probes.bpf.addrspace import Origin, sum_by_origin
from leaktrace.probes.bpf.keptwindows import KeptWindows
from leaktrace.probes.bpf.layout import COUNTERS, Range, Region, RegionKey, Target
from leaktrace.probes.bpf.ledger import OutstandingLedger
from leaktrace.probes.bpf.mapread import BatchReader
from leaktrace.probes.bpf.origins import GrowthOrigins, mmap_kind, origin_of


class KernelRegions:
    """The kernel-owned regions of one process, sorted by start, column-wise in machine-word arrays
    (``oids`` index the kernel side's interned origins; ``maxend[i]`` = max(ends[:i + 1]), for bisecting
    the first region that can overlap an address even if stale entries overlap; ``borns``: the seq of the
    mmap that made each, which an exact mremap keeps while it re-stamps ``seqs``)."""

    __slots__ = ("starts", "ends", "seqs", "oids", "maxend", "borns")

    def __init__(self, starts: array, ends: array, seqs: array, oids: array, maxend: array,
                 borns: array | None = None) -> None:
        self.starts, self.ends, self.seqs, self.oids, self.maxend = starts, ends, seqs, oids, maxend
        self.borns = seqs if borns is None else borns

    def __len__(self) -> int:
        return len(self.starts)

    def first_from(self, a: int) -> int:
        """Index of the first region whose end may lie above ``a``."""
        return bisect.bisect_right(self.maxend, a)


def _kept(col: array, keep: np.ndarray) -> array:
    """The entries of a machine-word column where ``keep`` is true, as a column of the same type."""
    out = array(col.typecode)
    out.frombytes(np.frombuffer(col, dtype=np.dtype(col.typecode))[keep].tobytes())
    return out


def _unseen(was: KernelRegions | None, kr: KernelRegions) -> list[int]:
    """Indexes of the regions of ``kr`` not in ``was`` with the same start and birth (both sorted by start)."""
    if was is None or not len(was):
        return list(range(len(kr)))
    ws, wq = np.frombuffer(was.starts, dtype=np.uint64), np.frombuffer(was.seqs, dtype=np.uint64)
    st, sq = np.frombuffer(kr.starts, dtype=np.uint64), np.frombuffer(kr.seqs, dtype=np.uint64)
    i = np.minimum(np.searchsorted(ws, st), len(ws) - 1)
    return np.flatnonzero((ws[i] != st) | (wq[i] != sq)).tolist()


class KernelSide:
    """The loaded program (``prog``: None before :meth:`attach` and after :meth:`close`), the maps user space
    reads and writes, and the kernel-owned regions: read from the ``regions`` map, interned per call site,
    and absorbed into ``ledger``. A hooked malloc chunk's region takes the caller ``origins`` found for its
    thread; one of malloc's own chunks, the caller its kept window names (``windows``)."""

    def __init__(self, ledger: OutstandingLedger, origins: GrowthOrigins) -> None:
        self.ledger = ledger
        self.origins = origins
        self.windows = KeptWindows(origins)
        self.prog: Any = None  # the loaded BCC program (its maps: regions, counters, stacks ...)
        self._regions_reader: BatchReader | None = None  # the regions map's batch reads, buffers kept
        self.pidns_ino: int | None = None  # set when /proc's pids are not the kernel's (bpf/leaktrace.bpf.c)
        self._lib: Any = None  # libbcc (bpf_lookup_and_delete)
        # Kernel regions at the last snapshot, per tgid (only starts and seqs are kept: 16 bytes a region).
        self._seen_kernel: dict[int, KernelRegions] = {}
        self.kernel_count = 0  # regions the kernel held at the last outstanding()
        # Kernel regions' origins, interned per call site (kind, site, ip, stack_id): t_born is the seq.
        self._korigin_ids: dict[tuple[str, int, int, int], int] = {}
        self._korigins: list[Origin] = []

    # ------------------------------------------------------------------ the program, its ring and maps
    def attach(self, prog: Any, lib: Any, on_record: Any, pidns_ino: int | None) -> None:
        """Hold the loaded program and open its ring (``on_record`` is called per record consumed)."""
        self.pidns_ino = pidns_ino
        self.prog = prog
        self._lib = lib
        self.windows.attach(prog, lib)
        try:
            self.prog[b"events"].open_ring_buffer(on_record)
        except Exception as e:
            self.prog.cleanup()
            raise BpfUnavailable(f"cannot open the BPF ring buffer: {e}") from e

    @property
    def lib(self) -> Any:
        """libbcc (its bpf_* syscall wrappers)."""
        return self._lib

    def close(self) -> None:
        self.windows.close()
        self.prog.cleanup()
        self.prog = None
        self._regions_reader = None

    def consume(self) -> None:
        """Hand what the ring holds to ``on_record`` (see :meth:`attach`)."""
        self.prog.ring_buffer_consume()

    def add_target(self, pid: int) -> None:
        if self.pidns_ino:
            # The kernel learns the host pid at the process's next traced call (bpf/leaktrace.bpf.c).
            self.prog[b"ns_targets"][ct.c_uint32(pid)] = ct.c_uint8(1)
        else:
            self.prog[b"targets"][ct.c_uint32(pid)] = Target()

    def untarget(self, pid: int) -> None:
        """``pid`` is no longer traced once its calls already past their entry have finished (host pids)."""
        try:
            del self.prog[b"targets"][ct.c_uint32(pid)]
        except KeyError:
            return
        time.sleep(0.02)  # as untarget_all: calls past their entry finish, their exit records them

    def untarget_all(self) -> None:
        """No process is traced any more once the calls already past their entry have finished."""
        if self.pidns_ino:  # first: a namespace task re-adds its host pid from it (bpf/leaktrace.bpf.c)
            self.prog[b"ns_targets"].clear()
        self.prog[b"targets"].clear()
        time.sleep(0.02)  # calls that passed their entry before the clear finish (their exit records them)
        self.prog[b"targets"].clear()

    def set_runtime(self, pid: int, code: tuple[int, int] | None, allocator: tuple[int, int] | None = None) -> None:
        """libc's code in ``pid`` (and an allocator's in malloc's place): anonymous mmaps called from there take
        the slow path with a stack window (bpf/leaktrace.bpf.c). Nothing without a loaded program; a range
        that is None is left as it is."""
        if self.prog is None:
            return
        if code is not None:
            self.prog[b"runtime"][ct.c_uint32(pid)] = Range(*code)
        if allocator is not None:
            self.prog[b"allocator_code"][ct.c_uint32(pid)] = Range(*allocator)

    def forget_runtime(self, pid: int) -> None:
        for name in (b"runtime", b"allocator_code"):
            try:
                del self.prog[name][ct.c_uint32(pid)]
            except (KeyError, TypeError):
                pass

    def oom_marked(self, pid: int, code: int | None) -> bool:
        """A SIGKILLed process the OOM killer marked just after its exit event was sent (the kernel sends the
        SIGKILL before oom:mark_victim fires): looked up once more now. Host pids only (the map's keys)."""
        if code != 9 or self.pidns_ino or self.prog is None:
            return False
        try:
            return ct.c_uint32(pid) in self.prog[b"oom_victims"]
        except Exception:  # a missing map (older program) means "not known"
            return False

    def read_counters(self, counters: dict[str, int]) -> None:
        """The kernel's counters (summed over CPUs) into ``counters``."""
        table = self.prog[b"counters"]
        for i, name in enumerate(COUNTERS):
            counters[name] = int(sum(table[ct.c_int(i)]))

    def stack(self, stack_id: int) -> list[int]:
        """The addresses the kernel recorded for ``stack_id`` (innermost first); none once evicted, or
        without a loaded program."""
        if self.prog is None:
            return []
        try:
            return list(self.prog[b"stacks"].walk(stack_id))
        except (KeyError, LeaktraceError, Exception):  # evicted stack id
            return []

    # ------------------------------------------------------------------ kernel-owned regions
    def scan(self) -> dict[int, KernelRegions]:
        """Kernel-owned regions per tgid, read straight into arrays (no object kept per region)."""
        cols = [array("Q") for _ in range(5)]  # tgid, start, end, seq, born
        oids = array("I")
        ids, origins = self._korigin_ids, self._korigins

        def fill(items: Any, cols: list[array], oids: array) -> None:
            tg, st, en, sq, bn = cols
            for k, v in items:
                o = self.windows.named(k.tgid, v) if v.window else self.origins.hook_caller_of(k.tgid, v)
                if o is not None:
                    key = (o.kind, o.site, o.ip, o.stack_id)  # malloc's chunk: named by its window (or its thread's)
                else:
                    key = (mmap_kind(v.fd, v.prot), v.site, v.ip, v.stack_id)
                oid = ids.get(key)
                if oid is None:
                    oid = ids[key] = len(origins)
                    origins.append(Origin(key[0], site=key[1], ip=key[2], stack_id=key[3]))
                tg.append(k.tgid)
                st.append(k.start)
                en.append(k.start + v.len)
                sq.append(v.seq)
                bn.append(v.born)
                oids.append(oid)

        table = self.prog[b"regions"]
        if self._regions_reader is None or self._regions_reader.table is not table:
            self._regions_reader = BatchReader(table, self._lib)
        try:
            fill(self._regions_reader.items(), cols, oids)
        except Exception:  # batch ops missing (old kernels): slower walk
            for c in (*cols, oids):
                del c[:]
            fill(table.items(), cols, oids)
        self.windows.end_scan()
        out: dict[int, KernelRegions] = {}
        if not oids:
            return out
        tg, st, en, sq, bn = (np.frombuffer(c, dtype=np.uint64) for c in cols)
        oi = np.frombuffer(oids, dtype=np.uint32)
        order = np.lexsort((st, tg))
        tg, st, en, sq, bn, oi = tg[order], st[order], en[order], sq[order], bn[order], oi[order]
        del cols, oids, order
        bounds = np.flatnonzero(np.diff(tg)) + 1
        for lo, hi in zip(np.concatenate(([0], bounds)), np.concatenate((bounds, [len(tg)])), strict=True):
            ends = en[lo:hi]
            out[int(tg[lo])] = KernelRegions(array("Q", st[lo:hi].tobytes()), array("Q", ends.tobytes()),
                                             array("Q", sq[lo:hi].tobytes()), array("I", oi[lo:hi].tobytes()),
                                             array("Q", np.maximum.accumulate(ends).tobytes()),
                                             array("Q", bn[lo:hi].tobytes()))
        return out

    def regions(self) -> dict[int, list[tuple[int, int, int, Origin]]]:
        """Kernel-owned regions per tgid: sorted (start, end, seq, origin) (for tests and debugging)."""
        out: dict[int, list[tuple[int, int, int, Origin]]] = {}
        for tgid, kr in self.scan().items():
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

    def _kernel_region_origin(self, tgid: int, v: Region) -> Origin:
        """A kernel region's origin, the region leaving the kernel (malloc's chunk: its window's; a hooked one's:
        see :meth:`GrowthOrigins.hook_caller_of`)."""
        o = self.windows.take(tgid, v) if v.window else self.origins.hook_caller_of(tgid, v)
        if o is not None:
            return Origin(o.kind, t_born=v.seq, site=o.site, ip=o.ip, stack_id=o.stack_id, tid=v.tid)
        return origin_of(v)

    def absorb(self, kmap: dict[int, KernelRegions], tgid: int, a: int, b: int,
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

    def drop(self, kmap: dict[int, KernelRegions], tgid: int, seq: int, taken: set[tuple[int, int]]) -> None:
        """Remove from the kernel map the regions of ``tgid`` born before ``seq`` (its exec or exit)."""
        kr = kmap.get(tgid)
        if kr is None:
            return
        for start, rseq in zip(kr.starts, kr.seqs, strict=True):
            if rseq < seq and (tgid, start) not in taken:
                val = self._take(tgid, start)
                taken.add((tgid, start))
                if val is not None and val.seq >= seq:
                    self._put_back(tgid, start, val)
                elif val is not None and val.window:
                    self.windows.discard(tgid, val.born)

    def take_born_before(self, tgid: int, seq: int) -> list[tuple[int, Region, Origin]]:
        """Remove the kernel-owned regions of ``tgid`` born before ``seq`` (a fresh read of the map): each as
        (start, region, origin)."""
        kr = self.scan().get(tgid)
        if kr is None:
            return []
        out = []
        for start, rseq in zip(kr.starts, kr.seqs, strict=True):
            if rseq < seq:
                val = self._take(tgid, start)
                if val is not None and val.seq >= seq:
                    self._put_back(tgid, start, val)
                elif val is not None:
                    out.append((start, val, self._kernel_region_origin(tgid, val)))
        return out

    def held_before(self, kmap: dict[int, KernelRegions], pid: int,
                    seq: int) -> list[tuple[int, int, int, Origin, int]]:
        """The kernel regions of ``pid`` in ``kmap`` born before ``seq``: (pid, start, end, origin, t_born)."""
        kr = kmap.get(pid)
        if kr is None:
            return []
        return [(pid, start, end, self._korigins[oid], rseq)
                for start, end, rseq, oid in zip(kr.starts, kr.ends, kr.seqs, kr.oids, strict=True) if rseq < seq]

    def outstanding(self) -> Iterator[tuple[int, int, int, Origin, int, bool]]:
        """Every outstanding region, both halves: (pid, start, end, origin, t_born, kernel_owned). The origin
        is the interned one of the call site (its own t_born is 0): the region's birth is ``t_born``."""
        return self._outstanding_rows(self._reconciled_scan())

    def outstanding_totals(self) -> Iterator[tuple[int, Origin, int, int]]:
        """(pid, interned origin, bytes, regions) per call site outstanding, both halves: a snapshot's sums,
        reconciled as :meth:`outstanding` is."""
        for pid, starts, ends, oids, origins in self.outstanding_columns():
            for o, nbytes, n in sum_by_origin(oids, starts, ends, origins):
                yield pid, o, nbytes, n

    def outstanding_columns(self, born_by: int | None = None) -> Iterator[tuple[int, array, array, array, list[Origin]]]:
        """(pid, starts, ends, origin ids, origins) per half of each process's outstanding intervals,
        reconciled as :meth:`outstanding` is: machine-word columns, no Python step per interval.
        ``born_by`` (a seq: when the ledger last took the ring's events): kernel regions first mapped after it
        are left out. The kernel's regions are read live while the ledger has applied the ring's events up to
        then only: a region mapped since would count while the unmap of the one it replaced, not settled
        in the kernel, still waits in the ring (a churner mapping 5,000 regions a second read up to 8x
        what it maps). A region's first mapping, not its last exact mremap: one grown in place since the
        drain was in the books before it."""
        kmap = self._reconciled_scan()
        korigins = self._korigins
        for tgid, kr in kmap.items():
            if born_by is not None and len(kr):
                keep = np.frombuffer(kr.borns, dtype=np.uint64) <= born_by
                if not keep.all():
                    yield tgid, _kept(kr.starts, keep), _kept(kr.ends, keep), _kept(kr.oids, keep), korigins
                    continue
            yield tgid, kr.starts, kr.ends, kr.oids, korigins
        for pid, sp in list(self.ledger.spaces.items()):
            yield (pid, *sp.columns())

    def _reconciled_scan(self) -> dict[int, KernelRegions]:
        """The kernel regions now, with the ledger's pieces under regions the kernel saw born since the last
        look removed (a seed taken after attach, or a stale piece: the kernel's is the truth)."""
        kmap = self.scan()
        prev = self._seen_kernel
        for tgid, kr in kmap.items():
            sp = self.ledger.spaces.get(tgid)
            if sp is None or not len(sp):
                continue
            for j in _unseen(prev.get(tgid), kr):
                sp.remove(kr.starts[j], kr.ends[j])
        # Keep only what the next snapshot compares with.
        self._seen_kernel = {t: KernelRegions(kr.starts, array("Q"), kr.seqs, array("I"), array("Q"))
                             for t, kr in kmap.items()}
        self.kernel_count = sum(len(kr) for kr in kmap.values())
        return kmap

    def _outstanding_rows(self, kmap: dict[int, KernelRegions]) -> Iterator[tuple[int, int, int, Origin, int, bool]]:
        korigins = self._korigins
        for tgid, kr in kmap.items():
            for start, end, seq, oid in zip(kr.starts, kr.ends, kr.seqs, kr.oids, strict=True):
                yield tgid, start, end, korigins[oid], seq, True
        for pid, sp in list(self.ledger.spaces.items()):
            for start, end, o, t_born in sp.rows():
                yield pid, start, end, o, t_born, False
