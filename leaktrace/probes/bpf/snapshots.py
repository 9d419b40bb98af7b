"""The rows the eBPF probe writes into the session (:class:`SnapshotRows`): per-library totals per tick, the
slow-path events, and at stop every outstanding region and one stack per call site; each named by the
library of its call site (:class:`LibraryNames`).

Session tables written (``t`` = seconds since hunt start, as every table):

``bpf_events``       one row per slow-path event: t, type (mmap|munmap|mremap|brk|fork|exec|exit|libmap|mprotect|
                     shmat|shmdt|mlock|munlock|mlockall|munlockall; a shmat's len is the segment size read from
                     /proc, 0 when unknown, its fd the shmid; an mlock's flags mlock2's, an mlockall's MCL_*),
                     pid, tid, addr, len, new_addr, new_len, flags, prot, site, stack_key, result, child
``bpf_stacks``       one row per call site (of the regions outstanding at stop, and of every lock call as it is
                     first seen): stack_key ("PID:0xRETADDR"), pid, site, stack_id, library,
                     symbol (the site frame as text), frames ("\\n"-joined, innermost first: the syscall
                     instruction, the caller at the return address, then the frame-pointer walk)
``ledger_snapshots`` per tick and (pid, library, kind): t, pid, library, kind (anon|file|heap|shm: SysV shmat),
                     outstanding_bytes, regions, resident_bytes (of those, present in RAM: pagemap; null
                     where not read: see probes/bpf/resident.py). Pre-existing mappings are not included.
``ledger_regions``   at stop, every outstanding region: pid, start, end, size, library, kind,
                     stack_key, preexisting, t_born (NaN for pre-existing), path, at_exit (False),
                     resident (bytes present in RAM then, from pagemap; null for pre-existing regions
                     and where the process was gone); and when a target exits, what it held then
                     (at_exit True)
``ledger_exits``     one row per target that exited during the hunt: t, pid, outstanding_bytes, regions
                     (what it held at its exit; its last ``ledger_snapshots`` rows are at the same t),
                     exit_code (the kernel's wait status, -1 when it could not be read), oom (the OOM
                     killer chose it)
``bpf_missed``       one row per target already gone when the probe went live (it died while the program
                     compiled): t (when the probe went live), pid, exit_code (-1 unless still a zombie)
``bpf_counters``     per tick: t, syscalls, fast_maps, settled, slow_events, lost_events, map_full,
                     stacks, failed, shm_unsized (SysV attaches not in the ledger: gone from /proc before
                     they were sized, and not detached since), ring_pending, kernel_regions, header_kind
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from leaktrace import procfs
from leaktrace.probes import HuntContext
from leaktrace.probes.bpf.addrspace import Origin, sum_by_id
from leaktrace.probes.bpf.kernel import KernelRegions, KernelSide
from leaktrace.probes.bpf.layout import EV_FORK, EVENT_NAMES, SITE_EVENTS, Event
from leaktrace.probes.bpf.ledger import OutstandingLedger
from leaktrace.probes.bpf.resident import RegionResidency, resident_by_origin
from leaktrace.probes.bpf.stackscan import StackScanner
from leaktrace.probes.bpf.symbolizer import Symbolizer

_EVENT_DTYPE = np.dtype(Event)  # struct lt_event as numpy reads the ctypes layout
_SITE_TYPES = np.array(sorted(SITE_EVENTS), dtype=np.uint32)


def _i64(x: int) -> int:
    """Parquet columns are int64: store u64 words (a garbage return address, fd -1) as their signed bits."""
    return x - (1 << 64) if x >= (1 << 63) else x


class LibraryNames:
    """The library each call site names, per process image (``ledger``'s exec count), from ``symbols``;
    ``refresh_maps(pid)`` re-reads a process's maps when a site lies outside the copy kept."""

    def __init__(self, ledger: OutstandingLedger, symbols: Symbolizer, refresh_maps: Callable[[int], None]) -> None:
        self.ledger = ledger
        self.symbols = symbols
        self.refresh_maps = refresh_maps
        self._site_lib: dict[tuple[int, int, int, int], str] = {}
        self._stacks: dict[tuple[int, int], int] = {}  # (pid, site) -> stack_id

    def of(self, pid: int, o: Origin) -> str:
        if o.preexisting:
            return os.path.basename(o.path) if o.path else "(pre-existing)"
        key = (pid, self.ledger.execs.get(pid, 0), o.site, o.ip)
        lib = self._site_lib.get(key)
        if lib is None:
            if not (self.symbols.knows(pid, o.site) or self.symbols.knows(pid, o.ip)):
                self.refresh_maps(pid)
            lib = self.symbols.library_of(pid, o.site, o.ip)
            if lib != "?" or not procfs.pid_exists(pid):
                self._site_lib[key] = lib
            if o.stack_id >= 0:
                self._stacks.setdefault((pid, o.site), o.stack_id)
        return lib

    def forget(self, pid: int) -> None:
        """The process exec'd: its sites name the libraries of its new image."""
        self._site_lib = {k: v for k, v in self._site_lib.items() if k[0] != pid}


class SnapshotRows:
    """Writes into ``ctx``'s session the rows of both halves (``kernel``'s regions and ``ledger``'s), named by
    ``libraries``, their stacks resolved with ``symbols`` and ``scanner``'s chains; ``header_kind`` is the
    kernel headers the program was built with."""

    def __init__(self, ctx: HuntContext, kernel: KernelSide, ledger: OutstandingLedger, libraries: LibraryNames,
                 symbols: Symbolizer, scanner: StackScanner, header_kind: str) -> None:
        self.ctx = ctx
        self.kernel = kernel
        self.ledger = ledger
        self.libraries = libraries
        self.symbols = symbols
        self.scanner = scanner
        self.header_kind = header_kind
        self.final = False  # the stop's snapshot: resident pages read without the per-tick bound
        # Resident bytes per (pid, origins list) and origin id as last read while the targets were traced, right
        # after a drain: at the last tick, and again just before the stop untargets them (read_before_stop). The
        # stop's snapshot takes these: it comes after the targets are untargeted, and by then an interval can
        # have moved (a buffer grown by mremap moves on most grows), its old range reading as 0. Only a process
        # with no such read (over the per-tick bound) is read again at the stop, unbounded.
        self._tick_resident: dict[tuple[int, int], dict[int, int] | None] = {}
        self._stop_resident: dict[tuple[int, int], dict[int, int]] = {}  # read_before_stop's
        self._lock_sites: set[tuple[int, int, int]] = set()  # (pid, its execs, site) of lock calls written

    def _t(self, seq_ns: int) -> float:
        return seq_ns / 1e9 - self.ctx.session.meta["t0_monotonic"]

    def event_columns(self, events: list[Event]) -> dict[str, Any]:
        """The ``bpf_events`` rows of ``events``, applied (a shmat's len is then its segment's), column by column:
        a drained batch is thousands of events, and a dict per row cost as much as their accounting."""
        # an event with a stack window (WindowEvent) is the event's record and the window after it
        a = np.frombuffer(b"".join([bytes(e)[:_EVENT_DTYPE.itemsize] for e in events]), dtype=_EVENT_DTYPE)
        types = a["type"]
        names = {v: EVENT_NAMES.get(v, str(v)) for v in np.unique(types).tolist()}
        keys = [""] * len(a)  # "PID:0xSITE" where the event has a call site
        tgids, sites = a["tgid"].tolist(), a["site"].tolist()
        for i in np.flatnonzero(np.isin(types, _SITE_TYPES)).tolist():
            keys[i] = f"{tgids[i]}:{sites[i]:#x}"
        # Parquet columns are int64: u64 words (a garbage return address, fd -1) go as their signed bits.
        words = {f: a[f].astype(np.int64) for f in ("addr", "len", "new_addr", "new_len", "flags", "prot", "fd",
                                                     "site")}
        return {"t": a["seq"] / 1e9 - self.ctx.session.meta["t0_monotonic"], "type": [names[v] for v in types.tolist()],
                "pid": a["tgid"].astype(np.int64), "tid": a["tid"].astype(np.int64), **words, "stack_key": keys,
                "result": a["result"].astype(np.int64),
                "child": np.where(types == EV_FORK, a["aux_pid"], 0).astype(np.int64)}

    # ------------------------------------------------------------------ snapshots
    def snapshot(self, counters: dict[str, int], ring_pending: int, born_by: int | None = None) -> None:
        """Per-library totals now, what of them is resident (every tick within the bound, all of it once
        ``final`` is set: the stop's), and ``counters`` (read from the kernel just before) with the records still queued
        (``ring_pending``); ``born_by``: the seq the ledger's events run to (kernel regions born since are
        not yet in its books; None at the stop, when the targets are untargeted and every event drained)."""
        t = self.ctx.session.now()
        groups: dict[tuple[int, str, str], list[Any]] = defaultdict(lambda: [0, 0, 0])
        sites: dict[tuple[int, int, int, int, str], int] = defaultdict(int)  # (pid, site, ip, stack_id, kind)
        mapped: dict[int, int] = defaultdict(int)  # pid -> every byte the books hold, pre-existing included
        for pid, starts, ends, oids, origins in self.kernel.outstanding_columns(born_by):
            key = (pid, id(origins))
            resident = self._stop_resident.get(key, self._tick_resident.get(key)) if self.final else None
            if resident is None:  # intervals born since the last tick count as not resident at the stop
                resident = resident_by_origin(pid, starts, ends, oids, origins, bounded=not self.final)
            if not self.final:
                self._tick_resident[key] = resident
            for oid, nbytes, n in sum_by_id(oids, starts, ends):
                o = origins[oid]
                if o.kind != "reserve":
                    mapped[pid] += nbytes
                if not o.counted:
                    continue
                g = groups[(pid, self.libraries.of(pid, o), o.kind)]
                g[0] += nbytes
                g[1] += n
                # a figure missing leaves its group's unknown (null): never an undercount
                g[2] = None if resident is None or g[2] is None else g[2] + resident.get(oid, 0)
                if not o.preexisting and o.site:
                    sites[(pid, o.site, o.ip, o.stack_id, o.kind)] += nbytes
        rows = [{"t": t, "pid": pid, "library": lib, "kind": kind, "outstanding_bytes": b, "regions": n,
                 "resident_bytes": r}
                for (pid, lib, kind), (b, n, r) in sorted(groups.items())]
        self.ctx.session.append("ledger_snapshots", rows)
        total = sum(r["outstanding_bytes"] for r in rows)
        self.ctx.session.append("bpf_counters", {"t": t, **counters, "ring_pending": ring_pending,
                                                 "kernel_regions": self.kernel.kernel_count,
                                                 "header_kind": self.header_kind})
        by_library: dict[str, int] = defaultdict(int)
        by_pid: dict[int, int] = defaultdict(int)
        for r in rows:
            by_library[r["library"]] += r["outstanding_bytes"]
            by_pid[r["pid"]] += r["outstanding_bytes"]
        self.ctx.live.bpf = {"outstanding_bytes": total, "events": counters["syscalls"],
                                "lost_events": counters["lost_events"],
                                "outstanding_by_library": dict(by_library), "outstanding_by_pid": dict(by_pid),
                                "mapped_by_pid": dict(mapped),
                                "top_sites": self.scanner.top_sites(sites, self.stack_frames)}

    def read_before_stop(self, born_by: int | None) -> None:
        """Every process's resident bytes by origin, unbounded, while its targets are still traced and just
        drained (to seq ``born_by``): the stop's snapshot takes these (the ledger's intervals then match the
        process's mappings; the last tick can be seconds behind the stop, when other probes take their time
        stopping)."""
        for pid, starts, ends, oids, origins in self.kernel.outstanding_columns(born_by):
            read = resident_by_origin(pid, starts, ends, oids, origins, bounded=False)
            if read is None:
                continue
            key = (pid, id(origins))
            # Read again (the process mapped while it was read): the most each origin read. A read that
            # races a move reads the range the buffer left as not resident, never more than it holds.
            was = self._stop_resident.get(key) or {}
            self._stop_resident[key] = {oid: max(n, was.get(oid, 0)) for oid, n in read.items()}

    def stack_frames(self, pid: int, site: int, ip: int, stack_id: int) -> list[str]:
        # Only code addresses are frames: the frame-pointer walk goes on through code built without frame
        # pointers with whatever words it finds (small integers, stack addresses), and nothing above the
        # first of those is a frame a call reached.
        frames: list[str] = []
        if ip and self.symbols.is_code(pid, ip):
            frames.append(str(self.symbols.frame(pid, ip)))
        chain = self.scanner.chains.get((pid, site))
        if chain is not None:  # a heap's growth: the return addresses its stack window held that a call reached
            chain = self.scanner.verified_chain(pid, chain, ip or None)
            return frames + [str(self.symbols.frame(pid, a)) for a in chain if self.symbols.is_code(pid, a)]
        if site:
            if not self.symbols.is_code(pid, site):
                return frames
            frames.append(str(self.symbols.frame(pid, site)))
        if stack_id >= 0:
            addrs = self.kernel.stack(stack_id)
            for a in addrs[1:]:  # [0] is the syscall instruction itself
                if a == site:
                    continue
                if not self.symbols.is_code(pid, a):
                    break
                frames.append(str(self.symbols.frame(pid, a)))
        return frames

    def lock_site(self, pid: int, o: Origin) -> None:
        """A lock call (mlock, munlock, mlockall …) from ``o``'s call site: its ``bpf_stacks`` row, written when
        the site is first seen, while the process's maps are known (locked pages leave nothing in the ledger
        to write a stack for at the stop)."""
        key = (pid, self.ledger.execs.get(pid, 0), o.site)
        if key in self._lock_sites:
            return
        self._lock_sites.add(key)
        self.ctx.session.append("bpf_stacks", [self._stack_row(pid, o.site, o)])

    def _stack_row(self, pid: int, site: int, o: Origin) -> dict[str, Any]:
        return {"stack_key": f"{pid}:{site:#x}", "pid": pid, "site": _i64(site), "stack_id": o.stack_id,
                "library": self.libraries.of(pid, o), "symbol": str(self.symbols.frame(pid, site)) if site else "",
                "frames": "\n".join(self.stack_frames(pid, site, o.ip, o.stack_id)),
                "method": "stack-scan" if (pid, site) in self.scanner.chains else "frame-pointer"}

    def write_final(self) -> None:
        self._write_regions(((pid, start, end, o, t_born)
                             for pid, start, end, o, t_born, _k in self.kernel.outstanding()), at_exit=False)

    def _write_regions(self, items: Iterable[tuple[int, int, int, Origin, int]], at_exit: bool) -> None:
        """Outstanding regions (pid, start, end, origin, t_born) as ``ledger_regions`` rows, and one
        ``bpf_stacks`` row per call site among them."""
        t0 = self.ctx.session.meta["t0_monotonic"]
        region_rows = []
        stack_origin: dict[tuple[int, int], Origin] = {}
        residency = RegionResidency()  # pages present now; null for a process already gone (an exit)
        for pid, start, end, o, t_born in items:
            if o.kind == "reserve":
                continue
            lib = self.libraries.of(pid, o)
            key = f"{pid}:{o.site:#x}" if not o.preexisting else ""
            if not o.preexisting:
                stack_origin.setdefault((pid, o.site), o)
            region_rows.append({"pid": pid, "start": start, "end": end, "size": end - start, "library": lib,
                                "kind": o.kind, "stack_key": key, "preexisting": o.preexisting,
                                "t_born": math.nan if o.preexisting else t_born / 1e9 - t0,
                                "path": o.path, "at_exit": at_exit,
                                "resident": None if o.preexisting else residency.of(pid, start, end)})
            if len(region_rows) >= 50_000:  # bounded: hundreds of thousands of regions after a long hunt
                self.ctx.session.append("ledger_regions", region_rows)
                self.ctx.session.flush()
                region_rows = []
        residency.close()
        self.ctx.session.append("ledger_regions", region_rows)
        self.ctx.session.append("bpf_stacks", [self._stack_row(pid, site, o) for (pid, site), o in stack_origin.items()])

    def record_exit(self, pid: int, seq: int, kmap: dict[int, KernelRegions], code: int | None = None,
                    oom: bool = False) -> None:
        """A target exits: what it held at that moment (both halves) becomes its last ledger snapshot, its
        regions and its call stacks, before the exit releases them — the leak of a worker the OOM killer
        just took stays in the report."""
        items = self.kernel.held_before(kmap, pid, seq)
        sp = self.ledger.spaces.get(pid)
        if sp is not None:
            items += [(pid, start, end, o, t_born) for start, end, o, t_born in sp.rows()]
        groups: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
        for _pid, start, end, o, _t in items:
            if o.counted:
                g = groups[(self.libraries.of(pid, o), o.kind)]
                g[0] += end - start
                g[1] += 1
        t = self._t(seq)
        # resident_bytes null: the exit took the pages; the last tick's figure is the last known
        self.ctx.session.append("ledger_snapshots", [
            {"t": t, "pid": pid, "library": lib, "kind": kind, "outstanding_bytes": b, "regions": n}
            for (lib, kind), (b, n) in sorted(groups.items())])
        self.ctx.session.append("ledger_exits", {"t": t, "pid": pid, "outstanding_bytes": sum(b for b, _ in groups.values()),
                                                 "regions": sum(n for _, n in groups.values()),
                                                 "exit_code": -1 if code is None else code, "oom": oom})
        self._write_regions(items, at_exit=True)
