"""A BPF hash map read whole with BPF_MAP_LOOKUP_BATCH into buffers kept between reads.

BCC's ``items_lookup_batch`` makes (and zeroes) room for the map's every possible entry on each call: for the
regions map, 262,144 keys and values, ~16 MB, read four times a second by a probe whose drains need the
kernel's regions. That allocation was three quarters of a watch's CPU over one traced torch worker. Here the
buffers start small, double while a read fills them, and are kept: a read costs what the map holds.
"""

from __future__ import annotations

import ctypes as ct
import errno
import os
from collections.abc import Iterator
from typing import Any

FIRST_CAPACITY = 4096  # entries: a process's few thousand kernel-owned regions in one call


class BatchReader:
    """Every (key, value) of ``table`` (a BCC hash table) as of one read, in the kernel's bucket order. The
    pairs are views of the reader's buffers: valid until its next :meth:`items`."""

    def __init__(self, table: Any, lib: Any) -> None:
        self.table, self.lib = table, lib
        self._cap = 0
        self._keys: Any = None
        self._values: Any = None

    def _grow(self, total: int) -> None:
        cap = max(FIRST_CAPACITY, 2 * self._cap)
        cap = min(cap, self.table.max_entries)
        keys, values = (self.table.Key * cap)(), (self.table.Leaf * cap)()
        if total:
            ct.memmove(keys, self._keys, ct.sizeof(self.table.Key) * total)
            ct.memmove(values, self._values, ct.sizeof(self.table.Leaf) * total)
        self._cap, self._keys, self._values = cap, keys, values

    def items(self) -> Iterator[tuple[Any, Any]]:
        """Raises OSError when the kernel refuses the batch read (kernels before 5.6 lack it)."""
        if self._keys is None:
            self._grow(0)
        ksize, vsize = ct.sizeof(self.table.Key), ct.sizeof(self.table.Leaf)
        cursor, total = ct.c_uint32(0), 0
        while True:
            count = ct.c_uint32(self._cap - total)
            res = self.lib.bpf_lookup_batch(self.table.map_fd, ct.byref(cursor) if total else None,
                                            ct.byref(cursor), ct.byref(self._keys, ksize * total),
                                            ct.byref(self._values, vsize * total), ct.byref(count))
            err = ct.get_errno()
            total += count.value
            if res != 0:
                if err == errno.ENOSPC and self._cap < self.table.max_entries:
                    self._grow(total)  # a bucket larger than the room left: read again from it, with more room
                    continue
                if err != errno.ENOENT:  # ENOENT: the last bucket was read
                    raise OSError(err, f"BPF_MAP_LOOKUP_BATCH: {os.strerror(err)}")
                break
            if total < self._cap and count.value == 0:
                break  # no progress (a bucket grew past the room left while read): what was read stands
            if total == self._cap:
                if self._cap >= self.table.max_entries:
                    break
                self._grow(total)
        keys, values = self._keys, self._values
        for i in range(total):
            yield keys[i], values[i]
