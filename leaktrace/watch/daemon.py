"""The watch's loop: every tick the selection is rescanned, the watcher probe reads each process's
smaps_rollup into the rolling history (a full smaps every smaps_every ticks), each process is judged (one judged
growing joins the eBPF ledger's targets: watch/ebpf.py), a leak held for --confirm-s starts a deep hunt, a
growing process that ended leaves an exit incident, watch.json is rewritten (atomically) and the Prometheus
snapshot replaced. It stops at --duration or on SIGTERM/Ctrl-C, stopping its deep hunts cleanly (their sessions
and reports are written)."""

from __future__ import annotations

import json
import resource
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from leaktrace import __version__
from leaktrace.atomic import atomic_write_text
from leaktrace.probes import HuntContext, HuntOptions, TargetSet
from leaktrace.probes.exporter import WatchExporter
from leaktrace.probes.watcher import WatcherProbe
from leaktrace.ticking import StopFlag, tick_until_stopped
from leaktrace.watch import FAST_CONFIRM_S, WatchOptions
from leaktrace.watch.books import HeapBooks, held_growth, held_line, not_held
from leaktrace.watch.ebpf import WatchLedger
from leaktrace.watch.incidents import (
    Incident,
    enforce_disk,
    poll_deep_hunt,
    start_deep_hunt,
    stop_deep_hunt,
    write_exit_incident,
)
from leaktrace.watch.judge import Judgement, judge, leaks_through, thresholds
from leaktrace.watch.kmsg import oom_killed
from leaktrace.watch.mallopt import fix_mmap_threshold
from leaktrace.watch.outstanding import outstanding_by_library
from leaktrace.watch.ring import RingSession
from leaktrace.watch.suspect import suspect
from leaktrace.watch.targets import Selector, selection

WATCH_JSON = "watch.json"
WATCH_SCHEMA = "leaktrace.watch/1"
MAX_INCIDENTS_LISTED = 100  # watch.json and memory: the newest incidents (all stay on disk, up to the bound)
MAX_EXITED_LISTED = 50
DISK_CHECK_EVERY_S = 60.0


@dataclass
class Tracked:
    pid: int
    root: int
    first_t: float
    j: Judgement
    leaking_since: float | None = None
    confirmed: bool = False
    grew: bool = False  # judged growing at least once: an exit leaves an incident
    last_grew: float = 0.0  # when it was last judged growing
    growing_since: float | None = None  # the start of its current run of ticks judged growing
    held: str | None = None  # why a leak by RSS is not confirmed (nothing it holds grows, or it stopped)


