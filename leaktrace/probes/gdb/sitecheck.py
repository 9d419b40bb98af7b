"""The last guard against a breakpoint outliving gdb: after gdb is gone, the target's code at the call site and
in the dynamic linker is its files' again.

gdb deletes its call-site breakpoint before it detaches, and removes what it inserted (its own breakpoints in
ld.so, which track dlopen) when it exits attached; only a gdb killed outright (SIGKILL, the OOM killer) leaves
its int3s behind, and the target dies of SIGTRAP at the next hit (the site's next call, the next dlopen). Each
is put back from the mapped file through /proc/PID/mem, as a debugger writes it.
"""

from __future__ import annotations

import os

from leaktrace import procfs
from leaktrace.errors import LeaktraceError
from leaktrace.procmem import ProcMem

INT3 = 0xCC
DYNAMIC_LINKER = "ld-linux"  # gdb's shared-library event breakpoints live in its code


def restore_breakpoints(pid: int, site: int = 0) -> int:
    """Put back the file's bytes where an int3 sits instead, at ``site`` and in the dynamic linker's code; the
    number of bytes put back."""
    try:
        maps = [m for m in procfs.read_maps(pid) if "x" in m.perms and m.path.startswith("/")]
    except LeaktraceError:
        return 0
    spans = [(site, site + 1, m) for m in maps if site and m.start <= site < m.end]
    spans += [(m.start, m.end, m) for m in maps if os.path.basename(m.path).startswith(DYNAMIC_LINKER)]
    restored = 0
    try:
        with ProcMem(pid, writable=True) as mem:
            for lo, hi, m in spans:
                with open(m.path, "rb") as f:
                    f.seek(lo - m.start + m.offset)
                    want = f.read(hi - lo)
                got = mem.read(lo, len(want)) or b""
                for i, (a, b) in enumerate(zip(got, want, strict=False)):
                    if a == INT3 and b != INT3:
                        restored += mem.write(lo + i, bytes([b]))
    except (OSError, LeaktraceError):
        pass
    return restored
