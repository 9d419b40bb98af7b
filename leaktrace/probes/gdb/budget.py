"""What one gdb run may cost the target and what it cost: :class:`PauseBudget` (the limits the sampler stops
within) and :class:`GdbRun` (one attach's figures, a ``gdb_runs`` row)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class PauseBudget:
    """Limits on how much the sampler may stop the target. ``pause_fraction`` of the elapsed sampling
    time (counted over at least ``floor_s``), and ``max_stops_per_s`` over any second."""

    pause_fraction: float = 0.01
    floor_s: float = 30.0
    max_stops_per_s: float = 200.0
    # gdb's own work per stop outside the handler (ptrace, waitpid, frame cache): bench_gdb measures the
    # pause seen by the target at ~1.5–2× the handler time; this allowance keeps the budget honest.
    per_stop_overhead_us: float = 150.0


@dataclass
class GdbRun:
    """One attach of the sampler to one process (a ``gdb_runs`` row): the figures come from the sampler's
    "attached" and "end" records (gdb_scripts/sampler.py), the rest from what the driver sees itself."""

    pid: int
    reason: str = ""  # why sampling ended: the sampler's word (budget, samples, exit) or the driver's
    stops: int = 0  # stops of a target thread the handler took (a syscall's entry and its exit each count)
    samples: int = 0  # stacks recorded (one per caught syscall exit)
    paused_s: float = 0.0  # stopped time charged to the pause budget: handler time + per-stop allowance
    handler_s: float = 0.0  # time spent in the sampler's stop handler alone
    attach_s: float = 0.0  # the attach's one-off whole-process pause, kept out of the budget
    symbols_s: float = 0.0  # the symbol read before the attach (the target is not stopped by it)
    threads: int = 0  # threads of the target at the attach
    python: str = ""  # the Python frame reader's status: "ok: ...", "n/a: ..." or "unavailable: ..."
    state_after: str | None = None  # /proc state letter after the detach; None when the process is gone
    tracer_after: int | None = None  # TracerPid after the detach (0: none)
    sigcont: bool = False  # a stop left behind by attach/detach was undone with SIGCONT
    site: int = 0  # the call site gdb stopped at (a breakpoint there), 0: the mapping syscalls (catch syscall)
    t_start_mono: float = 0.0  # time.monotonic() at the start, the sampler's clock too
    t_end_mono: float = 0.0
    records: list[dict[str, Any]] = field(default_factory=list)  # every JSON line the sampler wrote

    @property
    def sample_records(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("type") == "sample"]
