"""The /metrics probe and the load analysis: recorded vLLM text, a live loopback server, an unreachable
URL (warning, the hunt goes on), and load correlation on sessions written with the real SessionWriter."""

from __future__ import annotations

import http.server
import json
import socket
import sys
import threading
from pathlib import Path

import pytest
from conftest import run_cli

from leaktrace.analysis import load as load_analysis
from leaktrace.session import SessionReader, SessionWriter
from leaktrace.vllm.metrics import normalize_url, parse_metrics, summarize

DATA = Path(__file__).resolve().parent / "data"


def test_parse_recorded_single_server() -> None:
    samples = parse_metrics((DATA / "vllm_metrics_single.txt").read_text())
    assert len(samples) > 300
    s = summarize(samples)
    assert s["requests"] == 5 and s["generation_tokens"] == 40 and s["prompt_tokens"] > 0
    assert s["kv_external_prompt_tokens"] == 0 and s["nixl_transfers"] == 0
    assert s["api_rss"] > 100 * 2**20


def test_parse_recorded_decode() -> None:
    # Recorded from the decode instance of a real P/D pair (tests/data): KV arrived by NIXL transfer.
    s = summarize(parse_metrics((DATA / "vllm_metrics_decode.txt").read_text()))
    assert s["kv_external_prompt_tokens"] == 115 and s["nixl_transfers"] == 3 and s["requests"] == 3
    p = summarize(parse_metrics((DATA / "vllm_metrics_prefill.txt").read_text()))
    assert p["kv_external_prompt_tokens"] == 0 and p["nixl_transfers"] == 0 and p["prompt_tokens"] == 115


def test_parse_rejects_garbage() -> None:
    with pytest.raises(ValueError):
        parse_metrics("this is { not prometheus")
    with pytest.raises(ValueError):  # dropping the names not kept never makes a page valid
        parse_metrics("<html>\nthis is { not prometheus\n", keep=lambda n: n.startswith("vllm:"))


@pytest.mark.parametrize("page", ["single", "decode", "prefill"])
def test_parse_keeps_only_the_names_asked_for(page: str) -> None:
    text = (DATA / f"vllm_metrics_{page}.txt").read_text()
    full = parse_metrics(text)
    kept = parse_metrics(text, keep=lambda n: n.startswith("vllm:") and not n.endswith("_bucket"))
    assert kept == [s for s in full if s[0].startswith("vllm:") and not s[0].endswith("_bucket")]
    assert 0 < len(kept) < len(full) / 3


def test_normalize_url() -> None:
    assert normalize_url("127.0.0.1:8000") == "http://127.0.0.1:8000/metrics"
    assert normalize_url("http://127.0.0.1:8000/") == "http://127.0.0.1:8000/metrics"
    assert normalize_url("http://127.0.0.1:8000/custom") == "http://127.0.0.1:8000/custom"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def metrics_server():
    """Serves the recorded vLLM /metrics on 127.0.0.1, with a request counter that grows per scrape."""
    text = (DATA / "vllm_metrics_single.txt").read_text()
    state = {"n": 0}

    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            state["n"] += 1
            body = text.replace('vllm:request_success_total{engine="0",finished_reason="length",'
                                'model_name="/work/main/.cache/tiny-llama"} 5.0',
                                'vllm:request_success_total{engine="0",finished_reason="length",'
                                f'model_name="/work/main/.cache/tiny-llama"}} {5 + 10 * state["n"]}.0').encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/metrics", state
    srv.shutdown()


