"""Cluster hunt on a real vLLM P/D pair across two Ray nodes: prefill (and the proxy) on lt-pf (127.0.0.2,
the head), decode on lt-dc (127.0.0.3), each node in its own PID namespace, KV moved by NIXL between the
nodes' addresses (UCX on lo) inside the private network namespace the test creates (tests/cluster_helpers.py).
The decode worker leaks: it runs with UCX_RCACHE_MAX_UNRELEASED=inf and tests/targets/libinvq_leak.so
preloaded, the fast variant of tests/test_vllm_pd.py (on 2 cores the tiny model's worker munmaps too little
for UCX's own queue to grow measurably). `leaktrace cluster hunt --vllm` from the head must show each node's
instance and role, name the decode node's culprit in its worker, and show the prefill node clean.
As a fleet runs it: the nodes and the driver run leaktrace installed from its wheel (no repository on any
sys.path), the driver is started on the head with `--address auto`, and the user stops it with Ctrl-C
(every node's hunt stops, keeps its session, and the merged report is written)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_helpers import _missing, _node, _node_hunts, _why
from conftest import REPO, is_root, wait_for
from vllm_fixtures import require_vllm, vllm_servers

pytestmark = [pytest.mark.cluster, pytest.mark.vllm, pytest.mark.slow, pytest.mark.extended]
LEAK_LIB = REPO / ".cache" / "libinvq_leak.so"
HUNT_S = 40
PF, DC = ("lt-pf", "127.0.0.2"), ("lt-dc", "127.0.0.3")
TARGETS = REPO / "tests" / "targets"

# Run inside the network namespace (the servers' addresses exist only there): wait for /health, or send
# paced completions through the proxy for a while ("load"; prints "ok N failed M" after each), or until the
# first one goes through ("warm").
IN_NETNS = """
import sys, time, urllib.request
sys.path.insert(0, sys.argv[1])
import vllm_servers
what = sys.argv[2]
if what == "ready":
    deadline = time.monotonic() + float(sys.argv[3])
    pending = set(sys.argv[4:])
    while pending and time.monotonic() < deadline:
        for url in list(pending):
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        pending.discard(url)
            except OSError:
                pass
        time.sleep(1.0)
    print("ready" if not pending else f"not ready: {sorted(pending)}", flush=True)
elif what == "warm":
    # Until the first completion (or the deadline): the first ones may fail or wait while the decode
    # worker's NIXL handshake with the prefill worker times out and is made again.
    url, deadline = sys.argv[3], time.monotonic() + float(sys.argv[4])
    ok = failed = 0
    while not ok and time.monotonic() < deadline:
        o, f = vllm_servers.send_load(url, 1, timeout=90)
        ok, failed = ok + o, failed + f
    print(f"ok {ok} failed {failed}", flush=True)
else:
    url, seconds, pause = sys.argv[3], float(sys.argv[4]), float(sys.argv[5])
    ok = failed = 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        o, f = vllm_servers.send_load(url, 1, timeout=90)
        ok, failed = ok + o, failed + f
        print(f"ok {ok} failed {failed}", flush=True)  # a running count: the last line is the total so far
        time.sleep(pause)
