"""Watcher probe: /proc/PID/smaps_rollup of every process of the target trees every tick, and the full
/proc/PID/smaps of each every ``smaps_every`` ticks (at once for a process first seen, then on its own ticks,
skipped while nothing moved: FULL_SMAPS_MAX_SKIPS), diffed against the previous one. Each row is stamped
when its read returned, not when the tick began: on a saturated machine one tick's reads spread over seconds
(~4 s a tick beside a busy vLLM pair on 2 cores, bench_vllm_serving).

Tables written (declared in leaktrace.session.tables): ``processes``, ``rollup``, ``class_usage``,
``region_events`` (born, grown, shrunk, gone, moved), ``regions`` (first and last snapshot).
"""

from __future__ import annotations

import json
import os
from typing import Any

from leaktrace import procfs
from leaktrace.errors import AccessDenied, ProcessGone
from leaktrace.probes import HuntContext, ProbeBase
from leaktrace.probes.watcher_regions import (  # noqa: F401 - the region helpers are the watcher's API too
    RSS_GROWTH_EVENT_BYTES,
    Region,
    class_totals,
    diff_regions,
    read_regions,
    regions_from_smaps,
)
from leaktrace.procfs.exits import zombie_exit_code

# A due full read of a process whose mapped size (statm), RSS, anonymous and swapped bytes all stayed within
# RSS_GROWTH_EVENT_BYTES of the last full read is skipped: its diff could hold no grown region and no
# class changed by as much. The kernel walks every page table entry for smaps (~24 ms of reading and parsing
# for 2,000 mappings, 8 such processes on a vLLM node), statm costs the same for any size. Still read at
# least every FULL_SMAPS_MAX_SKIPS-th due time (a region moved without changing any total).
FULL_SMAPS_MAX_SKIPS = 6
# A tick's smaps_rollup of a process whose statm counters (mapped, resident, shared: no walk, no lock) have each
# moved less than ROLLUP_MOVE_BYTES since its last rollup reuses that rollup, its resident and anonymous figures
# carried forward by statm's own (resident - shared is the kernel's anonymous counter), up to ROLLUP_MAX_SKIPS
# ticks: what statm does not count (PSS of pages shared with processes that come and go, swap) is read again
# then. A rollup walks every page table entry: 20 ms for a 1.6 GB vLLM worker, ~70 ms a tick for a P/D pair's
# 8 processes, whose counters move a little every tick. On that pair nearly every rollup read is this
# periodic one, so it is rare: PSS and swap are at most 30 ticks old, the RSS and anonymous rates exact.
ROLLUP_MOVE_BYTES = 4 << 20
ROLLUP_MAX_SKIPS = 30


