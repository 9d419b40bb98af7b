"""The /metrics probe: scrape each vLLM API server's Prometheus text every tick.

URLs come from ``--metrics URL`` and, with ``--vllm``, from discovery (each API server's port on
127.0.0.1 when it listens on all addresses). Scrapes run in one background thread so a slow server (a
P/D pair on 2 cores can take seconds to answer) never delays the watcher's tick. An unreachable URL is a
warning line, once; the hunt goes on and says when the URL comes back. Fetching, parsing and the load
figures are :mod:`leaktrace.vllm.metrics`.

Tables:
  ``metrics``          t, url, instance, name, labels (JSON), value — every ``vllm:*`` sample and
                       ``process_resident_memory_bytes`` (histogram buckets and ``_created`` left out)
  ``metrics_summary``  t, url, instance, ok, requests, prompt_tokens, generation_tokens,
                       kv_external_prompt_tokens, nixl_transfers, nixl_bytes, nixl_failed, running,
                       waiting, kv_cache_usage, api_rss — the figures the load analysis needs
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from leaktrace.errors import MetricsUnreachable
from leaktrace.probes import HuntContext, HuntOptions, ProbeBase
from leaktrace.redact import redact_url
from leaktrace.vllm.metrics import normalize_url, parse_metrics, scrape, summarize


def _keep(name: str) -> bool:
    if name.endswith(("_bucket", "_created")):
        return False
    return name.startswith("vllm:") or name == "process_resident_memory_bytes"


class MetricsProbe(ProbeBase):
    name = "metrics"

    def __init__(self, options: HuntOptions) -> None:
        self.options = options
        self.urls: dict[str, int | None] = {normalize_url(u): None for u in options.metrics_urls}
        self.ctx: HuntContext | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.ok: dict[str, int] = {}
        self.failed: dict[str, int] = {}
        self.down: set[str] = set()
        self.first: dict[str, dict[str, float]] = {}
        self.last: dict[str, dict[str, float]] = {}

    def start(self, ctx: HuntContext) -> None:
        self.ctx = ctx
        if self.options.vllm:
            # Published by the vllm probe, which starts before us.
            for inst in ctx.live.vllm_instances:
                port = inst.get("port")
                if port:
                    host = inst.get("host") or "127.0.0.1"
                    host = "127.0.0.1" if host in ("0.0.0.0", "::", "localhost") else host
                    url = normalize_url(f"{host}:{port}")
                    if self.urls.get(url) is None:
                        self.urls[url] = inst["instance"]
        if not self.urls:
            ctx.warn("metrics: no /metrics URL to scrape (none given and no vLLM API server found)")
            return
        ctx.session.update_meta(metrics_urls={redact_url(u): i for u, i in self.urls.items()})
        self._scrape_all()  # the first scrape before the hunt's clock starts counting load
        self._thread = threading.Thread(target=self._loop, name="metrics-scrape", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.options.interval):
            self._scrape_all()

    def _scrape_all(self) -> None:
        assert self.ctx is not None
        t0, c0, now = time.monotonic(), time.thread_time(), self.ctx.session.now()
        try:
            self._scrape_each()
        finally:  # its own thread: counted beside the ticks (what the hunt's ticks cost, in the report)
            self.ctx.tick_costs.add("metrics (scrape thread)", time.monotonic() - t0, time.thread_time() - c0, now)

    def _scrape_each(self) -> None:
        assert self.ctx is not None
        for url, inst in self.urls.items():
            # Credentials in a --metrics URL are used to scrape, never written or shown.
            shown = redact_url(url)
            t = self.ctx.session.now()
            try:
                text = scrape(url, timeout=max(2.0, 3 * self.options.interval))
                samples = parse_metrics(text, keep=_keep)
            except MetricsUnreachable as e:
                self.failed[url] = self.failed.get(url, 0) + 1
                if url not in self.down:
                    self.down.add(url)
                    self.ctx.warn(f"metrics: {redact_url(e.message)}; the hunt goes on without it")
                self.ctx.session.append("metrics_summary", {"t": t, "url": shown, "instance": inst, "ok": False})
                continue
            except ValueError:  # not Prometheus text
                self.failed[url] = self.failed.get(url, 0) + 1
                if url not in self.down:
                    self.down.add(url)
                    self.ctx.warn(f"metrics: {shown} did not serve Prometheus text; the hunt goes on")
                continue
            if url in self.down:
                self.down.discard(url)
                self.ctx.log(f"metrics: {shown} reachable again")
            self.ok[url] = self.ok.get(url, 0) + 1
            summary = summarize(samples)
            self.first.setdefault(url, summary)
            self.last[url] = summary
            self.ctx.session.append("metrics_summary", {"t": t, "url": shown, "instance": inst, "ok": True, **summary})
            self.ctx.session.append("metrics", [
                {"t": t, "url": shown, "instance": inst, "name": n,
                 "labels": json.dumps(lb, sort_keys=True), "value": v}
                for n, lb, v in samples])  # parsed with keep=_keep: only those
            self.ctx.live.metrics_requests = {redact_url(u): s.get("requests") for u, s in self.last.items()}

    def tick(self, now: float) -> None:
        pass  # the scrape thread keeps its own cadence

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)
            self._scrape_all()  # the final counters, so the load covers the whole hunt

    def summary(self) -> dict[str, Any]:
        return {"urls": {redact_url(u): {"instance": i, "ok": self.ok.get(u, 0), "failed": self.failed.get(u, 0),
                             "delta": {k: self.last[u][k] - self.first[u][k]
                                       for k in ("requests", "generation_tokens", "nixl_transfers")}
                             if u in self.last else None}
                         for u, i in self.urls.items()}}
