"""The size of a SysV segment a target attached: the kernel half sends shmat's result address and the shmid
only (no BPF helper reaches the new mapping or the segment from a tracepoint under BCC).

/proc/sysvipc/shm gives the segment's own size by shmid while the segment exists: exactly what shmat mapped
(page-rounded), whatever the process did to the mapping since (the events after the attach are applied after it:
an extent read from /proc/PID/maps by then could already be cut by a later munmap or MAP_FIXED). That file lists
leaktrace's own IPC namespace only (a shmid of another namespace names another segment): for a process of
another namespace, the extent of the mapping at the attach address whose inode is the shmid ("/SYSV<key>
(deleted)" once IPC_RMID'd) answers, exact unless the process cut it before the read. When neither does, the
segment was destroyed before the read (IPC_RMID'd and detached everywhere: nothing of it is mapped any more): the
attach is left out and its shmdt, already in the ring, removes nothing, so the ledger stays exact. Such an attach
is "unsized" until its shmdt is seen; one never detached (the process ended first, or moved the mapping with
mremap) stays counted: the ledger's known inexactness. One /proc read per batch of events, only for batches that
attach segments.
"""

from __future__ import annotations

import os

from leaktrace import procfs
from leaktrace.errors import AccessDenied, ProcessGone
from leaktrace.procfs.parsers import Mapping


def _segment_extent(maps: list[Mapping], addr: int, shmid: int) -> int | None:
    """Bytes mapped from ``addr`` by the attach of segment ``shmid`` there: its mapping at ``addr`` and the
    ones that continue it (an mprotect of part of the segment splits it into several VMAs, each at its
    offset into the segment; a second attach of the same segment right above starts again at offset 0)."""
    end: int | None = None
    for m in maps:  # sorted by start
        if end is None and m.start == addr and m.inode == shmid and m.offset == 0:
            end = m.end
        elif end is not None:
            if m.start != end or m.inode != shmid or m.offset != m.start - addr:
                break
            end = m.end
    return None if end is None else end - addr


def read_sysvipc_sizes(text: str) -> dict[int, int]:
    """shmid -> size in bytes from /proc/sysvipc/shm (columns named by its header line)."""
    lines = text.splitlines()
    if not lines:
        return {}
    cols = lines[0].split()
    try:
        i_id, i_size = cols.index("shmid"), cols.index("size")
    except ValueError:
        return {}
    out: dict[int, int] = {}
    for line in lines[1:]:
        f = line.split()
        if len(f) > max(i_id, i_size) and f[i_id].isdigit() and f[i_size].isdigit():
            out[int(f[i_id])] = int(f[i_size])
    return out


def _same_ipc_namespace(pid: int) -> bool:
    """Does ``pid`` share our IPC namespace (so our /proc/sysvipc/shm lists its segments)?"""
    try:
        theirs = os.stat(f"{procfs.PROC}/{pid}/ns/ipc")
        ours = os.stat(f"{procfs.PROC}/self/ns/ipc")
    except OSError:
        return False  # gone, or not ours to read: do not guess
    return (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino)


class ShmSizer:
    """Sizes of attached segments, from /proc read once per process per batch (:meth:`new_batch`)."""

    def __init__(self) -> None:
        self._maps: dict[int, list[Mapping]] = {}
        self._ipc: dict[int, int] | None = None
        # (pid, address) -> attaches there whose size could not be read and whose shmdt is not seen yet
        self._unsized: dict[tuple[int, int], int] = {}
        self.unsized_total = 0  # every attach left unsized (most are detached at once: balanced)

    @property
    def unsized(self) -> int:
        """Attaches not in the ledger that may still be held: unsized, and not detached since."""
        return sum(self._unsized.values())

    def new_batch(self) -> None:
        self._maps.clear()
        self._ipc = None

    def size(self, pid: int, addr: int, shmid: int) -> int | None:
        """The bytes the attach mapped: the segment's size while it exists (the maps are read after the event,
        and what shows at ``addr`` by then may be cut by later calls, applied after this one), else its mapping's
        extent (a segment of another IPC namespace)."""
        n = self._ipc_sizes().get(shmid) if _same_ipc_namespace(pid) else None
        if n is None:
            maps = self._maps.get(pid)
            if maps is None:
                try:
                    maps = procfs.read_maps(pid)
                except (ProcessGone, AccessDenied, procfs.ParseError, OSError):
                    maps = []
                self._maps[pid] = maps
            n = _segment_extent(maps, addr, shmid)
        if not n:
            self._unsized[(pid, addr)] = self._unsized.get((pid, addr), 0) + 1
            self.unsized_total += 1
            return None
        return n

    def detached(self, pid: int, addr: int) -> None:
        """A shmdt: an unsized attach there is balanced (it held nothing the ledger misses)."""
        left = self._unsized.pop((pid, addr), 0) - 1
        if left > 0:
            self._unsized[(pid, addr)] = left

    def forget(self, pid: int) -> None:
        """The process exited or exec'd: its attachments are released, sized or not."""
        for key in [k for k in self._unsized if k[0] == pid]:
            del self._unsized[key]

    def _ipc_sizes(self) -> dict[int, int]:
        if self._ipc is None:
            try:
                with open(f"{procfs.PROC}/sysvipc/shm") as f:
                    self._ipc = read_sysvipc_sizes(f.read())
            except OSError:
                self._ipc = {}
        return self._ipc
