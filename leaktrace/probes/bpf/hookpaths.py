"""The kernel half's view of memory hooks (:class:`HookPaths`): where each process's hook library is
(`hooks`), and the paths through it learned from LT_EV_HOOKWIN windows (`hook_sites`, `hook_paths`; see
bpf/leaktrace.h and hookframes.py). What is learned is kept per library build, by file offset, so a process
that maps the same libucm later gets its paths at once, without a window."""

from __future__ import annotations

import ctypes as ct

from leaktrace.probes.bpf.hookframes import hook_code, walk_hook_frames
from leaktrace.probes.bpf.kernel import KernelSide
from leaktrace.probes.bpf.layout import Hook, HookKey, HookPath, WindowEvent
from leaktrace.probes.bpf.stackscan import StackScanner
from leaktrace.probes.bpf.symbolizer import MapEntry, Symbolizer

# Windows of one process that could not be walked before its hook is left alone (hooked mmaps then keep the
# hook's site, as without this): a build without unwind tables, or a path the walk does not understand.
MAX_FAILED_WALKS = 20


class _Learned:
    """One hook build's paths, by file offset: site -> caller_off; caller -> (dispatch_off, last_off, last_ret)."""

    def __init__(self) -> None:
        self.sites: dict[int, int] = {}
        self.paths: dict[int, tuple[int, int, int]] = {}


class HookPaths:
    """Learns the paths through each process's memory hook (its frames walked with ``symbols``' maps, the
    stacks of UCX's own chunks kept in ``scanner``'s chains) and writes them to ``kernel``'s hook maps."""

    def __init__(self, kernel: KernelSide, symbols: Symbolizer, scanner: StackScanner) -> None:
        self.kernel = kernel
        self.symbols = symbols
        self.scanner = scanner
        self._hook_of: dict[int, tuple[int, int, str]] = {}  # pid -> (code start, end, file) the kernel holds
        self._hook_base: dict[int, int] = {}  # pid -> the address of the hook file's offset 0
        self._learned: dict[str, _Learned] = {}  # hook file -> its paths
        self._failed_walks: dict[int, int] = {}
        self.hook_counts = {"windows": 0, "sites": 0, "paths": 0, "failed": 0}

    def set_code(self, pid: int, maps: list[MapEntry]) -> None:
        """Tell the kernel where the process's memory hook (UCX's libucm) is, once it is mapped (often after
        attach: NIXL loads UCX when its agent starts), with the paths already learned for that build."""
        hook = hook_code(maps)
        if hook is None or self.kernel.prog is None or self._hook_of.get(pid) == hook:
            return
        if self._failed_walks.get(pid, 0) >= MAX_FAILED_WALKS:
            return
        start, end, path = hook
        m = next(m for m in maps if m.start == start)
        self._hook_of[pid] = hook
        self._hook_base[pid] = m.start - m.offset
        self.kernel.prog[b"hooks"][ct.c_uint32(pid)] = Hook(start, end, 0)
        learned = self._learned.get(path)
        if learned is not None:
            for site, caller_off in learned.sites.items():
                self._write_site(pid, site, caller_off)
            for caller, p in learned.paths.items():
                self._write_path(pid, caller, p)

    def _write_site(self, pid: int, site_off: int, caller_off: int) -> None:
        key = HookKey(pid, 0, self._hook_base[pid] + site_off)
        self.kernel.prog[b"hook_sites"][key] = ct.c_uint64(caller_off)

    def _write_path(self, pid: int, caller_off_in_file: int, p: tuple[int, int, int]) -> None:
        base = self._hook_base[pid]
        dispatch_off, last_off, last_ret = p
        self.kernel.prog[b"hook_paths"][HookKey(pid, 0, base + caller_off_in_file)] = HookPath(
            dispatch_off, last_off, base + last_ret)

    def learn(self, e: WindowEvent) -> None:
        """An LT_EV_HOOKWIN window: walk it through the hook's frames, and hand what it shows to the kernel
        for every process that maps the same build."""
        pid = e.tgid
        self.hook_counts["windows"] += 1
        hook = self._hook_of.get(pid)
        if hook is None or not e.win_len:
            return
        walk = walk_hook_frames(lambda a: self.symbols.mapping(pid, a), e.window, e.site)
        if walk is not None and walk.dispatch_off is not None and not self.scanner.is_return_address(
                pid, walk.dispatched_to):
            walk = None  # the walk ended on a word that is no return address: do not trust it
        if walk is None:
            self.hook_counts["failed"] += 1
            n = self._failed_walks[pid] = self._failed_walks.get(pid, 0) + 1
            if n >= MAX_FAILED_WALKS:
                self._forget_hook(pid)
            return
        base, path = self._hook_base[pid], hook[2]
        learned = self._learned.setdefault(path, _Learned())
        same = [q for q, h in self._hook_of.items() if h[2] == path]
        site_off = e.site - base
        if site_off not in learned.sites:
            learned.sites[site_off] = walk.caller_off
            self.hook_counts["sites"] += 1
            for q in same:
                self._write_site(q, site_off, walk.caller_off)
        if walk.dispatch_off is None and (pid, e.site) not in self.scanner.chains:
            # UCX mapping for itself (the registration cache's chunks): its regions keep the hook's site, and
            # this is the stack they show, from the trampoline's caller out (libucs's ucs_mpool_grow ...)
            self.scanner.chains[(pid, e.site)] = [e.site] + self.scanner.return_addresses(
                pid, e.window[walk.caller_off:])
        if walk.dispatch_off is not None:
            caller_off = walk.caller - base
            p = (walk.dispatch_off, walk.last_off, walk.last_ret - base)
            if caller_off not in learned.paths:
                learned.paths[caller_off] = p
                self.hook_counts["paths"] += 1
                for q in same:
                    self._write_path(q, caller_off, p)

    def process_gone(self, pid: int) -> None:
        """The process exited or exec'd (the new image may map no hook, or map it elsewhere)."""
        self._forget_hook(pid)
        self._failed_walks.pop(pid, None)

    def _forget_hook(self, pid: int) -> None:
        """The kernel forgets the process's hook and paths (gone, or its hook cannot be walked)."""
        if self.kernel.prog is None:
            return
        if self._hook_of.pop(pid, None) is None:
            return
        self._hook_base.pop(pid, None)
        try:
            del self.kernel.prog[b"hooks"][ct.c_uint32(pid)]
        except (KeyError, TypeError):
            pass
        for table in (b"hook_sites", b"hook_paths", b"hook_own"):
            t = self.kernel.prog[table]
            for key in [k for k in t.keys() if k.tgid == pid]:
                try:
                    del t[key]
                except KeyError:
                    pass
