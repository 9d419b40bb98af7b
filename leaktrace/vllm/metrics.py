"""A vLLM API server's /metrics page (Prometheus text): fetch it, parse it, and sum the load figures.

The figures (:func:`summarize`) are what the load analysis and the P/D role guess need: requests, prompt
and generation tokens, prompt tokens received by KV transfer, NIXL transfers, queue lengths, KV cache
usage and the API server's RSS, each counter summed over engines and label sets.
"""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from leaktrace.errors import MetricsUnreachable

Sample = tuple[str, dict[str, str], float]


def parse_metrics(text: str) -> list[Sample]:
    """Prometheus text exposition → (sample name, labels, value), with prometheus_client's own parser."""
    out: list[Sample] = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.append((s.name, dict(s.labels), float(s.value)))
    return out


def _sum(samples: list[Sample], name: str, **match: str) -> float:
    return sum(v for n, lb, v in samples if n == name and all(lb.get(k) == want for k, want in match.items()))


def summarize(samples: list[Sample]) -> dict[str, float]:
    """The load figures of one scrape (counters summed over engines and label sets)."""
    return {
        "requests": _sum(samples, "vllm:request_success_total"),
        "prompt_tokens": _sum(samples, "vllm:prompt_tokens_total"),
        "generation_tokens": _sum(samples, "vllm:generation_tokens_total"),
        "kv_external_prompt_tokens": _sum(samples, "vllm:prompt_tokens_by_source_total",
                                          source="external_kv_transfer"),
        "nixl_transfers": _sum(samples, "vllm:nixl_xfer_time_seconds_count"),
        "nixl_bytes": _sum(samples, "vllm:nixl_bytes_transferred_sum"),
        "nixl_failed": _sum(samples, "vllm:nixl_num_failed_transfers_total"),
        "running": _sum(samples, "vllm:num_requests_running"),
        "waiting": _sum(samples, "vllm:num_requests_waiting"),
        "kv_cache_usage": _sum(samples, "vllm:kv_cache_usage_perc"),
        "api_rss": _sum(samples, "process_resident_memory_bytes"),
    }


def scrape(url: str, timeout: float = 5.0) -> str:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - the user's URL
            return r.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        raise MetricsUnreachable(f"{url} unreachable: {reason}") from e


def normalize_url(url: str) -> str:
    """Accept ``HOST:PORT``, ``http://HOST:PORT`` or a full URL; default path /metrics."""
    if "://" not in url:
        url = "http://" + url
    parts = urllib.parse.urlsplit(url)
    if parts.path in ("", "/"):
        parts = parts._replace(path="/metrics")
    return urllib.parse.urlunsplit(parts)