def test_hunt_scrapes_and_survives_unreachable(spawn, metrics_server, tmp_path) -> None:
    url, state = metrics_server
    dead = f"http://127.0.0.1:{_free_port()}/metrics"
    target = spawn([sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"])
    out = tmp_path / "h"
    r = run_cli("hunt", "--pid", target.pid, "--duration", "4", "--interval", "1", "--no-bpf", "--no-gdb",
                "--metrics", url, "--metrics", dead, "--out", out, "--format", "json", timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"metrics: {dead} unreachable" in r.stderr
    assert r.stderr.count(f"{dead} unreachable") == 1  # one warning, not one per tick
    reader = SessionReader(out)
    ms = reader.table("metrics_summary")
    ok = ms[ms["url"] == url]
    assert len(ok) >= 4 and ok["ok"].all() and state["n"] >= 4
    assert not ms[ms["url"] == dead]["ok"].any()
    assert (reader.table("metrics")["name"] == "vllm:generation_tokens_total").any()
    ld = load_analysis.load(reader)
    assert ld is not None and ld["requests"] == 10 * (len(ok) - 1)


def _session(tmp_path: Path, mem_at, req_at, seconds: int = 60, pids=(111, 222)) -> SessionReader:
    w = SessionWriter(tmp_path / "s", meta={"instances": [
        {"instance": 111, "role": "decode", "port": 8120, "pids": [111, 222], "processes": [], "model": "m"}],
        "metrics_urls": {"http://127.0.0.1:8120/metrics": 111}})
    for t in range(seconds):
        for pid in pids:
            w.append("rollup", {"t": float(t), "pid": pid, "rss": int(mem_at(t)) if pid == 222 else 500 << 20,
                                "pss": 0, "uss": 0, "anon": 0, "swap": 0, "shared": 0})
        w.append("metrics_summary", {"t": float(t) + 0.1, "url": "http://127.0.0.1:8120/metrics",
                                     "instance": 111, "ok": True, "requests": float(req_at(t)),
                                     "generation_tokens": float(req_at(t) * 8), "prompt_tokens": 0.0,
                                     "kv_external_prompt_tokens": float(req_at(t) * 14),
                                     "nixl_transfers": float(req_at(t)), "nixl_bytes": 0.0, "nixl_failed": 0.0})
    w.close()
    return SessionReader(tmp_path / "s")


def _bursty(t: int) -> float:
    """Cumulative requests: 20/s during the first and third 15 s, idle otherwise."""
    busy = [min(max(t - a, 0), 15) for a in (0, 30)]
    return 20.0 * sum(busy)


def test_load_follows_requests(tmp_path) -> None:
    # 1 MB per 100 requests, only while requests flow.
    r = _session(tmp_path, lambda t: (1 << 30) + _bursty(t) * 10_485.76, _bursty)
    ld = load_analysis.load(r)
    assert ld["requests"] == 600 and ld["generated_tokens"] == 4800 and ld["kv_transfers"] == 600
    assert ld["follows"] == "load", ld
    assert ld["mb_per_1k_requests"] == pytest.approx(10.0, rel=0.35)
    inst = load_analysis.instances(r)
    assert inst[0]["instance"] == 111 and inst[0]["role"] == "decode" and inst[0]["rss_growth_mb"] > 3
    assert ld["per_instance"][0]["role"] == "decode"


def test_load_follows_time(tmp_path) -> None:
    r = _session(tmp_path, lambda t: (1 << 30) + t * (200 << 10), _bursty)
    assert load_analysis.load(r)["follows"] == "time"


def test_load_steady_is_undetermined_and_flat_is_none(tmp_path) -> None:
    r = _session(tmp_path, lambda t: (1 << 30) + t * (200 << 10), lambda t: 10.0 * t)
    assert load_analysis.load(r)["follows"] == "undetermined"
    r2 = _session(tmp_path / "b", lambda t: 1 << 30, _bursty)
    assert load_analysis.load(r2)["follows"] == "none"


def test_load_counter_reset_and_no_metrics(tmp_path) -> None:
    r = _session(tmp_path, lambda t: 1 << 30, lambda t: t if t < 30 else t - 30)
    assert load_analysis.load(r)["requests"] == 29 + 29  # 0..29, then a restart counts from zero again
    w = SessionWriter(tmp_path / "empty")
    w.close()
    assert load_analysis.load(SessionReader(tmp_path / "empty")) is None
    assert load_analysis.instances(SessionReader(tmp_path / "empty")) == []


def test_python_heap_summary(tmp_path) -> None:
    w = SessionWriter(tmp_path / "p")
    w.append("pyheap", [{"t": 0.0, "pid": 5, "python": True, "version": "3.11", "frozen": 100, "tracked": 50,
                         "gen0_count": 1, "gen1_count": 2, "gen2_count": 3, "gen2_collections": 4},
                        {"t": 9.0, "pid": 5, "python": True, "version": "3.11", "frozen": 100, "tracked": 80,
                         "gen0_count": 1, "gen1_count": 2, "gen2_count": 3, "gen2_collections": 6}])
    w.close()
    ph = load_analysis.python_heap(SessionReader(tmp_path / "p"))
    assert ph[5]["heap_frozen"] and ph[5]["tracked_first"] == 50 and ph[5]["tracked_last"] == 80
    assert ph[5]["gen2_collections_during_hunt"] == 2
    json.dumps(ph)


def test_leak_per_request_and_per_kv_token(tmp_path) -> None:
    # 10 requests/s, 14 KV tokens moved per request, for 60 s; a 6 MiB/min culprit in the decode instance and
    # one of 3 MiB/min in a process of no instance (counted overall, not for the instance).
    r = _session(tmp_path, lambda t: 1 << 30, lambda t: 10.0 * t)
    ld = load_analysis.load(r)
    culprits = [{"pid": 222, "instance": 111, "mb_per_min": 6.0}, {"pid": 333, "instance": None, "mb_per_min": 3.0}]
    load_analysis.leak_per_load(ld, culprits)
    per_min = ld["requests"] * 60 / ld["span_s"]
    assert per_min == pytest.approx(600, rel=0.01)
    (inst,) = ld["per_instance"]
    assert inst["leak_mb_per_min"] == 6.0
    assert inst["leak_bytes_per_request"] == pytest.approx(6 * 2**20 / 600, rel=0.01)
    assert inst["leak_bytes_per_kv_token"] == pytest.approx(6 * 2**20 / (600 * 14), rel=0.01)
    assert ld["leak_mb_per_min"] == 9.0 and ld["leak_bytes_per_request"] == pytest.approx(9 * 2**20 / 600, rel=0.01)
    # No requests during the hunt: nothing to divide by, said as null.
    idle = load_analysis.load(_session(tmp_path / "idle", lambda t: 1 << 30, lambda t: 0.0))
    load_analysis.leak_per_load(idle, culprits)
    assert idle["leak_bytes_per_request"] is None and idle["per_instance"][0]["leak_bytes_per_kv_token"] is None


def test_html_shows_leak_per_request_and_kv_token(tmp_path) -> None:
    from leaktrace.report import html

    report = json.loads((Path(__file__).parent / "data" / "golden" / "demo" / "expected" / "report.json").read_text())
    ld = load_analysis.load(_session(tmp_path, lambda t: 1 << 30, lambda t: 10.0 * t))
    load_analysis.leak_per_load(ld, [{"pid": 222, "instance": 111, "mb_per_min": 6.0}])
    report["load"] = ld
    page = html.render(report)
    row = page[page.index("<td>111</td>"):].split("</tr>")[0]
    assert "<td>decode</td>" in row and f">{ld['leak_bytes_per_request']:.0f}<" in row, row
    assert f">{ld['per_instance'][0]['leak_bytes_per_kv_token']:.1f}<" in row, row


def test_role_from_counters_of_recorded_servers_and_a_decode_that_recomputed() -> None:
    from leaktrace.vllm.discover import role_from_counters

    data = Path(__file__).parent / "data"
    pre = summarize(parse_metrics((data / "vllm_metrics_prefill.txt").read_text()))
    dec = summarize(parse_metrics((data / "vllm_metrics_decode.txt").read_text()))
    assert role_from_counters(pre)[0] == "prefill" and role_from_counters(dec)[0] == "decode"
    # A decode whose KV transfers all failed recomputes the prompts itself (no KV received) but still answers
    # with more than one token per request (as on the first cross-node requests of a P/D pair).
    recomputed = {"requests": 3.0, "prompt_tokens": 60.0, "generation_tokens": 24.0, "nixl_transfers": 0.0,
                  "kv_external_prompt_tokens": 0.0}
    assert role_from_counters(recomputed) == ("decode", "generates more than one token per request")
    assert role_from_counters({"requests": 0.0})[0] is None
