"""The held-files probe: memory each target holds by file descriptor without mapping it (memfds, /dev/shm
files, dma-bufs kept open; leaktrace/procfs/heldfiles.py), every HELD_EVERY_TICKS ticks. Such memory never
shows in the process's RSS, only in the host's Shmem. Writes ``held_files``: per process, the bytes and
files held, and the names holding most ([name, files, bytes], several files often sharing one name).
"""

from __future__ import annotations

import json
from typing import Any

from leaktrace.errors import LeaktraceError
from leaktrace.probes import HuntOptions, RereadingProbe
from leaktrace.procfs.heldfiles import read_held_files

# A process's descriptors are listed and each link read: ~4 µs a descriptor, a few hundred in a vLLM worker.
HELD_EVERY_TICKS = 3
NAMES_KEPT = 5


class HeldFilesProbe(RereadingProbe):
    name = "heldfiles"

    def __init__(self, options: HuntOptions) -> None:
        super().__init__(options)
        self.samples = 0
        self.max_bytes = 0

    def _read(self, edge: str) -> None:
        assert self.ctx is not None
        if edge == "tick" and self._ticks % HELD_EVERY_TICKS:
            return
        now = self.ctx.session.now()
        rows = []
        for pid in self.ctx.targets.live():
            try:
                held = read_held_files(pid)
            except (LeaktraceError, OSError):
                continue  # gone, or unreadable: the watcher reports processes that vanish
            by_name: dict[str, list[int]] = {}  # name -> [files, bytes]: many files often share one name
            for f in held:
                n = by_name.setdefault(f.name, [0, 0])
                n[0] += 1
                n[1] += f.bytes
            largest = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:NAMES_KEPT]
            total = sum(f.bytes for f in held)
            rows.append({"t": now, "pid": pid, "bytes": total, "files": len(held),
                         "names": json.dumps([[name, files, size] for name, (files, size) in largest])})
            self.max_bytes = max(self.max_bytes, total)
        if rows:
            self.ctx.session.append("held_files", rows)
            self.samples += 1

    def summary(self) -> dict[str, Any]:
        return {"samples": self.samples, "max_bytes": self.max_bytes}
