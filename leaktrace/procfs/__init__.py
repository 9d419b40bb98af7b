"""Race-aware /proc readers (the pure parsers are in procfs/parsers.py, re-exported here): the one home of
reads of another process's /proc files and of the process tree (a process's memory: leaktrace.procmem).

Every reader turns "the process is gone" into :class:`ProcessGone` and "not allowed" into
:class:`AccessDenied`; parsers are pure functions over text so they can be tested on recorded files. Every
path is under :data:`PROC` (``LEAKTRACE_PROC``, for tests on a recorded /proc), psutil's reads included.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable, Iterator
from collections.abc import Mapping as MappingOf

import psutil

from leaktrace.errors import AccessDenied, NoSuchProcess, ProcessGone
from leaktrace.procfs.parsers import (
    Mapping,
    ParseError,
    mapped_inodes,
    parse_cmdline,
    parse_environ,
    parse_maps,
    parse_maps_line,
    parse_smaps,
    parse_smaps_compact,
    parse_smaps_rollup,
    parse_stat,
    parse_status,
    stat_field,
    status_int,
    status_kb,
)
from leaktrace.redact import redact_cmdline, redact_environ

__all__ = [
    "Mapping",
    "PAGE_SIZE",
    "PROC",
    "ParseError",
    "ancestors",
    "children_map",
    "exe_path",
    "is_alive",
    "iter_pids",
    "mapped_inodes",
    "parse_cmdline",
    "parse_environ",
    "parse_maps",
    "parse_maps_line",
    "parse_smaps",
    "parse_smaps_compact",
    "parse_smaps_rollup",
    "parse_stat",
    "parse_status",
    "pid_exists",
    "process_stats",
    "process_tree",
    "read_cmdline",
    "read_comm",
    "read_environ",
    "read_maps",
    "read_mapped_inodes",
    "read_owner_uid",
    "read_proc_bytes",
    "read_proc_text",
    "read_self_status",
    "read_smaps",
    "read_smaps_rollup",
    "read_statm",
    "read_stat",
    "read_status",
    "read_task_states",
    "read_sysctl",
    "require_pid",
    "stat_field",
    "status_int",
    "status_kb",
    "walk_tree",
]

PROC = os.environ.get("LEAKTRACE_PROC", "/proc")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
psutil.PROCFS_PATH = PROC  # psutil reads where the rest of leaktrace does


# ----------------------------------------------------------------------------- reading

def read_proc_bytes(pid: int, name: str) -> bytes:
    path = f"{PROC}/{pid}/{name}"
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError as e:
        raise ProcessGone(pid, name) from e
    except ProcessLookupError as e:  # ESRCH from a zombie's smaps
        raise ProcessGone(pid, name) from e
    except PermissionError as e:
        raise AccessDenied(pid, f"/proc/{pid}/{name}") from e
    except OSError as e:
        if e.errno in (errno.ESRCH, errno.ENOENT):
            raise ProcessGone(pid, name) from e
        if e.errno in (errno.EACCES, errno.EPERM):
            raise AccessDenied(pid, f"/proc/{pid}/{name}") from e
        raise


def read_proc_text(pid: int, name: str) -> str:
    # Mapping names may hold any bytes; surrogateescape keeps them round-trippable.
    return read_proc_bytes(pid, name).decode("utf-8", "surrogateescape")


def pid_exists(pid: int) -> bool:
    return os.path.exists(f"{PROC}/{pid}")


def require_pid(pid: int) -> None:
    if pid <= 0 or not pid_exists(pid):
        raise NoSuchProcess(pid)


# ----------------------------------------------------------------------------- per-pid wrappers

def read_maps(pid: int) -> list[Mapping]:
    return parse_maps(read_proc_text(pid, "maps"))


def read_mapped_inodes(pid: int) -> set[int]:
    return mapped_inodes(read_proc_text(pid, "maps"))


def read_smaps(pid: int) -> list[Mapping]:
    text = read_proc_text(pid, "smaps")
    if not text:
        # Only a process without an address space (zombie, kernel thread) has an empty smaps.
        raise ProcessGone(pid, "smaps")
    return parse_smaps(text)


def read_smaps_rollup(pid: int) -> dict[str, int]:
    text = read_proc_text(pid, "smaps_rollup")
    if not text.strip():
        # A zombie or a kernel thread has no mm: treat as gone for memory purposes.
        raise ProcessGone(pid, "smaps_rollup")
    return parse_smaps_rollup(text)


def read_statm(pid: int) -> tuple[int, int, int]:
    """(mapped, resident, shared) bytes of /proc/PID/statm: counters the kernel keeps, so the read neither walks
    the mappings nor takes the address space's lock (smaps_rollup does both: seconds on a loaded node whose
    target maps and unmaps all the time)."""
    text = read_proc_text(pid, "statm")
    if not text.strip():
        raise ProcessGone(pid, "statm")
    try:
        size, resident, shared = (int(v) * PAGE_SIZE for v in text.split()[:3])
    except ValueError as e:
        raise ParseError(f"/proc/{pid}/statm: {text[:80]!r}") from e
    return size, resident, shared


def read_status(pid: int) -> dict[str, str]:
    return parse_status(read_proc_text(pid, "status"))


def read_stat(pid: int) -> dict[str, object]:
    return parse_stat(read_proc_text(pid, "stat"))


def read_task_states(pid: int) -> dict[int, str]:
    """The state letter of each thread of ``pid`` (R, S, D, T, t…), from /proc/PID/task/TID/stat. A thread
    that ends while they are read is left out; the process gone raises ProcessGone."""
    try:
        tids = [int(t) for t in os.listdir(f"{PROC}/{pid}/task") if t.isdigit()]
    except FileNotFoundError as e:
        raise ProcessGone(pid, "task") from e
    except PermissionError as e:
        raise AccessDenied(pid, f"/proc/{pid}/task") from e
    out = {}
    for tid in tids:
        try:
            out[tid] = str(parse_stat(read_proc_text(pid, f"task/{tid}/stat"))["state"])
        except ProcessGone:
            continue
    return out


def read_self_status() -> dict[str, str]:
    """/proc/self/status: this process's own (its capabilities). An unreadable /proc raises OSError."""
    with open(f"{PROC}/self/status", encoding="utf-8", errors="surrogateescape") as f:
        return parse_status(f.read())