class Watch:
    def __init__(self, options: WatchOptions, out: Path, log: Callable[[str], None] = lambda s: None) -> None:
        self.options, self.out, self.log = options, out, log
        self.th = thresholds(options.leak_mb_per_min)
        self.window_s = max(60.0, 30.0 * options.interval)
        # History kept per process: the judging window, and at least 720 samples (2 h at the default
        # interval) for the session an exit incident leaves.
        self.ring = RingSession(rollup_rows=max(720, int(self.window_s / options.interval) + 8))
        self.selector = Selector(list(options.pids), options.vllm, options.match)
        hopts = HuntOptions(duration=float("inf"), interval=options.interval, smaps_every=options.smaps_every,
                            bpf=False, gdb=False, pyheap=False)
        self.targets = TargetSet(roots=[])
        self.ctx = HuntContext(session=self.ring, targets=self.targets, options=hopts,
                               log=log)
        self.ledger = WatchLedger(self.ring, hopts, log)  # eBPF, over the processes judged growing
        self.watcher = WatcherProbe(hopts)
        self.tracked: dict[int, Tracked] = {}
        self.incidents: deque[Incident] = deque(maxlen=MAX_INCIDENTS_LISTED)
        self.running: list[Incident] = []
        self.exited: deque[dict[str, Any]] = deque(maxlen=MAX_EXITED_LISTED)
        self.incidents_total = 0
        self.ticks = 0
        self.started_wall = time.time()
        self._last_disk = -DISK_CHECK_EVERY_S
        self._snap_lock = threading.Lock()
        self._snap: dict[str, Any] = {"procs": [], "outstanding": [], "incidents_total": 0, "cpu_s": 0.0}
        self.exporter: WatchExporter | None = None
        self.warnings = 0
        self.bpf: Any = None
        self.books = HeapBooks()
        self.verbose = False

    # -- the loop
    def run(self, stop: threading.Event | None = None) -> str:
        flag = StopFlag()
        flag.install()
        if stop is not None:
            flag.join(stop)
        reason = "deadline"
        fix_mmap_threshold()
        try:
            if self.options.prometheus_port is not None:
                self.exporter = WatchExporter(self.options.prometheus_port, self.options.prometheus_addr,
                                              self.snapshot)
                self.exporter.start()
                self.log(f"Prometheus metrics on http://{self.exporter.addr}:{self.exporter.port}/metrics")
            self.watcher.start(self.ctx)
            if self.options.bpf:
                self.bpf = self.ledger.start()
            t_end = None if self.options.duration is None else self.ring.now() + self.options.duration
            reason = tick_until_stopped(self.ring.now, self.options.interval, flag, lambda _now, _late: self.tick(),
                                        t_end=t_end)
        finally:
            for inc in list(self.running):
                stop_deep_hunt(inc)
                self._finished(inc)
            if self.bpf is not None:
                self._guarded("stopping the eBPF probe", self.bpf.stop)
            self.stop_reason = reason
            self._write_json(reason)
            if self.exporter is not None:
                self.exporter.stop()
            flag.restore()
        return reason

    def tick(self) -> None:
        now = self.ring.now()
        self.ticks += 1
        roots = self.selector.roots()
        with self.targets.lock:
            self.targets.roots[:] = roots
        before = set(self.targets.live())
        # The selection decides which roots are the same process (Selector checks start times): a pid the
        # watcher saw end may name a new matching process later (bounded over days of churn, too).
        self.watcher._dead_roots.clear()
        self.watcher.tick(now)
        live = set(self.targets.live())
        if self.bpf is not None:
            self._guarded("eBPF snapshot", self.bpf.tick, now)  # exits applied before they are handled
        root_of = self._roots_of(live)
        for pid in sorted(live - before):
            self.log(f"following pid {pid} (tree of {root_of.get(pid, pid)})")
        # One process's failure (a report that cannot be built, a /proc race) never stops the sentinel.
        for pid in sorted(set(self.tracked) - live):
            self._guarded(f"pid {pid} ended", self._ended, pid, now)
        for pid in sorted(live):
            self._guarded(f"judging pid {pid}", self._judge, pid, root_of.get(pid, pid), now)
        if self.bpf is not None:
            with self.targets.lock:
                parent = dict(self.targets.pids)
            self._guarded("eBPF targets", self.ledger.follow, self.tracked, parent, live,
                          {i.root for i in self.running}, now, self.window_s)
        for inc in list(self.running):
            if poll_deep_hunt(inc):
                self._finished(inc)
        if now - self._last_disk >= DISK_CHECK_EVERY_S or self._dirty:
            self._bound_disk()
            self._last_disk = now
        self._publish()
        self._write_json(None)

    _dirty = False

    def _guarded(self, what: str, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except Exception as e:  # logged with its cause; the watch goes on
            self.warnings += 1
            self.log(f"warning: {what}: {type(e).__name__}: {e}")
            if self.verbose:
                import traceback

                traceback.print_exc()

    def _roots_of(self, live: set[int]) -> dict[int, int]:
        with self.targets.lock:
            parent = dict(self.targets.pids)
            roots = set(self.targets.roots)
        out = {}
        for pid in live:
            p, seen = pid, set()
            while p not in roots and p in parent and p not in seen:
                seen.add(p)
                p = parent[p]
            out[pid] = p if p in roots else pid
        return out

    def _judge(self, pid: int, root: int, now: float) -> None:
        tr = self.tracked.get(pid)
        rows = self.ring.rollup(pid, since=now - self.window_s)
        j = judge(rows, self.th)
        if tr is None:
            tr = self.tracked[pid] = Tracked(pid, root, now, j)
        tr.j = j
        tr.grew = tr.grew or j.growing
        if j.growing:
            tr.last_grew = now
            if tr.growing_since is None:
                tr.growing_since = now
        else:
            tr.growing_since = None
        # malloc's books judge only beside the ledger: while it leaks (held back?), while it grows when it may be
        # confirmed early (what it held from the start of its growth)
        may_be_early = self.options.fast_confirm_mb_per_min > 0
        if self.bpf is not None and not tr.confirmed and (j.leaking or may_be_early and j.growing):
            row = self.books.read(pid, now)
            if row is not None:
                self.ring.append("malloc_state", row)
        if not j.leaking:
            tr.leaking_since, tr.held = None, None
            return
        if tr.leaking_since is None:
            tr.leaking_since = now
            self.log(f"pid {pid} grows {max(j.rss_per_s, j.anon_per_s) * 60 / 2**20:.1f} MB/min: a leak by "
                     f"the hunt's rules; confirming for {self.options.confirm_s:.0f}s")
        if tr.confirmed:
            return
        early = None
        if now - tr.leaking_since < self.options.confirm_s:
            early = self._held_grows(pid, tr, now)
            if early is None:
                return
        else:
            if not leaks_through(rows, tr.leaking_since, self.th):
                why = (f"no leak over the {now - tr.leaking_since:.0f}s it was judged leaking (its growth stopped "
                       "or slowed inside the judging window)")
                if tr.held is None:
                    self.log(f"pid {pid}: not confirmed: {why}")
                tr.held, tr.leaking_since = why, now  # confirmation starts over, as below
                return
            why = self._untouched(pid, tr, now)
            if why is not None:
                if tr.held is None:
                    self.log(f"pid {pid}: not confirmed: {why}")
                # confirmation starts over: growth that something it holds explains must last confirm_s of its own
                tr.held, tr.leaking_since = why, now
                return
        tr.held = None
        tr.confirmed = True
        # One deep hunt per tree at a time; with --vllm a deep hunt covers every vLLM server of the host (its
        # /metrics and roles come with `hunt --vllm`), so one at a time.
        if any(i.root == tr.root or self.options.vllm for i in self.running):
            return
        inc = start_deep_hunt(self.out, pid, tr.root, now, self.options)
        self.log(f"pid {pid}: leak confirmed{': ' + early if early else ''}; deep hunt of the tree of {tr.root} "
                 f"for {self.options.deep_hunt_s:.0f}s -> {inc.path}")
        self._new_incident(inc)
        if inc.proc is not None:
            self.running.append(inc)

    def _held_grows(self, pid: int, tr: Tracked, now: float) -> str | None:
        """Why a leak judged for less than --confirm-s is confirmed now (watch/books.py held_line): it grows at
        --fast-confirm-mb-per-min or more, for FAST_CONFIRM_S, and what it holds (malloc's books, the eBPF
        ledger, read since it was judged growing) grows with it. None: it waits --confirm-s."""
        assert tr.leaking_since is not None
        fast = self.options.fast_confirm_mb_per_min
        if self.bpf is None or fast <= 0 or tr.growing_since is None or now - tr.leaking_since < FAST_CONFIRM_S:
            return None
        grows = max(tr.j.rss_per_s, tr.j.anon_per_s) * 60 / 2**20
        if grows < fast:
            return None
        t0 = max(tr.growing_since, now - self.window_s)
        ledger = self.ring.since("ledger_snapshots", pid, t0) if self.ledger.holds(pid) else []
        return held_line(grows, held_growth(self.ring.since("malloc_state", pid, t0), ledger), fast)

    def _untouched(self, pid: int, tr: Tracked, now: float) -> str | None:
        """Why a process judged leaking by its RSS is no leak when nothing it holds grows over the span it has
        been leaking (at most the judging window): malloc's books and the eBPF ledger beside them
        (watch/books.py). None when it holds more, or when the ledger did not trace it over that span."""
        assert tr.leaking_since is not None
        t0 = max(tr.leaking_since, now - self.window_s)
        traced = self.ledger.traced_since(pid)
        if traced is None or traced > t0 + self.options.interval:
            return None
        return not_held(self.ring.since("malloc_state", pid, t0), self.ring.since("ledger_snapshots", pid, t0),
                        tr.j.rss_per_s * 60 / 2**20, tr.j.anon_per_s * 60 / 2**20, now - t0,
                        self.th["leak_mb_per_min"])

    def _ended(self, pid: int, now: float) -> None:
        tr = self.tracked.pop(pid)
        try:
            self._exit_incident(pid, tr, now)
        finally:
            self._forget(pid)

    def _forget(self, pid: int) -> None:
        self.ring.forget(pid)
        self.selector.forget(pid)
        self.books.forget(pid)
        if self.bpf is not None:  # the symbolizer keeps an exited process's maps for a hunt's final stacks
            self.bpf.symbols.forget(pid)
            self.bpf.libraries.forget(pid)

    def _exit_incident(self, pid: int, tr: Tracked, now: float) -> None:
        tables = self.ring.tables(pid)
        if tables.get("ledger_snapshots"):
            tables["bpf_counters"] = self.ring.tables(-1).get("bpf_counters") or []
        code = next((int(r["exit_code"]) for r in reversed(tables.get("processes") or [])
                     if r.get("event") == "exit" and r.get("exit_code") is not None and int(r["exit_code"]) >= 0),
                    None)
        kx = (tables.get("ledger_exits") or [None])[-1]  # the kernel's word on the exit, when the probe ran
        if kx is not None:
            code = int(kx["exit_code"]) if int(kx["exit_code"]) >= 0 else code
        oom = bool(kx and kx.get("oom")) or oom_killed(pid)
        self.exited.append({"pid": pid, "t": round(now, 3), "exit_code": code, "oom": oom, "grew": tr.grew})
        if tr.grew or tr.confirmed or oom:
            meta = {"selection": selection(self.options), "interval": self.options.interval,
                    "deep_hunts": [str(i.path) for i in self.incidents if i.kind == "leak" and i.root == tr.root],
                    "rates": {"rss_bytes_per_s": tr.j.rss_per_s, "anon_bytes_per_s": tr.j.anon_per_s}}
            inc = write_exit_incident(self.out, pid, tr.root, now, tables, code, oom, meta, self.options.formats)
            self.log(f"pid {pid} ended ({inc.exit['how'] if inc.exit else '?'}) while growing: {inc.path}")
            self._new_incident(inc)
            self._finished(inc)

    def _new_incident(self, inc: Incident) -> None:
        self.incidents.append(inc)
        self.incidents_total += 1
        self._dirty = True

    def _finished(self, inc: Incident) -> None:
        if inc in self.running:
            self.running.remove(inc)
            self.log(f"deep hunt of pid {inc.pid} {inc.status}: verdict {inc.verdict} ({inc.path})"
                     + (f": {inc.error}" if inc.error else ""))
        self._dirty = True

    def _bound_disk(self) -> None:
        self._dirty = False
        busy = {i.path for i in self.running}
        for p in enforce_disk(self.out, self.options.max_disk_mb * 2**20, busy):
            self.log(f"--max-disk-mb: deleted the oldest incident {p}")
            for inc in self.incidents:
                if inc.path == p:
                    inc.status = "deleted"

    # -- what others read
    def _publish(self) -> None:
        procs = []
        now = self.ring.now()
        for pid, tr in sorted(self.tracked.items()):
            info = self.selector.describe(pid, tr.root)
            state = ("confirmed" if tr.confirmed else "growing" if tr.held is not None
                     else "leaking" if tr.leaking_since is not None else "growing" if tr.j.growing else "ok")
            # Under confirmation or confirmed: what the eBPF ledger names, while the leak is confirmed.
            named = suspect(self.ring.since("ledger_snapshots", pid, now - self.window_s),
                            self.th["ledger_mb_per_min"]) if state in ("leaking", "confirmed") else None
            procs.append({"pid": pid, "root": tr.root, "label": info.label, "role": info.role,
                          "instance": info.instance, "rss": tr.j.rss, "anon": tr.j.anon,
                          "rss_per_s": tr.j.rss_per_s, "anon_per_s": tr.j.anon_per_s, "state": state,
                          "suspect": named, "held_back": tr.held})
        outstanding, resident = outstanding_by_library(self.tracked, self.ledger.holds, self.ring.latest,
                                                       self.incidents)
        ru = resource.getrusage(resource.RUSAGE_SELF)
        snap = {"procs": procs, "outstanding": [(*k, v) for k, v in outstanding.items()],
                "outstanding_resident": [(*k, v) for k, v in resident.items()],
                "incidents_total": self.incidents_total, "cpu_s": ru.ru_utime + ru.ru_stime,
                "ledger": self.bpf.summary() if self.bpf is not None else None}
        with self._snap_lock:
            self._snap = snap

    def snapshot(self) -> dict[str, Any]:
        with self._snap_lock:
            return self._snap

    def _write_json(self, stop_reason: str | None) -> None:
        snap = self.snapshot()
        doc = {
            "schema": WATCH_SCHEMA, "leaktrace": __version__, "started_wall": self.started_wall,
            "updated_wall": time.time(), "running": stop_reason is None, "stop_reason": stop_reason,
            "selection": selection(self.options), "interval_s": self.options.interval, "ticks": self.ticks,
            "thresholds": {"leak_mb_per_min": self.th["leak_mb_per_min"], "confirm_s": self.options.confirm_s,
                           "fast_confirm_mb_per_min": self.options.fast_confirm_mb_per_min,
                           "deep_hunt_s": self.options.deep_hunt_s, "max_disk_mb": self.options.max_disk_mb},
            "cpu_s": round(snap["cpu_s"], 3), "warnings": self.warnings, "ebpf": self.bpf is not None,
            "prometheus": None if self.exporter is None else {"addr": self.exporter.addr, "port": self.exporter.port},
            "targets": [{**{k: p[k] for k in ("pid", "root", "label", "role", "instance", "state")},
                         "rss_bytes": p["rss"], "anon_bytes": p["anon"],
                         "rss_mb_per_min": round(p["rss_per_s"] * 60 / 2**20, 4),
                         "anon_mb_per_min": round(p["anon_per_s"] * 60 / 2**20, 4),
                         **({"suspect": p["suspect"]} if p.get("suspect") else {}),
                         **({"held_back": p["held_back"]} if p.get("held_back") else {})} for p in snap["procs"]],
            "exited": list(self.exited),
            "incidents_total": self.incidents_total,
            "incidents": [i.as_dict() for i in self.incidents],
        }
        try:
            atomic_write_text(self.out / WATCH_JSON, json.dumps(doc, indent=1, default=str))
        except OSError as e:
            self.log(f"warning: cannot write {self.out / WATCH_JSON}: {e}")
