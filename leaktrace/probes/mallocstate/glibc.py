"""glibc malloc's own books, read from outside: how much of a process's heap is in use and how much is free
memory the allocator keeps (``/proc/PID/mem``; the target never stopped, no code run in it).

Where: ``main_arena`` and ``mp_`` are libc statics, and the members of ``struct malloc_state`` and ``struct
malloc_par`` lie where libc's debug information says (gdb over the file: Debian's libc6-dbg, found by build
id). What: every arena (``main_arena.next`` round to itself) — its ``system_mem`` (bytes taken from the
system), its top chunk, its fast bins and its regular bins (unsorted, small, large), walked chunk by chunk —
and ``mp_.mmapped_mem`` (chunks mmapped on their own). The figures are glibc's ``mallinfo2()``'s, computed as
it does (``int_mallinfo``): ``arena`` = Σ system_mem, ``fordblks`` = Σ (top + bins + fast bins) free,
``uordblks`` = arena − fordblks in use, ``hblkhd`` = mmapped. Chunks in the threads' tcaches count as in use,
as mallinfo2 counts them.

The lists are read while the process changes them (no lock is taken): a walk that leaves the arena or loops is
tried again from the list's head (LIST_TRIES), and one that still fails, or runs past MAX_CHUNKS, makes the read
say ``complete: False``.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Any

from leaktrace import procfs
from leaktrace.dwarf import dwarf_offsets
from leaktrace.errors import ProcessGone
from leaktrace.procmem import LIBC_RE, ProcMem, lib_path, load_bias

NBINS = 128
NFASTBINS = 10
MAX_ARENAS = 1024
MAX_CHUNKS = 50_000  # per read, all lists together: ~7 µs each
SIZE_MASK = ~0x7
MIN_CHUNK = 32
_EXPRS = (
    ("main_arena", "&main_arena"),
    ("mp", "&mp_"),
    ("state_size", "sizeof(struct malloc_state)"),
    ("fastbins", "&((struct malloc_state*)0)->fastbinsY"),
    ("top", "&((struct malloc_state*)0)->top"),
    ("bins", "&((struct malloc_state*)0)->bins"),
    ("next", "&((struct malloc_state*)0)->next"),
    ("system_mem", "&((struct malloc_state*)0)->system_mem"),
    ("mmapped_mem", "&((struct malloc_par*)0)->mmapped_mem"),
    ("chunk_fd", "&((struct malloc_chunk*)0)->fd"),
)


@dataclass(frozen=True)
class GlibcMalloc:
    """Where one process's glibc keeps its books: libc's path, its load bias and the layout's offsets."""

    libc: str
    bias: int
    offsets: dict[str, int]


def locate(pid: int) -> GlibcMalloc | str:
    """The process's glibc malloc, or why it cannot be read (a line for the report)."""
    maps = procfs.read_maps(pid)
    libc = lib_path(maps, LIBC_RE)
    if libc is None:
        return "no glibc mapped (a static binary, or another C library)"
    bias = load_bias(maps, libc)
    seen = f"{procfs.PROC}/{pid}/root{libc}"
    path = seen if os.path.exists(seen) else libc
    try:
        offsets = dwarf_offsets(path, os.stat(path).st_mtime_ns, _EXPRS)
    except OSError as e:
        raise ProcessGone(pid, "root") from e
    if bias is None:
        return f"{libc} is not mapped from its start"
    if offsets is None:
        return f"no debug information for {libc} (install libc6-dbg, or gdb): malloc's books cannot be read"
    return GlibcMalloc(libc, bias, offsets)


def read_malloc_state(pid: int, where: GlibcMalloc) -> dict[str, Any]:
    """mallinfo2()'s figures of a live process: ``arena``, ``fordblks`` (free, top and fast bins included),
    ``fsmblks`` (in fast bins), ``top`` (the top chunks), ``uordblks`` (in use), ``hblkhd`` (mmapped
    chunks), ``arenas``, ``free_chunks`` and ``complete`` (every list walked through)."""
    o = where.offsets
    out = {"arena": 0, "fordblks": 0, "fsmblks": 0, "top": 0, "hblkhd": 0, "arenas": 0, "free_chunks": 0,
           "complete": True}
    with ProcMem(pid) as procmem:
        mem = _Chunks(procmem, o["chunk_fd"])
        budget = [MAX_CHUNKS]
        main = where.bias + o["main_arena"]
        arena = main
        while out["arenas"] < MAX_ARENAS:
            raw = procmem.read(arena, o["state_size"])
            if not raw or len(raw) < o["state_size"]:
                out["complete"] = False
                break
            _arena(mem, arena, raw, o, out, budget)
            out["arenas"] += 1
            arena = struct.unpack_from("<Q", raw, o["next"])[0]
            if arena == main or arena == 0:
                break
        mmapped = mem.word(where.bias + o["mp"] + o["mmapped_mem"])
        if mmapped is None:
            out["complete"] = False
        else:
            out["hblkhd"] = mmapped
    out["uordblks"] = out["arena"] - out["fordblks"]
    return out


