"""Memory a process holds by file descriptor without mapping it: memfds, POSIX shared memory (/dev/shm) and
dma-bufs kept open. Their pages are allocated until the last descriptor closes (and a /dev/shm file is
unlinked), yet none of it shows in the process's RSS: only the host's Shmem grows. How CUDA IPC handles
and shared KV-staging buffers keep memory.

:func:`held_kind` classifies a descriptor's link (pure); :func:`read_held_files` lists a live process's
held files: one per file (several descriptors of one file count once), without those it also maps
(mapped memory is counted in RSS already).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from leaktrace import procfs
from leaktrace.errors import AccessDenied, ProcessGone

# The descriptor links that name memory rather than a file on a disk.
_PREFIXES = (("/memfd:", "memfd"), ("/dev/shm/", "shm"), ("/dmabuf:", "dmabuf"), ("anon_inode:dmabuf", "dmabuf"))


@dataclass(frozen=True)
class HeldFile:
    kind: str  # memfd | shm | dmabuf
    name: str  # the descriptor's link, as /proc shows it ("/memfd:staging (deleted)")
    inode: int
    bytes: int  # memory it holds: allocated blocks (a dma-buf: its size)


def held_kind(link: str) -> str | None:
    """What memory a descriptor's link names (memfd, shm, dmabuf), or None for anything else."""
    for prefix, kind in _PREFIXES:
        if link.startswith(prefix):
            return kind
    return None


def read_held_files(pid: int, mapped_inodes: set[int] | None = None) -> list[HeldFile]:
    """The memory-backed files ``pid`` holds open and does not map (``mapped_inodes``: the inodes its maps
    name, read now when not given). A descriptor closed while the list is read is skipped; the process gone
    raises ProcessGone."""
    base = f"{procfs.PROC}/{pid}/fd"
    try:
        fds = os.listdir(base)
    except FileNotFoundError as e:
        raise ProcessGone(pid, "fd") from e
    except PermissionError as e:
        raise AccessDenied(pid, f"/proc/{pid}/fd") from e
    links: list[tuple[str, str, str]] = []
    for fd in fds:
        try:
            link = os.readlink(f"{base}/{fd}")
        except OSError:
            continue  # closed meanwhile
        kind = held_kind(link)
        if kind is not None:
            links.append((fd, link, kind))
    if not links:
        return []
    if mapped_inodes is None:
        mapped_inodes = procfs.read_mapped_inodes(pid)
    seen: set[int] = set()
    out: list[HeldFile] = []
    for fd, link, kind in links:
        try:
            st = os.stat(f"{base}/{fd}")
        except OSError:
            continue  # closed meanwhile
        if st.st_ino in seen or st.st_ino in mapped_inodes:
            continue
        seen.add(st.st_ino)
        size = st.st_blocks * 512 if kind != "dmabuf" else max(st.st_size, st.st_blocks * 512)
        out.append(HeldFile(kind, link, st.st_ino, size))
    return out
