"""Stack scanning: return addresses found in a window of raw user stack, without frame pointers or unwind
tables (what Breakpad does when it has neither).

The kernel half sends, with each growth of a heap (brk of the main heap, mprotect of a glibc arena), the
bytes above the user stack pointer at the syscall. Every 8-byte word there that points into executable
code right after a call instruction (``e8 rel32``, or one of the ``ff /2`` indirect forms) is taken as a
return address, innermost first. The first one outside the C runtime (libc, ld.so: malloc's internals
and the syscall wrappers; and a memory hook, UCX's libucm, whose sbrk and mmap stand between malloc and the
kernel when its hooks are on) is the code that called malloc — even when that library is stripped and built
with ``-fomit-frame-pointer``.

A stale word (a return address left by an earlier, deeper call) can pass the test, and glibc's frames can
hold one (libffi's, under a library called through ctypes): of the first few foreign return addresses, the
caller is the first whose call lands in the C runtime (:meth:`StackScanner.live_caller`), else the first. The chain shown for a call site (:meth:`StackScanner.verified_chain`) keeps only the
frames a call can have reached: an indirect call, or a direct call whose target (through a PLT stub and a
jump written at the target, as memory hooks do) lies in the file of the verified frame below it. A stale
word between two libraries (an interpreter's frame left between libucs and libucm) fails that test; a
tail call inside one library passes it. Addresses resolve through the probe's copies of /proc/PID/maps (:class:`Symbolizer`);
code bytes are read from the mapped file (or the process's memory for anonymous code).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from leaktrace.memclass import ALLOCATOR_LIBRARY, LIBC_LIBRARY, MEMORY_HOOK_LIBRARY
from leaktrace.probes.bpf.procread import _read_maps
from leaktrace.probes.bpf.symbolizer import MapEntry, Symbolizer
from leaktrace.probes.bpf.x86code import (
    EPILOGUE_BYTES,
    LOOKBACK,
    ends_with_call,
    frame_from_epilogue,
    jump_target,
)
from leaktrace.procmem import read_bytes

# libc entry points that allocate from malloc's heaps: a growth whose libc frames pass through one is malloc's
MALLOC_FUNCTIONS = frozenset({"malloc", "calloc", "realloc", "reallocarray", "memalign", "posix_memalign",
                              "aligned_alloc", "valloc", "pvalloc", "__libc_malloc", "__libc_calloc",
                              "__libc_realloc", "__libc_memalign", "__libc_valloc", "__libc_pvalloc"})
MAX_FRAMES = 24  # return addresses kept per window
CALLER_CANDIDATES = 3  # foreign return addresses looked at for the one whose call reaches the C runtime
TOP_SITES_PER_PID = 8  # call sites published per process each tick (LiveFigures.bpf["top_sites"])
class StackScanner:
    """Return addresses in raw stack windows, per process, through the probe's maps copies."""

    def __init__(self, symbols: Symbolizer) -> None:
        self.symbols = symbols
        self._is_call: dict[tuple[str, int], bool] = {}  # (file, offset of the return address) -> answer
        # (pid, caller found) -> the return addresses of the first window that named it (the stack shown)
        self.chains: dict[tuple[int, int], list[int]] = {}
        self._ranges: dict[int, tuple[list[MapEntry], np.ndarray, np.ndarray]] = {}
        self._runtime: dict[str, str | None] = {}  # mapped file -> "libc" (libc, ld.so), "hook" (libucm) or None
        self._addr_cache: dict[int, tuple[list[MapEntry], dict[int, tuple[bool, bool | None]]]] = {}
        self._malloc_addr: dict[tuple[int, int], bool] = {}  # (pid, libc return address) -> in malloc & co.
        self._frames: dict[tuple[str, int], int | None] = {}  # (file, -offset of a syscall's ip) -> frame size
        self._reaches: dict[tuple[int, int, int], bool | None] = {}  # (pid, return address, frame below)
        self._calls_runtime: dict[tuple[int, int], bool] = {}  # (pid, return address) -> its call lands in it
        self._site_frames: dict[tuple[int, int, int], list[str]] = {}  # (pid, site, ip) -> its stack, as shown

    def _code_before(self, pid: int, m: MapEntry, addr: int) -> bytes:
        lo = max(m.start, addr - LOOKBACK)
        return self._code_at(pid, m, lo, addr - lo)

    def wrapper_caller(self, pid: int, ip: int, window: bytes) -> tuple[int, int] | None:
        """The return address of the syscall wrapper whose syscall instruction ends at ``ip``, read at the
        offset its epilogue gives (exact where a scan may take a stale word left in the wrapper's frame):
        (offset in the window, return address), or None when that word is not a return address."""
        m = self.symbols.mapping(pid, ip)
        if m is None or "x" not in m.perms:
            return None
        key = (m.path or f"{pid}:{m.start:#x}", -(ip - m.start + m.offset))  # negative: not a return address
        off = self._frames.get(key, -1)
        if off == -1:
            code = self._code_at(pid, m, ip, min(EPILOGUE_BYTES, m.end - ip))
            off = self._frames[key] = frame_from_epilogue(code)
        if off is None or off + 8 > len(window):
            return None
        word = int.from_bytes(window[off:off + 8], "little")
        return (off, word) if self.is_return_address(pid, word) else None

    def top_sites(self, sites: dict[tuple[int, int, int, int, str], int],
                  frames_of: Callable[[int, int, int, int], list[str]], per_pid: int = TOP_SITES_PER_PID
                  ) -> list[dict[str, Any]]:
        """The call sites holding most of what each process mapped since attach (``sites``: (pid, site, ip,
        stack_id, kind) -> bytes), each with its stack (``frames_of(pid, site, ip, stack_id)``, kept from its
        first time) and :meth:`own_caller`: what the gdb probe needs to stop on the path that grows and read
        its libraries only."""
        by_pid: dict[int, list[tuple[int, tuple[int, int, int, int, str]]]] = {}
        for key, n in sites.items():
            by_pid.setdefault(key[0], []).append((n, key))
        out = []
        for pid, items in by_pid.items():
            for n, (_p, site, ip, stack_id, kind) in sorted(items, reverse=True)[:per_pid]:
                frames = self._site_frames.get((pid, site, ip))
                if frames is None:
                    if len(self._site_frames) > 10_000:
                        self._site_frames.clear()
                    frames = frames_of(pid, site, ip, stack_id)
                    # Kept once the site's chain is known: frames made before it lack the libraries that
                    # own_caller's stop lies in, and gdb would stop there without their symbols.
                    if (pid, site) in self.chains:
                        self._site_frames[(pid, site, ip)] = frames
                out.append({"pid": pid, "site": site, "ip": ip, "kind": kind, "bytes": n, "frames": frames,
                            "break_at": self.own_caller(pid, site, ip)})
        return out

    def own_caller(self, pid: int, site: int, ip: int) -> int:
        """Where a stop sees only this site's own path: the first return address of its chain outside the C
        runtime and memory hooks (a hook's raw-mmap site is shared by every mapping it hooks; its caller, such
        as libucs's pool growth, is not), else the site itself."""
        chain = self.chains.get((pid, site))
        if chain is None:
            return site
        return next((a for a in self.verified_chain(pid, chain, ip or None) if self.in_runtime(pid, a) is False),
                    site)

    def verified_chain(self, pid: int, chain: list[int], below: int | None = None) -> list[int]:
        """``chain`` (return addresses, innermost first) without the frames no call reached: each is kept when
        :meth:`reaches` the last kept frame below it (``below`` for the first: the syscall's ip or the site)."""
        out: list[int] = []
        for a in chain:
            if below is None or self.reaches(pid, a, below) is not False:
                out.append(a)
                below = a
        return out

    def reaches(self, pid: int, ret: int, below: int) -> bool | None:
        """Can the call just before return address ``ret`` have led to code address ``below``? True for an
        indirect call, or a direct one whose target lies in ``below``'s file; None when unreadable."""
        key = (pid, ret, below)
        hit = self._reaches.get(key)
        if hit is None and key not in self._reaches:
            target = self.call_target(pid, ret)
            if target is None:
                hit = None if not self.is_return_address(pid, ret) else True
            else:
                a, b = self.symbols.mapping(pid, target), self.symbols.mapping(pid, below)
                hit = None if a is None or b is None else (a.path or a.start) == (b.path or b.start)
            if len(self._reaches) > 100_000:
                self._reaches.clear()
            self._reaches[key] = hit
        return hit

    def call_target(self, pid: int, ret: int) -> int | None:
        """Where the direct call (``e8 rel32``) ending at ``ret`` goes, through PLT stubs (``jmp *GOT``, read
        from the process) and jumps at the target (a hook's patch over libc's ``munmap``); None for an
        indirect call or unreadable code."""
        m = self.symbols.mapping(pid, ret)
        if m is None:
            return None
        code = self._code_before(pid, m, ret)
        if len(code) < 5 or code[-5] != 0xE8:
            return None
        target = (ret + int.from_bytes(code[-4:], "little", signed=True)) & 0xFFFFFFFFFFFFFFFF
        for _ in range(4):
            nxt = jump_target(target, read_bytes(pid, target, 16), lambda a: read_bytes(pid, a, 8))
            if nxt is None:
                break
            target = nxt
        return target

    def _code_at(self, pid: int, m: MapEntry, addr: int, n: int) -> bytes:
        """``n`` bytes of code at ``addr``: from the mapped file, or the process's memory for anonymous code."""
        path = m.path.removesuffix(" (deleted)")
        try:
            if path.startswith("/") and os.path.isfile(path):
                with open(path, "rb") as f:
                    f.seek(addr - m.start + m.offset)
                    return f.read(n)
        except (OSError, ValueError, OverflowError):
            return b""
        return read_bytes(pid, addr, n)

    def is_return_address(self, pid: int, addr: int) -> bool:
        return self._info(pid, addr)[0]

    def _info(self, pid: int, addr: int) -> tuple[bool, bool | None]:
        """(is ``addr`` a return address, is it in the C runtime: None outside named files), cached per
        address and maps copy (a growth's return addresses repeat from one event to the next)."""
        maps = self.symbols.entries(pid)
        cache = self._addr_cache.get(pid)
        if cache is None or cache[0] is not maps or len(cache[1]) > 100_000:
            cache = self._addr_cache[pid] = (maps, {})
        hit = cache[1].get(addr)
        if hit is None:
            hit = cache[1][addr] = (self._is_return_address(pid, addr), self._runtime_of(pid, addr))
        return hit

    def _is_return_address(self, pid: int, addr: int) -> bool:
        m = self.symbols.mapping(pid, addr)
        if m is None or "x" not in m.perms:
            return False
        key = (m.path or f"{pid}:{m.start:#x}", addr - m.start + m.offset)
        hit = self._is_call.get(key)
        if hit is None:
            code = self._code_before(pid, m, addr)
            hit = ends_with_call(code)
            if hit and len(code) >= 5 and code[-5] == 0xE8:
                # a direct call must land in code: cheap check against data that happens to hold 0xe8
                target = addr + int.from_bytes(code[-4:], "little", signed=True)
                hit = self.symbols.is_code(pid, target)
            if m.path:
                self._is_call[key] = hit
        return hit

    def _code_ranges(self, pid: int) -> tuple[np.ndarray, np.ndarray]:
        """Starts and ends of the executable mappings of ``pid`` (cached per maps copy)."""
        maps = self.symbols.entries(pid)
        hit = self._ranges.get(pid)
        if hit is None or hit[0] is not maps:
            code = [m for m in maps if "x" in m.perms]
            hit = (maps, np.array([m.start for m in code], dtype=np.uint64),
                   np.array([m.end for m in code], dtype=np.uint64))
            self._ranges[pid] = hit
        return hit[1], hit[2]

    def in_runtime(self, pid: int, addr: int) -> bool | None:
        """Is ``addr`` in libc, ld.so or a memory hook (UCX's libucm, which stands between malloc and the kernel
        when its hooks are on: malloc's sbrk and mmap go through it)? None when it is in no named file."""
        return self._info(pid, addr)[1]

    def in_libc(self, pid: int, addr: int) -> bool:
        """Is ``addr`` in libc or ld.so (not a memory hook)?"""
        return self._runtime_class(pid, addr) == "libc"

    def _runtime_of(self, pid: int, addr: int) -> bool | None:
        m = self.symbols.mapping(pid, addr)
        if m is None or not m.path or m.path.startswith("["):
            return None
        return self._class_of_file(m.path) is not None

    def _runtime_class(self, pid: int, addr: int) -> str | None:
        """"libc" (libc, ld.so), "allocator" (one in glibc malloc's place), "hook" (a memory hook) or None
        (anything else, or no named file)."""
        m = self.symbols.mapping(pid, addr)
        if m is None or not m.path or m.path.startswith("["):
            return None
        return self._class_of_file(m.path)

    def _class_of_file(self, path: str) -> str | None:
        if path not in self._runtime:
            name = os.path.basename(path.removesuffix(" (deleted)"))
            self._runtime[path] = ("allocator" if ALLOCATOR_LIBRARY.match(name) else
                                   "libc" if LIBC_LIBRARY.match(name) else
                                   "hook" if MEMORY_HOOK_LIBRARY.match(name) else None)
        return self._runtime[path]

    def return_addresses(self, pid: int, window: bytes, to_caller: bool = False,
                         foreign_max: int | None = None) -> list[int]:
        """Return addresses in ``window`` (raw stack from the stack pointer up), innermost first; with
        ``to_caller``, up to the first outside the C runtime (see :meth:`caller`); with ``foreign_max``, up to
        that many outside it (all that :meth:`via_malloc` and :meth:`live_caller` read of a chain)."""
        if to_caller:
            foreign_max = 1
        starts, ends = self._code_ranges(pid)
        if not len(starts):
            return []
        words = np.frombuffer(window, dtype="<u8", count=len(window) // 8)
        i = np.searchsorted(starts, words, side="right") - 1
        code = words[(i >= 0) & (words < ends[np.maximum(i, 0)])]  # words pointing into code, in order
        out: list[int] = []
        info = self._info
        foreign = 0
        for w in code.tolist():
            is_ret, runtime = info(pid, w)
            if is_ret:
                out.append(w)
                foreign += runtime is False
                if len(out) >= MAX_FRAMES or (foreign_max is not None and foreign >= foreign_max):
                    break
        return out

    def caller(self, pid: int, addrs: list[int]) -> int | None:
        """The first return address outside the C runtime, the dynamic loader and memory hooks."""
        for a in addrs:
            if self.in_runtime(pid, a) is False:
                return a
        return None

    def live_caller(self, pid: int, addrs: list[int]) -> int | None:
        """The code that called the C runtime: of the first CALLER_CANDIDATES return addresses outside it, the
        first whose call lands in it (a stale word left in malloc's frames by an earlier, deeper call does
        not: libffi's, under a library called through ctypes), else the first of them (its call may reach the
        runtime through a tail call: an interpreter's allocator wrapper)."""
        foreign = [a for a in addrs if self.in_runtime(pid, a) is False][:CALLER_CANDIDATES]
        return next((a for a in foreign if self.calls_runtime(pid, a)), foreign[0] if foreign else None)

    def calls_runtime(self, pid: int, ret: int) -> bool:
        """Does the call just before return address ``ret`` land in the C runtime or a memory hook: a direct
        call (through a PLT stub), or a call through a GOT word (``call *disp(%rip)``: code built -fno-plt)?"""
        key = (pid, ret)
        hit = self._calls_runtime.get(key)
        if hit is None:
            target = self.call_target(pid, ret)
            if target is None:
                target = self._got_call_target(pid, ret)
            hit = target is not None and bool(self._runtime_of(pid, target))
            if len(self._calls_runtime) > 100_000:
                self._calls_runtime.clear()
            self._calls_runtime[key] = hit
        return hit

    def _got_call_target(self, pid: int, ret: int) -> int | None:
        m = self.symbols.mapping(pid, ret)
        if m is None:
            return None
        code = self._code_before(pid, m, ret)
        if len(code) < 6 or code[-6:-4] != b"\xff\x15":
            return None
        word = read_bytes(pid, (ret + int.from_bytes(code[-4:], "little", signed=True)) & 0xFFFFFFFFFFFFFFFF, 8)
        return int.from_bytes(word, "little") if len(word) == 8 else None

    def via_malloc(self, pid: int, addrs: list[int]) -> bool:
        """Do the C-runtime frames of a stack (innermost first) pass through malloc & co.?"""
        for a in addrs:
            runtime = self.in_runtime(pid, a)
            if runtime is False:
                return False
            if runtime:
                hit = self._malloc_addr.get((pid, a))
                if hit is None:
                    if len(self._malloc_addr) > 100_000:
                        self._malloc_addr.clear()
                    # an allocator in glibc's place maps nothing but malloc's memory (its functions are local)
                    hit = self._malloc_addr[(pid, a)] = (self._runtime_class(pid, a) == "allocator"
                                                         or self.symbols.frame(pid, a).symbol in MALLOC_FUNCTIONS)
                if hit:
                    return True
        return False


def libc_code_of(pid: int) -> tuple[int, int] | None:
    """libc's executable mapping in ``pid``, read for the kernel before the process is traced: a mapping call
    made from libc (glibc's variadic mremap, malloc's mmap) between tracing and the seed's own maps read would
    otherwise go without its stack window, be blamed on libc, and a region it moves would keep that name."""
    maps = _read_maps(pid)
    return libc_code(maps) if maps is not None else None


def allocator_code(maps: list[MapEntry]) -> tuple[int, int] | None:
    """The executable mapping (start, end) of an allocator in glibc malloc's place (jemalloc, tcmalloc,
    mimalloc), if mapped."""
    for m in maps:
        if "x" in m.perms and ALLOCATOR_LIBRARY.match(os.path.basename(m.path)):
            return m.start, m.end
    return None


def libc_code(maps: list[MapEntry]) -> tuple[int, int] | None:
    """libc's executable mapping (start, end) in a maps listing, if mapped."""
    for m in maps:
        name = os.path.basename(m.path)
        if "x" in m.perms and name.startswith("libc") and LIBC_LIBRARY.match(name):
            return m.start, m.end
    return None
