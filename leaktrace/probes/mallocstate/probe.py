"""The malloc-state probe: glibc malloc's books of each target (leaktrace/probes/mallocstate/glibc.py) at
start, at stop and every READ_EVERY_TICKS ticks between while its reads stay within CPU_SHARE of the hunt's
time: ``malloc_state`` rows (mallinfo2()'s figures), from which the analysis tells a heap's growth in use
(a leak) from free memory the allocator keeps (retention)."""

from __future__ import annotations

import os
import time
from typing import Any

from leaktrace import procfs
from leaktrace.errors import LeaktraceError
from leaktrace.probes import HuntOptions, RereadingProbe
from leaktrace.probes.mallocstate.allocators import OtherAllocator, other_allocator
from leaktrace.probes.mallocstate.glibc import GlibcMalloc, locate, read_malloc_state

READ_EVERY_TICKS = 3
CPU_SHARE = 0.02  # of the hunt's wall time, for the reads between start and stop


class MallocStateProbe(RereadingProbe):
    name = "malloc"

    def __init__(self, options: HuntOptions) -> None:
        super().__init__(options)
        self._where: dict[int, GlibcMalloc | str] = {}
        self._facts: dict[int, dict[str, Any]] = {}
        self._allocators: dict[int, dict[str, str]] = {}  # pid -> the allocator serving malloc, not glibc's
        self._cpu_s = 0.0
        self._t0 = time.monotonic()
        self.reads = 0

    def _read(self, edge: str) -> None:
        assert self.ctx is not None
        if edge == "tick" and (self._ticks % READ_EVERY_TICKS
                               or self._cpu_s > CPU_SHARE * (time.monotonic() - self._t0)):
            return
        c0 = time.thread_time()
        rows = []
        for pid in self.ctx.targets.live():
            try:
                where = self._where.get(pid)
                if where is None:
                    where = self._where[pid] = self._locate(pid)
                    self._facts[pid] = process_facts(pid)
                if isinstance(where, str):
                    continue
                st = read_malloc_state(pid, where)
            except (LeaktraceError, OSError):
                continue  # gone, or unreadable
            rows.append({"t": self.ctx.session.now(), "pid": pid, **st, **self._facts.get(pid, {})})
        self._cpu_s += time.thread_time() - c0
        if rows:
            self.ctx.session.append("malloc_state", rows)
            self.reads += len(rows)

    def _locate(self, pid: int) -> GlibcMalloc | str:
        where, other = locate_books(pid)
        if other is not None:
            self._allocators[pid] = other.as_dict()
        return where

    def summary(self) -> dict[str, Any]:
        return {"reads": self.reads, "cpu_s": round(self._cpu_s, 3),
                "unreadable": {str(pid): why for pid, why in self._where.items() if isinstance(why, str)},
                "allocators": {str(pid): a for pid, a in self._allocators.items()}}


def locate_books(pid: int) -> tuple[GlibcMalloc | str, OtherAllocator | None]:
    """glibc malloc's books in ``pid``, or why they cannot be read; and the allocator that serves malloc
    instead of glibc's, when one does."""
    other = other_allocator(procfs.read_maps(pid), procfs.read_environ(pid))
    if other is not None:
        return other.line(), other
    return locate(pid), None


def process_facts(pid: int) -> dict[str, Any]:
    """What a retention remedy rests on, read once: the host's CPUs (glibc allows 8 arenas per CPU it sees),
    the container's CPU limit (cgroup v2 cpu.max: -1 none, None unknown) and the MALLOC_* settings."""
    facts: dict[str, Any] = {"host_cpus": os.cpu_count() or 0, "cpu_limit": None, "settings": ""}
    try:
        env = procfs.read_environ(pid)  # redacted: MALLOC_* are on the allow-list
        facts["settings"] = ", ".join(f"{k}={v}" for k, v in sorted(env.items()) if k.startswith("MALLOC_"))
        cg = procfs.read_proc_text(pid, "cgroup").splitlines()
        path = next((line.split(":", 2)[2] for line in cg if line.startswith("0::")), None)
        if path is not None:
            with open(f"/sys/fs/cgroup{path}/cpu.max") as f:
                quota, period = f.read().split()[:2]
            facts["cpu_limit"] = -1.0 if quota == "max" else int(quota) / int(period)
    except (LeaktraceError, OSError, ValueError):
        pass
    return facts
