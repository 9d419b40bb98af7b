"""The "vintage P/D" target: a real vLLM 0.32 prefill+decode pair over the NixlConnector with NIXL 0.9.0,
whose bundled UCX (1.20.0) still has the seed-002 leak (each munmap queues an rcache invalidation entry in
storage grown by raw mmap, never returned while UCX_RCACHE_MAX_UNRELEASED=inf).

Everything runs inside a private network namespace made here: NIXL 0.9.0's UCX refuses to start with
loopback only, so the namespace gets a veth pair with both ends inside (``eth0`` 10.77.0.1/24 and its peer
``veth1`` 10.77.0.2/24) and ``lo``; servers and proxy listen on 127.0.0.1 there, UCX_NET_DEVICES names the
namespace's interfaces only. Nothing can leave the namespace: it has no route out.

Set-up: tests/targets/setup_vllm_vintage.sh (nixl 0.9.0 in .cache/nixl-0.9.0, first on the servers'
PYTHONPATH only; a stub libcuda.so.1 for the NIXL UCX plugin; a random-weight Llama of many thin layers).
The workers munmap like production ones through two real deployment knobs: MALLOC_MMAP_THRESHOLD_=4096
(every tensor above 4 KiB is its own mapping) and chunked prefill of 32 tokens a step on the prefill server
(``--max-num-batched-tokens 32``: a 120-word prompt, ~390 tokens, is ~12 steps, each with its per-layer tensors).

Chunked prefill is what makes the leak show within a minute: the workers' munmaps, and so UCX's chunks,
scale with model steps, not requests (about 3x with chunks of 32 tokens than without, on 2 cores).

Also runnable by hand: ``python tests/targets/vintage_pd.py [leak|fixed] [SECONDS]`` starts the namespace,
the pair and the proxy, drives load and prints the workers' RSS every 10 s.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import subprocess
import sys
import threading
import time
import urllib.error
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import vllm_servers

REPO = vllm_servers.REPO
CACHE = REPO / ".cache"
NIXL_OLD = CACHE / "nixl-0.9.0"
CUDA_STUB = CACHE / "libcuda-stub"
# Many thin layers: every step's per-layer tensors cross the 4 KiB mmap threshold, and a step is cheap on
# one core, so a worker munmaps ~200-500 times a second under load (the 1024-hidden, 4-layer model: ~50).
MODEL = Path(os.environ.get("VINTAGE_MODEL", CACHE / "llama-256x16"))
NS_ADDR, NS_PEER = "10.77.0.1/24", "10.77.0.2/24"
CLONE_NEWNET = 0x40000000

# NIXL's UCX backend with one worker thread (vLLM's default is 4): fewer busy-polling threads on 2 cores.
# The KV lease stays vLLM's default (30 s; VINTAGE_KV_LEASE to try others). A decode's KV read sometimes takes
# as long as the lease (one read of 30.2 s, both servers idle meanwhile: every client waiting, no munmaps, UCX's
# queue not growing). A 6 s lease with 4 clients gave steadier traffic (~29 requests/min, a completion in every
# 10 s of 190 s) but is no deployment: 43 of 88 requests' blocks expired before the decode read them, and the
# decode read KV the prefill had already released ("Potentially invalid KV blocks"). With 30 s and 2 clients:
# windows of 20-30 s without a completion; with 4 clients ~25 requests/min, one such window in 200 s.
KV = {**vllm_servers.NIXL_KV, "kv_connector_extra_config": {
    "num_threads": int(os.environ.get("VINTAGE_NIXL_THREADS", "1")),
    **({"kv_lease_duration": int(os.environ["VINTAGE_KV_LEASE"])} if os.environ.get("VINTAGE_KV_LEASE") else {})}}

# The leak on: vLLM 0.32 sets UCX_RCACHE_MAX_UNRELEASED=1024 itself unless the variable is already set.
LEAK = "inf"
FIXED = "1024"


def available() -> str | None:
    """None when the vintage target can run here, else why not."""
    why = vllm_servers.available()
    if why:
        return why
    if os.geteuid() != 0:
        return "needs root (a private network namespace)"
    for path, what in ((NIXL_OLD / ".complete", "nixl 0.9.0"), (CUDA_STUB / "libcuda.so.1", "the libcuda stub"),
                       (MODEL / ".complete", "the 16-layer model")):
        if not path.exists():
            return f"no {what} (run tests/targets/setup_vllm_vintage.sh)"
    for tool in ("unshare", "nsenter", "ip"):
        if subprocess.run(["which", tool], capture_output=True).returncode != 0:
            return f"{tool} missing (apt-get install util-linux iproute2)"
    return None


class NetNs:
    """A private network namespace with ``lo`` and a veth pair, both ends inside; kept by a holder process
    that reads its stdin (when the test process dies the pipe closes and the namespace goes)."""

    SCRIPT = (f"ip link set lo up && ip link add eth0 type veth peer name veth1 && "
              f"ip addr add {NS_ADDR} dev eth0 && ip addr add {NS_PEER} dev veth1 && "
              f"ip link set eth0 up && ip link set veth1 up && echo ready && read _unused")

    def __init__(self, timeout: float = 10) -> None:
        self.popen = subprocess.Popen(["unshare", "--net", "--", "sh", "-c", self.SCRIPT], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      start_new_session=True)
        ready, _, _ = select.select([self.popen.stdout], [], [], timeout)
        line = self.popen.stdout.readline() if ready else ""  # type: ignore[union-attr]
        if line.strip() != "ready":
            self.close()
            err = self.popen.stderr.read() if self.popen.poll() is not None else "no answer"  # type: ignore[union-attr]
            raise RuntimeError(f"could not create the network namespace: {err.strip()}")

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def path(self) -> str:
        return f"/proc/{self.pid}/ns/net"

    def enter(self) -> list[str]:
        """Command prefix that runs a program inside this namespace."""
        return ["nsenter", f"--net={self.path}", "--"]

    def join_thread(self) -> None:
        """Move the calling thread (only it) into the namespace: its sockets then live there."""
        fd = os.open(self.path, os.O_RDONLY)
        try:
            if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns(CLONE_NEWNET) failed")
        finally:
            os.close(fd)

    def call(self, fn, *args, **kwargs):
        """Run ``fn`` in a fresh thread inside the namespace and return its result."""
        box: dict = {}

        def run() -> None:
            try:
                self.join_thread()
                box["r"] = fn(*args, **kwargs)
            except BaseException as e:  # re-raised in the caller
                box["e"] = e

        t = threading.Thread(target=run, daemon=True)
        t.start()
        t.join()
        if "e" in box:
            raise box["e"]
        return box.get("r")

    def interfaces(self) -> list[str]:
        out = subprocess.run([*self.enter(), "ip", "-o", "link", "show"], capture_output=True, text=True,
                             timeout=10, check=True).stdout
        return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]

    def close(self) -> None:
        if self.popen.poll() is None:
            try:
                self.popen.stdin.close()  # type: ignore[union-attr]
            except OSError:
                pass
            try:
                self.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=5)


def server_env(max_unreleased: str, side_port: int, core: int) -> dict[str, str]:
    return {
        # One OpenMP thread per server, each on its own core: with vLLM's default binding both servers'
        # compute threads share the two cores and spin in OpenMP barriers while the other holds the core
        # (the prefill can stall for minutes while the decode waits for its KV).
        "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VINTAGE_BIND", "nobind"), "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(NIXL_OLD),  # nixl 0.9.0 before .venv-vllm's 1.5.1
        "LD_LIBRARY_PATH": str(CUDA_STUB),
        "UCX_NET_DEVICES": "lo,eth0",  # the namespace's interfaces only
        "UCX_MODULES": "^ib*,rdmacm",
        "UCX_RCACHE_MAX_UNRELEASED": max_unreleased,
        # A real deployment knob: a fixed threshold (also turns glibc's dynamic one off) makes every
        # per-step tensor above 4 KiB an mmap/munmap pair, as large models do in production (1 KiB gives more
        # munmaps, and more of the worker's own malloc churn beside UCX's).
        "MALLOC_MMAP_THRESHOLD_": os.environ.get("VINTAGE_MMAP_THRESHOLD", "4096"),
        **({"MALLOC_TRIM_THRESHOLD_": "0", "MALLOC_TOP_PAD_": "0"} if os.environ.get("VINTAGE_TRIM") else {}),
        # The pair's own warm-up, bounded: oneDNN (inside vLLM's _C) caches a JIT-compiled primitive per new
        # batch shape, and chunked prefill with several clients makes new shapes for minutes: a real, bounded
        # growth of several MB/min that a 2-minute-old worker shows and a production worker is past. A smaller
        # cache (default 1024) is full within the warm-up.
        "ONEDNN_PRIMITIVE_CACHE_CAPACITY": os.environ.get("VINTAGE_ONEDNN_CACHE", "128"),
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side_port),
    }


def prefill_args() -> list[str]:
    """Chunked prefill of 32 tokens a step on the prefill server (a real knob, VINTAGE_BATCHED_TOKENS): each
    prompt becomes ~12 model steps, each munmapping its per-layer tensors (~3x the munmaps of one step)."""
    chunk = os.environ.get("VINTAGE_BATCHED_TOKENS", "32")
    return ["--max-num-batched-tokens", chunk] if chunk else []


@dataclass
class VintagePair:
    ns: NetNs
    prefill: vllm_servers.Server
    decode: vllm_servers.Server
    proxy: vllm_servers.Proxy
    max_unreleased: str

    def stop(self) -> None:
        for p in (self.proxy, self.decode, self.prefill):
            p.stop()
        self.ns.close()


def start(max_unreleased: str = LEAK, ns: NetNs | None = None, prefill_port: int = 8210,
          decode_port: int = 8220, proxy_port: int = 8230, timeout: float = 400) -> VintagePair:
    own_ns = ns is None
    ns = ns or NetNs()
    servers: list[vllm_servers.Server] = []
    try:
        pre = ns.enter()
        cores = (0, 1) if (os.cpu_count() or 1) >= 2 else (0, 0)
        for name, port, side, core, args in (("vintage-prefill", prefill_port, 5610, cores[0], prefill_args()),
                                             ("vintage-decode", decode_port, 5710, cores[1], [])):
            servers.append(vllm_servers.start_server(name, port, KV,
                                                     server_env(max_unreleased, side, core), prefix=pre,
                                                     model=MODEL, extra_args=args))
        ns.call(vllm_servers.wait_ready, servers, timeout)
        proxy = vllm_servers.start_proxy(proxy_port, [prefill_port], [decode_port], prefix=pre)
    except BaseException:
        for s in servers:
            s.stop()
        if own_ns:
            ns.close()
        raise
    return VintagePair(ns, servers[0], servers[1], proxy, max_unreleased)


PROMPT_WORDS = ("memory leak native heap registration cache invalidation queue prefill decode transfer "
                "tokens worker engine core scheduler block table attention layer").split()


def prompt(i: int, words: int = 120) -> str:
    """A distinct prompt of about ``words`` words (no prefix-cache hits between requests)."""
    body = " ".join(PROMPT_WORDS[(i * 7 + k * 3) % len(PROMPT_WORDS)] for k in range(words))
    return f"Request {i} {time.time():.6f}: {body}"


class Load(threading.Thread):
    """Completions through the proxy from inside the namespace, ``concurrency`` at a time, until stopped."""

    def __init__(self, ns: NetNs | None, url: str, concurrency: int = 4, max_tokens: int = 8,
                 words: int = 120) -> None:
        super().__init__(daemon=True)
        self.ns, self.url, self.concurrency, self.max_tokens, self.words = ns, url, concurrency, max_tokens, words
        self.ok = self.failed = 0
        self.stop_event = threading.Event()
        self._lock = threading.Lock()
        self._n = 0

    def _one(self) -> None:
        if self.ns is not None:
            self.ns.join_thread()
        while not self.stop_event.is_set():
            with self._lock:
                i = self._n
                self._n += 1
            try:
                vllm_servers.complete(self.url, prompt(i, self.words), self.max_tokens, timeout=90,
                                      model=MODEL)
                with self._lock:
                    self.ok += 1
            except (urllib.error.URLError, OSError, ValueError):
                with self._lock:
                    self.failed += 1
                self.stop_event.wait(1.0)

    def run(self) -> None:
        threads = [threading.Thread(target=self._one, daemon=True) for _ in range(self.concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=100)


def workers(server_pid: int) -> list[int]:
    """PIDs of the VLLM::Worker processes under a server."""
    out = []
    todo = [server_pid]
    while todo:
        pid = todo.pop()
        try:
            kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            continue
        for k in map(int, kids):
            todo.append(k)
            try:
                if Path(f"/proc/{k}/cmdline").read_bytes().startswith(b"VLLM::Worker"):
                    out.append(k)
            except OSError:
                pass
    return out


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class RssSampler(threading.Thread):
    """VmRSS of some processes once a second, from /proc (independent of leaktrace): the truth a hunt's rates
    are compared with."""

    def __init__(self, pids: list[int]) -> None:
        super().__init__(daemon=True)
        self.samples: dict[int, list[tuple[float, int]]] = {p: [] for p in pids}
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.is_set():
            now = time.monotonic()
            for p in self.samples:
                try:
                    self.samples[p].append((now, rss_kb(p) * 1024))
                except OSError:
                    pass
            self.stop_event.wait(1.0)

    def mb_per_min(self, pid: int, t0: float, t1: float) -> float:
        """The RSS slope (MiB/min, as report.json's "MB") between two CLOCK_MONOTONIC times; NaN under 3 samples."""
        import numpy as np

        pts = [(t, b) for t, b in self.samples[pid] if t0 <= t <= t1]
        if len(pts) < 3:
            return float("nan")
        t, b = np.array(pts, dtype=float).T
        return float(np.polyfit(t, b, 1)[0]) * 60 / 2**20

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=5)


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    mode = sys.argv[1] if len(sys.argv) > 1 else "leak"
    secs = float(sys.argv[2]) if len(sys.argv) > 2 else 120
    t0 = time.monotonic()
    pair = start(LEAK if mode == "leak" else FIXED)
    print(f"ready in {time.monotonic() - t0:.0f}s: prefill {pair.prefill.pid} decode {pair.decode.pid} "
          f"proxy {pair.proxy.pid} ns holder {pair.ns.pid}", flush=True)
    try:
        load = Load(pair.ns, pair.proxy.url, int(os.environ.get("CONC", "4")), int(os.environ.get("MAXTOK", "8")),
                    int(os.environ.get("WORDS", "120")))
        if secs > 0:
            load.start()
        else:
            secs = 1e9
        ws = {"prefill": workers(pair.prefill.pid), "decode": workers(pair.decode.pid)}
        t1 = time.monotonic()
        while time.monotonic() - t1 < secs:
            rss = {k: [rss_kb(p) // 1024 for p in v] for k, v in ws.items()}
            print(f"{time.monotonic() - t1:6.0f}s ok={load.ok} failed={load.failed} rss_mb={rss}", flush=True)
            time.sleep(10)
        load.stop()
    except KeyboardInterrupt:
        pass
    finally:
        pair.stop()


if __name__ == "__main__":
    main()