class WatcherProbe(ProbeBase):
    name = "watcher"
    required = True

    def __init__(self, options: Any = None) -> None:
        self.smaps_every = getattr(options, "smaps_every", 10) or 10
        self.ctx: HuntContext | None = None
        self._ticks = 0
        self._last_regions: dict[int, list[Region]] = {}
        self._first_done: set[int] = set()
        self._denied: set[int] = set()
        # PID reuse and exec(): a pid names the process first seen with this start time; a root whose
        # pid was reused is never hunted again; an exec() restarts the region diff (new address space).
        self._starttime: dict[int, int] = {}
        self._dead_roots: set[int] = set()
        self._exe: dict[int, str] = {}
        self.rollups = 0
        self.smaps_reads = 0
        self.smaps_skipped = 0  # due full reads skipped: nothing moved (FULL_SMAPS_MAX_SKIPS)
        self.rollups_skipped = 0  # rollup reads skipped: statm's counters had not moved (ROLLUP_MAX_SKIPS)
        # pid -> (tick, statm's (mapped, resident, shared), rollup figures) at its last rollup read
        self._rollup_at: dict[int, tuple[int, tuple[int, int, int], dict[str, int]]] = {}
        # pid -> (tick, (mapped, rss, anon, swap)) at its last full read
        self._at_full: dict[int, tuple[int, tuple[int, ...]]] = {}
        self._slots: dict[int, int] = {}  # pid -> its full reads' phase among the ticks

    # -- process tree
    def _refresh_tree(self, now: float) -> None:
        assert self.ctx is not None
        ts = self.ctx.targets
        found: dict[int, int] = {}
        stats = procfs.process_stats()  # one pass over /proc a tick: every root's tree, and who is who
        roots = []
        for root in ts.roots:
            if root in self._dead_roots or not self._same_process(root, stats.get(root)):
                self._dead_roots.add(root)
            else:
                roots.append(root)
        for pid, ppid in procfs.process_tree(roots, stats).items():
            if stats[pid]["state"] != "Z":  # a zombie's memory is already released
                found[pid] = ppid
        for root in roots:
            if root not in stats and self._unreadable(root):
                found.setdefault(root, 0)
        # Also keep children the bpf probe added (found in the kernel before we saw them here).
        with ts.lock:
            known = dict(ts.pids)
        for pid, ppid in known.items():
            if pid not in found and pid not in ts.roots and procfs.is_alive(pid) and self._same_process(pid):
                found[pid] = ppid
        # A child pid reused by a new child between two ticks: the old process exited, a new one is seen.
        reused = {p for p in found if p in known and not self._same_process(p, stats.get(p))}
        new = [p for p in found if p not in known or p in reused]
        gone = [p for p in known if p not in found or p in reused]
        with ts.lock:
            for p in gone:
                ts.pids.pop(p, None)
                ts.exited.setdefault(p, now)
            for p in new:
                ts.pids[p] = found[p]
        for p in gone:
            self._process_gone(p, now)
        for p in new:
            self._same_process(p)  # its start time is the reference from now on
            self._record_process(p, found[p], now, "seen")

    def _same_process(self, pid: int, stat: dict[str, object] | None = None) -> bool:
        """False when ``pid`` now names another process than the one first seen (compared by the start
        time in /proc/PID/stat, which exec() keeps and PID reuse changes; ``stat``: read this tick)."""
        try:
            st = int((stat or procfs.read_stat(pid))["starttime"])  # type: ignore[call-overload]
        except (ProcessGone, AccessDenied, procfs.ParseError, IndexError, ValueError):
            return True  # gone or unreadable: the tree refresh decides
        return self._starttime.setdefault(pid, st) == st

    @staticmethod
    def _unreadable(pid: int) -> bool:
        """``pid`` lives but its stat is not readable (its memory may still be): kept as a target."""
        try:
            procfs.read_stat(pid)
        except AccessDenied:
            return True
        except (ProcessGone, procfs.ParseError, IndexError, ValueError):
            return False
        return False

    def _record_process(self, pid: int, ppid: int, now: float, event: str) -> None:
        assert self.ctx is not None
        try:
            cmd = procfs.read_cmdline(pid)
            comm = procfs.read_comm(pid)
        except (ProcessGone, AccessDenied):
            cmd, comm = [], "?"
        try:
            exe = procfs.exe_path(pid)
        except (ProcessGone, AccessDenied):
            exe = ""
        label = self.ctx.targets.labels.get(pid) or comm
        self.ctx.targets.labels.setdefault(pid, label)
        root = next((r for r in self.ctx.targets.roots if r == pid), None)
        self.ctx.session.append("processes", {
            "t": now, "pid": pid, "ppid": ppid, "event": event, "comm": comm, "label": label,
            "cmdline": json.dumps(cmd), "exe": exe, "root": root if root is not None else -1,
        })
        self.ctx.log(f"watching pid {pid} ({comm})")

    def _process_gone(self, pid: int, now: float) -> None:
        assert self.ctx is not None
        self._write_last(pid, now)
        code = zombie_exit_code(pid)  # how it ended, while its parent has not reaped it (-1: not known)
        self.ctx.session.append("processes", {"t": now, "pid": pid, "ppid": -1, "event": "exit",
                                              "comm": self.ctx.targets.labels.get(pid, ""), "label": "",
                                              "cmdline": "[]", "exe": "", "root": -1,
                                              "exit_code": -1 if code is None else code})
        self.ctx.log(f"pid {pid} exited at t={now:.1f}s")
        self._last_regions.pop(pid, None)
        self._at_full.pop(pid, None)
        self._rollup_at.pop(pid, None)
        self._slots.pop(pid, None)
        self._starttime.pop(pid, None)
        self._exe.pop(pid, None)

    # -- probe API
    def start(self, ctx: HuntContext) -> None:
        self.ctx = ctx
        self._refresh_tree(ctx.session.now())
        # Nothing can be measured if no target's memory is readable: say so now, not after the hunt.
        denied: AccessDenied | None = None
        for pid in ctx.targets.live():
            try:
                procfs.read_smaps_rollup(pid)
                return
            except AccessDenied as e:
                denied = e
            except ProcessGone:
                continue
        if denied is not None:
            raise denied

    def tick(self, now: float) -> None:
        assert self.ctx is not None
        if self._ticks:
            self._refresh_tree(now)
        k = self._ticks
        self._ticks += 1
        rows = []
        # The stop reads every process in full: a due full read this close to the window's end would only
        # make the hunt's end later (a full read waits behind the target's own mmap/munmap: seconds on a
        # loaded node). A process seen for the first time is still read.
        closing = now + self.ctx.options.interval > self.ctx.window_end
        for pid in self.ctx.targets.live():
            try:
                mapped, r = self._rollup(pid)
            except ProcessGone:
                continue  # picked up as exited at the next tree refresh
            except AccessDenied as e:
                if pid not in self._denied:
                    self._denied.add(pid)
                    self.ctx.warn(str(e))
                continue
            self.rollups += 1
            rows.append(rollup_row(self.ctx.session.now(), pid, r))  # when read: see the module docstring
            # Each process's full reads fall on its own ticks (its slot, given in the order processes are
            # seen): 8 vLLM processes read on the same tick make it seconds long and the next ticks late.
            first = pid not in self._slots
            slot = self._slots.setdefault(pid, len(self._slots) % self.smaps_every)
            if first or ((k + slot) % self.smaps_every == 0 and not closing):
                figures = (mapped, r.get("Rss", 0), r.get("Anonymous", 0), r.get("Swap", 0))
                if not self._full_needed(pid, figures):
                    self.smaps_skipped += 1
                elif self._full_smaps(pid) is not None:
                    self._at_full[pid] = (self._ticks, figures)
        self.ctx.session.append("rollup", rows)
        self.ctx.live.rollup = {r["pid"]: r for r in rows}

    def _rollup(self, pid: int) -> tuple[int, dict[str, int]]:
        """``pid``'s mapped bytes (statm) and smaps_rollup figures; the rollup is read again only when statm's
        counters moved since the last read, or ROLLUP_MAX_SKIPS ticks after it. The rollup walks every mapping
        under the address space's lock: on a loaded P/D node, reads of 8 vLLM processes a tick waited seconds
        behind their own mmap/munmap."""
        counters = procfs.read_statm(pid)
        held = self._rollup_at.get(pid)
        if held is not None and self._ticks - held[0] < ROLLUP_MAX_SKIPS and \
                all(abs(a - b) < ROLLUP_MOVE_BYTES for a, b in zip(counters, held[1], strict=True)):
            self.rollups_skipped += 1
            return counters[0], carried_rollup(held[2], held[1], counters)
        r = procfs.read_smaps_rollup(pid)
        self._rollup_at[pid] = (self._ticks, counters, r)
        return counters[0], r

    def _full_needed(self, pid: int, figures: tuple[int, ...]) -> bool:
        """A due full read of ``pid`` is needed (see FULL_SMAPS_MAX_SKIPS)."""
        last = self._at_full.get(pid)
        if last is None or pid not in self._last_regions:
            return True
        tick, before = last
        if self._ticks - tick >= self.smaps_every * FULL_SMAPS_MAX_SKIPS:
            return True
        return any(abs(a - b) >= RSS_GROWTH_EVENT_BYTES for a, b in zip(figures, before, strict=True))

    def _full_smaps(self, pid: int, snapshot: str | None = None) -> list[Region] | None:
        assert self.ctx is not None
        try:
            regions = read_regions(pid)
        except (ProcessGone, AccessDenied):
            return None
        self.smaps_reads += 1
        s = self.ctx.session
        now = s.now()  # when read (see tick)
        s.append("class_usage", [{"t": now, "pid": pid, "cls": c, **v} for c, v in class_totals(regions).items()])
        prev = self._last_regions.get(pid)
        exe = _exe_of(pid)
        if self._exe.setdefault(pid, exe) != exe:
            # exec(): a new program in a new address space; diffing it against the old one would
            # report every region gone/born/moved.
            self._exe[pid] = exe
            prev = None
            s.append("processes", {"t": now, "pid": pid, "ppid": self.ctx.targets.pids.get(pid, -1),
                                   "event": "exec", "comm": _comm_of(pid), "label": "", "cmdline": "[]",
                                   "exe": exe, "root": -1})
            self.ctx.log(f"pid {pid} exec'd {exe}")
        if prev is not None:
            s.append("region_events", [{"t": now, "pid": pid, **e} for e in diff_regions(prev, regions)])
        self._last_regions[pid] = regions
        if pid not in self._first_done or snapshot:
            self._first_done.add(pid)
            s.append("regions", [_region_row(now, pid, snapshot or "first", r) for r in regions])
        return regions

    def _write_last(self, pid: int, now: float) -> None:
        """The last full snapshot: re-read if the process still lives, else the last one we had."""
        assert self.ctx is not None
        if self._full_smaps(pid, snapshot="last") is None and pid in self._last_regions:
            self.ctx.session.append("regions", [_region_row(now, pid, "last", r) for r in self._last_regions[pid]])

    def stop(self) -> None:
        if self.ctx is None:
            return
        now = self.ctx.session.now()
        for pid in self.ctx.targets.live():
            self._write_last(pid, now)

    def summary(self) -> dict[str, Any]:
        return {"ticks": self._ticks, "rollups": self.rollups, "rollups_skipped": self.rollups_skipped,
                "smaps_reads": self.smaps_reads, "smaps_skipped": self.smaps_skipped}


