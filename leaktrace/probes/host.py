"""The host probe: the host's memory and what each target pins, every tick (leaktrace/procfs/meminfo.py).

Memory that no process maps — pinned host buffers a driver keeps (RDMA registrations, a GPU runtime's pinned
staging pages), tmpfs files nobody maps, kernel allocations — never shows in a process's RSS: only the
host's MemAvailable falls. Writes ``host_memory`` (the sampled /proc/meminfo keys and the free pages of the
per-CPU lists, from /proc/zoneinfo, one row a tick) and
``host_procs`` (VmPin, VmLck and the live threads of each target, one row per target a tick): one small
read each, no target ever stopped.
"""

from __future__ import annotations

from typing import Any

from leaktrace.errors import LeaktraceError
from leaktrace.probes import HuntOptions, RereadingProbe
from leaktrace.procfs.meminfo import host_memory_row, read_meminfo, read_pcp_free, read_pinned


class HostMemoryProbe(RereadingProbe):
    name = "host"

    def __init__(self, options: HuntOptions) -> None:
        super().__init__(options)
        self.first: dict[str, Any] | None = None
        self.last: dict[str, Any] | None = None
        self._unreadable = False

    def _read(self, edge: str) -> None:
        assert self.ctx is not None
        now = self.ctx.session.now()
        try:
            row = {"t": now, **host_memory_row(read_meminfo(), read_pcp_free())}
        except OSError as e:
            if not self._unreadable:
                self.ctx.warn(f"host: /proc/meminfo unreadable ({e}): host memory not sampled")
            self._unreadable = True
            return
        self.ctx.session.append("host_memory", row)
        self.first = self.first or row
        self.last = row
        rows = []
        for pid in self.ctx.targets.live():
            try:
                rows.append({"t": now, "pid": pid, **read_pinned(pid)})
            except (LeaktraceError, OSError):
                continue  # gone, or unreadable: the watcher reports processes that vanish
        if rows:
            self.ctx.session.append("host_procs", rows)

    def summary(self) -> dict[str, Any]:
        if self.first is None or self.last is None:
            return {"samples": 0}
        mb = 1024 * 1024
        return {"mem_available_first_mb": round((self.first.get("mem_available") or 0) / mb, 1),
                "mem_available_last_mb": round((self.last.get("mem_available") or 0) / mb, 1),
                "samples": self._ticks + 1}
