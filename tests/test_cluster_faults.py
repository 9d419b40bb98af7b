"""Cluster hunts that meet faults, on a real Ray cluster of their own (tests/cluster_helpers.py) whose nodes
and driver run leaktrace **installed from its wheel**, as a fleet would (no repository on any sys.path; the
driver runs outside the checkout): lt-head (127.0.0.2), lt-nobpf (.5: its Ray processes run without
CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN, as in an unprivileged container: no eBPF there), lt-doomed (.6: its
raylet is killed in the middle of a hunt; the last test here). A leaker (1 MiB/s) runs on every node.
Everything stays inside a private network namespace. Each case: the merged report says which node and
why, and the other nodes' data is kept."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_helpers import NodeFixture, _lock_holders, _missing, _node, _node_hunts, _why
from conftest import REPO, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
HUNT_S = 20
KILL_HUNT_S = 60
LEAK_KIB_S = 1024  # 60 MiB/min
NO_BPF = ["setpriv", "--bounding-set", "-bpf,-perfmon,-sys_admin", "--inh-caps", "-bpf,-perfmon,-sys_admin", "--"]


@pytest.fixture(scope="module")
def faults_cluster(tmp_path_factory) -> Iterator:
    why = _missing()
    if why:
        pytest.skip(why)
    from cluster_helpers import RayNamespaceCluster, wheel_venv
    from fixtures.build import build

    leaker = build("leaker", ["leaker.c"])
    venv_bin = wheel_venv(tmp_path_factory.mktemp("wheel"))
    cluster = RayNamespaceCluster.start([("lt-head", "127.0.0.2"), ("lt-nobpf", "127.0.0.5"),
                                         ("lt-doomed", "127.0.0.6")], timeout=120, wrappers={"lt-nobpf": NO_BPF},
                                        venv_bin=venv_bin)
    fixtures: list[NodeFixture] = []
    try:
        cluster.fixtures = {name: NodeFixture(cluster.node(name), [leaker, "--leak-kib-per-s", LEAK_KIB_S,
                                                                     "--chunk-kib", 64])
                            for name in ("lt-head", "lt-nobpf", "lt-doomed")}
        fixtures = list(cluster.fixtures.values())
        yield cluster
    finally:
        for f in fixtures:
            f.kill()
        cluster.stop()


def _state(node, pid: int) -> str:
    """The process state letter of ``pid`` on ``node`` (its PID namespace), '' when it is gone."""
    r = subprocess.run([*node.enter(), "cat", f"/proc/{pid}/stat"], capture_output=True, text=True, timeout=30)
    return r.stdout.rsplit(")", 1)[1].split()[0] if r.returncode == 0 and ")" in r.stdout else ""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, "RAY_USAGE_STATS_ENABLED": "0"}


def _driver(cluster, out: Path, nodes: str, duration: int, *extra: str) -> subprocess.Popen:
    """`leaktrace cluster hunt` as a user on the head runs it: the installed command, outside the checkout."""
    return subprocess.Popen([*cluster.netns.enter(), str(cluster.venv_bin / "leaktrace"), "cluster", "hunt",
                             "--address", cluster.address, "--match", r"leaker --", "--nodes", nodes,
                             "--duration", str(duration), "--out", str(out), *extra],
                            cwd=str(out.parent), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _recording(n: int) -> bool:
    """``n`` node hunts run and have flushed watcher rows (a handshake, not a sleep)."""
    outs = list(_node_hunts().values())
    return len(outs) == n and all(any((o / "tables" / "rollup").glob("part-*")) for o in outs)


def _await_recording(driver: subprocess.Popen, n: int) -> None:
    """The handshake, failing with what the driver printed: a driver that ended before ``n`` node hunts ran
    together says why (a node that failed to start, or one started after the other had finished)."""
    if wait_for(lambda: _recording(n), timeout=120):
        return
    if driver.poll() is None:
        os.killpg(driver.pid, signal.SIGKILL)
    stdout, stderr = driver.communicate(timeout=60)
    pytest.fail(f"{n} node hunts never recorded together (now: {_node_hunts()}); driver exit {driver.returncode}\n"
                f"stdout: {stdout[-2000:]}\nstderr: {stderr[-2000:]}")


def test_node_without_bpf_hunts_with_proc_only_and_says_so(faults_cluster, tmp_path: Path) -> None:
    out = tmp_path / "hunt"
    driver = _driver(faults_cluster, out, "lt-head,lt-nobpf", HUNT_S, "--no-gdb")
    stdout, stderr = driver.communicate(timeout=HUNT_S + 240)
    assert driver.returncode == 0, stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    head, nobpf = _node(report, "lt-head"), _node(report, "lt-nobpf")
    # Every node ran the installed package, not the checkout.
    site = faults_cluster.venv_bin.parent / "lib"
    for n in (head, nobpf):
        path = Path(n["leaktrace"]["path"])
        assert path.is_relative_to(site) and not path.is_relative_to(REPO / "leaktrace"), n["leaktrace"]
    # The node without eBPF is hunted from /proc: its leak is found (rate from the watcher), and the report
    # says why it has no library.
    assert nobpf["status"] == "ok" and nobpf["verdict"] == "leak", _why(out)
    assert any("no eBPF on this node" in note and "--no-bpf" in note for note in nobpf["notes"]), nobpf
    top = nobpf["culprits"][0]
    assert top["pid"] == faults_cluster.fixtures["lt-nobpf"].pid and top["source"] == "watcher", top
    assert top["mb_per_min"] == pytest.approx(LEAK_KIB_S * 60 / 1024, rel=0.15)
    node_report = json.loads((out / nobpf["session"] / "report.json").read_text())
    assert not node_report["ledger"]["available"]
    assert any(w.startswith("lt-nobpf: no eBPF on this node") for w in report["warnings"]), report["warnings"]
    assert "no eBPF on this node" in stdout  # the driver's summary line for that node
    # The node with eBPF is untouched by its neighbour's fallback: the ledger names the leaking binary.
    assert head["status"] == "ok" and head["verdict"] == "leak" and head["notes"] == [], _why(out)
    assert head["culprits"][0]["library"] == "leaker" and head["culprits"][0]["source"] == "ledger"


def test_driver_killed_leaves_no_hunt_no_stopped_target(faults_cluster, tmp_path: Path) -> None:
    """SIGKILL of the driver (no chance to stop anything): Ray ends the job's tasks, each node's hunt gets
    SIGTERM from its dying task (PR_SET_PDEATHSIG) and stops cleanly — gdb detached, probe unloaded."""
    driver = _driver(faults_cluster, tmp_path / "hunt", "lt-head,lt-doomed", 600)
    try:
        _await_recording(driver, 2)
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(timeout=30)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    # ... and have let go of their targets (the next test hunts the same ones: once it found lt-doomed's
    # target still locked by a hunt whose command line already read empty)
    assert wait_for(lambda: not _node_hunts() and not _lock_holders(), timeout=90), (_node_hunts(), _lock_holders())
    for name in ("lt-head", "lt-doomed"):
        node, pid = faults_cluster.node(name), faults_cluster.fixtures[name].pid
        assert _state(node, pid) in ("R", "S", "D"), f"{name}: leaker state {_state(node, pid)!r}"
        # a zombie holds nothing (its ptrace ended with it): the node's PID 1, `ray start --block`, reaps no
        # orphan, and a gdb whose hunt Ray's worker took down with it stays one
        gdbs = subprocess.run([*node.enter(), "pgrep", "-x", "--runstates", "RSDt", "gdb"], capture_output=True,
                              text=True)
        assert gdbs.stdout.strip() == "", f"{name}: gdb left running: {gdbs.stdout}\n{_gdb_processes(node)}"


def _gdb_processes(node) -> str:
    """State (Z: a zombie no one reaped; t: tracing), parent, age and command of each gdb on the node."""
    ps = subprocess.run([*node.enter(), "ps", "-eo", "pid,ppid,stat,etimes,args"], capture_output=True, text=True)
    return "\n".join(line for line in ps.stdout.splitlines() if "gdb" in line or "PID" in line)


def test_node_killed_midhunt_is_reported_and_others_kept(faults_cluster, tmp_path: Path) -> None:
    """The raylet of lt-doomed is killed while both nodes hunt (its node dies with it): the merged report
    names lt-doomed as failed with the reason, and lt-head's whole hunt is kept. Destroys lt-doomed: last."""
    out = tmp_path / "hunt"
    # Longer than the other cases: the kill needs both node hunts running at once. With a 20 s hunt the
    # driver can end (exit 0) before the handshake sees both recording: a node whose Ray workers the
    # previous case's killed driver took down may start its task late, so the overlap gets room.
    driver = _driver(faults_cluster, out, "lt-head,lt-doomed", KILL_HUNT_S)
    try:
        _await_recording(driver, 2)
        doomed = faults_cluster.node("lt-doomed")
        r = subprocess.run([*doomed.enter(), "pkill", "-KILL", "-x", "raylet"], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        t_kill = time.monotonic()
        stdout, stderr = driver.communicate(timeout=KILL_HUNT_S + 180)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    assert driver.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr
    report = json.loads((out / "report.json").read_text())
    head, dead = _node(report, "lt-head"), _node(report, "lt-doomed")
    assert dead["status"] == "failed" and dead["verdict"] is None, _why(out)
    assert "died" in dead["reason"] or "crashed" in dead["reason"], dead["reason"]
    assert head["status"] == "ok" and head["verdict"] == "leak", _why(out)
    assert head["culprits"][0]["pid"] == faults_cluster.fixtures["lt-head"].pid
    assert report["verdict"] == "leak"
    assert "1 node(s) ok, 1 failed" in report["stop_reason"]
    assert time.monotonic() - t_kill < KILL_HUNT_S + 120  # the driver did not wait out a long timeout
    md = (out / "report.md").read_text()
    assert "## Failed nodes" in md and "lt-doomed" in md
