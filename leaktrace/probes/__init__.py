"""Probes: each collects rows into the session and renders nothing.

A probe implements :class:`Probe`. ``hunt`` starts every probe over one :class:`HuntContext`, calls
``tick`` from its main loop once per interval, and ``stop`` exactly once (also on Ctrl-C and errors).
Probes with their own threads (bpf polling, gdb sampling) must stop them in ``stop``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

from leaktrace.session import SessionWriter

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

    def all_seen(self) -> list[int]:
        with self.lock:
            return sorted(set(self.pids) | set(self.exited))


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


@dataclass
class LiveFigures:
    """The small figures probes publish while the hunt runs, for the live view, the Prometheus exporter and
    each other (the gdb probe samples a process once the watcher saw it grow). Each probe replaces its own
    field whole (one assignment), so readers in other threads see a complete value."""

    rollup: dict[int, dict[str, Any]] = field(default_factory=dict)  # watcher: smaps_rollup row per pid
    # bpf: outstanding_bytes, events, lost_events, outstanding_by_library {library: bytes},
    # outstanding_by_pid {pid: bytes} (what each process mapped since attach and still holds)
    bpf: dict[str, Any] = field(default_factory=dict)
    gdb: dict[str, Any] = field(default_factory=dict)  # gdb: runs, samples, paused_s
    vllm_instances: list[dict[str, Any]] = field(default_factory=list)  # vllm: one per server (port, role…)
    metrics_requests: dict[str, Any] = field(default_factory=dict)  # metrics: requests per /metrics URL


@dataclass
class HuntContext:
    session: SessionWriter
    targets: TargetSet
    options: HuntOptions
    log: Any  # callable(str) -> None, progress/log lines for the user
    warnings: list[str] = field(default_factory=list)
    live: LiveFigures = field(default_factory=LiveFigures)

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

    def start(self, ctx: HuntContext) -> None: ...

    def tick(self, now: float) -> None: ...

    def stop(self) -> None: ...

    def summary(self) -> dict[str, Any]: ...
