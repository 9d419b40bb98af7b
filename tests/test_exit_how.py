"""How a target ended, and nothing lost when it does: exited with its status, killed by a signal, OOM-killed
by the kernel (in a memory cgroup this test creates) — the report says which, keeps what the target held at
its exit (checked against the fixture's own bookkeeping) and names the library that leaked it. A target
that lives only seconds after attach still gets its events, its ledger and a verdict; one that dies while
the eBPF program compiles is reported as such.

The fixture (tests/fixtures/shapes.c, ``mremap`` shape: a buffer grown with mremap that moves, plus guard
pages, all from the stripped vendor library libshape.so) waits for SIGUSR1, sent once the hunt's probes are
live, so every byte it holds was mapped under the probe's eyes: the ledger at exit must match its truth."""

from __future__ import annotations

import os
import signal
import time

import pytest
from conftest import is_root
from exit_helpers import BackgroundHunt, MemoryCgroup
from shapes_helpers import Truth, shape_argv

from leaktrace.session import SessionReader

pytestmark = [pytest.mark.bpf, pytest.mark.skipif(not is_root(), reason="BPF needs root")]


def _start(spawn, shapes_bin, tmp_path, kib_per_s: int, *extra: str, cgroup: MemoryCgroup | None = None):
    truth = tmp_path / "truth"
    argv = shape_argv(shapes_bin, "mremap", kib_per_s, truth, "--start-on-usr1", "1", *extra)
    target = spawn(cgroup.wrap(argv) if cgroup else argv)
    hunt = BackgroundHunt(target.pid, tmp_path / "s", "--duration", "90")
    return target, hunt, truth


def _go(target, hunt) -> None:
    """Start the fixture's leak once every probe is live."""
    hunt.wait_attached()
    os.kill(target.pid, signal.SIGUSR1)


def _check_kept(rep: dict, pid: int, truth: Truth, how: str, **exit_fields) -> dict:
    """The report says how ``pid`` ended, keeps what it held then (±5% of the fixture's last truth) and names
    libshape.so for it."""
    (proc,) = [p for p in rep["processes"] if p["pid"] == pid]
    ex = proc["exit"]
    assert ex is not None and ex["how"] == how and ex["source"] == "ebpf", ex
    for k, v in exit_fields.items():
        assert ex[k] == v, ex
    (held,) = [e for e in rep["ledger"]["exits"] if e["pid"] == pid]
    assert held["exit"]["how"] == how
    assert held["outstanding_bytes"] == pytest.approx(truth.held, rel=0.05), (held, truth)
    assert rep["ledger"]["events"] > 0 and rep["ledger"]["lost_events"] == 0
    assert rep["verdict"] == "leak", rep["verdict_reason"]
    top = rep["culprits"][0]
    assert (top["pid"], top["library"], top["kind"]) == (pid, "libshape.so", "native-mmap"), top
    assert top["outstanding_bytes"] == held["outstanding_bytes"]
    assert any(f.startswith("libshape.so") for f in top["stack"]), top["stack"]  # its call stack, kept at exit
    return ex


def test_normal_exit_says_status_and_keeps_the_ledger(spawn, shapes_bin, tmp_path):
    target, hunt, truth_path = _start(spawn, shapes_bin, tmp_path, 2048, "--exit-after", "12")
    try:
        _go(target, hunt)
        rep = hunt.finish()
    finally:
        hunt.kill()
    truth = Truth.read(truth_path)
    _check_kept(rep, target.pid, truth, "exited", status=0, signal=None)
    assert rep["stop_reason"] == "all targets exited"
    top = rep["culprits"][0]
    assert top["mb_per_min"] == pytest.approx(2048 * 60 / 1024, rel=0.15)  # the rate asked: 120 MB/min
    md = (tmp_path / "s" / "report.md").read_text()
    assert f"pid {target.pid} (shapes): exited with status 0" in md
    assert "exited with status 0" in (tmp_path / "s" / "report.html").read_text()
    # The session has it too, where the probe wrote it.
    lx = SessionReader(tmp_path / "s").table("ledger_exits")
    assert list(lx["exit_code"]) == [0] and not bool(lx["oom"].iloc[0])


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV])
def test_killed_by_a_signal(spawn, shapes_bin, tmp_path, sig):
    target, hunt, truth_path = _start(spawn, shapes_bin, tmp_path, 2048)
    try:
        _go(target, hunt)
        time.sleep(9)
        os.kill(target.pid, sig)
        rep = hunt.finish()
    finally:
        hunt.kill()
    ex = _check_kept(rep, target.pid, Truth.read(truth_path), "signal", signal=sig.name, status=None)
    assert f"killed by {sig.name}" in (tmp_path / "s" / "report.md").read_text(), ex


