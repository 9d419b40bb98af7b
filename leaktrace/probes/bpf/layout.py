"""The Python mirror of bpf/leaktrace.h (the only copy in Python): slow-path event types, the per-CPU
counters, and the ctypes layouts of the kernel's region map (key, value) and of a ring-buffer event.
Field for field and constant for constant it must match the header: tests/test_bpf_layout.py compiles
the header and compares every struct's size, every field's offset, size and signedness, and every
constant named here (``X`` is the header's ``LT_X``)."""

from __future__ import annotations

import ctypes as ct

EV_MMAP, EV_MUNMAP, EV_MREMAP, EV_BRK, EV_FORK, EV_EXEC, EV_EXIT, EV_LIBMAP, EV_MPROTECT = range(1, 10)
EV_SHMAT, EV_SHMDT = 10, 11  # SysV shm attach (fd = shmid, len 0: sized in user space) and detach
EV_HOOKWIN = 12  # a window of a hooked mmap to learn the hook's frames from (nothing to account)
EV_FAULTWIN = 13  # a window of the first write fault of a fault key, to name who touched the page from
# pages locked (mlock, mlock2: flags = mlock2's) and unlocked; mlockall (flags = MCL_*) and munlockall
EV_MLOCK, EV_MUNLOCK, EV_MLOCKALL, EV_MUNLOCKALL = 14, 15, 16, 17
LOCK_EVENTS = frozenset({EV_MLOCK, EV_MUNLOCK, EV_MLOCKALL, EV_MUNLOCKALL})
EV_MEMFD = 18  # a memfd created: fd = the descriptor returned, flags = MFD_* (the call path of memory held by fd)
# Events with nothing to account, sent for their call path alone (who locks pages, who keeps memory by fd).
CALL_PATH_EVENTS = LOCK_EVENTS | {EV_MEMFD}
EVENT_NAMES = {EV_MMAP: "mmap", EV_MUNMAP: "munmap", EV_MREMAP: "mremap", EV_BRK: "brk", EV_FORK: "fork",
               EV_EXEC: "exec", EV_EXIT: "exit", EV_LIBMAP: "libmap", EV_MPROTECT: "mprotect",
               EV_SHMAT: "shmat", EV_SHMDT: "shmdt", EV_HOOKWIN: "hookwin",
               EV_FAULTWIN: "faultwin", EV_MLOCK: "mlock", EV_MUNLOCK: "munlock", EV_MLOCKALL: "mlockall",
               EV_MUNLOCKALL: "munlockall", EV_MEMFD: "memfd"}
# The events that carry the call site of their syscall (its caller, the stack key of what it accounts).
SITE_EVENTS = frozenset({EV_MMAP, EV_MREMAP, EV_BRK, EV_MUNMAP, EV_MPROTECT, EV_SHMAT, EV_SHMDT, EV_MEMFD,
                         *LOCK_EVENTS})
COUNTERS = ["syscalls", "fast_maps", "settled", "slow_events", "lost_events", "map_full", "stacks", "failed"]
MREMAP_DONTUNMAP = 4
EXIT_OOM, EXIT_NO_CODE = 1, 2  # EXIT event flags (LT_EXIT_*): result holds the wait status
ANON_FD = 0xFFFFFFFF
SCAN_BYTES = 4096  # LT_SCAN_BYTES
FAULT_BUCKET_SHIFT = 21  # fault_counts' address buckets: 2 MiB
# fault_stats indices (LT_FSTAT_*): write faults, of them counted (sampled), dropped (map full), windows sent
FSTAT_WRITES, FSTAT_SAMPLED, FSTAT_DROPPED, FSTAT_WINDOWS = range(4)
NFSTATS = 4
FAULT_STATS = ["fault_writes", "fault_sampled", "fault_dropped", "fault_windows"]


class Target(ct.Structure):
    _fields_ = [("parent", ct.c_uint32), ("pad", ct.c_uint32), ("dirty", ct.c_uint64)]


class RegionKey(ct.Structure):
    _fields_ = [("tgid", ct.c_uint32), ("pad", ct.c_uint32), ("start", ct.c_uint64)]


class Region(ct.Structure):
    _fields_ = [("len", ct.c_uint64), ("seq", ct.c_uint64), ("born", ct.c_uint64), ("site", ct.c_uint64),
                ("ip", ct.c_uint64),
                ("stack_id", ct.c_int64), ("tid", ct.c_uint32), ("prot", ct.c_uint32),
                ("flags", ct.c_uint32), ("fd", ct.c_uint32), ("window", ct.c_uint32), ("pad", ct.c_uint32)]


class WindowKey(ct.Structure):
    """struct lt_window_key: a kept stack window's (process, birth seq of its region) in `windows`."""

    _fields_ = [("tgid", ct.c_uint32), ("pad", ct.c_uint32), ("born", ct.c_uint64)]


class Event(ct.Structure):
    _fields_ = [("seq", ct.c_uint64), ("type", ct.c_uint32), ("tgid", ct.c_uint32), ("tid", ct.c_uint32),
                ("aux_pid", ct.c_uint32), ("addr", ct.c_uint64), ("len", ct.c_uint64),
                ("new_addr", ct.c_uint64), ("new_len", ct.c_uint64), ("flags", ct.c_uint64),
                ("prot", ct.c_uint64), ("fd", ct.c_uint64), ("site", ct.c_uint64), ("ip", ct.c_uint64),
                ("stack_id", ct.c_int64), ("result", ct.c_int64)]


class Range(ct.Structure):
    """struct lt_range: libc's code in one process (the `runtime` map)."""

    _fields_ = [("start", ct.c_uint64), ("end", ct.c_uint64)]


class Hook(ct.Structure):
    """struct lt_hook: a memory-hook library's code in one process (the `hooks` map)."""

    _fields_ = [("start", ct.c_uint64), ("end", ct.c_uint64), ("learn_seq", ct.c_uint64)]


class HookKey(ct.Structure):
    """struct lt_hook_key: (process, return address) in `hook_sites` and `hook_paths`."""

    _fields_ = [("tgid", ct.c_uint32), ("pad", ct.c_uint32), ("addr", ct.c_uint64)]


class HookPath(ct.Structure):
    """struct lt_hook_path: where a dispatch path's caller is, and the hook frame that checks the path."""

    _fields_ = [("dispatch_off", ct.c_uint64), ("last_off", ct.c_uint64), ("last_ret", ct.c_uint64)]


class FaultKey(ct.Structure):
    """struct lt_fault_key: (process, faulting ip, site: memset's caller when ip is in libc, 2 MiB bucket)."""

    _fields_ = [("tgid", ct.c_uint32), ("pad", ct.c_uint32), ("ip", ct.c_uint64), ("site", ct.c_uint64),
                ("bucket", ct.c_uint64)]


class WindowEvent(Event):
    """struct lt_window_event: an event followed by a window of the raw user stack (heap growth)."""

    _fields_ = [("sp", ct.c_uint64), ("win_len", ct.c_uint64), ("data", ct.c_uint8 * SCAN_BYTES)]

    @property
    def window(self) -> bytes:
        return bytes(self.data)[:min(self.win_len, SCAN_BYTES)]
