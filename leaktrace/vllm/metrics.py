"""A vLLM API server's /metrics page (Prometheus text): fetch it, parse it, and sum the load figures.

The figures (:func:`summarize`) are what the load analysis and the P/D role guess need: requests, prompt
and generation tokens, prompt tokens received by KV transfer, NIXL transfers, queue lengths, KV cache
usage and the API server's RSS, each counter summed over engines and label sets.
"""

from __future__ import annotations

import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from leaktrace.errors import MetricsUnreachable

Sample = tuple[str, dict[str, str], float]


_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def _kept_lines(text: str, keep: Callable[[str], bool]) -> str:
    """``text`` less the sample lines (and HELP/TYPE lines) of names ``keep`` refuses. Only well-formed names
    are dropped: a line that is not Prometheus text stays, so the parser still rejects the page."""
    out = []
    for line in text.splitlines():
        if line.startswith("#"):
            words = line.split(None, 3)
            name = words[2] if len(words) >= 3 and words[1] in ("HELP", "TYPE") else None
        else:
            m = _NAME.match(line)
            name = m.group(0) if m and line[m.end():m.end() + 1] in ("{", " ", "\t") else None
        if name is None or keep(name):
            out.append(line)
    return "\n".join(out) + "\n"


def parse_metrics(text: str, keep: Callable[[str], bool] | None = None) -> list[Sample]:
    """Prometheus text exposition → (sample name, labels, value), with prometheus_client's own parser.
    ``keep``: the sample names wanted (a family's HELP and TYPE lines by the family's name); the others are
    dropped before parsing: a vLLM API server's page is ~500 samples, ~80 of them vLLM's own figures, and
    the parser costs ~13 µs a sample on every scrape of the hunt."""
    if keep is not None:
        text = _kept_lines(text, keep)
    out: list[Sample] = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            # a line _kept_lines left for the parser to reject may parse into a name ``keep`` refuses
            # ("INFINITY" reads as INFINIT = +Inf): dropped as its well-formed kin are
            if keep is None or keep(s.name):
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
        with urllib.request.urlopen(url, timeout=timeout) as r:  # the user's URL
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
