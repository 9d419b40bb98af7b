"""Probes: each collects rows into the session and renders nothing.

A probe implements :class:`Probe` (:class:`ProbeBase` gives its optional parts). ``hunt`` starts every probe
over one :class:`HuntContext`, calls ``tick`` from its main loop once per interval, and ``stop`` exactly
once (also on Ctrl-C and errors). Probes with their own threads (bpf polling, gdb sampling) must stop them
in ``stop``. Rows go to the context's :class:`SessionSink`: a session directory's writer in a hunt, watch's
in-memory ring in a watch.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from leaktrace.sched import HUNT_NICE

MAX_WARNINGS = 200


@dataclass
class TargetSet:
    """The live process set being hunted. Roots are what the user named; the watcher adds descendants
    each tick (the bpf probe may add them sooner, from the kernel)."""

    roots: list[int]
    pids: dict[int, int] = field(default_factory=dict)  # pid -> ppid, live ones
    exited: dict[int, float] = field(default_factory=dict)  # pid -> t of exit
    labels: dict[int, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def live(self) -> list[int]:
        with self.lock:
            return sorted(self.pids)



@dataclass
class HuntOptions:
    duration: float = 60.0
    interval: float = 1.0
    smaps_every: int = 10  # full smaps every N ticks
    bpf: bool = True
    gdb: bool = True
    gdb_samples: int | None = None  # None: default policy; 0: disabled
    vllm: bool = False
    metrics_urls: list[str] = field(default_factory=list)
    pyheap: bool = True  # the Python heap probe (Python targets only; --no-pyheap)
    prometheus_port: int | None = None
    prometheus_addr: str = "127.0.0.1"
    live: bool | None = None  # None: when stdout is a TTY
    # BPF asked for (the CLI's default): unavailable, the hunt stops with one clear error (exit 5) instead
    # of going on with /proc alone.
    bpf_required: bool = False
    gdb_seconds: float | None = None  # longest gdb window per process (None: the probe's default)
    # Pause budget of the gdb sampler (None: the probe's defaults, see probes/gdb/attach.PauseBudget).
    gdb_pause_fraction: float | None = None
    gdb_max_stops_per_s: float | None = None
    nice: int = HUNT_NICE  # the hunt's scheduling priority (leaktrace/sched.py); 0: left as it is


@dataclass
class LiveFigures:
    """The small figures probes publish while the hunt runs, for the live view, the Prometheus exporter and
    each other (the gdb probe samples a process once the watcher saw it grow). Each probe replaces its own
    field whole (one assignment), so readers in other threads see a complete value."""

    rollup: dict[int, dict[str, Any]] = field(default_factory=dict)  # watcher: smaps_rollup row per pid
    # bpf: outstanding_bytes, events, lost_events, outstanding_by_library {library: bytes},
    # outstanding_by_pid {pid: bytes} (what each process mapped since attach and still holds), mapped_by_pid {pid:
    # bytes} (all it maps in the books, pre-existing included: a churner replacing what it held at attach keeps it
    # flat while its since-attach figure climbs from 0), top_sites [{pid,
    # site, ip, kind, bytes, frames, break_at}] (the call sites holding most of that, per process: gdb stops there)
    bpf: dict[str, Any] = field(default_factory=dict)
    gdb: dict[str, Any] = field(default_factory=dict)  # gdb: runs, samples, paused_s
    vllm_instances: list[dict[str, Any]] = field(default_factory=list)  # vllm: one per server (port, role…)
    metrics_requests: dict[str, Any] = field(default_factory=dict)  # metrics: requests per /metrics URL


class TickCosts:
    """What each probe's ticks cost (wall and this thread's CPU seconds) and how late the ticks started: a
    stalled hunt (ticks late while every probe is quick: the hunt was not scheduled) is told apart from a
    slow probe, and a probe that waits (wall far above CPU: a /proc read of a busy process, a socket) from
    one that computes."""

    def __init__(self) -> None:
        self.probes: dict[str, dict[str, float]] = {}
        self.ticks = 0
        self.late_ticks = 0  # started more than one interval after they were due
        self.max_late_s = 0.0
        self.max_late_at_s: float | None = None
        self.stop_s: dict[str, float] = {}  # what each probe's stop took (its last reads, its threads joined)
        self.attach_cpu_s: float | None = None  # this process's CPU until every probe was live (imports, compile)

    def stopped(self, name: str, wall_s: float) -> None:
        self.stop_s[name] = round(wall_s, 3)

    def add(self, name: str, wall_s: float, cpu_s: float, now: float) -> None:
        d = self.probes.setdefault(name, {"ticks": 0, "wall_s": 0.0, "cpu_s": 0.0, "max_wall_s": 0.0,
                                          "max_wall_at_s": 0.0})
        d["ticks"] += 1
        d["wall_s"] += wall_s
        d["cpu_s"] += cpu_s
        if wall_s > d["max_wall_s"]:
            d["max_wall_s"], d["max_wall_at_s"] = wall_s, now

    def attached(self) -> None:
        import resource

        own = resource.getrusage(resource.RUSAGE_SELF)
        self.attach_cpu_s = round(own.ru_utime + own.ru_stime, 3)

    def started(self, late_s: float, interval: float, now: float) -> None:
        self.ticks += 1
        if late_s > interval:
            self.late_ticks += 1
        if late_s > self.max_late_s:
            self.max_late_s, self.max_late_at_s = late_s, now

    def as_dict(self) -> dict[str, Any]:
        import resource

        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return {"process_cpu_s": round(own.ru_utime + own.ru_stime, 3),  # every thread, since leaktrace started
                "children_cpu_s": round(kids.ru_utime + kids.ru_stime, 3),  # helpers reaped: gdb, walkers
                "attach_cpu_s": self.attach_cpu_s,
                "ticks": self.ticks, "late_ticks": self.late_ticks, "max_late_s": round(self.max_late_s, 3),
                "max_late_at_s": None if self.max_late_at_s is None else round(self.max_late_at_s, 3),
                "stop_s": dict(self.stop_s),
                "probes": {k: {f: (int(v) if f == "ticks" else round(v, 4)) for f, v in d.items()}
                           for k, d in self.probes.items()}}


class SessionSink(Protocol):
    """Where probes write their rows: leaktrace.session.SessionWriter (a session directory) or
    leaktrace.watch.ring.RingSession (watch's bounded history in memory)."""

    meta: dict[str, Any]
    path: Path | None  # the session directory; None when rows are kept in memory only

    def now(self) -> float: ...  # seconds since the session's start (monotonic)

    def append(self, table: str, rows: list[dict[str, Any]] | dict[str, Any]) -> None: ...

    def append_columns(self, table: str, columns: dict[str, Any]) -> None: ...  # rows given column by column

    def update_meta(self, **fields: Any) -> None: ...

    def flush(self) -> None: ...


@dataclass
class HuntContext:
    session: SessionSink
    targets: TargetSet
    options: HuntOptions
    log: Any  # callable(str) -> None, progress/log lines for the user
    warnings: list[str] = field(default_factory=list)
    live: LiveFigures = field(default_factory=LiveFigures)
    tick_costs: TickCosts = field(default_factory=TickCosts)
    # Set by the hunt once every probe has started (the eBPF program compiled and tracing): work that can wait
    # (heap walks) waits for it, so none of it competes with the compile on a node whose cores serve.
    attached: threading.Event = field(default_factory=threading.Event)
    window_end: float = float("inf")  # session time at which the hunt's window ends (set by its main loop)

    def warn(self, msg: str) -> None:
        # Bounded: a probe that warns every tick of a day-long hunt must not grow leaktrace itself.
        if len(self.warnings) < MAX_WARNINGS:
            self.warnings.append(msg)
            self.log(f"warning: {msg}")
        elif len(self.warnings) == MAX_WARNINGS:
            self.warnings.append(f"more warnings suppressed after {MAX_WARNINGS}")
            self.log(f"warning: more warnings suppressed after {MAX_WARNINGS}")


class Probe(Protocol):
    name: str
    required: bool  # a failed start stops the hunt with its error; else it is a warning and the hunt goes on

    def prepare(self, ctx: HuntContext) -> bool:
        """Start, in the background, work that can run before the probe's turn (the eBPF program's compile);
        True when it did: such a probe starts after the others, its work running beside their starts."""
        ...

    def start(self, ctx: HuntContext) -> None: ...

    def tick(self, now: float) -> None: ...

    def stop(self) -> None: ...

    def cancel(self) -> None:
        """Prepared but never started (a required probe failed first): undo what ``prepare`` began."""
        ...

    def summary(self) -> dict[str, Any]: ...


class ProbeBase:
    """The optional parts of :class:`Probe` as most probes have them: not required, nothing to prepare."""

    name = ""
    required = False

    def prepare(self, ctx: HuntContext) -> bool:
        return False

    def cancel(self) -> None:
        return None


class RereadingProbe(ProbeBase):
    """The frame of a probe that reads its targets at start, as ticks come and a last time at stop: it keeps
    the hunt's options, the context from ``start`` on and the ticks counted, and calls ``_read(edge)`` with
    edge "start", "tick" or "stop" (at stop only when it was started). A subclass sets ``name`` and writes
    ``_read`` and ``summary``; it decides on which ticks a read is due."""

    def __init__(self, options: HuntOptions) -> None:
        self.options = options
        self.ctx: HuntContext | None = None
        self._ticks = 0

    def start(self, ctx: HuntContext) -> None:
        self.ctx = ctx
        self._read("start")

    def tick(self, now: float) -> None:
        self._ticks += 1
        self._read("tick")

    def stop(self) -> None:
        if self.ctx is not None:
            self._read("stop")

    def _read(self, edge: str) -> None:
        raise NotImplementedError
