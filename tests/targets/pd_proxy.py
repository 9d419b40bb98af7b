"""A small P/D proxy for two vLLM servers with the NixlConnector (loopback only).

Each ``POST /v1/completions`` goes first to a prefill server with ``max_tokens=1`` and
``kv_transfer_params={"do_remote_decode": true}``, then to a decode server with the ``kv_transfer_params``
the prefill answered (where decode should READ the KV blocks from). The command line names the ports the
way vLLM's toy proxy does (``--prefiller-ports``, ``--decoder-ports``): that is what ``leaktrace ps``
reads to tell prefill from decode.

Standard library only, so it runs under any Python. Refuses non-loopback addresses.
"""

from __future__ import annotations

import argparse
import ipaddress
import itertools
import json
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _loopback(host: str) -> str:
    if host == "localhost":
        return "127.0.0.1"
    if not ipaddress.ip_address(host).is_loopback:
        sys.exit(f"pd_proxy: {host} is not a loopback address; this test proxy only talks to 127.0.0.0/8")
    return host


class Proxy:
    def __init__(self, prefill: list[str], decode: list[str], timeout: float) -> None:
        self.prefill = itertools.cycle(prefill)
        self.decode = itertools.cycle(decode)
        self.lock = threading.Lock()
        self.timeout = timeout
        self.counts = {"requests": 0, "failed": 0}

    def post(self, base: str, path: str, body: dict) -> dict:
        req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=self.timeout) as r:  # loopback only
            return json.loads(r.read())

    def completion(self, path: str, body: dict) -> dict:
        with self.lock:
            p, d = next(self.prefill), next(self.decode)
        pre = dict(body, max_tokens=1, stream=False,
                   kv_transfer_params={"do_remote_decode": True, "do_remote_prefill": False,
                                       "remote_engine_id": None, "remote_block_ids": None,
                                       "remote_host": None, "remote_port": None})
        pre.pop("max_completion_tokens", None)
        answer = self.post(p, path, pre)
        dec = dict(body, kv_transfer_params=answer.get("kv_transfer_params"))
        return self.post(d, path, dec)


def make_handler(proxy: Proxy):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *args: object) -> None:
            pass

        def _reply(self, code: int, obj: dict) -> None:
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # http.server API
            if self.path in ("/health", "/healthcheck"):
                self._reply(200, {"ok": True, **proxy.counts})
            else:
                self._reply(404, {"error": "not found"})

        def do_POST(self) -> None:  # http.server API
            if self.path not in ("/v1/completions", "/v1/chat/completions"):
                self._reply(404, {"error": "not found"})
                return
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            try:
                out = proxy.completion(self.path, body)
            except (urllib.error.URLError, OSError, ValueError) as e:
                proxy.counts["failed"] += 1
                self._reply(502, {"error": f"{e.__class__.__name__}: {e}"})
                return
            proxy.counts["requests"] += 1
            self._reply(200, out)

    return Handler


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--prefiller-host", default="127.0.0.1")
    ap.add_argument("--prefiller-ports", type=int, nargs="+", required=True)
    ap.add_argument("--decoder-host", default="127.0.0.1")
    ap.add_argument("--decoder-ports", type=int, nargs="+", required=True)
    ap.add_argument("--timeout", type=float, default=120.0)
    a = ap.parse_args()
    host, ph, dh = _loopback(a.host), _loopback(a.prefiller_host), _loopback(a.decoder_host)
    proxy = Proxy([f"http://{ph}:{p}" for p in a.prefiller_ports],
                  [f"http://{dh}:{p}" for p in a.decoder_ports], a.timeout)
    server = ThreadingHTTPServer((host, a.port), make_handler(proxy))
    print(f"ready {a.port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
