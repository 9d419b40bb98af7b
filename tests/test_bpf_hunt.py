"""`leaktrace hunt` with the eBPF probe on a Python parent whose multiprocessing *spawn* child, started
once the hunt is attached, leaks through the stripped raw-syscall library: followed from the kernel and
named. Each step waits on a handshake (the session's attach, the fixture's "child" and "leaked" lines), and
the hunt is stopped once every mapping is made, so a loaded machine changes timings, never the totals."""

from __future__ import annotations

import json
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_cli
from fixtures.bpf_harness import bpf_lib, is_root, smaps_sizes
from ops_helpers import session_now, wait_attached

from leaktrace.session import SessionReader

pytestmark = [pytest.mark.bpf, pytest.mark.skipif(not is_root(), reason="BPF needs root")]
SPAWNER = Path(__file__).parent / "fixtures" / "bpf_spawner.py"


def _line(p: subprocess.Popen, timeout: float) -> str:
    ready, _, _ = select.select([p.stdout], [], [], timeout)
    return p.stdout.readline() if ready else ""  # type: ignore[union-attr]


def test_spawn_child_after_attach_is_followed(tmp_path, spawn) -> None:
    count, size = 40, 1 << 20
    go = tmp_path / "spawn-now"
    parent = spawn([sys.executable, SPAWNER, bpf_lib(), f"file:{go}", count, size, "0.15"])
    out = tmp_path / "hunt"
    log_path = tmp_path / "hunt.log"
    with open(log_path, "w") as log_file:
        hunt = subprocess.Popen([sys.executable, "-m", "leaktrace", "hunt", "--pid", str(parent.pid), "--duration",
                                 "300", "--interval", "1", "--out", str(out), "--no-gdb"],
                                stdout=log_file, stderr=subprocess.STDOUT, text=True)
    try:
        assert wait_attached(out, timeout=120), log_path.read_text()
        t_go = session_now(out)
        go.touch()  # the spawn starts now, with every probe attached
        child_line = _line(parent.popen, 60)
        assert child_line.startswith("child"), child_line
        child = int(child_line.split()[1])
        assert _line(parent.popen, 120).split() == ["leaked", str(count)]
        hunt.send_signal(signal.SIGTERM)  # its last tick records the final state
        hunt.wait(timeout=120)
    finally:
        if hunt.poll() is None:
            hunt.kill()
            hunt.wait()
    log = log_path.read_text()
    assert hunt.returncode == 0, log
    report = json.loads((out / "report.json").read_text())
    assert report["stop_reason"] == "SIGTERM"
    assert report["ledger"]["lost_events"] == 0
    assert report["ledger"]["events"] > count
    named = [c for c in report["culprits"] if c["kind"] == "native-mmap" and c["pid"] == child]
    assert named, (report["culprits"], log)
    assert named[0]["library"] == "libbpfleak.so"
    assert named[0]["outstanding_bytes"] == count * size, _groups_of(out, child)
    reader = SessionReader(out)
    reg = reader.table("ledger_regions")
    mine = reg[(reg["pid"] == child) & (reg["library"] == "libbpfleak.so") & (reg["kind"] == "anon")]
    assert int(mine["size"].sum()) == count * size and len(mine) == count
    assert mine["t_born"].min() >= t_go  # every one born after the spawn, which came after attach
    traced = reg[(reg["pid"] == child) & ~reg["preexisting"].astype(bool) & (reg["kind"] == "anon")]
    proc_total = smaps_sizes(child, [(int(r.start), int(r.end)) for r in traced.itertuples()])
    assert abs(int(traced["size"].sum()) - proc_total) <= 0.01 * proc_total
    assert run_cli("report", out).returncode == 0


def _groups_of(out: Path, pid: int) -> list[list]:
    """The process's last ledger snapshot and its regions, by (library, kind): where a missing byte went."""
    reader = SessionReader(out)
    snaps = reader.table("ledger_snapshots")
    mine = snaps[snaps["pid"] == pid]
    last = mine[mine["t"] == mine["t"].max()]
    regions = reader.table("ledger_regions")
    regions = regions[regions["pid"] == pid]
    return [sorted(zip(last["library"], last["kind"], last["outstanding_bytes"], strict=True)),
            regions.groupby(["library", "kind"])["size"].agg(["sum", "count"]).reset_index().values.tolist()]