def read_owner_uid(pid: int) -> int:
    """The owner of /proc/PID: the process's effective uid (root for a non-dumpable process)."""
    try:
        return os.stat(f"{PROC}/{pid}").st_uid
    except FileNotFoundError as e:
        raise ProcessGone(pid) from e
    except PermissionError as e:
        raise AccessDenied(pid, f"/proc/{pid}") from e


def read_sysctl(name: str) -> str | None:
    """The first line of /proc/sys/NAME (``kernel/yama/ptrace_scope``), stripped; None when unreadable."""
    try:
        with open(f"{PROC}/sys/{name}", encoding="utf-8", errors="surrogateescape") as f:
            return f.readline().strip()
    except OSError:
        return None


def read_environ(pid: int, redact: bool = True) -> dict[str, str]:
    env = parse_environ(read_proc_bytes(pid, "environ"))
    return redact_environ(env) if redact else env


def read_cmdline(pid: int, redact: bool = True) -> list[str]:
    argv = parse_cmdline(read_proc_bytes(pid, "cmdline"))
    return redact_cmdline(argv) if redact else argv


def read_comm(pid: int) -> str:
    return read_proc_text(pid, "comm").strip()


def exe_path(pid: int) -> str:
    """The executable's path ("" when the kernel does not say: a zombie, a kernel thread). psutil's reader:
    it knows /proc/PID/exe's quirks (a " (deleted)" suffix, a zombie's ENOENT)."""
    try:
        return psutil.Process(pid).exe()
    except psutil.NoSuchProcess as e:
        raise ProcessGone(pid, "exe") from e
    except psutil.AccessDenied as e:
        raise AccessDenied(pid, f"/proc/{pid}/exe") from e


def is_alive(pid: int) -> bool:
    """``pid`` exists and is not a zombie (psutil's status)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def iter_pids() -> Iterator[int]:
    for name in os.listdir(PROC):
        if name.isdigit():
            yield int(name)


def process_stats() -> dict[int, dict[str, object]]:
    """pid → its parsed /proc/PID/stat, for every live process readable now (one pass over /proc, races
    tolerated): what children_map and process_tree derive from, for a caller that needs several."""
    out: dict[int, dict[str, object]] = {}
    for pid in iter_pids():
        try:
            out[pid] = read_stat(pid)
        except (ProcessGone, AccessDenied, ParseError, IndexError, ValueError):
            continue
    return out


def children_map(stats: dict[int, dict[str, object]] | None = None) -> dict[int, list[int]]:
    """ppid → [pid] for every live process (``stats``: a :func:`process_stats` already read, else read now)."""
    out: dict[int, list[int]] = {}
    for pid, st in (process_stats() if stats is None else stats).items():
        out.setdefault(int(st["ppid"]), []).append(pid)  # type: ignore[call-overload]
    return out


def walk_tree(roots: Iterable[int], kids: MappingOf[int, list[int]]) -> list[int]:
    """``roots`` and all their descendants in ``kids`` (ppid → [pid], as :func:`children_map` gives), each
    once, depth first."""
    out: dict[int, None] = {}
    stack = list(roots)
    while stack:
        pid = stack.pop()
        if pid in out:
            continue
        out[pid] = None
        stack.extend(kids.get(pid, []))
    return list(out)


def process_tree(roots: list[int], stats: dict[int, dict[str, object]] | None = None) -> dict[int, int]:
    """Every live process in the trees rooted at ``roots``: {pid: ppid} (``stats`` as for children_map)."""
    stats = process_stats() if stats is None else stats
    tree = walk_tree([r for r in roots if r in stats], children_map(stats))
    return {pid: int(stats[pid]["ppid"]) for pid in tree}  # type: ignore[call-overload]


def ancestors(pid: int) -> set[int]:
    """``pid`` and its ancestors up to (not including) init, read now; those whose stat cannot be read end
    the chain."""
    out: set[int] = set()
    while pid > 1 and pid not in out:
        out.add(pid)
        try:
            pid = int(read_stat(pid)["ppid"])  # type: ignore[call-overload]
        except (ProcessGone, AccessDenied, ParseError, IndexError, ValueError):
            break
    return out
