"""Watcher probe: /proc/PID/smaps_rollup of every process of the target trees every tick, and the full
/proc/PID/smaps every ``smaps_every`` ticks, diffed against the previous one. Each row is stamped when its read
returned, not when the tick began: on a saturated machine one tick's reads spread over seconds (~4 s a tick
beside a busy vLLM pair on 2 cores, bench_vllm_serving).

Tables written (declared in leaktrace.session.tables): ``processes``, ``rollup``, ``class_usage``,
``region_events`` (born, grown, shrunk, gone, moved), ``regions`` (first and last snapshot).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import psutil

from leaktrace import procfs
from leaktrace.errors import AccessDenied, ProcessGone
from leaktrace.memclass import classify_all
from leaktrace.probes import HuntContext
from leaktrace.procfs import Mapping
from leaktrace.procfs.exits import zombie_exit_code

# A region whose RSS rises by at least this much without changing size is reported as grown.
RSS_GROWTH_EVENT_BYTES = 1 << 20


@dataclass(slots=True)
class Region:
    start: int
    end: int
    perms: str
    path: str
    cls: str
    rss: int
    anon: int

    @property
    def size(self) -> int:
        return self.end - self.start


def regions_from_smaps(mappings: list[Mapping]) -> list[Region]:
    classes = classify_all(mappings)
    return [Region(m.start, m.end, m.perms, m.path, c, m.rss, m.anonymous) for m, c in zip(mappings, classes, strict=True)]


def read_regions(pid: int) -> list[Region]:
    """Full smaps of ``pid`` as classified regions (the compact parser: this runs on every full tick)."""
    text = procfs.read_proc_text(pid, "smaps")
    if not text:
        raise ProcessGone(pid, "smaps")
    regions = [Region(s, e, perms, path, "", rss, anon) for s, e, perms, path, rss, anon in procfs.parse_smaps_compact(text)]
    for r, c in zip(regions, classify_all(regions), strict=True):
        r.cls = c
    return regions


def class_totals(regions: list[Region]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for r in regions:
        d = out.setdefault(r.cls, {"size": 0, "rss": 0, "anon": 0, "count": 0})
        d["size"] += r.size
        d["rss"] += r.rss
        d["anon"] += r.anon
        d["count"] += 1
    return out


def _similar(a: Region, b: Region) -> bool:
    return a.perms == b.perms and a.path == b.path and a.cls == b.cls


def diff_regions(prev: list[Region], cur: list[Region]) -> list[dict[str, Any]]:
    """Events between two snapshots of one address space.

    - same start and kind: ``grown``/``shrunk`` when the size changed, or RSS rose by ≥ RSS_GROWTH_EVENT_BYTES;
    - an old and a new region that overlap (the kernel merged or split VMAs, e.g. an anonymous region
      extended downwards by the next mmap) are the same region: ``grown``/``shrunk`` with old_start;
    - an old region gone and a similar one (same perms, path, class) born elsewhere with no overlap:
      ``moved`` — mremap(MAYMOVE) or munmap+mmap cycles (seed 002's signature);
    - everything else: ``born`` / ``gone``."""
    events: list[dict[str, Any]] = []
    prev_by_start = {r.start: r for r in prev}
    cur_by_start = {r.start: r for r in cur}
    # Same start and same kind: the same region. Same start but another kind (the kernel reused the
    # address for a different mapping) is a gone + a born.
    same = {s for s, r in cur_by_start.items() if s in prev_by_start and _similar(prev_by_start[s], r)}
    gone = [r for r in prev if r.start not in same]
    born = [r for r in cur if r.start not in same]

    def ev(kind: str, new: Region | None, old: Region | None) -> dict[str, Any]:
        ref = new or old
        assert ref is not None
        return {"event": kind, "start": new.start if new else old.start,  # type: ignore[union-attr]
                "end": new.end if new else old.end,  # type: ignore[union-attr]
                "size": new.size if new else 0, "rss": new.rss if new else 0,
                "old_start": old.start if old else None, "old_size": old.size if old else None,
                "old_rss": old.rss if old else None, "perms": ref.perms, "path": ref.path, "cls": ref.cls}

    for r in cur:
        if r.start not in same:
            continue
        o = prev_by_start[r.start]
        if r.size > o.size or (r.size == o.size and r.rss - o.rss >= RSS_GROWTH_EVENT_BYTES):
            events.append(ev("grown", r, o))
        elif r.size < o.size:
            events.append(ev("shrunk", r, o))

    # Overlap pairing: both lists are sorted by start, a sweep keeps it linear.
    gone.sort(key=lambda r: r.start)
    born.sort(key=lambda r: r.start)
    paired_gone: set[int] = set()
    paired_born: set[int] = set()
    i = 0
    for b in born:
        while i < len(gone) and gone[i].end <= b.start:
            i += 1
        j = i
        while j < len(gone) and gone[j].start < b.end:
            g = gone[j]
            if g.start not in paired_gone and _similar(g, b):
                paired_gone.add(g.start)
                paired_born.add(b.start)
                if b.size != g.size or b.rss - g.rss >= RSS_GROWTH_EVENT_BYTES:
                    events.append(ev("grown" if b.size >= g.size else "shrunk", b, g))
                break
            j += 1
    gone = [g for g in gone if g.start not in paired_gone]
    born = [b for b in born if b.start not in paired_born]

    # Moves: for each gone region, the unpaired born region of the same kind closest in size
    # (the new one is at least half and at most 4× the old: growth by mremap, or a re-map).
    for g in sorted(gone, key=lambda r: -r.size):
        if g.cls not in ("anon", "arena", "heap", "shm", "other"):
            continue
        best: Region | None = None
        for b in born:
            if b.start in paired_born or not _similar(g, b):
                continue
            if not (g.size // 2 <= b.size <= g.size * 4):
                continue
            if best is None or abs(b.size - g.size) < abs(best.size - g.size):
                best = b
        if best is not None:
            paired_born.add(best.start)
            paired_gone.add(g.start)
            events.append(ev("moved", best, g))
    for g in gone:
        if g.start not in paired_gone:
            events.append(ev("gone", None, g))
    for b in born:
        if b.start not in paired_born:
            events.append(ev("born", b, None))
    return events


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def label_of(pid: int) -> str:
    """A short human label from comm/cmdline (vLLM-aware labels come from leaktrace.vllm.labels)."""
    try:
        comm = procfs.read_comm(pid)
    except (ProcessGone, AccessDenied):
        return "?"
    return comm


class WatcherProbe:
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

    # -- process tree
    def _refresh_tree(self, now: float) -> None:
        assert self.ctx is not None
        ts = self.ctx.targets
        found: dict[int, int] = {}
        for root in ts.roots:
            if root in self._dead_roots or not self._same_process(root):
                self._dead_roots.add(root)
                continue
            try:
                p = psutil.Process(root)
                if p.status() != psutil.STATUS_ZOMBIE:  # a zombie's memory is already released
                    found[root] = p.ppid()
                for c in p.children(recursive=True):
                    try:
                        if c.status() != psutil.STATUS_ZOMBIE:
                            found[c.pid] = c.ppid()
                    except psutil.NoSuchProcess:
                        pass
            except psutil.NoSuchProcess:
                continue
            except psutil.AccessDenied:
                found.setdefault(root, 0)
        # Also keep children the bpf probe added (found in the kernel before we saw them here).
        with ts.lock:
            known = dict(ts.pids)
        for pid, ppid in known.items():
            if pid not in found and pid not in ts.roots and _alive(pid) and self._same_process(pid):
                found[pid] = ppid
        # A child pid reused by a new child between two ticks: the old process exited, a new one is seen.
        reused = {p for p in found if p in known and not self._same_process(p)}
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

    def _same_process(self, pid: int) -> bool:
        """False when ``pid`` now names another process than the one first seen (compared by the start
        time in /proc/PID/stat, which exec() keeps and PID reuse changes)."""
        try:
            st = int(procfs.read_stat(pid)["starttime"])  # type: ignore[call-overload]
        except (ProcessGone, AccessDenied, procfs.ParseError, IndexError, ValueError):
            return True  # gone or unreadable: the tree refresh decides
        return self._starttime.setdefault(pid, st) == st

    def _record_process(self, pid: int, ppid: int, now: float, event: str) -> None:
        assert self.ctx is not None
        try:
            cmd = procfs.read_cmdline(pid)
            comm = procfs.read_comm(pid)
        except (ProcessGone, AccessDenied):
            cmd, comm = [], "?"
        try:
            exe = psutil.Process(pid).exe()
        except (psutil.Error, OSError):
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
        full = self._ticks % self.smaps_every == 0
        self._ticks += 1
        rows = []
        for pid in self.ctx.targets.live():
            try:
                r = procfs.read_smaps_rollup(pid)
            except ProcessGone:
                continue  # picked up as exited at the next tree refresh
            except AccessDenied as e:
                if pid not in self._denied:
                    self._denied.add(pid)
                    self.ctx.warn(str(e))
                continue
            self.rollups += 1
            rows.append(rollup_row(self.ctx.session.now(), pid, r))  # when read: see the module docstring
            if full:
                self._full_smaps(pid)
        self.ctx.session.append("rollup", rows)
        self.ctx.live.rollup = {r["pid"]: r for r in rows}

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
        return {"ticks": self._ticks, "rollups": self.rollups, "smaps_reads": self.smaps_reads}


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
