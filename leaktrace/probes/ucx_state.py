"""The ucx probe: effective UCX state of every target that maps UCX (see leaktrace.vllm.ucx).

Writes the ``ucx_state`` table: one row per process when first seen with UCX mapped, and again whenever
a value changes (vLLM and NIXL set UCX_* in-process at run time, lazily, just before importing nixl),
plus a last row at stop. Reading costs a few milliseconds per process and never stops it. The culprit
rules read this table for the remedy (effective values and where each came from).
"""

from __future__ import annotations

from typing import Any

from leaktrace import procfs
from leaktrace.errors import LeaktraceError
from leaktrace.probes import HuntOptions, RereadingProbe
from leaktrace.procfs.parsers import parse_maps
from leaktrace.vllm import ucx

_COMPARED = ("hooks_active", "hook_mode", "rcache_max_unreleased", "rcache_enable", "ucx_libs")


class UcxStateProbe(RereadingProbe):
    name = "ucx"

    def __init__(self, options: HuntOptions, every: int = 10) -> None:
        super().__init__(options)
        self.every = every
        self.last: dict[int, dict[str, Any]] = {}
        self.without_ucx: dict[int, int] = {}  # pid -> tick it was last seen without UCX mapped

    def _read(self, edge: str) -> None:
        """A tick reads the processes not known yet, and all of them every ``every`` ticks; start and stop read
        every process and write a row for each (the stop's row is its last)."""
        assert self.ctx is not None
        force = edge != "tick"
        for pid in self.ctx.targets.live():
            if not force and self._ticks % self.every and (pid in self.last or pid in self.without_ucx):
                continue  # known: look again every `every` ticks (UCX may be dlopen'ed later)
            try:
                text = procfs.read_proc_text(pid, "maps")
                # Most targets never map UCX (API servers, engine cores): their text is searched for the
                # libraries' common prefix, not parsed (thousands of mappings each; the parse costs twice the
                # read, and a regular expression over the whole text more than the parse).
                maps = parse_maps(text) if "/libuc" in text else []
                if not any(m.path and ucx.UCX_LIB_RE.search(m.path) for m in maps):
                    self.without_ucx[pid] = self._ticks
                    continue
                cfg = ucx.read_ucx_config(pid, maps=maps)
            except (LeaktraceError, OSError, ValueError):
                continue  # gone, or unreadable: the watcher reports processes that vanish
            row = cfg.as_row(self.ctx.session.now())
            prev = self.last.get(pid)
            if prev is None or force or any(prev.get(k) != row.get(k) for k in _COMPARED):
                self.ctx.session.append("ucx_state", row)
                if prev is None and cfg.leak_prone:
                    self.ctx.log(f"ucx: pid {pid} has UCX memory hooks on with an unbounded invalidation "
                                 f"queue ({cfg.hook_mode}, UCX_RCACHE_MAX_UNRELEASED={cfg.rcache_max_unreleased})")
            self.last[pid] = row

    def summary(self) -> dict[str, Any]:
        return {str(pid): {k: r.get(k) for k in (*_COMPARED, "leak_prone")} for pid, r in self.last.items()}
