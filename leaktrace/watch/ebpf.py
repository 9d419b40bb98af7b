"""The watch's eBPF ledger: the probe of `hunt` (outstanding bytes by library and call site, live on /metrics and
kept in exit incidents), over the processes the watch judges growing only (and the children they fork), never
the whole selection. A clean node's allocator churn (tens of thousands of map/unmap calls a second over twenty
workers) is then filtered in the kernel, never handled here; a leak is growing ticks before it is judged a
leak, and its ledger runs from then on."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from leaktrace.probes import HuntContext, HuntOptions, SessionSink, TargetSet

# The watch's eBPF ring: 2048 pages, 8 MiB, ~70,000 records. Only growing processes are traced (see follow), each
# drained every quarter second; the hunt's 32 MiB ring is sized for a whole loaded P/D pair going undrained for
# tens of seconds. The kernel allocates it whole, and its pages count twice in the watch's RSS once written
# (the ring is mapped twice, for records that wrap).
WATCH_RING_PAGES = 2048


class WatchLedger:
    """The probe (``probe``, None until :meth:`start` made it live) and what it traces (``traced``)."""

    def __init__(self, session: SessionSink, options: HuntOptions, log: Callable[[str], None]) -> None:
        self.traced = TargetSet(roots=[])
        self.ctx = HuntContext(session=session, targets=self.traced, options=options, log=log)
        self.log = log
        self.probe: Any = None

    def start(self) -> Any:
        """The probe, live; None when eBPF is unavailable (the watch goes on with /proc alone and says so)."""
        from leaktrace.errors import LeaktraceError
        from leaktrace.probes.bpf.probe import BpfProbe
        from leaktrace.tracefs import ensure_mounted

        try:
            ensure_mounted()
            probe = BpfProbe(self.ctx.options, defines={"LT_RING_PAGES": WATCH_RING_PAGES})
            probe.start(self.ctx)
        except (LeaktraceError, OSError) as e:
            self.log(f"warning: eBPF ledger off (the watch goes on with /proc): {e}")
            return None
        self.probe = probe
        return probe

    def follow(self, tracked: Mapping[int, Any], parent: Mapping[int, int], live: set[int]) -> None:
        """Growing processes (``tracked``: pid -> the watch's Tracked) join the targets (seeded with what they
        map already); a traced process stays traced while it lives."""
        new = [pid for pid, tr in tracked.items() if tr.grew and pid in live and pid not in self.traced.pids]
        with self.traced.lock:
            for pid in [p for p in self.traced.pids if p not in live]:
                del self.traced.pids[pid]
            for pid in new:
                self.traced.pids[pid] = parent.get(pid, 0)
        for pid in sorted(new):
            self.log(f"pid {pid} grows: its mappings traced by the eBPF ledger from now on")
            self.probe.add_pid(pid)
