"""Host memory and per-process pinned/locked memory: /proc/meminfo and the VmPin/VmLck/Threads lines of
/proc/PID/status. Pure parsers over text (tested on recorded files) and their race-aware readers.

Memory no process maps — pinned host buffers a driver holds (RDMA registrations, CUDA's pinned staging
pages), tmpfs files nobody maps, kernel allocations — shows only as the host's MemAvailable falling while
every process's RSS stays flat; Unevictable/Mlocked and each process's VmPin/VmLck say which of it is
pinned and who pinned it.
"""

from __future__ import annotations

import os

from leaktrace import procfs
from leaktrace.procfs.parsers import parse_status, status_int, status_kb

# /proc/meminfo keys sampled (bytes in the result), in the order of the host_memory table's columns.
# AnonPages: every process's anonymous memory together (what processes hold, against what nobody maps).
# VmallocUsed, SUnreclaim, KernelStack, PageTables: the kernel's own memory (BPF maps and driver buffers are
# vmalloc'ed), which no process's RSS shows either.
MEMINFO_KEYS = {"MemTotal": "mem_total", "MemAvailable": "mem_available", "MemFree": "mem_free",
                "AnonPages": "anon_pages", "Shmem": "shmem", "Mapped": "mapped", "Unevictable": "unevictable",
                "Mlocked": "mlocked", "Cached": "cached", "VmallocUsed": "vmalloc_used",
                "SUnreclaim": "slab_unreclaimable", "KernelStack": "kernel_stack", "PageTables": "page_tables"}


def parse_meminfo(text: str) -> dict[str, int]:
    """Every ``Key:  1234 kB`` line of /proc/meminfo, in bytes (counts without a unit, like
    HugePages_Total, as they are)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        parts = rest.split()
        if not sep or not parts:
            continue
        try:
            n = int(parts[0])
        except ValueError:
            continue
        out[key.strip()] = n * 1024 if len(parts) > 1 and parts[1] == "kB" else n
    return out


def host_memory_row(meminfo: dict[str, int], pcp_free: int | None = None) -> dict[str, int | None]:
    """The sampled keys of a parsed /proc/meminfo under the table's column names (None when absent:
    MemAvailable needs Linux ≥ 3.14), and ``pcp_free`` (``parse_pcp_free_pages`` in bytes, None unread)."""
    return {**{col: meminfo.get(key) for key, col in MEMINFO_KEYS.items()}, "pcp_free": pcp_free}


def parse_pcp_free_pages(zoneinfo: str) -> int:
    """Free pages parked in the per-CPU page lists of every zone: the ``count:`` of each CPU under a zone's
    ``pagesets`` in /proc/zoneinfo. The kernel takes them out of MemFree (and so MemAvailable) when it moves
    them there; kernels from 6.7 size these lists to the allocation traffic (each CPU's ``high_max``: hundreds
    of MB on a large zone), so a process freeing memory fast leaves the host looking hundreds of MB short for
    as long as it churns."""
    pages, in_pagesets = 0, False
    for line in zoneinfo.splitlines():
        word = line.strip()
        if line.startswith("Node "):
            in_pagesets = False
        elif word == "pagesets":
            in_pagesets = True
        elif in_pagesets and word.startswith("count:"):
            try:
                pages += int(word.split()[1])
            except (IndexError, ValueError):
                pass  # a line cut short: the others still count
    return pages


def pinned_from_status(text: str) -> dict[str, int]:
    """(vm_pin, vm_lck in bytes, threads) from the text of /proc/PID/status: memory pinned by drivers
    (get_user_pages: RDMA, VFIO, io_uring), memory mlock()ed, live threads."""
    st = parse_status(text)
    return {"vm_pin": status_kb(st, "VmPin"), "vm_lck": status_kb(st, "VmLck"), "threads": status_int(st, "Threads")}


def read_meminfo(proc: str | None = None) -> dict[str, int]:
    """/proc/meminfo parsed; OSError when /proc is not readable (no process to be gone here)."""
    with open(os.path.join(proc or procfs.PROC, "meminfo"), encoding="ascii", errors="replace") as f:
        return parse_meminfo(f.read())


def read_pcp_free(proc: str | None = None) -> int | None:
    """Bytes of free pages in the per-CPU lists (``parse_pcp_free_pages``); None when /proc/zoneinfo is
    unreadable (a restricted container)."""
    try:
        with open(os.path.join(proc or procfs.PROC, "zoneinfo"), encoding="ascii", errors="replace") as f:
            return parse_pcp_free_pages(f.read()) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return None


def read_pinned(pid: int) -> dict[str, int]:
    """``pinned_from_status`` of a live process; ProcessGone / AccessDenied as every per-pid reader."""
    return pinned_from_status(procfs.read_proc_text(pid, "status"))
