"""The compiler's memory, handed back once the program is loaded.

BCC compiles the program with clang and LLVM inside this process: their code pages (libLLVM, libclang-cpp,
libbcc: ~80 MB read in) and the compile's heap (~20 MB left free in malloc's arenas) are not used again once
the program is loaded, yet all of it would stay in the process's RSS for its life — weeks, for a watch on
every node of a fleet. After the load, those libraries' pages are advised out (MADV_PAGEOUT: a reclaim hint
that discards nothing — clean file pages are dropped and read back if ever needed, written ones stay) and
malloc gives its free memory back to the kernel (malloc_trim).
"""

from __future__ import annotations

import ctypes
import re

from leaktrace.procfs import PAGE_SIZE, parse_maps

MADV_PAGEOUT = 21  # linux/mman.h, since 5.4; older kernels answer EINVAL and nothing changes
COMPILER_LIBS = re.compile(r"/lib(LLVM|clang-cpp|clang|bcc)[-.][^/]*$")


def release_compiler_memory() -> int:
    """Advise out the compiler's libraries and trim malloc; the bytes this process's RSS fell by (0 when it
    did not, or the kernel would not)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        with open("/proc/self/maps", encoding="utf-8", errors="surrogateescape") as f:
            maps = parse_maps(f.read())  # this process's own: never a recorded /proc
        before = _resident()
    except OSError:
        return 0
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for m in maps:
        if COMPILER_LIBS.search(m.path):
            libc.madvise(m.start, m.end - m.start, MADV_PAGEOUT)
    libc.malloc_trim(0)
    try:
        return max(0, before - _resident())
    except OSError:
        return 0


def _resident() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE_SIZE