class _Chunks:
    """Reads of a chunk's header: its size word and the link after it (one pread of 16 bytes at chunk + 8:
    free chunks lie anywhere in the heap, so reading whole pages would read a page a chunk)."""

    def __init__(self, mem: ProcMem, fd_at: int) -> None:
        self.mem = mem
        self.fd_at = fd_at

    def word(self, addr: int) -> int | None:
        raw = self.mem.read(addr, 8)
        return struct.unpack("<Q", raw)[0] if raw and len(raw) == 8 else None

    def size_and_link(self, chunk: int) -> tuple[int, int] | None:
        if self.fd_at != 16:  # the layout this reads in one go: size at +8, fd at +16
            size, link = self.word(chunk + 8), self.word(chunk + self.fd_at)
            return None if size is None or link is None else (size & SIZE_MASK, link)
        raw = self.mem.read(chunk + 8, 16)
        if not raw or len(raw) < 16:
            return None
        size, link = struct.unpack("<QQ", raw)
        return size & SIZE_MASK, link


def _size(word: int | None) -> int | None:
    return None if word is None else word & SIZE_MASK


def _arena(mem: _Chunks, arena: int, raw: bytes, o: dict[str, int], out: dict[str, Any], budget: list[int]) -> None:
    system = struct.unpack_from("<Q", raw, o["system_mem"])[0]
    out["arena"] += system
    top = struct.unpack_from("<Q", raw, o["top"])[0]
    size = _size(mem.word(top + 8)) if top else 0
    if size is None:
        out["complete"] = False
    else:
        out["fordblks"] += size
        out["top"] += size
    fd_at = o["chunk_fd"]
    for i in range(NFASTBINS):
        at = o["fastbins"] + 8 * i
        walked = _list(mem, arena + at, struct.unpack_from("<Q", raw, at)[0], 0, fd_at, system, budget, True)
        if walked is None:
            out["complete"] = False
            continue
        out["fsmblks"] += walked[0]
        out["fordblks"] += walked[0]
        out["free_chunks"] += walked[1]
    for i in range(1, NBINS):
        # bin_at(av, i): a fake chunk whose fd/bk are bins[2(i-1)], bins[2(i-1)+1]
        at = o["bins"] + 16 * (i - 1)
        walked = _list(mem, arena + at, struct.unpack_from("<Q", raw, at)[0], arena + at - fd_at, fd_at, system,
                       budget, False)
        if walked is None:
            out["complete"] = False
            continue
        out["fordblks"] += walked[0]
        out["free_chunks"] += walked[1]


# A list that changed under its walk is walked again from its head, read anew: each list is then read whole
# at its own moment (a churner changes some list every few microseconds, a list of a few hundred chunks takes
# a millisecond to walk), and the sum is off by the few operations between the lists' moments.
LIST_TRIES = 4


def _list(mem: _Chunks, head_at: int, first: int, head: int, fd_at: int, system: int, budget: list[int],
          safe_linking: bool) -> tuple[int, int] | None:
    """(bytes, chunks) of one bin or fast bin, its first chunk ``first`` as the arena's snapshot holds it and
    ``head_at`` where the arena keeps it; None when every try met a list changing under it."""
    for attempt in range(LIST_TRIES):
        if attempt:
            first = mem.word(head_at)
            if first is None:
                return None
        walked = _walk(mem, first, head, fd_at, system, budget, safe_linking)
        if walked is not None or budget[0] <= 0:
            return walked
    return None


def _walk(mem: _Chunks, p: int, head: int, fd_at: int, system: int, budget: list[int],
          safe_linking: bool) -> tuple[int, int] | None:
    """(bytes, chunks) of the free chunks of one list, from ``p`` along fd links to ``head`` (0: a fast bin's
    end); None when the walk left the list (it changed under the read). A fast bin's links are stored xor-ed
    with their own address >> 12 (glibc 2.32's safe-linking)."""
    walked = chunks = 0
    seen: set[int] = set()
    while p != head:
        if p in seen or budget[0] <= 0 or not p:
            return None
        seen.add(p)
        budget[0] -= 1
        got = mem.size_and_link(p)
        if got is None:
            return None
        size, link = got
        if not MIN_CHUNK <= size <= system:  # a list changed under the read: not a chunk of this arena
            return None
        walked += size
        chunks += 1
        p = link ^ ((p + fd_at) >> 12) if safe_linking else link
    return walked, chunks
