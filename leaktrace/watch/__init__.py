"""`leaktrace watch`: the always-on sentinel. A conductor like leaktrace/hunt.py, over a target set that
changes (processes matching the selection are picked up as they start and followed until they end):

  targets   which roots to follow, rescanned every tick (--pid, --vllm, --match)
  ring      the bounded in-memory session the watcher probe writes into (rolling history per process)
  judge     the verdict rules of `hunt` (leaktrace.analysis) over each process's recent history
  incidents a confirmed leak's deep hunt (a normal `hunt` of its tree) and the session left by a growing
            process that ended; the disk bound (--max-disk-mb)
  outstanding  what the tracked processes hold by library, for the Prometheus snapshot
  daemon    the loop: tick, judge, escalate, watch.json, the Prometheus snapshot, a clean stop
"""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_INTERVAL_S = 10.0
DEFAULT_CONFIRM_S = 120.0
# --fast-confirm-mb-per-min: a leak at least this fast is confirmed once judged leaking for FAST_CONFIRM_S, when
# what it holds grows with it (watch/books.py held_line). Off by default: a cache filling at that rate, or a
# sawtooth's rise, holds what it grows by as a leak does, and a clean day then pages several times more
# (docs/verdicts.md).
DEFAULT_FAST_CONFIRM_MB_PER_MIN = 0.0
FAST_CONFIRM_S = 20.0
DEFAULT_DEEP_HUNT_S = 300.0
DEFAULT_MAX_DISK_MB = 1024.0


@dataclass
class WatchOptions:
    pids: list[int] = field(default_factory=list)
    vllm: bool = False
    match: str | None = None
    interval: float = DEFAULT_INTERVAL_S
    prometheus_port: int | None = None
    prometheus_addr: str = "127.0.0.1"
    leak_mb_per_min: float | None = None  # None: the verdict rules' own threshold (hunt's)
    confirm_s: float = DEFAULT_CONFIRM_S
    fast_confirm_mb_per_min: float = DEFAULT_FAST_CONFIRM_MB_PER_MIN  # 0: every leak waits confirm_s
    deep_hunt_s: float = DEFAULT_DEEP_HUNT_S
    max_disk_mb: float = DEFAULT_MAX_DISK_MB
    duration: float | None = None  # None: until SIGTERM / Ctrl-C
    bpf: bool = True  # passed on to the deep hunts (--no-bpf)
    gdb: bool = True  # passed on to the deep hunts (--no-gdb)
    smaps_every: int = 30  # a full smaps (class growth, region diffs) every N ticks: rare, it costs
    formats: tuple[str, ...] = ("json", "md", "html")
