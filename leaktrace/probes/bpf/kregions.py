"""The kernel's regions of each process as user space reads them (:class:`KernelRegions`: machine-word columns),
and what reads them: a batch's lazy read, and the comparisons of one read with the last."""

from __future__ import annotations

import bisect
from array import array
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from leaktrace.probes.bpf.kernel import KernelSide


class KernelRegions:
    """The kernel-owned regions of one process, sorted by start, column-wise in machine-word arrays
    (``oids`` index the kernel side's interned origins; ``maxend[i]`` = max(ends[:i + 1]), for bisecting
    the first region that can overlap an address even if stale entries overlap; ``borns``: the seq of the
    mmap that made each, which an exact mremap keeps while it re-stamps ``seqs``)."""

    __slots__ = ("starts", "ends", "seqs", "oids", "maxend", "borns")

    def __init__(self, starts: array, ends: array, seqs: array, oids: array, maxend: array,
                 borns: array | None = None) -> None:
        self.starts, self.ends, self.seqs, self.oids, self.maxend = starts, ends, seqs, oids, maxend
        self.borns = seqs if borns is None else borns

    def __len__(self) -> int:
        return len(self.starts)

    def first_from(self, a: int) -> int:
        """Index of the first region whose end may lie above ``a``."""
        return bisect.bisect_right(self.maxend, a)


def _kept(col: array, keep: np.ndarray) -> array:
    """The entries of a machine-word column where ``keep`` is true, as a column of the same type."""
    out = array(col.typecode)
    out.frombytes(np.frombuffer(col, dtype=np.dtype(col.typecode))[keep].tobytes())
    return out


class LazyRegions:
    """The kernel's regions per tgid (:meth:`KernelSide.scan`) for one batch of events, read at the first look:
    a read is a pass over every region of every target, and a batch whose munmaps each remove one whole region
    (taken by its key: :meth:`KernelSide.take_exact`) and whose mmaps are plain needs none."""

    def __init__(self, side: KernelSide) -> None:
        self._side = side
        self._map: dict[int, KernelRegions] | None = None

    def get(self, tgid: int) -> KernelRegions | None:
        if self._map is None:
            self._map = self._side.scan()
        return self._map.get(tgid)


def _unseen(was: KernelRegions | None, kr: KernelRegions) -> list[int]:
    """Indexes of the regions of ``kr`` not in ``was`` with the same start and birth (both sorted by start)."""
    if was is None or not len(was):
        return list(range(len(kr)))
    ws, wq = np.frombuffer(was.starts, dtype=np.uint64), np.frombuffer(was.seqs, dtype=np.uint64)
    st, sq = np.frombuffer(kr.starts, dtype=np.uint64), np.frombuffer(kr.seqs, dtype=np.uint64)
    i = np.minimum(np.searchsorted(ws, st), len(ws) - 1)
    return np.flatnonzero((ws[i] != st) | (wq[i] != sq)).tolist()
