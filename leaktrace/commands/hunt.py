"""`leaktrace hunt`: run the probes over live process trees and write a session + report."""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from leaktrace.commands import format_option
from leaktrace.commands.options import probe_options, prometheus_options, quiet_option
from leaktrace.errors import UsageError
from leaktrace.huntspec import HuntSpec
from leaktrace.outdir import output_dir
from leaktrace.report.formats import REPORT_FORMATS
from leaktrace.sched import HuntPriority

_HUNT = HuntSpec()


def make_logger(quiet: bool):
    def log(msg: str) -> None:
        if not quiet:
            click.echo(f"[{time.strftime('%H:%M:%S')}] {msg}", err=True)
    return log


@click.command("hunt")
@click.option("--pid", "pids", type=int, multiple=True, help="Root of a process tree to hunt (repeatable).")
@click.option("--vllm", is_flag=True, help="Hunt every vLLM server on this host (API server, EngineCore, workers).")
@click.option("--duration", type=float, default=_HUNT.duration, show_default=True, help="Seconds to hunt.")
@click.option("--out", "out", type=click.Path(file_okay=False), default=None,
              help="Session directory to write (default: a new ./leaktrace-DATE-TIME). One that holds a "
                   "session is refused (exit 13) unless --force.")
@click.option("--force", is_flag=True,
              help="Replace the session already in --out (the old one stays whole until the new one starts).")
@probe_options()
@click.option("--nice", type=click.IntRange(-20, 19), default=_HUNT.nice, show_default=True,
              help="The hunt's scheduling priority. Negative: its session's group (or a `leaktrace` cpu cgroup) "
                   "is raised too, so its ticks run on time beside busy servers (which then yield it the CPU "
                   "when it asks); 0: left as it is (ticks late on a saturated node).")
@prometheus_options("Expose leaktrace's figures on 127.0.0.1:PORT.")
@click.option("--live/--no-live", default=_HUNT.live, help="Live terminal view (default: when stderr is a TTY).")
@format_option(REPORT_FORMATS, "json,md,html")
@quiet_option()
def hunt(**params: Any) -> None:
    """Hunt a native-memory leak in live process trees.

    Every --pid names the root of a tree: children (and children born during the hunt) are hunted too.
    The hunt stops at --duration, on Ctrl-C or SIGTERM, or when every target exited, and always writes
    the session and OUT/report.json (plus the other --format files). Exit status 0 whatever the verdict.

    \b
    Examples:
      leaktrace hunt --pid 4242 --duration 120 --out hunt1
      leaktrace hunt --vllm --duration 300 --metrics http://127.0.0.1:8000/metrics
    """
    spec = HuntSpec(**params)
    if not spec.pids and not spec.vllm:
        raise UsageError("nothing to hunt: give --pid PID (repeatable) or --vllm")
    if spec.duration <= 0 or spec.interval <= 0:
        raise UsageError("--duration and --interval must be positive")
    # The hunt's priority from its first second: on a node whose cores serve, the imports (pandas, pyarrow,
    # bcc) and the vLLM discovery before the first probe starts took 6-27 s of wall at an even share.
    priority = HuntPriority(spec.nice)
    priority.raise_()
    try:
        _hunt(spec, priority)
    finally:
        priority.restore()


def _hunt(spec: HuntSpec, priority: HuntPriority) -> None:
    from leaktrace.hunt import run_hunt

    options = spec.probe_options()
    roots = list(spec.pids)
    if spec.vllm:
        from leaktrace.vllm.discover import vllm_targets

        found = vllm_targets()
        if not found and not roots:
            raise UsageError("--vllm: no vLLM server found on this host (see `leaktrace ps`)")
        roots += [p for p in found if p not in roots]
    log = make_logger(spec.quiet)
    from leaktrace.live import live_view

    # Absolute before any probe loads (libbcc moves the working directory while it compiles).
    with (output_dir(spec.out, prefix="leaktrace", force=spec.force) as out_dir,
          live_view(options, log, quiet=spec.quiet) as on_tick):
        # The report is rendered by run_hunt: still at the hunt's priority (see there).
        result = run_hunt(roots, options, out_dir, log=log, on_tick=on_tick, replace=spec.force,
                          report_formats=spec.formats, priority=priority)
    report = result.report
    assert report is not None
    if result.warnings:
        click.echo(f"{len(result.warnings)} warning(s); see {out_dir / 'meta.json'}", err=True)
    top = report["culprits"][0] if report["culprits"] else None
    python = (top.get("python") if top else None) or {}
    py_types = [t["type"] for t in (python.get("types") or [])[:3]]  # a python-heap culprit: its growing types
    click.echo(f"verdict: {report['verdict']}" + (
        f" — top culprit: {top['kind']} {top.get('library') or ', '.join(py_types)} pid {top['pid']} "
        f"{top['mb_per_min']:.2f} MB/min" if top else ""))
    click.echo(f"report: {out_dir / 'report.json'}")
    sys.stdout.flush()
