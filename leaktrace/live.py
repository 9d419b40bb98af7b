"""Live view of a running hunt: per-process RSS and recent growth rates, the top growing library (once
the eBPF probe publishes its ledger), elapsed/remaining time.

On a terminal it is a rich ``Live`` panel on stderr; elsewhere (a pipe, a log file, systemd) it prints
one plain status line every ``PLAIN_EVERY_S`` seconds through the hunt's logger, so a long hunt in a
log still shows progress without flooding it.

Inputs are the small figures probes publish in ``HuntContext.live`` (probes.LiveFigures; nothing here
reads /proc): the watcher's smaps_rollup per process every tick, the eBPF ledger's outstanding bytes by
library, the gdb sampler's runs.
:class:`~leaktrace.probes.recent.RecentRates` is shared with the Prometheus exporter so both show the
same figures.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from leaktrace.probes import HuntContext, HuntOptions
from leaktrace.probes.recent import WINDOW_S, RecentRates, as_int

MB = 1024 * 1024
PLAIN_EVERY_S = 10.0
MAX_ROWS = 12  # processes shown in the panel (the fastest-growing first)


def _fmt_s(s: float) -> str:
    s = max(0, int(s))
    return f"{s // 3600:d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _mb_min(per_s: float) -> str:
    return f"{per_s * 60 / MB:+.2f}"


class LiveView:
    """``on_tick(ctx, now)`` for :func:`leaktrace.hunt.run_hunt`. ``mode``: "panel" (rich, stderr),
    "plain" (a status line through the logger every PLAIN_EVERY_S) or "off"."""

    def __init__(self, mode: str, log: Callable[[str], None], duration: float) -> None:
        self.mode = mode
        self.log = log
        self.duration = duration
        self.rates = RecentRates()
        self._live: Any = None
        self._last_plain = -PLAIN_EVERY_S
        self._ctx: HuntContext | None = None

    # -- lifecycle (the context manager in live_view() calls these)
    def open(self) -> None:
        if self.mode != "panel":
            return
        from rich.console import Console
        from rich.live import Live

        console = Console(stderr=True, force_terminal=True)
        self._live = Live(
            console=console, refresh_per_second=2, transient=False, redirect_stdout=True, redirect_stderr=True
        )
        self._live.start()

    def close(self) -> None:
        if self._live is not None:
            try:
                if self._ctx is not None:
                    self._live.update(self._panel(self._ctx, self._ctx.session.now()), refresh=True)
            finally:
                self._live.stop()
                self._live = None

    # -- the hunt's callback
    def __call__(self, ctx: HuntContext, now: float) -> None:
        if self.mode == "off":
            return
        self._ctx = ctx
        self.rates.update(ctx.live, now)
        if self.mode == "panel" and self._live is not None:
            self._live.update(self._panel(ctx, now))
        elif self.mode == "plain" and now - self._last_plain >= PLAIN_EVERY_S:
            self._last_plain = now
            self.log(self.status_line(ctx, now))

    def _times(self, ctx: HuntContext, now: float) -> tuple[float, float]:
        elapsed = now - float(ctx.session.meta.get("attach_s") or 0.0)
        return elapsed, max(0.0, self.duration - elapsed)

    def status_line(self, ctx: HuntContext, now: float) -> str:
        elapsed, remaining = self._times(ctx, now)
        rates = self.rates.process_rates()
        total = sum(r["rss"] for r in rates.values())
        parts = [
            f"live {_fmt_s(elapsed)} elapsed, {_fmt_s(remaining)} left",
            f"{len(rates)} process(es) RSS {total / MB:.1f} MB",
        ]
        top = sorted(rates.items(), key=lambda kv: -kv[1]["anon_per_s"])[:3]
        parts += [
            f"pid {pid} RSS {r['rss'] / MB:.1f} MB anon {_mb_min(r['anon_per_s'])} MB/min" for pid, r in top
        ]
        libs = self.rates.library_growth()
        if libs and libs[0][2] > 0:
            parts.append(f"top library {libs[0][0]} {_mb_min(libs[0][2])} MB/min")
        lost = as_int(self.rates.bpf.get("lost_events"))
        if lost:
            parts.append(f"{lost} lost events")
        return "; ".join(parts)

    def _panel(self, ctx: HuntContext, now: float) -> Any:
        from rich.console import Group
        from rich.panel import Panel
        from rich.table import Table
        from rich.text import Text

        elapsed, remaining = self._times(ctx, now)
        rates = self.rates.process_rates()
        table = Table(expand=True, pad_edge=False, box=None)
        for col, just in (
            ("pid", "right"),
            ("process", "left"),
            ("RSS MB", "right"),
            ("RSS MB/min", "right"),
            ("anon MB", "right"),
            ("anon MB/min", "right"),
        ):
            table.add_column(col, justify=just)  # type: ignore[arg-type]
        labels = ctx.targets.labels
        rows = sorted(rates.items(), key=lambda kv: -kv[1]["anon_per_s"])
        for pid, r in rows[:MAX_ROWS]:
            style = "bold red" if r["anon_per_s"] * 60 >= MB and r["span_s"] >= 10 else ""
            table.add_row(
                str(pid),
                str(labels.get(pid, "?"))[:32],
                f"{r['rss'] / MB:.1f}",
                _mb_min(r["rss_per_s"]),
                f"{r['anon'] / MB:.1f}",
                _mb_min(r["anon_per_s"]),
                style=style,
            )
        if len(rows) > MAX_ROWS:
            table.add_row("", f"… {len(rows) - MAX_ROWS} more", "", "", "", "")
        lines = []
        libs = self.rates.library_growth()
        if libs:
            lib, outstanding, growth = libs[0]
            lines.append(
                f"top growing library: {lib}  {_mb_min(growth)} MB/min, {outstanding / MB:.1f} MB outstanding"
            )
        bpf = self.rates.bpf
        if bpf:
            lines.append(
                f"eBPF ledger: {as_int(bpf.get('events'))} events, {as_int(bpf.get('lost_events'))} lost"
            )
        gdb = self.rates.gdb
        if gdb:
            paused = gdb.get("paused_s")
            lines.append(
                f"gdb: {as_int(gdb.get('samples'))} stack samples"
                + (f", target paused {float(paused) * 1000:.0f} ms" if paused is not None else "")
            )
        if ctx.warnings:
            lines.append(f"{len(ctx.warnings)} warning(s); last: {ctx.warnings[-1][:100]}")
        title = (
            f"leaktrace hunt — {_fmt_s(elapsed)} elapsed, {_fmt_s(remaining)} left — "
            f"rates over the last {int(WINDOW_S)} s"
        )
        return Panel(
            Group(table, Text("\n".join(lines), style="dim") if lines else Text("")),
            title=title,
            subtitle=str(ctx.session.path),
            title_align="left",
        )


def choose_mode(options: HuntOptions, stream: Any = None) -> str:
    """--live: the panel; --no-live: nothing but the usual log lines; default: the panel on a
    terminal, plain status lines otherwise."""
    stream = stream if stream is not None else sys.stderr
    if options.live is True:
        return "panel"
    if options.live is False:
        return "off"
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    return "panel" if tty else "plain"


@contextmanager
def live_view(options: HuntOptions, log: Callable[[str], None], quiet: bool = False) -> Iterator[LiveView]:
    """The on_tick callback for run_hunt, with the terminal restored however the hunt ends."""
    mode = "off" if quiet else choose_mode(options)
    view = LiveView(mode, log, options.duration)
    view.open()
    try:
        yield view
    finally:
        view.close()
