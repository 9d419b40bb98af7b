"""Where a heap's growth comes from: the caller of malloc (or of a hooked mmap) found in an event's stack
window (a mixin of BpfProbe, which holds the scanner, the program and the kernel regions' origins)."""

from __future__ import annotations

import ctypes as ct
from typing import Any

from leaktrace.probes.bpf.addrspace import Origin
from leaktrace.probes.bpf.layout import EV_MREMAP, Event, Range, TinyWindowEvent, WindowEvent
from leaktrace.probes.bpf.ledger import MapEntry
from leaktrace.probes.bpf.stackscan import hook_code


class GrowthOrigins:
    # (pid, tid) -> the origin the thread's last full window gave a hooked mmap (bpf/leaktrace.h: tiny windows)
    _hook_callers: dict[tuple[int, int], Origin]
    _hook_code: dict[int, tuple[int, int]]  # pid -> the hook library's code range the kernel holds
    prog: Any

    def _forget_code_ranges(self, pid: int) -> None:
        for table in (b"runtime", b"hooks"):
            try:
                del self.prog[table][ct.c_uint32(pid)]
            except (KeyError, TypeError):
                pass
        self._hook_code.pop(pid, None)
        self._hook_callers = {k: v for k, v in self._hook_callers.items() if k[0] != pid}

    def _set_hook_code(self, pid: int, maps: list[MapEntry]) -> None:
        """Tell the kernel half where the process's memory-hook library (UCX's libucm) is, once it is mapped
        (often later than attach: NIXL loads UCX when its agent starts): anonymous mmaps called from there
        carry a stack window too, which names the hook's caller (bpf/leaktrace.bpf.c)."""
        hook = hook_code(maps)
        if hook is None or self.prog is None or self._hook_code.get(pid) == hook:
            return
        self.prog[b"hooks"][ct.c_uint32(pid)] = Range(*hook)
        self._hook_code[pid] = hook

    def _growth_origin(self, e: Event, kind: str | None) -> Origin:
        """The origin of a heap's growth: its call site is the first return address outside libc/ld.so
        (and memory hooks) found by scanning the event's stack window (the caller of malloc, or of the hooked
        mmap), else the syscall's caller; UCX's own mappings through its hook stay on the hook's call site.
        ``kind`` None (an anonymous mmap or mprotect made by libc): "heap" when malloc & co. made it, else
        "anon"."""
        o = self._origin_of(e, kind or "anon")
        if not isinstance(e, (WindowEvent, TinyWindowEvent)) or not e.win_len:
            return o
        window = e.window
        if e.type == EV_MREMAP:
            # A wrapper called straight by its user (mremap): its return address sits at the offset its
            # epilogue says; a scan could take a stale word left in the wrapper's frame instead.
            exact = self.scanner.wrapper_caller(e.tgid, e.ip, window)
            if exact is not None and self.scanner.in_runtime(e.tgid, exact[1]) is False:
                caller = exact[1]
                if (e.tgid, caller) not in self.scanner.chains:
                    self.scanner.chains[(e.tgid, caller)] = self.scanner.return_addresses(e.tgid, window[exact[0]:])
                return Origin(kind or "anon", t_born=o.t_born, site=caller, ip=o.ip, stack_id=-1, tid=o.tid)
        head: list[int] = []  # return addresses known exactly, innermost first, before the scanned part
        hooked = self.scanner.in_hook(e.tgid, e.site)
        if hooked and int.from_bytes(window[:8], "little") == e.site:
            # A hooked call: libc's syscall() (no frame) returned to the hook's raw-syscall trampoline
            # (ucm_orig_mmap_syscall), whose own caller sits at the offset its epilogue says. Its frame has a
            # padding slot that can hold a stale return address, which a scan would take for the caller.
            exact = self.scanner.wrapper_caller(e.tgid, e.site, window[8:])
            if exact is not None:
                head, window = [e.site], window[8 + exact[0]:]
                if self.scanner.in_ucx(e.tgid, exact[1]) and not self.scanner.in_hook(e.tgid, exact[1]):
                    # UCX mapping memory for itself (the registration cache's chunks, ucs_mpool_grow): UCX's, kept
                    # on the hook's call site (libucm), with the chain that shows which part of UCX asked for it
                    # (kept, or replaced by a longer one: the first may come from a tiny window)
                    chain = head + self.scanner.return_addresses(e.tgid, window)
                    if len(chain) > len(self.scanner.chains.get((e.tgid, e.site), ())):
                        self.scanner.chains[(e.tgid, e.site)] = chain
                    return o
        if hooked and isinstance(e, TinyWindowEvent):
            # The hook dispatching someone else's mmap, within a few ms of this thread's last full window: that
            # window's caller (a burst of one thread's mmaps has one caller); none yet: not UCX's (libc's syscall)
            last = self._hook_callers.get((e.tgid, e.tid))
            if last is None:
                return Origin(kind or "anon", t_born=o.t_born, site=0, ip=o.ip, stack_id=-1, tid=o.tid)
            return Origin(last.kind, t_born=o.t_born, site=last.site, ip=o.ip, stack_id=-1, tid=o.tid)
        got = self._scanned_origin(e, o, kind, window, head, hooked)
        if hooked and got.site != e.site:  # a caller found past the hook (never remember the hook itself)
            if len(self._hook_callers) > 100_000:
                self._hook_callers.clear()
            self._hook_callers[(e.tgid, e.tid)] = got
        return got

    def _scanned_origin(self, e: Event, o: Origin, kind: str | None, window: bytes, head: list[int],
                        hooked: bool) -> Origin:
        """The origin from a scan of ``window`` (see :meth:`_growth_origin`); ``o`` when nothing better."""
        inner = self.scanner.return_addresses(e.tgid, window, to_caller=True)
        caller = self.scanner.caller(e.tgid, inner)
        if caller is not None and hooked and self.scanner.in_ucx(e.tgid, caller):
            # UCX's own allocation through its hooked mmap (or malloc): UCX's too, as above
            if (e.tgid, e.site) not in self.scanner.chains:
                self.scanner.chains[(e.tgid, e.site)] = head + self.scanner.return_addresses(e.tgid, window)
            return o
        if kind is None:
            kind = "heap" if self.scanner.via_malloc(e.tgid, inner) else "anon"
            o = self._origin_of(e, kind)
        if caller is None:
            return o
        if (e.tgid, caller) not in self.scanner.chains:  # the first time: the whole chain, for the stack shown
            self.scanner.chains[(e.tgid, caller)] = head + self.scanner.return_addresses(e.tgid, window)
        return Origin(kind, t_born=o.t_born, site=caller, ip=o.ip, stack_id=-1, tid=o.tid)
