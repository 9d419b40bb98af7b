"""What of the ledger's outstanding intervals is resident: the pages present in RAM, read from
``/proc/PID/pagemap`` (leaktrace.procfs.pagemap) at the instant of a snapshot.

The ledger counts address space (what a process mapped and still maps); RAM is what it touched. A thread
stack keeps 8 MiB mapped and a few hundred KiB resident; a journal grown by mremap is resident as far as it
was written. Both figures go into the session: ``resident_bytes`` of each ``ledger_snapshots`` row and
``resident`` of each ``ledger_regions`` row, null where it could not be read (the process gone, or a tick
whose intervals exceed the per-tick bound: the analysis then takes the last known figure).

Cost (pagemap walks the page tables): about 2.5 ms per GiB of address space and 4 us per interval on a
2-core box. A tick reads at most :data:`TICK_MAX_BYTES` of address space and :data:`TICK_MAX_RANGES`
intervals per process; the final snapshot and the regions at stop read everything once.
"""

from __future__ import annotations

from array import array

import numpy as np

from leaktrace.errors import AccessDenied, ProcessGone
from leaktrace.probes.bpf.addrspace import Origin
from leaktrace.procfs.pagemap import Pagemap

TICK_MAX_BYTES = 16 << 30  # ~40 ms of page-table walk
TICK_MAX_RANGES = 10_000  # ~40 ms of preads


def counted_ids(origins: list[Origin]) -> np.ndarray:
    """Per origin id: whether a snapshot counts it (mapped since attach, not a PROT_NONE reservation)."""
    return np.fromiter((o.counted for o in origins), dtype=bool, count=len(origins))


def resident_by_origin(pid: int, starts: array, ends: array, oids: array, origins: list[Origin],
                       bounded: bool = True) -> dict[int, int] | None:
    """Resident bytes per origin id of the counted intervals of one process (columns as the ledger keeps
    them); None when they cannot be read now (gone, not ours) or, ``bounded``, exceed a tick's bound."""
    if not len(oids):
        return {}
    ids = np.frombuffer(oids, dtype=np.uint32)
    lo = np.frombuffer(starts, dtype=np.uint64)
    hi = np.frombuffer(ends, dtype=np.uint64)
    keep = counted_ids(origins)[ids]
    ids, lo, hi = ids[keep], lo[keep], hi[keep]
    if not len(ids):
        return {}
    if bounded and (len(ids) > TICK_MAX_RANGES or int((hi - lo).sum()) > TICK_MAX_BYTES):
        return None
    out: dict[int, int] = {}
    try:
        with Pagemap(pid) as pm:
            for k, a, b in zip(ids.tolist(), lo.tolist(), hi.tolist(), strict=True):
                out[k] = out.get(k, 0) + pm.resident(a, b)
    except (ProcessGone, AccessDenied):
        return None
    return out


class RegionResidency:
    """Resident bytes of regions one at a time, any process: one pagemap descriptor per process, kept
    open until :meth:`close`; None for a process that is gone (or not ours to read)."""

    def __init__(self) -> None:
        self._open: dict[int, Pagemap | None] = {}

    def of(self, pid: int, start: int, end: int) -> int | None:
        if pid not in self._open:
            try:
                self._open[pid] = Pagemap(pid)
            except (ProcessGone, AccessDenied):
                self._open[pid] = None
        pm = self._open[pid]
        if pm is None:
            return None
        try:
            return pm.resident(start, end)
        except (ProcessGone, AccessDenied):
            pm.close()
            self._open[pid] = None
            return None

    def close(self) -> None:
        for pm in self._open.values():
            if pm is not None:
                pm.close()
        self._open.clear()
