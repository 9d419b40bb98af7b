"""Prometheus exporter: ``hunt --prometheus-port PORT`` serves leaktrace's own figures so Grafana can
chart a long hunt.

Served on 127.0.0.1 unless ``--prometheus-addr`` says otherwise (the figures name processes and
libraries of the host: not for the open network by default). A custom registry holds one collector
that renders the latest snapshot taken at the hunt's tick, so a scrape never touches /proc or the
probes, and processes that exited simply stop appearing.

Metrics (all prefixed ``leaktrace_``):
  hunt_elapsed_seconds, hunt_remaining_seconds, targets                           gauges
  process_rss_bytes{pid,process}, process_anon_bytes{pid,process}                 gauges
  process_rss_growth_bytes_per_second, process_anon_growth_bytes_per_second       gauges, robust slope
                                                                                  over the last minute
  ledger_outstanding_bytes{library}, ledger_outstanding_total_bytes               gauges (eBPF ledger)
  ledger_events_total, ledger_lost_events_total                                   counters (eBPF)
  gdb_pause_seconds_total, gdb_samples_total                                      counters (gdb sampler)
  warnings_total                                                                  counter

``leaktrace watch`` serves its own set (WatchExporter, WATCH_METRICS below): per process (pid, label, role,
instance) RSS, growth rate and leak state; outstanding bytes by (pid, library, kind), mapped and resident; incidents and the
watch's own CPU seconds; while its eBPF ledger is live, the events it was handed and those lost.
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Iterator
from typing import Any

from leaktrace.errors import UsageError
from leaktrace.probes import HuntContext, ProbeBase
from leaktrace.probes.recent import RecentRates

DEFAULT_ADDR = "127.0.0.1"


class PortUnavailable(UsageError):
    default_remedy = "choose another --prometheus-port (or stop what listens there)"


def ledger_counters(bpf: dict[str, Any]) -> Iterator[Any]:
    """The eBPF ledger's counters, from its probe's summary(): the hunt's and the watch's endpoints alike."""
    from prometheus_client.core import CounterMetricFamily

    yield CounterMetricFamily("leaktrace_ledger_events", "Traced memory syscalls of the target set.",
                              value=float(bpf.get("events") or 0))
    yield CounterMetricFamily("leaktrace_ledger_lost_events",
                              "Events the kernel could not hand over (ledger inexact by these).",
                              value=float(bpf.get("lost_events") or 0))


class _SnapshotCollector:
    """Renders the exporter's latest snapshot (taken under a lock at each tick)."""

    def __init__(self, exporter: PrometheusExporter) -> None:
        self.exporter = exporter

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        snap = self.exporter.snapshot()
        g = GaugeMetricFamily
        yield g("leaktrace_hunt_elapsed_seconds", "Seconds since all probes attached.", value=snap["elapsed"])
        yield g(
            "leaktrace_hunt_remaining_seconds", "Seconds until the hunt's deadline.", value=snap["remaining"]
        )
        yield g("leaktrace_targets", "Processes of the target trees alive now.", value=len(snap["procs"]))
        metrics = {
            "rss": g(
                "leaktrace_process_rss_bytes", "Resident set size (smaps_rollup).", labels=["pid", "process"]
            ),
            "anon": g(
                "leaktrace_process_anon_bytes",
                "Anonymous resident memory (smaps_rollup).",
                labels=["pid", "process"],
            ),
            "rss_per_s": g(
                "leaktrace_process_rss_growth_bytes_per_second",
                "Robust (Theil-Sen) RSS slope over the last minute.",
                labels=["pid", "process"],
            ),
            "anon_per_s": g(
                "leaktrace_process_anon_growth_bytes_per_second",
                "Robust (Theil-Sen) anonymous-memory slope over the last minute.",
                labels=["pid", "process"],
            ),
        }
        for pid, r in snap["procs"].items():
            labels = [str(pid), snap["labels"].get(pid, "?")]
            for key, fam in metrics.items():
                fam.add_metric(labels, float(r[key]))
        yield from metrics.values()
        bpf = snap["bpf"]
        if bpf:
            lib = g(
                "leaktrace_ledger_outstanding_bytes",
                "Bytes mapped during the hunt and not unmapped, by the library that mapped them.",
                labels=["library"],
            )
            for name, b in (bpf.get("outstanding_by_library") or {}).items():
                lib.add_metric([str(name)], float(b))
            yield lib
            if bpf.get("outstanding_bytes") is not None:
                yield g(
                    "leaktrace_ledger_outstanding_total_bytes",
                    "Outstanding bytes in the eBPF ledger.",
                    value=float(bpf["outstanding_bytes"]),
                )
            yield from ledger_counters(bpf)
        gdb = snap["gdb"]
        if gdb:
            yield CounterMetricFamily(
                "leaktrace_gdb_pause_seconds",
                "Time the gdb sampler kept targets stopped.",
                value=float(gdb.get("paused_s") or 0.0),
            )
            yield CounterMetricFamily(
                "leaktrace_gdb_samples", "Stacks sampled by gdb.", value=float(gdb.get("samples") or 0)
            )
        yield CounterMetricFamily(
            "leaktrace_warnings", "Warnings raised by the hunt.", value=snap["warnings"]
        )