def _exe_of(pid: int) -> str:
    try:
        return os.readlink(f"{procfs.PROC}/{pid}/exe")
    except OSError:
        return ""


def _comm_of(pid: int) -> str:
    try:
        return procfs.read_comm(pid)
    except (ProcessGone, AccessDenied):
        return "?"


def carried_rollup(r: dict[str, int], before: tuple[int, int, int], now: tuple[int, int, int]) -> dict[str, int]:
    """Rollup figures ``r`` (read when statm said ``before``) moved by statm's change to ``now``: RSS by
    resident, anonymous (private, so PSS and private dirty too) by resident - shared."""
    d_rss = now[1] - before[1]
    d_anon = (now[1] - now[2]) - (before[1] - before[2])
    if not d_rss and not d_anon:
        return r
    out = dict(r)
    out["Rss"] = max(0, r.get("Rss", 0) + d_rss)
    for k in ("Anonymous", "Pss", "Private_Dirty"):
        out[k] = max(0, r.get(k, 0) + d_anon)
    return out


def rollup_row(now: float, pid: int, r: dict[str, int]) -> dict[str, Any]:
    return {
        "t": now, "pid": pid, "rss": r.get("Rss", 0), "pss": r.get("Pss", 0),
        "uss": r.get("Private_Clean", 0) + r.get("Private_Dirty", 0),
        "anon": r.get("Anonymous", 0), "swap": r.get("Swap", 0),
        "shared": r.get("Shared_Clean", 0) + r.get("Shared_Dirty", 0),
    }


def _region_row(now: float, pid: int, snapshot: str, r: Region) -> dict[str, Any]:
    return {"t": now, "pid": pid, "snapshot": snapshot, "start": r.start, "end": r.end, "size": r.size,
            "rss": r.rss, "anon": r.anon, "perms": r.perms, "offset": 0, "path": r.path, "cls": r.cls}
