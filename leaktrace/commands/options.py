"""The command-line options more than one subcommand takes, declared once (hunt, cluster hunt, watch), with
the hunt's defaults read from :class:`leaktrace.huntspec.HuntSpec`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from leaktrace.huntspec import HuntSpec

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]
_HUNT = HuntSpec()


def stack(*decorators: Decorator) -> Decorator:
    """Several options as one decorator, listed in --help in the order given."""
    def apply(f: Callable[..., Any]) -> Callable[..., Any]:
        for d in reversed(decorators):
            f = d(f)
        return f
    return apply


def match_option(what: str, more: str = "") -> Decorator:
    return click.option("--match", "match", default=None, metavar="REGEX",
                        help=f"{what} the processes whose command line matches REGEX (re.search){more}.")


def quiet_option() -> Decorator:
    return click.option("-q", "--quiet", is_flag=True, help="No progress lines.")


def prometheus_options(port_help: str) -> Decorator:
    return stack(
        click.option("--prometheus-port", type=int, default=_HUNT.prometheus_port, help=port_help),
        click.option("--prometheus-addr", default=_HUNT.prometheus_addr, show_default=True,
                     help="Address the Prometheus endpoint binds to."))


def probe_options(where: str = "") -> Decorator:
    """What the probes of a hunt do (``hunt`` and each node of ``cluster hunt``); ``where`` qualifies the
    URLs of --metrics (", as each node sees it")."""
    return stack(
        click.option("--interval", type=float, default=_HUNT.interval, show_default=True,
                     help="Seconds between watcher ticks."),
        click.option("--smaps-every", type=int, default=_HUNT.smaps_every, show_default=True,
                     help="Full smaps diff every N ticks."),
        click.option("--gdb-samples", type=int, default=_HUNT.gdb_samples,
                     help="gdb stack samples per process (0 disables; default: a few, only when growth is seen)."),
        click.option("--gdb-seconds", type=float, default=_HUNT.gdb_seconds,
                     help="Longest gdb sampling window per process (default 10 s)."),
        click.option("--gdb-pause-pct", type=float, default=_HUNT.gdb_pause_pct,
                     help="Most of the target's time gdb may keep it stopped, in percent (default 1)."),
        click.option("--metrics", "metrics_urls", multiple=True,
                     help=f"vLLM /metrics URL to scrape{where} (repeatable)."),
        click.option("--no-bpf", is_flag=True,
                     help="Do not load the eBPF probes (needed without root/BPF: /proc and gdb only, no ledger)."),
        click.option("--no-gdb", is_flag=True, help="Do not attach gdb."),
        click.option("--pyheap/--no-pyheap", default=_HUNT.pyheap, show_default=True,
                     help="Read the Python heap of Python targets (on by default): GC state and objects counted "
                          "by type, read through /proc/PID/mem (the target is never stopped, no code runs in "
                          "it), so the report tells Python-object growth (culprit python-heap, growing types, "
                          "gc.freeze state) from native growth. Cost (bench/bench_pyheap.py): ~0.02 ms a tick, "
                          "plus a walk of the GC lists (~0.8 µs an object: ~0.1 s for 120k objects, ~0.6 s for "
                          "vLLM's ~700k) at start, at stop and at most 2% of the time; the target's slowdown at "
                          "that schedule is within noise (0.96-1.06x of its speed without the probe). "
                          "--no-pyheap turns it off."))
