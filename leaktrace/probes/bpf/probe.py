"""The eBPF probe: every mmap/munmap/mremap/brk of the target process tree, an exact outstanding ledger.

Kernel half: bpf/leaktrace.bpf.c (see its header comment). It settles plain mmap + exact munmap/mremap
pairs in an address-keyed map and hands the rest to user space as slow-path events. This probe drains
those events every POLL_INTERVAL_S, applies them in order to the interval ledger (ledger.py), moving
kernel-owned regions into the ledger when a slow event touches them ("absorbing" them, in timestamp order
so a region born after an unmap is never blamed on it), and once per tick writes per-library totals.

The probe composes objects it owns, each given what it uses at construction: the ledger and the
symbolizer; :class:`~.origins.GrowthOrigins` (heap growth's callers, from stack windows), named when the books
are read for the C runtime's anonymous mmaps (:class:`~.deferred.DeferredOrigins`: most are unmapped first);
:class:`~.kernel.KernelSide` (the loaded program, its ring and maps, the kernel-owned regions, malloc's chunks
among them with their windows: :class:`~.keptwindows.KeptWindows`);
:class:`~.hookpaths.HookPaths` (memory hooks' paths, learned and written to the kernel's maps);
:class:`~.seeds.AddressSpaceSeeds` (each process's maps read as the ledger's seed, and re-read for names);
:class:`~.snapshots.LibraryNames` and, from ``start``, :class:`~.snapshots.SnapshotRows` (the session
rows, whose tables :mod:`.snapshots` lists). The probe keeps the lifecycle, the lock, the event queue
and the order events are applied in.
"""

from __future__ import annotations

import ctypes as ct
import threading
import time
from typing import Any

from leaktrace.probes import HuntContext, HuntOptions, ProbeBase
from leaktrace.probes.bpf import loader
from leaktrace.probes.bpf.deferred import DeferredOrigins
from leaktrace.probes.bpf.faults import DEFAULT_SAMPLE, FaultSites
from leaktrace.probes.bpf.hookpaths import HookPaths
from leaktrace.probes.bpf.kernel import KernelSide
from leaktrace.probes.bpf.layout import (
    CALL_PATH_EVENTS,
    COUNTERS,
    EV_BRK,
    EV_EXEC,
    EV_EXIT,
    EV_FAULTWIN,
    EV_FORK,
    EV_HOOKWIN,
    EV_LIBMAP,
    EV_MMAP,
    EV_MPROTECT,
    EV_MREMAP,
    EV_MUNMAP,
    EV_SHMAT,
    EV_SHMDT,
    EXIT_NO_CODE,
    EXIT_OOM,
    MREMAP_DONTUNMAP,
    Event,
    WindowEvent,
)
from leaktrace.probes.bpf.ledger import OutstandingLedger, page_up
from leaktrace.probes.bpf.missed import missed_at_attach
from leaktrace.probes.bpf.origins import GrowthOrigins, mmap_kind, origin_of
from leaktrace.probes.bpf.polllock import PollLock
from leaktrace.probes.bpf.procread import _is_process
from leaktrace.probes.bpf.seeds import AddressSpaceSeeds
from leaktrace.probes.bpf.snapshots import LibraryNames, SnapshotRows
from leaktrace.probes.bpf.stackscan import StackScanner, libc_code_of
from leaktrace.probes.bpf.symbolizer import Symbolizer
from leaktrace.probes.bpf.sysvshm import ShmSizer

# Events applied per drain: ~20 ms of Python work at bench_bpf's rates, the lock (and the tick) held briefly.
MAX_BATCH = 8192
# Resident reads just before the stop, while the targets keep mapping during them: each origin keeps its most.
STOP_READ_TRIES = 3
# Seconds between drains when the last batch was not full: each drain with events reads the kernel's region
# table once, whatever the batch's size; the ring holds ~280,000 records (LT_RING_PAGES).
POLL_INTERVAL_S = 0.25
# A ring record, as bytes to copy an event from.
_WINDOW_SIZE = ct.sizeof(WindowEvent)
_WINDOW_BYTES = ct.c_char * _WINDOW_SIZE
_EVENT_BYTES = ct.c_char * ct.sizeof(Event)
# At stop the kernel stops tracing first, then every record the ring holds is applied: the ledger is then
# exactly the targets' address spaces at that instant, both halves read after the same last call.


