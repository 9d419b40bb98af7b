"""Start and stop real vLLM (CPU) servers for the tests: a single server, or a P/D pair + proxy.

Every server listens on 127.0.0.1 only and runs with UCX_NET_DEVICES=lo (UCX would otherwise also send
KV traffic over eth0). Each process starts in its own process group and is stopped by that group.
Also runnable by hand: ``python tests/targets/vllm_servers.py pd`` (Ctrl-C stops everything).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".venv-vllm"
MODEL = REPO / ".cache" / "tiny-llama"
TARGETS = Path(__file__).resolve().parent
LOGS = REPO / ".cache" / "vllm-logs"

NIXL_KV = {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cpu"}


def available() -> str | None:
    """None when the vLLM target can run here, else why not."""
    if not (VENV / "bin" / "vllm").exists():
        return "no .venv-vllm (run tests/targets/setup_vllm.sh, or .ci/setup.sh)"
    if not (MODEL / ".complete").exists():
        return "no tiny model (run tests/targets/setup_vllm.sh)"
    return None


def base_env(extra: dict[str, str] | None = None, host: str = "127.0.0.1") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UCX_", "VLLM_", "PYTHONPATH"))}
    env.update({
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_HOST_IP": host,
        # One OpenMP thread per worker, as the vintage pair (tests/targets/vintage_pd.py): two workers with one
        # per core each spin in OpenMP barriers on 2 cores and starve everything beside them, a hunt included.
        "OMP_NUM_THREADS": "1",
        "UCX_NET_DEVICES": "lo", "UCX_MODULES": "^ib*,rdmacm",
        "VLLM_NIXL_SIDE_CHANNEL_HOST": host,
    })
    env.update(extra or {})
    return env


@dataclass
class Server:
    name: str
    port: int
    popen: subprocess.Popen
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    host: str = "127.0.0.1"

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self, timeout: float = 20.0) -> None:
        stop_group(self.popen, timeout)


def stop_group(popen: subprocess.Popen, timeout: float = 20.0) -> None:
    """SIGTERM the process group (vLLM stops its tree in ~3 s), SIGKILL what is left."""
    try:
        os.killpg(popen.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        popen.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(popen.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        popen.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def start_server(name: str, port: int, kv: dict | None = None, env: dict[str, str] | None = None,
                 host: str = "127.0.0.1", prefix: list[str] | None = None, model: Path = MODEL,
                 extra_args: list[str] | None = None) -> Server:
    """``host``: a loopback address (each node of the cluster tests has its own); ``prefix``: a command prefix
    that places the server on such a node (its network, PID and mount namespaces)."""
    LOGS.mkdir(parents=True, exist_ok=True)
    log = LOGS / f"{name}-{port}.log"
    argv = [*(prefix or []), str(VENV / "bin" / "vllm"), "serve", str(model), "--host", host, "--port", str(port),
            "--max-model-len", "512", "--dtype", "bfloat16", "--enforce-eager", "--max-num-seqs", "8"]
    if kv:
        argv += ["--kv-transfer-config", json.dumps(kv)]
    argv += extra_args or []
    full_env = base_env(env, host)
    with open(log, "w") as f:
        popen = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env=full_env, start_new_session=True, cwd=str(REPO))
    return Server(name, port, popen, log, full_env, host)


def wait_ready(servers: list[Server], timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    pending = list(servers)
    while pending:
        for s in list(pending):
            if s.popen.poll() is not None:
                raise RuntimeError(f"vLLM {s.name} exited with {s.popen.returncode}:\n{s.tail()}")
            try:
                with urllib.request.urlopen(f"{s.url}/health", timeout=2) as r:
                    if r.status == 200:
                        pending.remove(s)
            except (urllib.error.URLError, OSError):
                pass
        if pending and time.monotonic() > deadline:
            raise RuntimeError(f"vLLM {[s.name for s in pending]} not ready in {timeout:.0f}s:\n{pending[0].tail()}")
        if pending:
            time.sleep(1.0)


@dataclass
class Proxy:
    port: int
    popen: subprocess.Popen
    host: str = "127.0.0.1"

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        stop_group(self.popen, 5)


def start_proxy(port: int, prefill_ports: list[int], decode_ports: list[int], host: str = "127.0.0.1",
                prefill_host: str = "127.0.0.1", decode_host: str = "127.0.0.1",
                prefix: list[str] | None = None) -> Proxy:
    argv = [*(prefix or []), sys.executable, str(TARGETS / "pd_proxy.py"), "--host", host, "--port", str(port),
            "--prefiller-host", prefill_host, "--prefiller-ports", *map(str, prefill_ports),
            "--decoder-host", decode_host, "--decoder-ports", *map(str, decode_ports)]
    popen = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                             start_new_session=True)
    line = popen.stdout.readline()  # type: ignore[union-attr]
    if not line.startswith("ready"):
        stop_group(popen, 5)
        raise RuntimeError(f"proxy did not start: {line!r}")
    return Proxy(port, popen, host)


def complete(base_url: str, prompt: str, max_tokens: int = 8, timeout: float = 90.0, model: Path = MODEL) -> dict:
    body = {"model": str(model), "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    req = urllib.request.Request(f"{base_url}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as r:  # loopback only
        return json.loads(r.read())


def send_load(base_url: str, n: int, max_tokens: int = 8, timeout: float = 90.0,
              deadline_s: float | None = None) -> tuple[int, int]:
    """n sequential completions with distinct prompts (so nothing hits the prefix cache);
    returns (ok, failed). Stops early at ``deadline_s`` seconds."""
    ok = failed = 0
    t0 = time.monotonic()
    for i in range(n):
        if deadline_s is not None and time.monotonic() - t0 > deadline_s:
            break
        prompt = f"Request {i} at {time.time():.6f}: the quick brown fox jumps over the lazy dog number {i * 7}"
        try:
            complete(base_url, prompt, max_tokens, timeout)
            ok += 1
        except (urllib.error.URLError, OSError, ValueError):
            failed += 1
    return ok, failed


def start_pd(prefill_port: int = 8110, decode_port: int = 8120, proxy_port: int = 8130,
             decode_env: dict[str, str] | None = None) -> tuple[Server, Server, Proxy]:
    prefill = start_server("prefill", prefill_port, NIXL_KV, {"VLLM_NIXL_SIDE_CHANNEL_PORT": "5600"})
    decode = start_server("decode", decode_port, NIXL_KV,
                          {"VLLM_NIXL_SIDE_CHANNEL_PORT": "5700", **(decode_env or {})})
    try:
        wait_ready([prefill, decode])
        proxy = start_proxy(proxy_port, [prefill_port], [decode_port])
    except BaseException:
        decode.stop()
        prefill.stop()
        raise
    return prefill, decode, proxy


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "single"
    t0 = time.monotonic()
    # Background jobs ignore SIGINT: let SIGTERM stop the servers too.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    if mode == "pd":
        p, d, x = start_pd()
        print(f"P/D ready in {time.monotonic() - t0:.0f}s: prefill {p.pid}:{p.port} decode {d.pid}:{d.port} "
              f"proxy {x.pid}:{x.port}", flush=True)
        procs = [x, d, p]
    else:
        s = start_server("single", 8100)
        wait_ready([s])
        print(f"single ready in {time.monotonic() - t0:.0f}s: {s.pid}:{s.port}", flush=True)
        procs = [s]
    try:
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        for pr in procs:
            pr.stop()
