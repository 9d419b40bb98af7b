"""The conductor: starts every probe over one target set, ticks them, stops them cleanly (deadline,
Ctrl-C, SIGTERM, every target gone), closes the session, then runs analysis and the reporters."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from leaktrace import outdir, procfs, redact
from leaktrace.errors import LeaktraceError, NoSuchProcess, OutputNotWritable
from leaktrace.probes import HuntContext, HuntOptions, Probe, TargetSet
from leaktrace.probes.bpf.probe import BpfProbe
from leaktrace.probes.exporter import PrometheusExporter
from leaktrace.probes.gdb.probe import GdbProbe
from leaktrace.probes.heldfiles import HeldFilesProbe
from leaktrace.probes.host import HostMemoryProbe
from leaktrace.probes.mallocstate.probe import MallocStateProbe
from leaktrace.probes.metrics import MetricsProbe
from leaktrace.probes.pyheap.probe import PyHeapProbe
from leaktrace.probes.ucx_state import UcxStateProbe
from leaktrace.probes.vllm import VllmProbe
from leaktrace.probes.watcher import WatcherProbe
from leaktrace.sched import HuntPriority
from leaktrace.session import SessionWriter
from leaktrace.targetlock import TargetLocks
from leaktrace.ticking import StopFlag, tick_until_stopped

# The probes beside the watcher: (name, class, enabled(options)). Each class is built as Class(options).
# A probe that raises a LeaktraceError on start is skipped with a warning, unless it sets
# ``required = True`` (then the hunt stops with that error, the session kept).
PROBES: list[tuple[str, type, Callable[[HuntOptions], bool]]] = [
    ("vllm", VllmProbe, lambda o: o.vllm),
    ("bpf", BpfProbe, lambda o: o.bpf),
    ("gdb", GdbProbe, lambda o: o.gdb and o.gdb_samples != 0),
    ("metrics", MetricsProbe, lambda o: bool(o.metrics_urls) or o.vllm),
    ("pyheap", PyHeapProbe, lambda o: o.pyheap),
    # Effective UCX state (hooks, hook mode, rcache limits) of targets that map UCX: cheap, always on.
    ("ucx", UcxStateProbe, lambda o: True),
    # The host's memory and what each target pins (memory no process maps): one small read a tick, always on.
    ("host", HostMemoryProbe, lambda o: True),
    # Memory held by descriptors (memfds, /dev/shm files, dma-bufs) and not mapped: a descriptor list every few ticks.
    ("heldfiles", HeldFilesProbe, lambda o: True),
    # glibc malloc's books: in use or free memory the allocator keeps. Start, stop, and a 2% CPU share between.
    ("malloc", MallocStateProbe, lambda o: True),
    ("exporter", PrometheusExporter, lambda o: o.prometheus_port is not None),
]


@dataclass
class HuntResult:
    out: Path
    stop_reason: str
    duration_s: float
    report: dict[str, Any] | None
    warnings: list[str]


def build_probes(options: HuntOptions, log: Callable[[str], None]) -> list[Probe]:
    return [WatcherProbe(options)] + [cls(options) for _name, cls, enabled in PROBES if enabled(options)]


def describe_target(pid: int) -> dict[str, Any]:
    """What the user pointed at, for meta.json: redacted command line and the allow-listed settings of
    its environment (values of every other key never reach disk; only their number is kept)."""
    from leaktrace.errors import AccessDenied, ProcessGone

    out: dict[str, Any] = {"pid": pid}
    try:
        out["comm"] = procfs.read_comm(pid)
        out["cmdline"] = procfs.read_cmdline(pid)
        env = procfs.read_environ(pid)
        out["environ"] = {k: v for k, v in env.items() if v != redact.REDACTED}
        out["environ_redacted_keys"] = sum(1 for v in env.values() if v == redact.REDACTED)
    except (ProcessGone, AccessDenied) as e:
        out["error"] = str(e)
    return out


def run_hunt(pids: list[int], options: HuntOptions, out: str | os.PathLike[str],
             log: Callable[[str], None] = lambda s: None, meta: dict[str, Any] | None = None,
             stop: threading.Event | None = None, write_reports: bool = True,
             on_tick: Callable[[HuntContext, float], None] | None = None, replace: bool = False,
             report_formats: tuple[str, ...] | None = None, priority: HuntPriority | None = None) -> HuntResult:
    """Hunt the trees rooted at ``pids`` into the session directory ``out``. ``replace``: an ``out``
    that holds a session is replaced (atomically, see SessionWriter) instead of refused. ``write_reports``:
    the report rendered in ``report_formats`` (None: every format). ``priority``: already raised by the
    caller, who restores it (the CLI raises it before its imports); else raised and restored here."""
    out = outdir.absolute(out)  # callers other than the CLI may pass a relative path
    pids = list(dict.fromkeys(pids))
    for pid in pids:
        procfs.require_pid(pid)
    locks = TargetLocks()  # one hunt per target process: a second one is refused (TargetBusy)
    locks.acquire(pids, str(out))
    try:
        session = _open_session(pids, options, out, meta, replace)
    except BaseException:
        locks.release()
        raise
    targets = TargetSet(roots=pids)
    ctx = HuntContext(session=session, targets=targets, options=options, log=log)
    flag = StopFlag()
    flag.install()
    # Before any probe starts a thread or a helper: they inherit it.
    own_priority = priority is None
    if priority is None:
        priority = HuntPriority(options.nice)
        priority.raise_()
    session.update_meta(scheduling=priority.done)
    if stop is not None:
        flag.join(stop)
    if options.bpf:
        from leaktrace.tracefs import ensure_mounted

        _root, done = ensure_mounted()
        if done:
            log(done)
    started: list[Probe] = []
    stop_reason = "deadline"
    fatal: LeaktraceError | None = None
    try:
        try:
            fatal, stop_reason = _start_probes(build_probes(options, log), ctx, started)
            if not targets.live() and fatal is None:
                fatal = NoSuchProcess(pids[0], f"target pid(s) {pids} exited before the hunt started")
            if fatal is None:
                stop_reason = _tick_until_stopped(started, ctx, flag, on_tick)
        finally:
            duration = _stop_and_close(started, ctx, stop_reason)
            flag.restore()
            locks.release()
        if fatal is not None:
            raise fatal
        if session.write_error is not None:
            err = session.write_error
            raise OutputNotWritable(f"writing the session {out} failed: {err.strerror or err}",
                                    outdir.write_error_remedy(err, out))
        log(f"hunt stopped: {stop_reason} after {duration:.1f}s")
        report = None
        if write_reports:
            from leaktrace.report import FORMATS, render_session

            report = render_session(out, FORMATS if report_formats is None else report_formats)
    finally:
        # The report is the hunt's last step and renders at its priority: on a node whose cores serve, an even
        # share with the busy threads there stretched its ~4 s of CPU to ~20 s after the stop.
        if own_priority:
            priority.restore()
    return HuntResult(out, stop_reason, duration, report, ctx.warnings)


def _open_session(pids: list[int], options: HuntOptions, out: Path, meta: dict[str, Any] | None,
                  replace: bool) -> SessionWriter:
    return SessionWriter(out, meta={
        "target": {"pids": pids, "processes": [describe_target(pid) for pid in pids]},
        "options": {k: redact.redact_cmdline(v) if k == "metrics_urls" else v  # user:pass@ in URLs
                    for k, v in asdict(options).items()},
        "argv": redact.redact_cmdline(sys.argv),
        **(meta or {}),
    }, replace=replace)


def _start_probes(probes: list[Probe], ctx: HuntContext, started: list[Probe]) -> tuple[LeaktraceError | None, str]:
    """Start each probe (appending it to ``started``); (the error of a required probe that failed,
    the stop reason it gives), or (None, "deadline")."""
    fatal: LeaktraceError | None = None
    stop_reason = "deadline"
    # Work a probe can do before its turn (the eBPF program's compile: seconds of LLVM, in C++ without the
    # GIL) starts now, in the background, beside the other probes' starts.
    prepared = [p.prepare(ctx) for p in probes]
    took: dict[str, float] = {}
    # Those compiling in the background start last: their compile runs beside the others' starts (gdb's
    # symbol reads, /proc walks) instead of ahead of them. Ticks and stops keep the build order.
    order = [p for p, pre in zip(probes, prepared, strict=True) if not pre] + \
            [p for p, pre in zip(probes, prepared, strict=True) if pre]
    for p in order:
        t0 = time.monotonic()
        try:
            p.start(ctx)
            started.append(p)
        except LeaktraceError as e:
            if p.required:
                fatal = e
                stop_reason = f"probe {p.name} failed: {e}"
                break
            ctx.warn(f"{p.name} probe off: {e}")
        finally:
            took[p.name] = round(time.monotonic() - t0, 3)
    started.sort(key=probes.index)
    for p in probes:
        if p not in started:
            p.cancel()  # prepared but never started (a required probe failed first): its work undone
    session = ctx.session
    attach_s = session.now()
    ctx.tick_costs.attached()
    ctx.attached.set()
    session.update_meta(attach_s=attach_s, probe_attach_s=took, probes=[p.name for p in started])
    if fatal is None:
        ctx.log(f"attached {len(started)} probe(s) to {len(ctx.targets.live())} process(es) in {attach_s:.2f}s: "
                + ", ".join(p.name for p in started))
    return fatal, stop_reason


def _tick_all(started: list[Probe], ctx: HuntContext, now: float, warn: bool = True) -> None:
    for p in started:
        t0, c0 = time.monotonic(), time.thread_time()
        try:
            p.tick(now)
        except LeaktraceError as e:
            if warn:
                ctx.warn(f"{p.name}: {e}")
        finally:
            ctx.tick_costs.add(p.name, time.monotonic() - t0, time.thread_time() - c0, now)


def _tick_until_stopped(started: list[Probe], ctx: HuntContext, flag: StopFlag,
                        on_tick: Callable[[HuntContext, float], None] | None) -> str:
    """The main loop: every probe ticks once per interval until the deadline, a signal or the end of
    every target. Returns the stop reason."""
    session, options = ctx.session, ctx.options

    def tick(now: float, late_s: float) -> str | None:
        ctx.tick_costs.started(late_s, options.interval, now)
        _tick_all(started, ctx, now)
        if on_tick is not None:
            on_tick(ctx, now)
        return None if ctx.targets.live() else "all targets exited"

    ctx.window_end = (session.meta.get("attach_s") or 0.0) + options.duration
    return tick_until_stopped(session.now, options.interval, flag, tick, t_end=ctx.window_end,
                              last_tick=lambda now: _tick_all(started, ctx, now, warn=False))


def _stop_probe(p: Probe, ctx: HuntContext) -> None:
    t0 = time.monotonic()
    try:
        p.stop()
    except Exception as e:  # stopping must reach every probe
        ctx.warn(f"{p.name} stop: {e}")
    ctx.tick_costs.stopped(p.name, time.monotonic() - t0)


def _stop_and_close(started: list[Probe], ctx: HuntContext, stop_reason: str) -> float:
    """Stop every started probe (each, whatever the others do), then close the session with their
    summaries. Returns the hunt's duration (seconds since attach)."""
    session, targets = ctx.session, ctx.targets
    # All at once: each stop mostly waits on something of its own (the heap walker's last walks in its process,
    # the ring's last events, the last smaps reads, gdb's detach), and one after the other their waits added up
    # (on a loaded P/D pair: pyheap 8-9 s + bpf 1.3-3.9 s + watcher 0.2-1.2 s).
    stoppers = [threading.Thread(target=_stop_probe, args=(p, ctx), name=f"stop-{p.name}", daemon=True)
                for p in reversed(started)]
    for th in stoppers:
        th.start()
    for th in stoppers:
        th.join()
    summaries = {}
    for p in started:
        try:
            summaries[p.name] = p.summary()
        except Exception:
            summaries[p.name] = {}
    duration = session.now() - (session.meta.get("attach_s") or 0.0)
    session.close(stop_reason=stop_reason, duration_s=duration, warnings=ctx.warnings,
                  tick_costs=ctx.tick_costs.as_dict(),
                  exited={str(k): v for k, v in targets.exited.items()}, probe_summaries=summaries,
                  labels={str(k): v for k, v in targets.labels.items()})
    if session.write_error is not None:
        ctx.warn(f"session write failed: {session.write_error}")
    return duration
