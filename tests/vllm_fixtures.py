"""The one real vLLM P/D pair of the suite, started once per test session and shared by the modules that use it.

The pair is the one of tests/targets/vintage_pd.py: vLLM 0.32 (CPU) prefill + decode over the NixlConnector
with NIXL 0.9.0, whose bundled UCX 1.20.0 has the seed-002 leak (each munmap queues an rcache invalidation
entry in 148 KiB chunks mapped by UCM's raw mmap, never returned while UCX_RCACHE_MAX_UNRELEASED=inf). No
LD_PRELOAD, no test library: the leak is UCX's own. It runs in a private network namespace (nothing can leave
it); four clients send completions through the proxy from the fixture's start to its end, as a deployment's
traffic goes on while someone hunts.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from conftest import LEAKTRACE, REPO

sys.path.insert(0, str(REPO / "tests" / "targets"))

import vintage_pd
import vllm_servers

# Load before anything is asserted: the NIXL handshake, the first KV transfers, and the workers' own warm-up
# (oneDNN's primitive cache fills with the batch shapes that four clients make).
WARMUP_S = 45
MIN_WARM_REQUESTS = 4


def require_vllm() -> None:
    why = vllm_servers.available()
    if why:
        pytest.skip(f"vLLM target missing: {why}")


@dataclass
class RealPair:
    pair: vintage_pd.VintagePair
    load: vintage_pd.Load
    workers: dict[str, int]  # role -> VLLM::Worker pid

    @property
    def ns(self) -> vintage_pd.NetNs:
        return self.pair.ns

    @property
    def prefill(self) -> vllm_servers.Server:
        return self.pair.prefill

    @property
    def decode(self) -> vllm_servers.Server:
        return self.pair.decode

    @property
    def proxy(self) -> vllm_servers.Proxy:
        return self.pair.proxy

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        """``leaktrace ARGS`` inside the pair's network namespace (where its servers' addresses are)."""
        return subprocess.run([*self.ns.enter(), *LEAKTRACE, *map(str, args)], capture_output=True, text=True,
                              timeout=timeout, cwd=str(REPO))

    def cli_popen(self, *args: str, stderr) -> subprocess.Popen:
        return subprocess.Popen([*self.ns.enter(), *LEAKTRACE, *map(str, args)], stdout=subprocess.DEVNULL,
                                stderr=stderr, text=True, cwd=str(REPO))

    def restart_proxy(self) -> None:
        self.pair.proxy.stop()
        self.pair.proxy = vllm_servers.start_proxy(self.pair.proxy.port, [self.prefill.port], [self.decode.port],
                                                   prefix=self.ns.enter())
        self.load.url = self.pair.proxy.url


# Module scope: the pair and its load stop with the module that uses them, not at the end of the run (the
# modules after it would run beside a vLLM pair serving on the same two cores).
@pytest.fixture(scope="module")
def real_pd() -> Iterator[RealPair]:
    why = vintage_pd.available()
    if why:
        pytest.skip(f"real vLLM P/D target missing: {why}")
    pair = vintage_pd.start(vintage_pd.LEAK)
    load = vintage_pd.Load(pair.ns, pair.proxy.url)
    try:
        workers = {"prefill": vintage_pd.workers(pair.prefill.pid), "decode": vintage_pd.workers(pair.decode.pid)}
        assert all(len(w) == 1 for w in workers.values()), workers
        load.start()
        started = time.monotonic()
        deadline = started + 300
        while (load.ok < MIN_WARM_REQUESTS or time.monotonic() - started < WARMUP_S) and time.monotonic() < deadline:
            time.sleep(1)
        assert load.ok >= 1, f"no completion through the P/D proxy:\n{pair.decode.tail()}"
        yield RealPair(pair, load, {role: w[0] for role, w in workers.items()})
    finally:
        load.stop()
        pair.stop()
