"""The one place that decides a mapping's memory class.

Classes: heap, arena, anon, stack, shm, file, lib, driver, special, other.
"""

from __future__ import annotations

import re

CLASSES = ("heap", "arena", "anon", "stack", "shm", "file", "lib", "driver", "special", "other")

_LIB_RE = re.compile(r"\.so(\.[0-9.]+)?( \(deleted\))?$|\.so[.-]")
_DRIVER_PREFIXES = ("/dev/nvidia", "/dev/infiniband", "/dev/dri", "/dev/kfd", "/dev/accel", "/dev/hugepages", "/dev/uverbs", "/dev/gdrdrv", "/dev/xpmem", "/dev/knem", "anon_inode:")
_SPECIAL = {"[vdso]", "[vvar]", "[vsyscall]", "[vvar_vclock]", "[uprobes]"}
# The culprit kind of each memory class.
KIND_OF_CLASS = {"anon": "native-mmap", "arena": "malloc-heap", "heap": "malloc-heap", "shm": "shm",
                 "file": "file", "driver": "other", "stack": "other", "lib": "file", "other": "other"}
# Allocators preloaded or linked in glibc malloc's place: malloc itself, whoever calls it.
ALLOCATOR_LIBRARIES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("jemalloc", re.compile(r"^libjemalloc[.-]")),
    ("tcmalloc", re.compile(r"^libtcmalloc(_minimal)?(_debug)?[.-]")),
    ("mimalloc", re.compile(r"^libmimalloc[.-]")),
)
ALLOCATOR_LIBRARY = re.compile("|".join(p.pattern for _, p in ALLOCATOR_LIBRARIES))
# The C runtime, the dynamic loader and an allocator in malloc's place: never "the library that allocated"
# (malloc, mmap, brk wrappers).
LIBC_LIBRARY = re.compile(r"^(libc|libpthread|ld-linux)[.-]|" + ALLOCATOR_LIBRARY.pattern)
# A library that replaces mmap & co. in the whole process (UCX's memory hooks, libucm, hashed in wheels): on the
# path of every mmap, sbrk and munmap of a hooked process, so its frames say nothing about who keeps memory.
MEMORY_HOOK_LIBRARY = re.compile(r"^libucm(-[0-9a-f]{8})?\.so")
_ARENA_ALIGN = 64 << 20  # glibc HEAP_MAX_SIZE on 64-bit: arenas are 64 MiB-aligned reservations


def is_shm(path: str) -> bool:
    return (
        path.startswith("/dev/shm/")
        or path.startswith("/SYSV")
        or path.startswith("/memfd:")
        or path.startswith("memfd:")
        or path.startswith("/run/shm/")
        # MAP_SHARED|MAP_ANONYMOUS memory shows as the deleted /dev/zero it is backed by.
        or path.startswith("/dev/zero")
    )


def classify(path: str, perms: str, start: int = 0, end: int = 0, arena_starts: frozenset[int] | set[int] = frozenset()) -> str:
    """Class of one mapping. ``arena_starts`` are addresses of 64 MiB-aligned anon reservations
    (see :func:`arena_bases`); the ``---p`` tail of an arena and its ``rw-p`` head both count as arena."""
    if path == "[heap]":
        return "heap"
    if path.startswith("[stack"):
        return "stack"
    if path in _SPECIAL:
        return "special"
    if is_shm(path):
        return "shm"
    if path.startswith(_DRIVER_PREFIXES):
        return "driver"
    if path == "" or path.startswith("[anon"):
        if arena_starts and _arena_base(start) in arena_starts:
            return "arena"
        return "anon"
    if path.startswith("["):
        return "other"
    name = path.rsplit("/", 1)[-1]
    if _LIB_RE.search(name) or "x" in perms and path.startswith("/"):
        return "lib"
    return "file"


def _arena_base(addr: int) -> int:
    return addr & ~(_ARENA_ALIGN - 1)


def arena_bases(mappings: list) -> frozenset[int]:
    """glibc non-main arenas: an anonymous rw mapping starting at a 64 MiB boundary, immediately
    followed (or itself followed within the same 64 MiB) by an anonymous ``---p`` reservation.
    The heuristic is the one pmap readers use; it never claims file mappings."""
    bases: set[int] = set()
    anon = [m for m in mappings if m.path == "" or m.path.startswith("[anon:glibc")]
    by_start = {m.start: m for m in anon}
    for m in anon:
        if m.start % _ARENA_ALIGN != 0 or "rw" not in m.perms[:2]:
            continue
        nxt = by_start.get(m.end)
        if (nxt is not None and nxt.perms.startswith("---") and nxt.end - m.start <= _ARENA_ALIGN) or m.size == _ARENA_ALIGN:
            bases.add(m.start)
        if m.path.startswith("[anon:glibc"):
            bases.add(_arena_base(m.start))
    return frozenset(bases)


def classify_all(mappings: list) -> list[str]:
    bases = arena_bases(mappings)
    return [classify(m.path, m.perms, m.start, m.end, bases) for m in mappings]
