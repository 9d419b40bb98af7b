"""The daemon's own malloc settings: a process that runs for weeks on every node must give back what its
transient reads allocate."""

from __future__ import annotations

import contextlib
import ctypes

# glibc's malloc raises its mmap threshold (to 32 MiB) after a large block is freed, and its trim threshold with
# it: the transient buffers of a process's first reads (smaps of thousands of mappings, a library's symbol
# tables) then stay in the heap, free, for the life of the daemon (~60 MB once a torch worker is traced). A
# fixed threshold keeps blocks from 128 KiB up in their own mappings, returned when freed.
MMAP_THRESHOLD = 128 << 10
M_MMAP_THRESHOLD = -3  # malloc.h


def fix_mmap_threshold() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
