"""How a conductor runs (a hunt, and watch): :class:`StopFlag`, set by the signals that stop it, and
:func:`tick_until_stopped`, one tick an interval until a stop."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any


class StopFlag:
    """Set by SIGINT/SIGTERM/SIGHUP (once :meth:`install` ran on the main thread) or by :meth:`join`'s event;
    the first signal stops cleanly, a second one during shutdown is ignored so the report is still written."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.reason = ""
        self._old: dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        for sig in sigs:
            self._old[sig] = signal.signal(sig, self._handler)
        # A hunt started by a process that blocks these (a Ray worker does) inherits the mask across
        # exec(): unblocked, or Ctrl-C forwarded by a cluster driver would stay pending for ever.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, sigs)

    def join(self, stop: threading.Event) -> None:
        """An external stop (the demo, a Ray task, a test) sets this flag too."""
        threading.Thread(target=lambda: (stop.wait(), self.event.set()), daemon=True).start()

    def _handler(self, signum: int, frame: Any) -> None:
        if not self.event.is_set():
            self.reason = {signal.SIGINT: "interrupted (Ctrl-C)", signal.SIGTERM: "SIGTERM",
                           signal.SIGHUP: "SIGHUP"}.get(signum, f"signal {signum}")
        self.event.set()

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def tick_until_stopped(clock: Callable[[], float], interval: float, flag: StopFlag,
                       tick: Callable[[float, float], str | None], t_end: float | None = None,
                       last_tick: Callable[[float], None] | None = None) -> str:
    """Call ``tick(now, late_s)`` once per ``interval`` (``clock``'s seconds) until the flag is set, ``tick``
    returns a reason to stop, or ``clock`` reaches ``t_end`` ("deadline"). Returns the stop reason. A flag set
    while waiting for the next tick calls ``last_tick(now)`` (the final state recorded) before returning.

    Missed ticks are skipped, not caught up: after a stall (the process not scheduled on a saturated
    machine, a slow /proc read) a burst of back-to-back ticks would cost the targets CPU and bunch the
    samples in time."""
    end = float("inf") if t_end is None else t_end
    next_tick = clock()
    while True:
        now = clock()
        late_s = now - next_tick
        next_tick = max(next_tick, now)
        reason = tick(now, late_s)
        if flag.event.is_set():
            return flag.reason or "stopped"
        if reason:
            return reason
        if now >= end:
            return "deadline"
        next_tick += interval
        if flag.event.wait(max(0.0, min(next_tick, end) - clock())):
            if last_tick is not None:
                last_tick(clock())
            return flag.reason or "stopped"
