"""Resident pages of address ranges of another process, exact: ``/proc/PID/pagemap``.

pagemap holds one little-endian u64 per virtual page: bit 63 set when the page is present in RAM, bit 62
when it is swapped out (Documentation/admin-guide/mm/pagemap.rst). Reading it as root walks the page
tables without stopping the process. A range that is not mapped reads as zeros (not present).

:func:`count_present` is the pure decoder (testable on recorded bytes); :class:`Pagemap` reads ranges of
one process (one descriptor, one ``pread`` per range), and :func:`resident_bytes` is the one-shot form.
A process that is gone raises :class:`ProcessGone`, one not ours to read :class:`AccessDenied`.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable

import numpy as np

from leaktrace import procfs
from leaktrace.errors import AccessDenied, ProcessGone

PRESENT = np.uint64(1 << 63)
SWAPPED = np.uint64(1 << 62)
ENTRY = 8  # bytes of pagemap per page
CHUNK_PAGES = 1 << 18  # pages read per pread: 2 MiB of pagemap, 1 GiB of address space


def count_present(raw: bytes) -> tuple[int, int]:
    """(present pages, swapped pages) in a run of pagemap entries (a trailing partial entry is ignored)."""
    n = len(raw) // ENTRY
    if not n:
        return 0, 0
    words = np.frombuffer(raw, dtype="<u8", count=n)
    return int(np.count_nonzero(words & PRESENT)), int(np.count_nonzero(words & SWAPPED))


class Pagemap:
    """``/proc/PID/pagemap`` of one process, open: :meth:`resident` per range."""

    def __init__(self, pid: int, proc: str | None = None) -> None:
        self.pid = pid
        self.page = procfs.PAGE_SIZE
        path = f"{proc or procfs.PROC}/{pid}/pagemap"
        try:
            self.fd = os.open(path, os.O_RDONLY)
        except (FileNotFoundError, ProcessLookupError) as e:
            raise ProcessGone(pid, "pagemap") from e
        except PermissionError as e:
            raise AccessDenied(pid, f"/proc/{pid}/pagemap") from e

    def resident(self, start: int, end: int) -> int:
        """Bytes of [start, end) present in RAM now (swapped pages are not resident)."""
        first, last = start // self.page, (end + self.page - 1) // self.page
        present = 0
        while first < last:
            n = min(CHUNK_PAGES, last - first)
            try:
                raw = os.pread(self.fd, n * ENTRY, first * ENTRY)
            except OSError as e:
                # the mm is gone (exit) while the file stays open: ESRCH, or a read of nothing
                if e.errno in (errno.ESRCH, errno.ENOENT, errno.EIO):
                    raise ProcessGone(self.pid, "pagemap") from e
                raise
            if not raw:
                raise ProcessGone(self.pid, "pagemap")
            present += count_present(raw)[0]
            first += len(raw) // ENTRY
        return present * self.page

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> Pagemap:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def resident_bytes(pid: int, ranges: Iterable[tuple[int, int]]) -> list[int]:
    """The resident bytes of each of ``ranges`` ((start, end) of ``pid``), read at one instant."""
    with Pagemap(pid) as pm:
        return [pm.resident(a, b) for a, b in ranges]