class PrometheusExporter(ProbeBase):
    name = "exporter"
    # The user asked for the endpoint: a port that cannot be bound stops the hunt with one line rather
    # than a warning scrolled away at the start of an hours-long hunt.
    required = True

    def __init__(self, options: Any) -> None:
        self.port = int(options.prometheus_port)
        self.addr = getattr(options, "prometheus_addr", None) or DEFAULT_ADDR
        self.duration = float(getattr(options, "duration", 0.0))
        self.rates = RecentRates()
        self.ctx: HuntContext | None = None
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._snap: dict[str, Any] = {
            "elapsed": 0.0,
            "remaining": self.duration,
            "procs": {},
            "labels": {},
            "bpf": {},
            "gdb": {},
            "warnings": 0,
        }
        self.scrapes = 0

    def start(self, ctx: HuntContext) -> None:
        from prometheus_client import CollectorRegistry

        self.ctx = ctx
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_SnapshotCollector(self))  # type: ignore[arg-type]
        self._server, self._thread = serve(self.port, self.addr, self.registry)
        self.port = self._server.server_port  # port 0 asks the kernel for a free one
        ctx.session.update_meta(prometheus={"addr": self.addr, "port": self.port})
        ctx.log(f"Prometheus metrics on http://{self.addr}:{self.port}/metrics")
        self.tick(ctx.session.now())

    def tick(self, now: float) -> None:
        assert self.ctx is not None
        ctx = self.ctx
        self.rates.update(ctx.live, now)
        elapsed = now - float(ctx.session.meta.get("attach_s") or now)
        with ctx.targets.lock:
            labels = dict(ctx.targets.labels)
        snap = {
            "elapsed": max(0.0, elapsed),
            "remaining": max(0.0, self.duration - elapsed),
            "procs": self.rates.process_rates(),
            "labels": {int(k): str(v) for k, v in labels.items()},
            "bpf": self.rates.bpf,
            "gdb": self.rates.gdb,
            "warnings": len(ctx.warnings),
        }
        with self._lock:
            self._snap = snap

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            self.scrapes += 1
            return self._snap

    def stop(self) -> None:
        stop_serving(self._server, self._thread)
        self._server = self._thread = None

    def summary(self) -> dict[str, Any]:
        return {"addr": self.addr, "port": self.port, "scrapes": self.scrapes}


def stop_serving(server: Any, thread: Any) -> None:
    """Shut down what :func:`serve` started (either may be None: never started)."""
    if server is not None:
        server.shutdown()
        server.server_close()
    if thread is not None:
        thread.join(timeout=5)


def serve(port: int, addr: str, registry: Any) -> tuple[Any, Any]:
    """Start the HTTP endpoint of ``registry``; a port that cannot be bound is one line (PortUnavailable)."""
    from prometheus_client import start_http_server

    try:
        return start_http_server(port, addr=addr, registry=registry)
    except (OSError, OverflowError) as e:  # OverflowError: a port outside 0-65535
        why = ("already in use" if getattr(e, "errno", None) == errno.EADDRINUSE
               else (getattr(e, "strerror", None) or str(e)))
        raise PortUnavailable(f"cannot serve Prometheus metrics on {addr}:{port}: {why}") from e


