"""The stack windows the kernel keeps for malloc's own chunks (:class:`KeptWindows`).

An anonymous mmap called from the C runtime (a chunk above malloc's mmap threshold) is blamed on malloc's caller,
found by scanning a window of the raw user stack taken at the syscall. The kernel keeps such a chunk on its fast
path and its window in the ``windows`` map under {tgid, born} (bpf/leaktrace.bpf.c): an exact munmap settles both,
so allocator churn (torch at glibc's mmap threshold of 4096: thousands of chunks a second per worker, nearly all
unmapped within milliseconds) sends nothing to user space. A window is read and scanned only for a chunk still
held when the books are read (named once per chunk, the name kept while the chunk lives), or when user space takes
the chunk's region out of the kernel (absorbed by a slow event, or dropped at an exit).
"""

from __future__ import annotations

import ctypes as ct
from typing import Any

from leaktrace.probes.bpf.addrspace import Origin
from leaktrace.probes.bpf.layout import Region, WindowEvent, WindowKey
from leaktrace.probes.bpf.origins import GrowthOrigins, origin_of


class KeptWindows:
    """The ``windows`` map of a loaded program (``attach``), read through libbcc's syscall wrappers; each window
    named by ``origins`` (its chunk's caller of malloc)."""

    def __init__(self, origins: GrowthOrigins) -> None:
        self.origins = origins
        self._fd = -1
        self._lib: Any = None
        self._named: dict[tuple[int, int], Origin] = {}  # (tgid, born) -> its chunk's origin, while it is held
        self._seen: dict[tuple[int, int], Origin] = {}  # those named in the scan under way
        self.scanned = 0  # windows read from the kernel and scanned

    def attach(self, prog: Any, lib: Any) -> None:
        self._fd = prog[b"windows"].map_fd
        self._lib = lib

    def close(self) -> None:
        self._fd = -1
        self._named.clear()
        self._seen.clear()

    def named(self, tgid: int, v: Region) -> Origin:
        """The origin of kernel region ``v`` (one with a kept window), its window left in the kernel: read and
        scanned once per chunk."""
        key = (tgid, v.born)
        o = self._named.get(key)
        if o is None:
            o = self._read(tgid, v, delete=False)
        self._seen[key] = o
        return o

    def end_scan(self) -> None:
        """A read of every kernel region is done: only the chunks it saw keep their names."""
        self._named, self._seen = self._seen, {}

    def take(self, tgid: int, v: Region) -> Origin:
        """The origin of region ``v``, which user space takes out of the kernel: its window goes with it."""
        o = self._named.pop((tgid, v.born), None)
        if o is None:
            return self._read(tgid, v, delete=True)
        self._delete(tgid, v.born)
        return o

    def discard(self, tgid: int, born: int) -> None:
        """The region born at ``born`` left the kernel unnamed (its process exited or exec'd): its window goes."""
        self._named.pop((tgid, born), None)
        self._delete(tgid, born)

    def _delete(self, tgid: int, born: int) -> None:
        if self._fd >= 0:
            key = WindowKey(tgid, 0, born)
            self._lib.bpf_delete_elem(self._fd, ct.byref(key))

    def _read(self, tgid: int, v: Region, delete: bool) -> Origin:
        """Scan the window kept for ``v``; the region's own call site (libc's) when there is none."""
        if self._fd < 0:
            return origin_of(v)
        key = WindowKey(tgid, 0, v.born)
        w = WindowEvent()
        read = self._lib.bpf_lookup_and_delete if delete else self._lib.bpf_lookup_elem
        if read(self._fd, ct.byref(key), ct.byref(w)) != 0:
            return origin_of(v)
        self.scanned += 1
        return self.origins.growth_origin(w, None)
