"""The watch's eBPF ledger: the probe of `hunt` (outstanding bytes by library and call site, live on /metrics and
kept in exit incidents), over the processes the watch judges growing only (and the children they fork), never
the whole selection, and only while they grow. A clean node's allocator churn (tens of thousands of map/unmap
calls a second over twenty workers) is then filtered in the kernel, never handled here; a leak is growing ticks
before it is judged a leak, and its ledger runs from then on."""

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
        self._traced_at: dict[int, float] = {}  # pid -> when it joined the targets

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

    def follow(self, tracked: Mapping[int, Any], parent: Mapping[int, int], live: set[int], hunted: set[int],
               now: float, window_s: float) -> None:
        """Processes judged growing (``tracked``: pid -> the watch's Tracked) join the targets (seeded with what
        they map already). One is let go once it has not grown for ``window_s``, or once it is confirmed and no
        deep hunt of its tree runs (``hunted``: their roots; the hunt's report names the culprit, the watch's
        /metrics take its figures then): a clean churner judged growing for a moment costs a window of its
        events, never its life's."""
        gone, release = [], []
        for pid in list(self.traced.pids):
            tr = tracked.get(pid)
            if pid not in live:
                gone.append(pid)  # its exit event settled its books
            elif tr is not None and tr.confirmed and tr.root not in hunted:
                release.append(pid)
            elif (tr is None or tr.leaking_since is None) and \
                    now - max(self._traced_at.setdefault(pid, now), tr.last_grew if tr else 0.0) >= window_s:
                release.append(pid)  # (a child its traced parent forked counts from when it is first seen here)
        new = [pid for pid, tr in tracked.items()
               if tr.j.growing and not tr.confirmed and pid in live and pid not in self.traced.pids]
        with self.traced.lock:
            for pid in gone:
                del self.traced.pids[pid]
            for pid in new:
                self.traced.pids[pid] = parent.get(pid, 0)
        for pid in gone:
            self._traced_at.pop(pid, None)
        for pid in release:
            if self.probe.remove_pid(pid):  # False in a PID namespace: it stays traced
                with self.traced.lock:
                    self.traced.pids.pop(pid, None)
                self._traced_at.pop(pid, None)
                self.log(f"pid {pid}: no longer traced by the eBPF ledger")
        for pid in sorted(new):
            self.log(f"pid {pid} grows: its mappings traced by the eBPF ledger from now on")
            self._traced_at[pid] = now
            self.probe.add_pid(pid)

    def traced_since(self, pid: int) -> float | None:
        """When ``pid`` joined the traced processes (None: not traced now)."""
        return self._traced_at.get(pid) if pid in self.traced.pids else None

    def holds(self, pid: int) -> bool:
        """Is ``pid`` traced now (its ledger rows are what it holds, not history)?"""
        return pid in self.traced.pids