"""


def _in_netns(cluster, *args: str, timeout: float) -> str:
    r = cluster.run_in_netns([sys.executable, "-c", IN_NETNS, str(TARGETS), *map(str, args)], timeout=timeout)
    return r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr[-2000:]


@pytest.fixture(scope="module")
def pd_cluster(tmp_path_factory) -> Iterator:
    require_vllm()
    why = _missing()
    if why:
        pytest.skip(why)
    if not LEAK_LIB.exists():
        pytest.skip("no .cache/libinvq_leak.so (run tests/targets/setup_vllm.sh)")
    from cluster_helpers import RayNamespaceCluster, wheel_venv

    venv_bin = wheel_venv(tmp_path_factory.mktemp("wheel"))
    cluster = RayNamespaceCluster.start([PF, DC], timeout=120, venv_bin=venv_bin)
    started = []
    try:
        def on(name: str) -> list[str]:
            return [*cluster.netns.enter(), *cluster.node(name).enter()]

        kv = vllm_servers.NIXL_KV
        # UCX's shared-memory transports (cma, posix, sysv…) find their peer by pid, which another node's PID
        # namespace does not show: as between real hosts, KV moves over TCP (on lo here).
        between_nodes = {"UCX_TLS": "^sm"}
        started.append(vllm_servers.start_server("x-prefill", 8110, kv, {"VLLM_NIXL_SIDE_CHANNEL_PORT": "5600",
                                                                         **between_nodes},
                                                 host=PF[1], prefix=on(PF[0])))
        # LD_PRELOAD through `env` after the namespace prefix: only the decode server's tree loads it.
        started.append(vllm_servers.start_server(
            "x-decode", 8120, kv, {"VLLM_NIXL_SIDE_CHANNEL_PORT": "5700", "UCX_RCACHE_MAX_UNRELEASED": "inf",
                                   "LEAKTRACE_TESTLEAK_HZ": "2000", **between_nodes},
            host=DC[1], prefix=[*on(DC[0]), "env", f"LD_PRELOAD={LEAK_LIB}"]))
        state = _in_netns(cluster, "ready", 300, *(s.url for s in started), timeout=330)
        assert state == "ready", f"{state}\n--- prefill\n{started[0].tail()}\n--- decode\n{started[1].tail()}"
        proxy = vllm_servers.start_proxy(8130, [8110], [8120], host=PF[1], prefill_host=PF[1], decode_host=DC[1],
                                         prefix=on(PF[0]))
        started.append(proxy)
        # Warm-up: the NIXL handshake between the nodes and a first transfer (the first request may fail
        # while the decode worker's handshake with the prefill worker times out; the next ones go through).
        warm = _in_netns(cluster, "warm", proxy.url, 300, timeout=500)
        assert warm.startswith("ok ") and not warm.startswith("ok 0"), warm
        cluster.proxy = proxy
        yield cluster
    finally:
        for s in reversed(started):
            s.stop()
        cluster.stop()


def _driver_on_head(cluster, out: Path) -> subprocess.Popen:
    """`leaktrace cluster hunt --address auto --vllm` as a user on the head types it: the installed command,
    in the head node's PID namespace, outside the checkout, until Ctrl-C."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.Popen([*cluster.netns.enter(), *cluster.node(PF[0]).enter(), str(cluster.venv_bin / "leaktrace"),
                             "cluster", "hunt", "--address", "auto", "--vllm", "--duration", "600", "--interval", "1",
                             "--no-gdb", "--out", str(out)],
                            cwd=str(out.parent), env={**env, "RAY_USAGE_STATS_ENABLED": "0"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _ctrl_c(driver: subprocess.Popen) -> None:
    """Ctrl-C to the leaktrace process itself (nsenter, its parent here, would die of it, not pass it on)."""
    import psutil

    kids = psutil.Process(driver.pid).children()
    assert kids, "the driver is not running"
    for k in kids:
        os.kill(k.pid, signal.SIGINT)


def test_cluster_hunt_vllm_names_decode_node_and_shows_prefill_clean(pd_cluster, tmp_path: Path) -> None:
    load = subprocess.Popen([*pd_cluster.netns.enter(), sys.executable, "-c", IN_NETNS, str(TARGETS), "load",
                             pd_cluster.proxy.url, str(HUNT_S + 120), "0.5"], stdout=subprocess.PIPE, text=True)
    out = tmp_path / "hunt"
    driver = _driver_on_head(pd_cluster, out)
    try:
        # Handshake: both node hunts run and have flushed watcher rows; then HUNT_S of hunting, then Ctrl-C.
        def both_recording() -> bool:
            outs = list(_node_hunts().values())
            return len(outs) == 2 and all(any((o / "tables" / "rollup").glob("part-*")) for o in outs)

        assert wait_for(both_recording, timeout=240), (_node_hunts(), driver.poll())
        time.sleep(HUNT_S)
        _ctrl_c(driver)
        stdout, stderr = driver.communicate(timeout=360)  # the driver's Ctrl-C grace is 180 s
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
        load.terminate()
        lines = load.communicate(timeout=120)[0].strip().splitlines()
        served = lines[-1] if lines else "ok 0 (no request completed)"
    # Ctrl-C: the exit status of a `hunt` stopped by Ctrl-C, every node's hunt stopped with its session kept,
    # nothing left running, the merged report written.
    assert driver.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr
    assert f"report: {out / 'report.json'}" in stdout
    assert wait_for(lambda: not _node_hunts(), timeout=30), _node_hunts()
    assert not served.startswith("ok 0"), served  # requests went through during the hunt
    report = json.loads((out / "report.json").read_text())
    pf, dc = _node(report, PF[0]), _node(report, DC[0])
    assert pf["status"] == "ok" and dc["status"] == "ok", (_why(out), stderr[-3000:])
    assert report["stop_reason"].startswith("interrupted (Ctrl-C); cluster: 2 node(s) ok, 0 failed"), (
        report["stop_reason"], _why(out))
    for n in (pf, dc):
        node_meta = json.loads((out / n["session"] / "meta.json").read_text())
        assert node_meta["complete"] and node_meta["stop_reason"] == "interrupted (Ctrl-C)", node_meta["stop_reason"]
        # The node ran the installed package, not the checkout.
        path = Path(n["leaktrace"]["path"])
        assert path.is_relative_to(pd_cluster.venv_bin.parent / "lib"), n["leaktrace"]
        assert not path.is_relative_to(REPO / "leaktrace"), n["leaktrace"]
    assert json.loads((out / "cluster.json").read_text())["address"] == "auto"

    # Each node's instance and its role, side by side in the merged report.
    assert [i["hostname"] for i in report["roles"].get("prefill", [])] == [PF[0]], report["roles"]
    assert [i["hostname"] for i in report["roles"].get("decode", [])] == [DC[0]], report["roles"]
    by_node = {(i["hostname"], i["role"]) for i in report["instances"]}
    assert by_node == {(PF[0], "prefill"), (DC[0], "decode")}, report["instances"]

    # The decode node's culprit: its worker, with the library (eBPF ledger, PID-namespace aware).
    assert report["verdict"] == "leak" and dc["verdict"] == "leak", _why(out)
    top = dc["culprits"][0]
    assert top["hostname"] == DC[0] and top["process_label"] == "worker", top
    assert top["process_title"].startswith("VLLM::Worker"), top
    decode_instance = next(i for i in report["instances"] if i["hostname"] == DC[0])
    assert top["instance"] == decode_instance["instance"], (top, decode_instance)
    assert top["mb_per_min"] > 5, top
    if is_root():
        # The library comes from the node's eBPF ledger across its PID namespace: as the ledger's own culprit,
        # or joined by address to /proc's growth when the two rate the window differently ("watcher+ledger";
        # which of the two ranks first is the analysis's business: tests/test_coverage.py).
        culprits = [(c["source"], c["library"], c["mb_per_min"], c["evidence"]) for c in dc["culprits"]]
        assert top["library"] == "libinvq_leak.so" and top["source"] in ("ledger", "watcher+ledger"), culprits
    assert report["culprits"][0]["hostname"] == DC[0]

    # The prefill node is clean: nothing comparable there.
    assert not [c for c in pf["culprits"] if c["mb_per_min"] > 5], pf["culprits"]
    md = (out / "report.md").read_text()
    assert f"| prefill | {PF[0]} |" in md and f"| decode | {DC[0]} |" in md
