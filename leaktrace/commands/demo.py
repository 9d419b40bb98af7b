"""`leaktrace demo`: build and start the bundled leaking workload, hunt it with every probe available,
write the report, and say whether (and when) the workload's library was named."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import click

from leaktrace.commands import format_option
from leaktrace.errors import TargetError, UsageError
from leaktrace.outdir import output_dir
from leaktrace.report.formats import REPORT_FORMATS

READY_TIMEOUT_S = 30.0


def start_workload(lib: Path, mb_per_min: float, buffer_kib: int) -> subprocess.Popen[str]:
    """The Python host in its own process group (stopped by that group), ready once it prints so."""
    p = subprocess.Popen([sys.executable, "-m", "leaktrace.demo.host", str(lib), "--mb-per-min", str(mb_per_min),
                          "--buffer-kib", str(buffer_kib)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True, env={**os.environ, "XFER_MAX_UNRELEASED": "inf"})
    deadline = time.monotonic() + READY_TIMEOUT_S
    line = ""
    while time.monotonic() < deadline:
        line = p.stdout.readline() if p.stdout else ""  # blocks until the host prints or exits
        if line.startswith("ready") or p.poll() is not None:
            break
    if not line.startswith("ready"):
        stop_workload(p)
        err = (p.stderr.read() if p.stderr else "").strip().splitlines()[-1:] or [""]
        raise TargetError(f"the demo workload did not start: {err[0]}", "run `leaktrace -v demo` for details")
    return p


def stop_workload(p: subprocess.Popen[str]) -> None:
    for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            break
        try:
            p.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue


@click.command("demo")
@click.option("--duration", type=float, default=40.0, show_default=True, help="Seconds to hunt.")
@click.option("--out", "out", type=click.Path(file_okay=False), default=None,
              help="Session directory to write (default: a new ./leaktrace-demo-DATE-TIME). One that holds a "
                   "session is refused (exit 13) unless --force.")
@click.option("--force", is_flag=True, help="Replace the session already in --out.")
@click.option("--rate", "mb_per_min", type=float, default=120.0, show_default=True,
              help="Leak rate of the workload (MiB/min).")
@click.option("--no-bpf", is_flag=True, help="Do not load the eBPF probes.")
@click.option("--no-gdb", is_flag=True, help="Do not attach gdb.")
@format_option(REPORT_FORMATS, "json,md,html,folded")
@click.option("-q", "--quiet", is_flag=True, help="No progress lines.")
def demo(duration: float, out: str | None, force: bool, mb_per_min: float, no_bpf: bool, no_gdb: bool,
         formats: tuple[str, ...], quiet: bool) -> None:
    """Start the bundled leaking workload, hunt it, write the report.

    The workload is a Python host calling a small native "transfer" library (C, built with gcc into
    ~/.cache/leaktrace/demo) that maps buffers through raw mmap syscalls and defers their unmapping into
    a queue it never drains — the vLLM/UCX leak of seed 002 in miniature. As root, the eBPF probe names
    the library (libxfer_demo.so) and its call path; the report says how many seconds after attach.
    """
    from leaktrace.commands.hunt import make_logger
    from leaktrace.demo import LIBRARY, build_library
    from leaktrace.hunt import run_hunt
    from leaktrace.probes import HuntOptions
    from leaktrace.report import render_session

    if duration <= 0 or mb_per_min <= 0:
        raise UsageError("--duration and --rate must be positive")
    log = make_logger(quiet)
    with output_dir(out, prefix="leaktrace-demo", force=force) as out_dir:
        lib = build_library()
        log(f"demo library: {lib}")
        buffer_kib = 256
        proc = start_workload(lib, mb_per_min, buffer_kib)
        log(f"demo workload: pid {proc.pid}, leaking {mb_per_min:g} MiB/min through {LIBRARY}")
        options = HuntOptions(duration=duration, interval=1.0, smaps_every=2, bpf=not no_bpf, gdb=not no_gdb)
        try:
            result = run_hunt([proc.pid], options, out_dir, log=log, write_reports=False, replace=force,
                              meta={"demo": {"library": LIBRARY, "mb_per_min": mb_per_min,
                                             "buffer_kib": buffer_kib, "pid": proc.pid}})
        finally:
            stop_workload(proc)
    report = render_session(out_dir, formats=formats)
    top = report["culprits"][0] if report["culprits"] else None
    click.echo(f"verdict: {report['verdict']}"
               + (f" (hunt stopped early: {result.stop_reason})" if result.stop_reason != "deadline" else ""))
    if top is not None:
        named = f", named {top['first_named_s']:.1f} s after attach" if top.get("first_named_s") is not None else ""
        click.echo(f"top culprit: {top.get('library') or 'library not named'} (pid {top['pid']}) "
                   f"{top['mb_per_min']:.1f} MB/min{named} — workload leaks {mb_per_min:g} MiB/min")
        if top.get("remedy"):
            click.echo(f"remedy: {top['remedy']}")
        if top.get("library") != LIBRARY:
            click.echo("the library was not named: run as root with the eBPF probe (see `leaktrace doctor`)")
    written = [REPORT_FORMATS.reporter(f).filename for f in REPORT_FORMATS.selected(formats)]
    main = "report.html" if "report.html" in written else "report.json"
    also = [f for f in written if f != main]
    click.echo(f"report: {out_dir / main}" + (f" (also {', '.join(also)})" if also else ""))
