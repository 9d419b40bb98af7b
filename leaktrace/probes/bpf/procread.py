"""The /proc reads the eBPF probe makes (through leaktrace.procfs), shaped for it: a process's maps as the
ledger's entries, its start_brk, whether a pid is a process."""

from __future__ import annotations

from leaktrace import procfs
from leaktrace.errors import AccessDenied, ProcessGone
from leaktrace.probes.bpf.symbolizer import MapEntry


def _read_maps(pid: int) -> list[MapEntry] | None:
    """/proc/PID/maps through procfs (only "\n" ends a line: file names keep \x0c, \u2028 ...); None when
    the process is gone or unreadable."""
    try:
        maps = procfs.read_maps(pid)
    except (ProcessGone, AccessDenied, procfs.ParseError, OSError):
        return None
    return [MapEntry(m.start, m.end, m.offset, m.perms, m.path) for m in maps]


def _start_brk(pid: int) -> int | None:
    try:
        return int(procfs.stat_field(procfs.read_proc_text(pid, "stat"), 47))  # start_brk
    except (ProcessGone, AccessDenied, OSError, ValueError):  # ValueError: procfs.ParseError too
        return None


def _is_process(pid: int) -> bool:
    """A process (its own thread group leader), not one more thread of another."""
    try:
        return procfs.status_int(procfs.read_status(pid), "Tgid") == pid
    except (ProcessGone, AccessDenied, OSError, ValueError):
        return False
