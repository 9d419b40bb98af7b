"""What gdb reads before it attaches: the ELF files a process maps with code, each at its load bias."""

from __future__ import annotations

import os

from leaktrace import procfs
from leaktrace.elf import first_load_vaddr
from leaktrace.errors import LeaktraceError

# The longest symbol read gdb is given (not attached meanwhile: the target runs untouched). 50-70 s seen for a
# vLLM worker (torch's libraries) on 2 saturated cores.
SYMBOLS_TIMEOUT_S = 300.0


def symbol_files(pid: int) -> list[tuple[str, int]]:
    """(path, load bias) of each ELF file the process maps with code, but its executable (gdb reads that at
    the attach). The path is reached through /proc/PID/root when the process sees another filesystem."""
    try:
        maps = procfs.read_maps(pid)
        exe = os.readlink(f"/proc/{pid}/exe")
    except (LeaktraceError, OSError):
        return []
    code = {m.path for m in maps if "x" in m.perms and m.path.startswith("/") and m.path != exe}
    out = []
    for m in maps:
        if m.path in code and m.offset == 0:
            code.discard(m.path)
            path = m.path if _same_file(m.path, m.inode) else f"/proc/{pid}/root{m.path}"
            try:
                out.append((path, m.start - first_load_vaddr(path)))
            except (OSError, ValueError):
                continue
    return out


def _same_file(path: str, inode: int) -> bool:
    try:
        return os.stat(path).st_ino == inode
    except OSError:
        return False
