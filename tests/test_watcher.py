"""The watcher on real processes: measured rates vs the fixture's known rate, moved regions, children
born after attach, targets exiting mid-hunt."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import pytest
from conftest import run_cli, wait_for

from leaktrace.analysis.growth import rate
from leaktrace.hunt import run_hunt
from leaktrace.probes import HuntOptions
from leaktrace.probes.watcher import Region, diff_regions
from leaktrace.session import SessionReader

MB = 1 << 20
WATCHER_ONLY = dict(bpf=False, gdb=False)


def test_leak_rate_matches_fixture(tmp_path, spawn, leaker_bin):
    # 2 MiB/s in 64 KiB raw mmaps, every page touched: 120 MB/min of RSS and anonymous memory.
    p = spawn([leaker_bin, "--leak-kib-per-s", "2048", "--chunk-kib", "64"])
    res = run_hunt([p.pid], HuntOptions(duration=10, interval=0.5, smaps_every=4, **WATCHER_ONLY), tmp_path / "s")
    rep = res.report
    assert rep["verdict"] == "leak"
    proc = next(x for x in rep["processes"] if x["pid"] == p.pid)
    for key in ("rss_mb_per_min", "anon_mb_per_min", "uss_mb_per_min"):
        assert proc[key] == pytest.approx(120.0, rel=0.10), key
    assert rep["growth_by_class"]["anon"] == pytest.approx(120.0, rel=0.15)
    assert rep["culprits"] and rep["culprits"][0]["pid"] == p.pid
    on_disk = json.loads((tmp_path / "s" / "report.json").read_text())
    assert on_disk["schema"] == "leaktrace.report/1" and on_disk["verdict"] == "leak"


def test_churn_without_leak_is_no_leak(tmp_path, spawn, leaker_bin):
    p = spawn([leaker_bin, "--churn-per-s", "500", "--chunk-kib", "256"])
    res = run_hunt([p.pid], HuntOptions(duration=16, interval=0.5, smaps_every=4, **WATCHER_ONLY), tmp_path / "s")
    assert res.report["verdict"] == "no-leak"
    assert res.report["culprits"] == []
    proc = res.report["processes"][0]
    assert abs(proc["rss_mb_per_min"]) < 1.0


def test_mremap_region_moves_and_grows(tmp_path, spawn, leaker_bin):
    # 1 MiB added per second by mremap(MAYMOVE); a guard page after each growth forces a move.
    p = spawn([leaker_bin, "--mremap-kib-per-s", "1024"])
    run_hunt([p.pid], HuntOptions(duration=8, interval=0.5, smaps_every=2, **WATCHER_ONLY), tmp_path / "s",
             write_reports=False)
    ev = SessionReader(tmp_path / "s").table("region_events")
    moved = ev[(ev["event"] == "moved") & (ev["pid"] == p.pid)]
    assert len(moved) >= 2
    assert (moved["size"] > moved["old_size"]).all()
    assert (moved["start"] != moved["old_start"]).all()


def test_child_born_after_start_is_picked_up(tmp_path, spawn, leaker_bin):
    p = spawn([leaker_bin, "--leak-kib-per-s", "1024", "--fork-on-usr1", "1"])
    forked_at: list[float] = []

    def on_tick(ctx, now: float) -> None:  # the fork is asked for at the 4th tick, well after attach
        if len(forked_at) == 0 and now >= 1.5:
            forked_at.append(now)
            os.kill(p.pid, signal.SIGUSR1)

    res = run_hunt([p.pid], HuntOptions(duration=12, interval=0.5, smaps_every=4, **WATCHER_ONLY), tmp_path / "s",
                   on_tick=on_tick)
    r = SessionReader(tmp_path / "s")
    procs = r.table("processes")
    seen = procs[procs["event"] == "seen"]
    children = seen[seen["ppid"] == p.pid]
    assert len(children) == 1
    child = int(children["pid"].iloc[0])
    assert forked_at and children["t"].iloc[0] > forked_at[0]  # born after attach, picked up at a later tick
    roll = r.table("rollup")
    c = roll[roll["pid"] == child]
    assert rate(c["t"], c["rss"], warmup_s=0).mb_per_min == pytest.approx(60.0, rel=0.15)
    assert {x["pid"] for x in res.report["processes"]} == {p.pid, child}


def test_target_exits_mid_hunt(tmp_path, spawn, leaker_bin):
    p = spawn([leaker_bin, "--leak-kib-per-s", "512"])
    told: list[float] = []

    def on_tick(ctx, now: float) -> None:  # the target is told to exit (SIGTERM: it returns 0) at a tick
        if not told and now >= 3.0:
            told.append(now)
            os.kill(p.pid, signal.SIGTERM)

    res = run_hunt([p.pid], HuntOptions(duration=30, interval=0.5, **WATCHER_ONLY), tmp_path / "s", on_tick=on_tick)
    assert res.stop_reason == "all targets exited"
    assert p.popen.wait(timeout=10) == 0
    proc = res.report["processes"][0]
    # Seen gone within a tick or two of the exit, and the hunt stopped there (not at its 30 s deadline).
    assert told and proc["exited_s"] is not None and told[0] <= proc["exited_s"] <= told[0] + 2.0, (proc, told)
    assert res.duration_s < told[0] + 5.0
    r = SessionReader(tmp_path / "s")
    assert r.complete
    assert set(r.table("regions")["snapshot"]) == {"first", "last"}


def test_sigterm_stops_cleanly_and_writes_report(tmp_path, spawn, leaker_bin):
    import subprocess
    import sys

    p = spawn([leaker_bin, "--leak-kib-per-s", "256"])
    out = tmp_path / "s"
    h = subprocess.Popen([sys.executable, "-m", "leaktrace", "hunt", "--pid", str(p.pid), "--duration", "600",
                          "--no-bpf", "--no-gdb", "--out", str(out), "--interval", "0.5"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert wait_for(lambda: (out / "tables" / "rollup").is_dir(), timeout=30)
    h.send_signal(signal.SIGTERM)
    so, se = h.communicate(timeout=60)
    assert h.returncode == 0, se
    rep = json.loads((out / "report.json").read_text())
    assert rep["stop_reason"] == "SIGTERM"
    assert "verdict:" in so


def test_diff_regions_pure():
    a = Region(0x1000, 0x3000, "rw-p", "", "anon", 0x2000, 0x2000)
    grown_down = Region(0x0000, 0x3000, "rw-p", "", "anon", 0x3000, 0x3000)  # VMA extended downwards
    ev = diff_regions([a], [grown_down])
    assert [e["event"] for e in ev] == ["grown"]
    moved = Region(0x9000, 0xC000, "rw-p", "", "anon", 0x3000, 0x3000)
    ev = diff_regions([a], [moved])
    assert [e["event"] for e in ev] == ["moved"] and ev[0]["old_start"] == 0x1000
    lib = Region(0x5000, 0x6000, "r-xp", "/lib/x.so", "lib", 0x1000, 0)
    ev = diff_regions([a, lib], [a])
    assert [e["event"] for e in ev] == ["gone"]


def test_cli_bad_input(tmp_path, spawn, leaker_bin):
    r = run_cli("hunt", "--pid", "999999999", "--duration", "2", "--no-bpf", "--no-gdb", "--out", tmp_path / "x")
    assert r.returncode == 3 and "no such process" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    p = spawn([leaker_bin])
    r = run_cli("hunt", "--pid", p.pid, "--duration", "2", "--no-bpf", "--no-gdb", "--out", "/proc/nope")
    assert r.returncode == 9 and "cannot write" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("report", tmp_path / "missing")
    assert r.returncode == 7 and "Traceback" not in r.stderr
    (tmp_path / "trunc").mkdir()
    (tmp_path / "trunc" / "meta.json").write_text('{"schema": "leak')
    r = run_cli("report", tmp_path / "trunc")
    assert r.returncode == 7 and "corrupt" in r.stderr
    r = run_cli("hunt", "--duration", "2")
    assert r.returncode == 2


def test_permission_denied_on_smaps(tmp_path, spawn, leaker_bin):
    """An unprivileged hunter on a root-owned target: one clear warning, the hunt finishes."""
    import shutil

    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root to start the hunter as nobody")
    import subprocess
    import sys
    import tempfile

    p = spawn([leaker_bin, "--leak-kib-per-s", "256"])
    base = Path(tempfile.mkdtemp(prefix="leaktrace-nobody-"))
    os.chmod(base, 0o777)
    out = base / "s"

    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m",
                        "leaktrace", "hunt", "--pid", str(p.pid), "--duration", "2", "--no-bpf", "--no-gdb",
                        "--out", str(out)], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "HOME": "/tmp", "MPLCONFIGDIR": "/tmp"})
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 4, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("leaktrace: error:")]
    assert len(errors) == 1 and "permission denied" in errors[0]
    # Nothing collected is lost: the session was finalized and says why it stopped.
    meta = json.loads((out / "meta.json").read_text())
    assert meta["complete"] and "permission denied" in meta["stop_reason"]
    shutil.rmtree(base, ignore_errors=True)


def test_stop_event_from_another_thread(tmp_path, spawn, leaker_bin):
    """An external stop (set from another thread, as the demo and the Ray task do) after the 4th tick
    ends the hunt at once: stop reason "stopped", the ticks so far (plus at most the final one) on disk."""
    p = spawn([leaker_bin, "--leak-kib-per-s", "256"])
    stop = threading.Event()
    ticks: list[float] = []

    def on_tick(ctx, now: float) -> None:
        ticks.append(now)
        if len(ticks) == 4:
            threading.Thread(target=stop.set).start()

    res = run_hunt([p.pid], HuntOptions(duration=60, interval=0.5, **WATCHER_ONLY), tmp_path / "s", stop=stop,
                   on_tick=on_tick)
    assert res.stop_reason == "stopped", res.stop_reason
    assert res.duration_s < 10
    r = SessionReader(tmp_path / "s")
    assert r.complete and r.meta["stop_reason"] == "stopped"
    roll = r.table("rollup")
    assert set(roll["pid"]) == {p.pid}
    # The stop is seen after the 4th tick (or, were its thread slow to run, the 5th); a stop seen while
    # waiting for the next tick records one last tick (on_tick is not called for it).
    assert len(ticks) in (4, 5) and len(roll) - len(ticks) in (0, 1), (len(roll), ticks)


def test_a_reused_rollup_moves_with_statm() -> None:
    from leaktrace.probes.watcher import carried_rollup

    read = {"Rss": 100 << 20, "Pss": 90 << 20, "Anonymous": 60 << 20, "Private_Dirty": 70 << 20, "Swap": 5}
    before = (500 << 20, 100 << 20, 40 << 20)  # mapped, resident, shared (anonymous 60 MiB)
    assert carried_rollup(read, before, before) is read
    # 3 MiB more resident, of which 1 MiB file pages: anonymous +2 MiB
    got = carried_rollup(read, before, (503 << 20, 103 << 20, 41 << 20))
    assert got["Rss"] == 103 << 20 and got["Anonymous"] == 62 << 20
    assert got["Pss"] == 92 << 20 and got["Private_Dirty"] == 72 << 20 and got["Swap"] == 5
    assert read["Rss"] == 100 << 20  # the held figures are not changed in place