class BpfProbe(ProbeBase):
    name = "bpf"

    def __init__(self, options: HuntOptions | None = None, poll_interval: float = POLL_INTERVAL_S,
                 defines: dict[str, int] | None = None) -> None:
        # BPF is on by default but optional: unavailable, the hunt warns and goes on with the watcher,
        # unless the user asked for it explicitly (options.bpf_required).
        self.required = bool(options is not None and options.bpf_required)
        self.poll_interval = poll_interval
        # Compile-time knobs over bpf/leaktrace.bpf.c's defaults (the ring's size among them: LT_RING_PAGES).
        self.defines = dict(defines or {})
        self.ledger = OutstandingLedger()
        self.symbols = Symbolizer()
        self.scanner = StackScanner(self.symbols)
        self.origins = GrowthOrigins(self.scanner)
        self.kernel = KernelSide(self.ledger, self.origins)
        self.deferred = DeferredOrigins(self.ledger, self.origins)
        self.hooks = HookPaths(self.kernel, self.symbols, self.scanner)
        self.faults = FaultSites(self.kernel, self.ledger, self.symbols, self.scanner,
                                 self.defines.get("LT_FAULT_SAMPLE", DEFAULT_SAMPLE))
        self.seeds = AddressSpaceSeeds(self.ledger, self.symbols, self.kernel, self.hooks)
        self.libraries = LibraryNames(self.ledger, self.symbols, self.seeds.refresh_maps)
        self.writer: SnapshotRows | None = None  # made at start: it writes into the hunt's session
        self.lock = PollLock()  # the tick and add_pid take it ahead of the poll thread
        self.header_kind = ""
        self.ctx: HuntContext | None = None
        self._queue: list[Event] = []
        self._applied = 0  # events taken from the ring and applied (all batches)
        self._consumed_ns: int | None = None  # when the ring was last taken (CLOCK_MONOTONIC ns: the seq clock)
        self._known: set[int] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._counters: dict[str, int] = {**dict.fromkeys(COUNTERS, 0), "shm_unsized": 0}
        self.shm_sizer = ShmSizer()
        self.attach_s: float | None = None  # from the compile's start to live
        self.compile_s: float | None = None
        self._build = loader.ProgramBuild(self.defines)  # compiled in the background from prepare()
        self.error: str | None = None

    def prepare(self, ctx: HuntContext) -> bool:
        self._build.start()  # at the hunt's start; start() waits for it
        return True

    def cancel(self) -> None:
        self._build.cancel()  # never started: a program compiled in the background is unloaded

    def start(self, ctx: HuntContext) -> None:
        self.ctx = ctx
        prog, choice, pidns_ino, self.compile_s = self._build.result()
        self.header_kind = choice.kind
        self.writer = SnapshotRows(ctx, self.kernel, self.ledger, self.libraries, self.symbols, self.scanner,
                                   choice.kind)
        self.kernel.attach(prog, loader.import_bcc().libbcc.lib, self._on_event, pidns_ino)
        for pid in ctx.targets.live():
            self._add_target(pid)
        self.attach_s = time.monotonic() - self._build.started_at
        missed_at_attach(ctx, self.attach_s)
        where = f", pids of PID namespace {pidns_ino}" if pidns_ino else ""
        ctx.log(f"bpf: tracing {len(self._known)} process(es), {choice.kind} kernel headers{where}, "
                f"live {self.attach_s:.2f}s after the compile began (compile and load {self.compile_s:.2f}s)")
        self._thread = threading.Thread(target=self._poll_loop, name="bpf-poll", daemon=True)
        self._thread.start()

    def add_pid(self, pid: int) -> None:
        with self.lock.ahead():
            self._add_target(pid)

    def remove_pid(self, pid: int) -> bool:
        """Stop tracing ``pid``, which lives on (the watch's: a process no longer growing), and forget all the
        books held of it. False in a PID namespace (the kernel keys targets by host pids): it stays traced."""
        if self.kernel.pidns_ino:
            return False
        with self.lock.ahead():
            if pid in self._known and self.kernel.prog is not None:
                self.kernel.untarget(pid)
                while self._drain():
                    pass
                self.kernel.drop(self.kernel.scan(), pid, (1 << 64) - 1, set())
                self._known.discard(pid)
                self.ledger.release(pid)
                for forget in (self.deferred.forget, self.seeds.forget, self.shm_sizer.forget, self.hooks.process_gone,
                               self.origins.forget, self.faults.forget, self.kernel.forget_runtime, self.symbols.forget,
                               self.libraries.forget):
                    forget(pid)
        return True

    def _add_target(self, pid: int) -> None:
        if pid in self._known:
            return
        self._known.add(pid)
        self.kernel.set_runtime(pid, libc_code_of(pid))  # before tracing: see libc_code_of
        self.kernel.add_target(pid)
        self.seeds.seed(pid)

    def _poll_loop(self) -> None:
        full = False
        # A full batch means more is waiting: drain again at once, but take the lock per batch so the
        # hunt's tick (watcher, snapshots) never waits behind a stream of events.
        while not self._stop.wait(0 if full else self.poll_interval):
            while self.lock.waited and not self._stop.is_set():
                time.sleep(0.001)  # a tick (or add_pid) waits for the lock: let it have it first
            try:
                with self.lock:
                    full = self._drain()
            except Exception as e:  # never kill the hunt from the poll thread
                self.error = f"{type(e).__name__}: {e}"
                if self.ctx:
                    self.ctx.warn(f"bpf: event processing failed: {self.error}")
                return

    def tick(self, now: float) -> None:
        with self.lock.ahead():
            if self.ctx is not None:
                for pid in self.ctx.targets.live():
                    self._add_target(pid)
            self._drain()
            self._snapshot()

    def stop(self) -> None:
        if self.kernel.prog is None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self.lock:
            try:
                if self.writer is not None:
                    # Read again while the targets made mapping calls during the read (a buffer grown by
                    # mremap moves on most grows, and the kernel settles an exact move without an event).
                    for _ in range(STOP_READ_TRIES):
                        self._drain()
                        self.deferred.settle_all()
                        before = self._mapping_calls()
                        self.writer.read_before_stop(self._consumed_ns)
                        if self._mapping_calls() == before:
                            break
                self._drain_at_stop()
                if self.writer is not None:
                    self.writer.final = True  # the last snapshot reads every resident page, unbounded
                self._snapshot()
                if self.writer is not None:
                    self.writer.write_final()
            finally:
                self.kernel.close()

    def _mapping_calls(self) -> int:
        """The targets' mapping calls traced so far (the kernel's count, fast path included)."""
        counters = dict(self._counters)
        self.kernel.read_counters(counters)
        return counters["syscalls"]

    def _snapshot(self) -> None:
        if self.kernel.prog is None or self.writer is None:
            return
        self.kernel.read_counters(self._counters)
        # the stop's: every target untargeted and every event drained, the kernel's regions all in the books
        born_by = None if self.writer.final else self._consumed_ns
        self.deferred.settle_all()
        self.writer.snapshot(self._counters, len(self._queue), born_by)
        self.faults.tick(self.writer.ctx)

    def _drain_at_stop(self) -> None:
        """Untarget every process, then apply all the ring holds. While the targets are traced, the kernel's
        own regions (read at the final snapshot) run ahead of the events drained: without this, a library
        that maps a chunk per 1,024 munmaps would leave chunks outstanding whose munmaps are still in the ring."""
        self.kernel.untarget_all()
        while self._drain():
            pass

    def summary(self) -> dict[str, Any]:
        tot = self.ledger_totals()
        return {"events": self._counters["syscalls"], "lost_events": self._counters["lost_events"],
                "outstanding_bytes": tot, "slow_events": self._counters["slow_events"],
                "settled_in_kernel": self._counters["settled"], "headers": self.header_kind,
                "attach_s": self.attach_s, "compile_s": self.compile_s and round(self.compile_s, 3),
                "error": self.error, "memory_hook": dict(self.hooks.hook_counts)}

    def ledger_totals(self) -> int:
        live = self.ctx.live.bpf if self.ctx else {}
        return int(live.get("outstanding_bytes", 0))

    # ------------------------------------------------------------------ events
    def _on_event(self, _ctx: Any, data: Any, size: int) -> int:
        if size >= _WINDOW_SIZE:  # one copy, out of the ring's memory (thousands a second under churn)
            self._queue.append(WindowEvent.from_buffer_copy(_WINDOW_BYTES.from_address(data)))
        else:
            self._queue.append(Event.from_buffer_copy(_EVENT_BYTES.from_address(data)))
        # A negative answer ends libbpf's ring_buffer__consume() after this record (already consumed):
        # without it, one consume lasts as long as the target keeps the ring fed — tens of seconds under
        # a steady munmap stream, with the tick blocked behind it.
        return -1 if len(self._queue) >= MAX_BATCH else 0

    def _drain(self) -> bool:
        """Apply at most MAX_BATCH events from the ring; True when the batch was full (more may wait)."""
        if self.kernel.prog is None or self.writer is None:
            return False
        # The books run to the last event taken (snapshots leave out kernel regions born after it): when it
        # began, for a consume that emptied the ring; else its last event's, as older ones wait behind it.
        self._consumed_ns = began = time.monotonic_ns()
        self.kernel.consume()
        if not self._queue:
            return False
        last = max(e.seq for e in self._queue)
        self._consumed_ns = last if len(self._queue) >= MAX_BATCH else max(began, last)
        batch, self._queue = self._queue, []
        self._applied += len(batch)
        needs_kernel = any(e.type in (EV_MMAP, EV_MUNMAP, EV_MREMAP, EV_MPROTECT, EV_SHMAT, EV_EXEC, EV_EXIT)
                           for e in batch)
        kmap = self.kernel.scan() if needs_kernel else {}
        self.shm_sizer.new_batch()
        taken: set[tuple[int, int]] = set()
        applied = []
        for e in batch:
            if e.type == EV_HOOKWIN:  # nothing to account: a window to learn a hook's frames from
                self.hooks.learn(e)
                continue
            if e.type == EV_FAULTWIN:  # nothing to account: a window naming who touched a page
                self.faults.learn(e)
                continue
            self._apply(e, kmap, taken)
            applied.append(e)
        self.seeds.refresh_due_maps()
        self._counters["shm_unsized"] = self.shm_sizer.unsized
        if self.ctx is not None and applied:
            self.ctx.session.append_columns("bpf_events", self.writer.event_columns(applied))
        return len(batch) >= MAX_BATCH

    def _apply(self, e: Event, kmap: dict, taken: set) -> None:
        pid = e.tgid
        if self.seeds.holds(e):
            return  # already in the process's seed (see AddressSpaceSeeds.seed)
        if e.type == EV_MMAP:
            self.kernel.absorb(kmap, pid, e.addr, e.addr + e.len, e.seq, taken)
            self.deferred.unmapping(pid, e.addr, e.addr + page_up(e.len))
            kind = mmap_kind(e.fd, e.prot)
            self.ledger.mmap(pid, e.addr, e.len, self.deferred.mmap_origin(e) if kind == "anon" else origin_of(e, kind))
            if e.fd != (1 << 64) - 1 and e.prot & 4:
                self.seeds.library_loaded(pid)
        elif e.type == EV_MUNMAP:
            self.kernel.absorb(kmap, pid, e.addr, e.addr + e.len, e.seq, taken)
            self.deferred.unmapping(pid, e.addr, e.addr + page_up(e.len))
            self.ledger.munmap(pid, e.addr, e.len)
        elif e.type == EV_MREMAP:
            self.kernel.absorb(kmap, pid, e.addr, e.addr + e.len, e.seq, taken)
            self.kernel.absorb(kmap, pid, e.new_addr, e.new_addr + e.new_len, e.seq, taken)
            self.deferred.settle(pid, e.addr, e.addr + page_up(e.len))  # its pieces move: named where they are
            self.ledger.mremap(pid, e.addr, e.len, e.new_addr, e.new_len,
                               dontunmap=bool(e.flags & MREMAP_DONTUNMAP), origin=self.origins.growth_origin(e, "anon"))
        elif e.type == EV_BRK:
            self.ledger.brk(pid, e.addr, self.origins.growth_origin(e, "heap"))
        elif e.type == EV_SHMAT:
            self._apply_shmat(e, kmap, taken)
        elif e.type == EV_SHMDT:
            self.shm_sizer.detached(pid, e.addr)
            self.ledger.shmdt(pid, e.addr)
        elif e.type == EV_MPROTECT:
            self.kernel.absorb(kmap, pid, e.addr, e.addr + e.len, e.seq, taken)
            # committed by libc's malloc (growing an arena heap): the malloc heap; by libc otherwise (a thread
            # stack) or by anything else: anonymous memory of the caller
            kind = None if self.scanner.in_runtime(pid, e.ip) else "anon"
            # no stack window (rate-limited in the kernel): the growth continues the memory just below it
            self.deferred.settle(pid, e.addr - 1, e.addr)  # what it may continue
            cont = None if isinstance(e, WindowEvent) else self.ledger.origin_before(pid, e.addr)
            self.ledger.mprotect(pid, e.addr, e.len, e.prot, cont or self.origins.growth_origin(e, kind))
        elif e.type == EV_FORK:
            child = e.aux_pid
            # A child named first by the tree (add_target) holds its seed: again, its regions read pre-existing.
            if child not in self._known and _is_process(child):
                self.symbols.copy_maps(pid, child)
                self._known.add(child)
                self.seeds.seed(child)
                if self.ctx is not None:
                    with self.ctx.targets.lock:
                        self.ctx.targets.pids.setdefault(child, pid)
        elif e.type == EV_EXEC:
            self.kernel.drop(kmap, pid, e.seq, taken)
            self.deferred.forget(pid)
            self.ledger.exec(pid)
            self.shm_sizer.forget(pid)
            self.symbols.forget(pid)
            self.libraries.forget(pid)
            self.hooks.process_gone(pid)  # the new image may map no hook, or map it elsewhere
            self.origins.forget(pid)
            self.faults.forget(pid)
            self.seeds.seed(pid)
        elif e.type == EV_EXIT:
            code = None if e.flags & EXIT_NO_CODE else int(e.result)
            oom = bool(e.flags & EXIT_OOM) or self.kernel.oom_marked(pid, code)
            self.deferred.settle_pid(pid)  # what it held is its last snapshot
            if self.writer is not None:
                self.writer.record_exit(pid, e.seq, kmap, code, oom)
            self.kernel.drop(kmap, pid, e.seq, taken)
            self.ledger.exit(pid, e.seq)
            self.seeds.forget(pid)
            self.shm_sizer.forget(pid)
            self._known.discard(pid)
            self.hooks.process_gone(pid)
            self.origins.forget(pid)
            self.faults.forget(pid)
            self.kernel.forget_runtime(pid)
        elif e.type == EV_LIBMAP:
            self.seeds.library_loaded(pid)
        elif e.type in CALL_PATH_EVENTS:  # nothing to account: who locks pages, or keeps memory by fd
            if self.writer is not None:
                self.writer.lock_site(pid, origin_of(e, "lock"))

    def _apply_shmat(self, e: Event, kmap: dict, taken: set) -> None:
        """A SysV segment attached: sized by the kernel (a segment a traced process created) or from /proc
        (sysvshm.py), then mapped like an mmap (SHM_REMAP may overlay kernel-owned regions: absorbed first). The
        event row records the size found."""
        size = e.len or self.shm_sizer.size(e.tgid, e.addr, e.fd & 0xFFFFFFFF)
        if size is None:
            return
        e.len = size = page_up(size)  # as the mapping (/proc/sysvipc/shm gives the segment's bytes)
        self.kernel.absorb(kmap, e.tgid, e.addr, e.addr + size, e.seq, taken)
        self.ledger.shmat(e.tgid, e.addr, size, origin_of(e, "shm"))
