"""Each traced process's address space as /proc/PID/maps shows it: the ledger's seed at attach, at a fork
and at an exec, and the maps copies the symbolizer and the hook learner read between (libraries loaded).

The seed is the ledger's starting point; the events the ring holds from before the read are already in it,
so :meth:`AddressSpaceSeeds.holds` tells the probe which of them not to apply again.
"""

from __future__ import annotations

import time

from leaktrace.probes.bpf.hookpaths import HookPaths
from leaktrace.probes.bpf.kernel import KernelSide
from leaktrace.probes.bpf.layout import (
    EV_BRK,
    EV_EXEC,
    EV_MMAP,
    EV_MPROTECT,
    EV_MREMAP,
    EV_MUNMAP,
    EV_SHMAT,
    EV_SHMDT,
    Event,
)
from leaktrace.probes.bpf.ledger import SHARED_ANON, OutstandingLedger
from leaktrace.probes.bpf.procread import _read_maps, _start_brk
from leaktrace.probes.bpf.stackscan import allocator_code, libc_code
from leaktrace.probes.bpf.symbolizer import MapEntry, Symbolizer

# Events whose effect a maps read made after them already holds (see AddressSpaceSeeds.seed).
# (An EXEC too: a child seeded at its FORK once it had exec'd holds the new image already.)
_SEEDED_TYPES = frozenset((EV_MMAP, EV_MUNMAP, EV_MREMAP, EV_BRK, EV_MPROTECT, EV_SHMAT, EV_SHMDT, EV_EXEC))


class AddressSpaceSeeds:
    def __init__(self, ledger: OutstandingLedger, symbols: Symbolizer, kernel: KernelSide,
                 hooks: HookPaths) -> None:
        self.ledger = ledger
        self.symbols = symbols
        self.kernel = kernel
        self.hooks = hooks
        self._maps_due: set[int] = set()  # processes that loaded a library in the batch being applied
        self._maps_refreshed: dict[int, float] = {}
        # pid -> when its maps were last read as its seed (CLOCK_MONOTONIC ns, the events' clock): see seed
        self._seeded_at: dict[int, int] = {}

    def seed(self, pid: int) -> None:
        """The process's address space as /proc/PID/maps shows it now: traced since (add_target), or a child
        (FORK) or new image (EXEC) already running, so its events up to the read are both in the seed and in the
        ring. Those are not applied again (_SEEDED_TYPES): replayed over a state that already holds them, a move
        or a brk would apply twice, an mprotect undo a later mmap's protection. Its kernel-owned regions born
        before the read leave the kernel: the seed holds what is left of them, and its pieces there take their
        origin (but for the PROT_NONE ones, reservations; a piece mapped since into a hole one left is blamed on
        it too)."""
        t = time.monotonic_ns()
        maps = _read_maps(pid)
        if maps is None:
            return
        self._seeded_at[pid] = t
        self.symbols.set_maps(pid, maps)
        self._maps_refreshed[pid] = time.monotonic()
        # [vsyscall] sits in kernel space: no syscall of the process can map or unmap it.
        self.ledger.seed(pid, [(m.start, m.end, m.path) for m in maps if m.end < 1 << 63], _start_brk(pid),
                         t=t, reserved=[(m.start, m.end) for m in maps  # a shared one PROT_NONE too
                                        if m.path in ("", SHARED_ANON) and m.perms.startswith("---")])
        if self.kernel.prog is not None:
            for start, val, origin in self.kernel.take_born_before(pid, t):
                self.ledger.relabel(pid, start, start + val.len, origin)
        libc, allocator = libc_code(maps), allocator_code(maps)
        if libc is not None or allocator is not None:
            self.kernel.set_runtime(pid, libc, allocator)
        self._set_hook_code(pid, maps)

    def holds(self, e: Event) -> bool:
        """True when the event's process was seeded after it: the seed already holds its effect."""
        return e.type in _SEEDED_TYPES and e.seq < self._seeded_at.get(e.tgid, 0)

    def forget(self, pid: int) -> None:
        self._seeded_at.pop(pid, None)

    def _set_hook_code(self, pid: int, maps: list[MapEntry]) -> None:
        """The hook learner sees every maps copy the probe reads (at seed and at refresh)."""
        self.hooks.set_code(pid, maps)

    def library_loaded(self, pid: int) -> None:
        self._maps_due.add(pid)

    def refresh_due_maps(self) -> None:
        """Libraries loaded during a batch: one /proc/PID/maps read per process per batch, not one per
        library (importing torch maps hundreds). Nothing in a batch needs them before its end: names are
        looked up at snapshot time."""
        for pid in self._maps_due:
            self.refresh_maps(pid, force=True)
        self._maps_due.clear()

    def refresh_maps(self, pid: int, force: bool = False) -> None:
        last = self._maps_refreshed.get(pid, 0.0)
        if not force and time.monotonic() - last < 1.0:
            return
        maps = _read_maps(pid)
        if maps is not None:
            self.symbols.set_maps(pid, maps)
            self._maps_refreshed[pid] = time.monotonic()
            self._set_hook_code(pid, maps)