# The metrics `leaktrace watch` serves (DESIGN.md, Watch): docs/grafana and docs/prometheus name only these.
WATCH_METRICS = ("leaktrace_process_rss_bytes", "leaktrace_process_growth_bytes_per_second",
                 "leaktrace_process_leak_state", "leaktrace_outstanding_bytes",
                 "leaktrace_outstanding_resident_bytes", "leaktrace_incidents_total",
                 "leaktrace_watch_cpu_seconds_total", "leaktrace_watch_targets", "leaktrace_ledger_events_total",
                 "leaktrace_ledger_lost_events_total")
LEAK_STATES = {"ok": 0, "growing": 1, "leaking": 2, "confirmed": 3}


class _WatchCollector:
    """Renders the watch's latest snapshot (replaced whole at each tick: a scrape reads no /proc)."""

    def __init__(self, snapshot: Any) -> None:
        self.snapshot = snapshot

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        snap = self.snapshot()
        who = ["pid", "label", "role", "instance"]
        rss = GaugeMetricFamily("leaktrace_process_rss_bytes", "Resident set size (smaps_rollup).", labels=who)
        growth = GaugeMetricFamily("leaktrace_process_growth_bytes_per_second",
                                   "Robust (Theil-Sen) slope of the RSS or anonymous memory, the faster, over "
                                   "the watch's window.", labels=who)
        state = GaugeMetricFamily("leaktrace_process_leak_state",
                                  "0 ok, 1 growing, 2 a leak by the hunt's rules, 3 confirmed (deep hunt).",
                                  labels=who)
        for p in snap["procs"]:
            labels = [str(p["pid"]), str(p["label"]), str(p["role"]), str(p["instance"])]
            rss.add_metric(labels, float(p["rss"]))
            growth.add_metric(labels, float(max(p["rss_per_s"], p["anon_per_s"])))
            state.add_metric(labels, float(LEAK_STATES.get(p["state"], 0)))
        yield rss
        yield growth
        yield state
        yield GaugeMetricFamily("leaktrace_watch_targets", "Processes followed now.", value=len(snap["procs"]))
        out = GaugeMetricFamily("leaktrace_outstanding_bytes",
                                "Bytes mapped and not unmapped, by the library that mapped them (the watch's eBPF "
                                "ledger, else its deep hunt's).", labels=["pid", "library", "kind"])
        for pid, lib, kind, b in snap["outstanding"]:
            out.add_metric([str(pid), str(lib), str(kind)], float(b))
        yield out
        res = GaugeMetricFamily("leaktrace_outstanding_resident_bytes",
                                "Of leaktrace_outstanding_bytes, the bytes present in RAM (/proc/PID/pagemap): "
                                "what costs memory, where the other is address space.",
                                labels=["pid", "library", "kind"])
        for pid, lib, kind, b in snap.get("outstanding_resident", []):
            res.add_metric([str(pid), str(lib), str(kind)], float(b))
        yield res
        yield CounterMetricFamily("leaktrace_incidents", "Incidents written (deep hunts and exits).",
                                  value=float(snap["incidents_total"]))
        yield CounterMetricFamily("leaktrace_watch_cpu_seconds", "CPU time of the watch process itself.",
                                  value=float(snap["cpu_s"]))
        if snap.get("ledger"):  # the eBPF ledger is live
            yield from ledger_counters(snap["ledger"])


class WatchExporter:
    """The Prometheus endpoint of `leaktrace watch`: ``snapshot()`` returns {"procs": [{pid, label, role,
    instance, rss, rss_per_s, anon_per_s, state}], "outstanding": [(pid, library, kind, bytes)],
    "outstanding_resident": [(pid, library, kind, bytes)], "incidents_total", "cpu_s", "ledger": the eBPF probe's
    summary() or None}."""

    def __init__(self, port: int, addr: str | None, snapshot: Any) -> None:
        self.port = int(port)
        self.addr = addr or DEFAULT_ADDR
        self.snapshot = snapshot
        self._server: Any = None
        self._thread: Any = None

    def start(self) -> None:
        from prometheus_client import CollectorRegistry

        registry = CollectorRegistry(auto_describe=False)
        registry.register(_WatchCollector(self.snapshot))  # type: ignore[arg-type]
        self._server, self._thread = serve(self.port, self.addr, registry)
        self.port = self._server.server_port  # port 0 asks the kernel for a free one

    def stop(self) -> None:
        stop_serving(self._server, self._thread)
        self._server = self._thread = None
