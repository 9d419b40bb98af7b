"""What gdb reads before it attaches: the ELF files a process maps with code, each at its load bias."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from leaktrace import procfs
from leaktrace.elf import first_load_vaddr
from leaktrace.errors import LeaktraceError
from leaktrace.sched import HUNT_NICE, helper_group

# gdb's priority while it reads symbols: spare CPU only. The read is a minute of a full core for a vLLM worker
# on 2 cores; at normal priority, even unattached, it stalls the traffic of a P/D pair serving beside it (the
# leaking worker grows nothing for ~40 s of a 66 s read).
SYMBOLS_NICE = 19
# The longest symbol read gdb is given (not attached meanwhile: the target runs untouched). A vLLM worker
# (torch's libraries) takes 50-70 s on 2 saturated cores.
SYMBOLS_TIMEOUT_S = 300.0
# At a call site, the largest library whose symbols gdb reads: a stack through torch's CPU library stops
# unwinding there rather than wait for its read (libtorch_cpu.so, 434 MB: 8.8 s and 550 MB of gdb idle, against
# 0.3 s for libc10.so); the frames that name the culprit lie inside it.
SITE_SYMBOLS_MAX_BYTES = 256 << 20


def symbol_files(pid: int) -> list[tuple[str, int]]:
    """(path, load bias) of each ELF file the process maps with code, but its executable (gdb reads that at
    the attach). The path is reached through /proc/PID/root when the process sees another filesystem."""
    try:
        maps = procfs.read_maps(pid)
        exe = procfs.exe_path(pid)
    except (LeaktraceError, OSError):
        return []
    code = {m.path for m in maps if "x" in m.perms and m.path.startswith("/") and m.path != exe}
    out = []
    for m in maps:
        if m.path in code and m.offset == 0:
            code.discard(m.path)
            path = m.path if _same_file(m.path, m.inode) else f"{procfs.PROC}/{pid}/root{m.path}"
            try:
                out.append((path, m.start - first_load_vaddr(path)))
            except (OSError, ValueError):
                continue
    return out


def site_symbol_files(pid: int, libraries: set[str]) -> list[tuple[str, int]]:
    """:func:`symbol_files` of the named libraries only (file names as mapped: those a call site's stack passes
    through), each up to SITE_SYMBOLS_MAX_BYTES."""
    out = []
    for path, bias in symbol_files(pid):
        if os.path.basename(path) in libraries:
            try:
                if os.path.getsize(path) <= SITE_SYMBOLS_MAX_BYTES:
                    out.append((path, bias))
            except OSError:
                continue
    return out


def _same_file(path: str, inode: int) -> bool:
    try:
        return os.stat(path).st_ino == inode
    except OSError:
        return False


@contextmanager
def symbols_niced(gdb_pid: int) -> Iterator[None]:
    """gdb at SYMBOLS_NICE for the read, then back to its own priority for sampling (its handler's speed
    is the target's pause), where that is permitted (root: CAP_SYS_NICE); kept niced otherwise."""
    try:
        before = os.getpriority(os.PRIO_PROCESS, gdb_pid)
        os.setpriority(os.PRIO_PROCESS, gdb_pid, SYMBOLS_NICE)
    except OSError:
        before = None
    try:
        yield
    finally:
        if before is not None:
            try:
                os.setpriority(os.PRIO_PROCESS, gdb_pid, before)
            except OSError:
                pass
        helper_group(gdb_pid, HUNT_NICE)  # sampling: the target stopped at a breakpoint waits for gdb
