"""Cluster hunt on a real three-node Ray cluster (head + two workers) sealed in a private network namespace.

One cluster for the module (tests/cluster_helpers.py): nodes lt-head (127.0.0.2), lt-b (.3), lt-c (.4),
each in its own PID namespace so a task on one node sees only that node's processes. Fixtures: a leaker
on lt-b (2 MiB/s) and one on lt-head (1 MiB/s), a churning non-leaker on lt-c. Every Ray process, fixture
and the driver (`leaktrace cluster hunt`) run inside the network namespace; nothing talks to any
address outside it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_helpers import NodeFixture, _missing, _node, _node_hunts, _why, cluster_cli
from conftest import REPO, run_cli

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

HUNT_S = 20
LEAK_B_KIB_S = 2048  # 120 MB/min
LEAK_HEAD_KIB_S = 1024  # 60 MB/min


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator:
    why = _missing()
    if why:
        pytest.skip(why)
    from cluster_helpers import RayNamespaceCluster
    from fixtures.build import build

    leaker = build("leaker", ["leaker.c"])
    cluster = RayNamespaceCluster.start([("lt-head", "127.0.0.2"), ("lt-b", "127.0.0.3"), ("lt-c", "127.0.0.4")],
                                        timeout=120)
    fixtures: list[NodeFixture] = []
    try:
        cluster.fixtures = {
            "lt-b": NodeFixture(cluster.node("lt-b"), [leaker, "--leak-kib-per-s", LEAK_B_KIB_S, "--chunk-kib", 64]),
            "lt-head": NodeFixture(cluster.node("lt-head"),
                                   [leaker, "--leak-kib-per-s", LEAK_HEAD_KIB_S, "--chunk-kib", 64]),
            "lt-c": NodeFixture(cluster.node("lt-c"), [leaker, "--churn-per-s", 50, "--chunk-kib", 64]),
        }
        fixtures = list(cluster.fixtures.values())
        print(f"cluster up in {cluster.up_s:.1f}s", file=sys.stderr)
        yield cluster
    finally:
        for f in fixtures:
            f.kill()
        cluster.stop()
        print(f"cluster down in {cluster.down_s:.1f}s", file=sys.stderr)


def test_network_namespace_has_only_loopback(ray_cluster) -> None:
    assert ray_cluster.netns.interfaces() == ["lo"]
    ids = {n.node_id for n in ray_cluster.nodes}
    assert len(ids) == 3 and all(ids)


def test_match_names_leaking_node_and_clean_node(ray_cluster, tmp_path: Path) -> None:
    out = tmp_path / "hunt"
    r = cluster_cli(ray_cluster, "hunt", "--address", ray_cluster.address, "--match", r"leaker --",
                    "--nodes", "lt-b,lt-c", "--duration", HUNT_S, "--no-gdb", "--out", out)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["schema"] == "leaktrace.report/1"
    assert report["verdict"] == "leak", _why(out)
    assert {n["hostname"] for n in report["nodes"]} == {"lt-b", "lt-c"}

    b, c = _node(report, "lt-b"), _node(report, "lt-c")
    leaker_b = ray_cluster.fixtures["lt-b"].pid
    assert b["status"] == "ok" and b["verdict"] == "leak", _why(out)
    assert b["node_id"] == ray_cluster.node("lt-b").node_id
    top = b["culprits"][0]
    assert top["pid"] == leaker_b and top["process_label"] == "other" and top["process_title"] == "leaker"
    # 2 MiB/s = 120 MiB/min (the report's MB are MiB); the watcher's slope is within 15% of it.
    assert top["mb_per_min"] == pytest.approx(LEAK_B_KIB_S * 60 / 1024, rel=0.15)
    # Library attribution comes from the eBPF ledger (root, PID-namespace-aware tracing: this module runs
    # as root): it saw the leaker's mmaps, and the culprit names the binary that called syscall().
    b_ledger = json.loads((out / b["session"] / "report.json").read_text())["ledger"]
    assert b_ledger["available"] and b_ledger["events"] > 0 and b_ledger["lost_events"] == 0, b_ledger
    assert top["library"] == "leaker" and top["source"] == "ledger", (b_ledger, top)
    assert c["status"] == "ok" and c["verdict"] == "no-leak" and c["culprits"] == [], _why(out)
    assert c["targets"] and c["targets"][0]["pid"] == ray_cluster.fixtures["lt-c"].pid

    # The merged view: culprits and processes say which node they are from.
    assert report["culprits"][0]["hostname"] == "lt-b"
    assert {(p["hostname"], p["pid"]) for p in report["processes"]} >= {
        ("lt-b", leaker_b), ("lt-c", ray_cluster.fixtures["lt-c"].pid)}
    md = (out / "report.md").read_text()
    assert "| lt-b | 127.0.0.3 |" in md and "| lt-c | 127.0.0.4 |" in md

    # Each node's session came back whole: `leaktrace report` re-renders it on its own.
    node_dir = out / b["session"]
    rr = run_cli("report", node_dir, "--format", "json")
    assert rr.returncode == 0, rr.stderr
    assert json.loads((node_dir / "report.json").read_text())["verdict"] == "leak"

    # `cluster report` re-renders the merged report from the node sessions, without Ray or the cluster.
    (out / "report.json").unlink()
    rr = run_cli("cluster", "report", out)
    assert rr.returncode == 0, rr.stderr
    again = json.loads((out / "report.json").read_text())
    assert again["verdict"] == "leak"
    assert [(n["hostname"], n["status"], n["verdict"]) for n in again["nodes"]] == [
        (n["hostname"], n["status"], n["verdict"]) for n in report["nodes"]]


def test_failed_node_is_reported_and_others_complete(ray_cluster, tmp_path: Path) -> None:
    # A PID that existed on lt-c and is gone by the time the hunt starts there. lt-c is named by the
    # custom resource it was started with, lt-b by hostname, the head by IP.
    gone = subprocess.run([*ray_cluster.node("lt-c").enter(), "sh", "-c", "echo $$"], capture_output=True,
                          text=True, timeout=10, check=True)
    gone_pid = int(gone.stdout.strip())
    head_pid, b_pid = ray_cluster.fixtures["lt-head"].pid, ray_cluster.fixtures["lt-b"].pid
    out, shared = tmp_path / "hunt", tmp_path / "shared"
    # This time the node sessions go to a directory every node can write (as an NFS or hostPath volume
    # would be), not through the object store.
    r = cluster_cli(ray_cluster, "hunt", "--address", ray_cluster.address, "--pid", f"127.0.0.2={head_pid}",
                    "--pid", f"lt-b={b_pid}", "--pid", f"lt_lt-c={gone_pid}", "--duration", HUNT_S, "--no-gdb",
                    "--shared-dir", shared, "--out", out)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    c = _node(report, "lt-c")
    assert c["status"] == "failed"
    assert "no such process" in c["reason"] and str(gone_pid) in c["reason"], c
    assert c["verdict"] is None and c["culprits"] == []
    for host, pid in (("lt-head", head_pid), ("lt-b", b_pid)):
        n = _node(report, host)
        assert n["status"] == "ok" and n["verdict"] == "leak", n
        assert n["culprits"][0]["pid"] == pid
    assert report["verdict"] == "leak"
    run_dir = shared / f"leaktrace-{json.loads((out / 'cluster.json').read_text())['run_id']}"
    assert sorted(Path(n["session"]).parent for n in report["nodes"] if n["session"]) == [run_dir, run_dir]
    assert not any((out / "nodes").iterdir())
    # The same leak in the same kind of process on two nodes is one recurring culprit.
    rec = report["recurring_culprits"]
    assert rec and rec[0]["nodes"] == ["lt-b", "lt-head"] and rec[0]["kind"] == "native-mmap", rec
    assert "lt-c" in (out / "report.md").read_text().split("## Failed nodes")[1]
    assert "lt-c (127.0.0.4): failed: no such process" in r.stdout


def test_unreachable_address_is_one_line_error(ray_cluster) -> None:
    r = cluster_cli(ray_cluster, "hunt", "--address", "127.0.0.2:1", "--match", "x", "--duration", 5,
                    timeout=60)
    assert r.returncode == 10, r.stderr
    assert r.stderr.count("\n") == 1 and "no Ray head answers at 127.0.0.2:1" in r.stderr


def test_node_without_vllm_is_reported_without_targets(ray_cluster, tmp_path: Path) -> None:
    out = tmp_path / "hunt"
    r = cluster_cli(ray_cluster, "hunt", "--address", ray_cluster.address, "--vllm", "--nodes", "lt-c",
                    "--duration", 5, "--out", out, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    (c,) = report["nodes"]
    assert c["hostname"] == "lt-c" and c["status"] == "ok" and c["no_targets"] and c["verdict"] is None, c
    assert c["reason"] == "no vLLM server on this node"
    assert report["verdict"] == "inconclusive" and report["culprits"] == []


def test_ctrl_c_of_driver_stops_every_node_and_keeps_their_sessions(ray_cluster, tmp_path: Path) -> None:
    """Ctrl-C of the driver, started with SIGINT ignored as a background job of a script is: the driver still
    stops every node's hunt and writes the merged report."""
    from conftest import wait_for

    out = tmp_path / "hunt"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    driver = subprocess.Popen([*ray_cluster.netns.enter(), sys.executable, "-m", "leaktrace", "cluster", "hunt",
                               "--address", ray_cluster.address, "--match", r"leaker --", "--nodes", "lt-b,lt-c",
                               "--duration", "600", "--no-gdb", "--out", str(out)],
                              cwd=str(REPO), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        # Handshake: both node hunts run and have flushed watcher rows (not a sleep).
        def both_recording() -> bool:
            outs = list(_node_hunts().values())
            return len(outs) == 2 and all(any((o / "tables" / "rollup").glob("part-*")) for o in outs)

        assert wait_for(both_recording, timeout=120), (_node_hunts(), driver.poll())
        driver.send_signal(signal.SIGINT)
        stdout, stderr = driver.communicate(timeout=240)  # the driver's Ctrl-C grace is 180 s
    finally:
        driver.kill()
    # The same exit status as a `hunt` stopped by Ctrl-C, and the merged report is written.
    assert driver.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr
    report = json.loads((out / "report.json").read_text())
    assert report["stop_reason"].startswith("interrupted (Ctrl-C); cluster: 2 node(s) ok, 0 failed"), (
        report["stop_reason"], _why(out), stderr[-2000:])
    assert json.loads((out / "cluster.json").read_text())["stop_reason"] == "interrupted (Ctrl-C)"
    for host in ("lt-b", "lt-c"):
        n = _node(report, host)
        assert n["status"] == "ok" and n["session"], _why(out)
        node_meta = json.loads((out / n["session"] / "meta.json").read_text())
        assert node_meta["complete"] and node_meta["stop_reason"] == "interrupted (Ctrl-C)", node_meta["stop_reason"]
        assert node_meta["duration_s"] < 300
    assert {p["pid"] for p in report["processes"] if p["hostname"] == "lt-b"} == {ray_cluster.fixtures["lt-b"].pid}
    assert wait_for(lambda: not _node_hunts(), timeout=30), _node_hunts()  # no hunt left behind
    assert f"report: {out / 'report.json'}" in stdout


def test_address_auto_on_the_head(ray_cluster, tmp_path: Path) -> None:
    """`--address auto` as a user types it on the head node: Ray finds the cluster running there."""
    out = tmp_path / "hunt"
    head = ray_cluster.node("lt-head")
    r = ray_cluster.run_in_netns([*head.enter(), sys.executable, "-m", "leaktrace", "cluster", "hunt",
                                  "--address", "auto", "--match", r"leaker --", "--nodes", "lt-head",
                                  "--duration", "8", "--no-gdb", "--out", str(out)], timeout=240, cwd=str(REPO))
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    (n,) = report["nodes"]
    assert n["hostname"] == "lt-head" and n["status"] == "ok", _why(out)
    assert n["targets"][0]["pid"] == ray_cluster.fixtures["lt-head"].pid
    assert json.loads((out / "cluster.json").read_text())["address"] == "auto"