def test_oom_killed_in_a_memory_cgroup(spawn, shapes_bin, tmp_path):
    limit = 64 * 1024 * 1024
    cg = MemoryCgroup(limit)
    try:
        target, hunt, truth_path = _start(spawn, shapes_bin, tmp_path, 6144, cgroup=cg)
        try:
            _go(target, hunt)
            rep = hunt.finish()
        finally:
            hunt.kill()
            target.kill()
        assert cg.oom_kills() >= 1  # the kernel's OOM killer did it, not the test
    finally:
        cg.close()
    truth = Truth.read(truth_path)
    assert truth.held > limit // 2  # it leaked into its limit
    ex = _check_kept(rep, target.pid, truth, "oom-killed", signal="SIGKILL")
    assert "OOM-killed (SIGKILL)" in (tmp_path / "s" / "report.md").read_text(), ex


def test_short_lived_target_gets_events_ledger_and_verdict(spawn, shapes_bin, tmp_path):
    """Exits ~6 s after attach: shorter than a steady-growth verdict normally needs (min_span_s)."""
    target, hunt, truth_path = _start(spawn, shapes_bin, tmp_path, 2048, "--exit-after", "6")
    try:
        attach = hunt.wait_attached()
        os.kill(target.pid, signal.SIGUSR1)
        rep = hunt.finish()
    finally:
        hunt.kill()
    truth = Truth.read(truth_path)
    ex = _check_kept(rep, target.pid, truth, "exited", status=0)
    assert ex["t"] - attach < rep["thresholds"]["min_span_s"]
    top = rep["culprits"][0]
    assert top["mb_per_min"] == pytest.approx(2048 * 60 / 1024, rel=0.25)
    assert any("short-lived" in e for e in top["evidence"]), top["evidence"]


def test_target_gone_before_the_probe_was_live_is_said_plainly(spawn, shapes_bin, tmp_path):
    """Killed while the eBPF program compiles: no ledger can exist; the report says why, and how it ended."""
    target, hunt, _ = _start(spawn, shapes_bin, tmp_path, 2048)
    try:
        hunt.wait_line(f"watching pid {target.pid}")  # the watcher is live; the BPF program compiles next
        os.kill(target.pid, signal.SIGKILL)
        rep = hunt.finish()
    finally:
        hunt.kill()
    (proc,) = [p for p in rep["processes"] if p["pid"] == target.pid]
    ex = proc["exit"]
    assert ex["before_ebpf"] and "before the eBPF probe was live" in ex["note"], ex
    # Still a zombie of this test when the probe went live: /proc gave its wait status.
    assert (ex["how"], ex["signal"], ex["source"]) == ("signal", "SIGKILL", "proc"), ex
    assert "before the eBPF probe was live" in rep["verdict_reason"]
    assert rep["verdict"] != "leak" and rep["ledger"]["events"] == 0
    assert any("before the eBPF probe was live" in w for w in rep["warnings"])


def test_watcher_only_reads_a_zombies_status_and_judges_a_short_life(spawn, shapes_bin, tmp_path):
    """--no-bpf: how it ended comes from /proc while the target is still an unreaped zombie (this test is
    its parent), and a target that lived ~6 s after attach still gets a verdict from the watcher's samples."""
    truth = tmp_path / "truth"
    target = spawn(shape_argv(shapes_bin, "mremap", 8192, truth, "--start-on-usr1", "1", "--exit-after", "6"))
    hunt = BackgroundHunt(target.pid, tmp_path / "s", "--duration", "60", "--no-bpf")
    try:
        _go(target, hunt)
        rep = hunt.finish()
    finally:
        hunt.kill()
    (proc,) = [p for p in rep["processes"] if p["pid"] == target.pid]
    assert proc["exit"]["how"] == "exited" and proc["exit"]["status"] == 0 and proc["exit"]["source"] == "proc"
    assert rep["ledger"]["available"] is False
    assert rep["verdict"] == "leak", rep["verdict_reason"]
    top = rep["culprits"][0]
    assert top["pid"] == target.pid and top["source"] == "watcher" and top["kind"] == "native-mmap", top
    assert any(e.startswith("short-lived") for e in top["evidence"]), top["evidence"]
    assert "lower confidence" in rep["verdict_reason"]
    assert "exited with status 0" in (tmp_path / "s" / "report.md").read_text()
