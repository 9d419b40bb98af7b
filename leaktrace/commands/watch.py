"""`leaktrace watch`: the always-on sentinel (follow processes, deep-hunt a confirmed leak, keep the evidence
of a growing process that ends)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import click

from leaktrace import outdir
from leaktrace.commands import format_option
from leaktrace.commands.hunt import make_logger
from leaktrace.commands.options import match_option, prometheus_options, quiet_option
from leaktrace.errors import OutputNotWritable, SessionExists, UsageError
from leaktrace.report.formats import REPORT_FORMATS
from leaktrace.watch import (
    DEFAULT_CONFIRM_S,
    DEFAULT_DEEP_HUNT_S,
    DEFAULT_FAST_CONFIRM_MB_PER_MIN,
    DEFAULT_INTERVAL_S,
    DEFAULT_MAX_DISK_MB,
    FAST_CONFIRM_S,
    WatchOptions,
)


def watch_dir(out: str | None) -> Path:
    """--out: new, empty, or the directory of an earlier watch (a restarted daemon goes on there); one that
    holds a session or other files is refused (exit 13). Without --out: a new ./leaktrace-watch-DATE-TIME."""
    if out is None or out == "":
        return outdir.claim_default("leaktrace-watch")
    path = outdir.absolute(out)
    if path.exists() and not path.is_dir():
        raise OutputNotWritable(f"--out {path} is a file, not a directory")
    if outdir.holds_session(path):
        raise SessionExists(f"--out {path} holds a hunt session, not a watch", "choose another --out")
    if path.is_dir() and any(path.iterdir()) and not (path / "watch.json").exists():
        raise SessionExists(f"--out {path} holds other files", "choose a new or empty --out, or an earlier watch's")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise OutputNotWritable(f"cannot write --out {path}: {e.strerror or e}") from e
    return path


@click.command("watch")
@click.option("--pid", "pids", type=int, multiple=True, help="Root of a process tree to follow (repeatable).")
@click.option("--vllm", is_flag=True, help="Follow every vLLM server on this host, those started later too.")
@match_option("Follow", ", those started later too")
@click.option("--interval", type=float, default=DEFAULT_INTERVAL_S, show_default=True,
              help="Seconds between ticks (smaps_rollup of each process, the selection rescanned).")
@click.option("--out", "out", type=click.Path(file_okay=False), default=None,
              help="Watch directory: watch.json and incidents/ (default: a new ./leaktrace-watch-DATE-TIME). "
                   "An earlier watch's directory is continued.")
@prometheus_options("Serve the metrics on 127.0.0.1:PORT/metrics.")
@click.option("--leak-mb-per-min", type=float, default=None,
              help="Growth that counts as a leak (default: the hunt's verdict threshold, 1 MB/min).")
@click.option("--confirm-s", type=float, default=DEFAULT_CONFIRM_S, show_default=True,
              help="Seconds a leak must hold before the deep hunt starts.")
@click.option("--fast-confirm-mb-per-min", type=float, default=DEFAULT_FAST_CONFIRM_MB_PER_MIN, show_default=True,
              help=f"A leak at least this fast is confirmed after {FAST_CONFIRM_S:.0f} s instead of --confirm-s when what the process "
                   "holds (malloc's memory in use, the eBPF ledger's mappings) grows with it, e.g. 10 (0: never early). "
                   "A cache filling that fast is confirmed too: more incidents on a clean node.")
@click.option("--deep-hunt-s", type=float, default=DEFAULT_DEEP_HUNT_S, show_default=True,
              help="Length of the deep hunt (gdb stacks, heap walks, eBPF ledger) of a confirmed leak's tree.")
@click.option("--max-disk-mb", type=float, default=DEFAULT_MAX_DISK_MB, show_default=True,
              help="Disk bound of --out: the oldest incidents are deleted beyond it.")
@click.option("--duration", type=float, default=None, help="Stop after SEC seconds (default: until SIGTERM/Ctrl-C).")
@click.option("--no-bpf", is_flag=True,
              help="No eBPF ledger, in the watch nor its deep hunts (/proc, and gdb in deep hunts, only).")
@click.option("--no-gdb", is_flag=True, help="Deep hunts without gdb.")
@format_option(REPORT_FORMATS, "json,md,html")
@quiet_option()
def watch(pids: tuple[int, ...], vllm: bool, match: str | None, interval: float, out: str | None,
          prometheus_port: int | None, prometheus_addr: str, leak_mb_per_min: float | None, confirm_s: float,
          fast_confirm_mb_per_min: float, deep_hunt_s: float, max_disk_mb: float, duration: float | None, no_bpf: bool, no_gdb: bool,
          formats: tuple[str, ...], quiet: bool) -> None:
    """Watch process trees always-on, light (a /proc read per process a tick, no gdb; the eBPF ledger only of
    the processes that grow).

    Processes matching the selection are picked up as they start and followed until they end. A growth
    that is a leak by the hunt's rules for --confirm-s gets a deep hunt of its tree, a fast one (see
    --fast-confirm-mb-per-min) sooner when what it holds grows with it (a normal session with its reports in OUT/incidents/<UTC time>-<pid>/); a growing process that ends (OOM kill included) leaves
    OUT/incidents/<UTC time>-<pid>-exit/. OUT/watch.json is kept current. Stops on SIGTERM or Ctrl-C
    (exit 0) or at --duration.

    \b
    Examples:
      leaktrace watch --vllm --out /var/lib/leaktrace --prometheus-port 9464
      leaktrace watch --match 'VLLM::Worker' --interval 5 --confirm-s 300
    """
    from leaktrace.watch.daemon import Watch

    if sum([bool(pids), vllm, match is not None]) != 1:
        raise UsageError("choose what to watch with exactly one of --pid PID (repeatable), --vllm or --match REGEX")
    if match is not None:
        try:
            re.compile(match)
        except re.error as e:
            raise UsageError(f"--match {match!r} is not a valid regular expression: {e}") from e
    for name, v in (("--interval", interval), ("--confirm-s", confirm_s + 1e-9), ("--deep-hunt-s", deep_hunt_s),
                    ("--max-disk-mb", max_disk_mb), ("--duration", duration), ("--leak-mb-per-min", leak_mb_per_min)):
        if v is not None and not v > 0:
            raise UsageError(f"{name} must be positive")
    if not fast_confirm_mb_per_min >= 0:
        raise UsageError("--fast-confirm-mb-per-min must be 0 (off) or positive")
    if prometheus_port is not None and not 0 <= prometheus_port <= 65535:
        raise UsageError(f"--prometheus-port {prometheus_port} is not a port (0-65535)")
    if pids:
        from leaktrace import procfs

        for pid in pids:
            procfs.require_pid(pid)
    options = WatchOptions(pids=list(pids), vllm=vllm, match=match, interval=interval,
                           prometheus_port=prometheus_port, prometheus_addr=prometheus_addr,
                           leak_mb_per_min=leak_mb_per_min, confirm_s=confirm_s,
                           fast_confirm_mb_per_min=fast_confirm_mb_per_min, deep_hunt_s=deep_hunt_s,
                           max_disk_mb=max_disk_mb, duration=duration, bpf=not no_bpf, gdb=not no_gdb,
                           formats=formats)

    out_dir = watch_dir(out)
    w = Watch(options, out_dir, log=make_logger(quiet))
    w.verbose = bool((click.get_current_context().find_root().obj or {}).get("verbose"))
    reason = w.run()
    click.echo(f"watch stopped: {reason}; {w.incidents_total} incident(s); {out_dir / 'watch.json'}")
