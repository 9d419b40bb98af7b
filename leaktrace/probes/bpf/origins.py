"""Where a mapping comes from: the origin of an event or a kernel region (:func:`origin_of`), and of a heap's
growth (:class:`GrowthOrigins`): the caller of malloc found in an event's stack window, also when malloc's mmap
went through a memory hook (UCX's libucm)."""

from __future__ import annotations

from leaktrace.probes.bpf.addrspace import Origin
from leaktrace.probes.bpf.layout import ANON_FD, EV_MMAP, EV_MREMAP, Event, Region, WindowEvent
from leaktrace.probes.bpf.stackscan import CALLER_CANDIDATES, StackScanner


def mmap_kind(fd: int, prot: int) -> str:
    """An mmap's origin kind: a file, anonymous memory, or a PROT_NONE anonymous reservation."""
    if (fd & 0xFFFFFFFF) != ANON_FD:
        return "file"
    return "anon" if prot else "reserve"


def origin_of(v: Region | Event, kind: str | None = None) -> Origin:
    """The origin an event or a kernel region names itself: its call site, stack and birth."""
    if kind is None:
        kind = mmap_kind(v.fd, v.prot)
    return Origin(kind, t_born=v.seq, site=v.site, ip=v.ip, stack_id=v.stack_id, tid=v.tid)


class GrowthOrigins:
    """Origins found by scanning stack windows with ``scanner`` (whose call chains it fills), and the
    origin each thread's last hooked malloc chunk was given, for that thread's chunks sent without a
    window."""

    def __init__(self, scanner: StackScanner) -> None:
        self.scanner = scanner
        self._hook_callers: dict[tuple[int, int], Origin] = {}  # (pid, tid) -> its last hooked malloc chunk's origin

    def growth_origin(self, e: Event, kind: str | None) -> Origin:
        """The origin of a heap's growth: its call site is the first return address outside libc/ld.so
        found by scanning the event's stack window (the caller of malloc), else the syscall's caller.
        ``kind`` None (an anonymous mmap or mprotect made by libc): "heap" when malloc & co. made it, else
        "anon"."""
        o = origin_of(e, kind or "anon")
        if not isinstance(e, WindowEvent) or not e.win_len:
            return o
        window = e.window
        if e.type == EV_MMAP and e.aux_pid:
            # made through a memory hook: the kernel read the hooked function's caller (libc's malloc here) at
            # this offset (bpf/leaktrace.h, struct lt_hook_path); below it are only the hook's own frames. The
            # thread's next chunks come without a window for a few ms: they take this caller (hook_caller_of).
            o = self._scanned_origin(e, o, kind, window[e.aux_pid:])
            if o.site != e.site:
                if len(self._hook_callers) > 100_000:
                    self._hook_callers.clear()
                self._hook_callers[(e.tgid, e.tid)] = o
            return o
        if e.type == EV_MREMAP:
            # A wrapper called straight by its user (mremap): its return address sits at the offset its
            # epilogue says; a scan could take a stale word left in the wrapper's frame instead.
            exact = self.scanner.wrapper_caller(e.tgid, e.ip, window)
            if exact is not None and self.scanner.in_runtime(e.tgid, exact[1]) is False:
                caller = exact[1]
                if (e.tgid, caller) not in self.scanner.chains:
                    self.scanner.chains[(e.tgid, caller)] = self.scanner.return_addresses(e.tgid, window[exact[0]:])
                return Origin(kind or "anon", t_born=o.t_born, site=caller, ip=o.ip, stack_id=-1, tid=o.tid)
        return self._scanned_origin(e, o, kind, window)

    def _scanned_origin(self, e: Event, o: Origin, kind: str | None, window: bytes) -> Origin:
        """The origin from a scan of ``window`` for the caller of the C runtime (StackScanner.live_caller);
        ``o`` when there is none."""
        # Every growth event of a heap is scanned (thousands a second under churn): only as far as the
        # caller's candidates; the whole chain once per caller, for the stack shown.
        chain = self.scanner.return_addresses(e.tgid, window, foreign_max=CALLER_CANDIDATES)
        if kind is None:
            kind = "heap" if self.scanner.via_malloc(e.tgid, chain) else "anon"
            o = origin_of(e, kind)
        caller = self.scanner.live_caller(e.tgid, chain)
        if caller is None:
            return o
        if (e.tgid, caller) not in self.scanner.chains:
            self.scanner.chains[(e.tgid, caller)] = self.scanner.return_addresses(e.tgid, window)
        return Origin(kind, t_born=o.t_born, site=caller, ip=o.ip, stack_id=-1, tid=o.tid)

    def hook_caller_of(self, tgid: int, v: Region) -> Origin | None:
        """A malloc chunk mapped through a memory hook without a stack window (the kernel sends one per thread
        per few ms: bpf/leaktrace.bpf.c) is a kernel region with libc's site: the origin its thread's last window
        named (a thread's burst of chunks has one caller). None for any other region."""
        o = self._hook_callers.get((tgid, v.tid)) if self._hook_callers else None
        if o is not None and v.fd == ANON_FD and self.scanner.in_libc(tgid, v.site):
            return o
        return None

    def forget(self, pid: int) -> None:
        """The process exited or exec'd: its threads' hooked callers no longer apply."""
        self._hook_callers = {k: v for k, v in self._hook_callers.items() if k[0] != pid}
