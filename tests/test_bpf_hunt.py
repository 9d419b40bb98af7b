"""`leaktrace hunt` with the eBPF probe on a Python parent whose multiprocessing *spawn* child, started
10 s after attach, leaks through the stripped raw-syscall library: followed from the kernel and named."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_cli
from fixtures.bpf_harness import bpf_lib, is_root, smaps_sizes

from leaktrace.session import SessionReader

pytestmark = [pytest.mark.bpf, pytest.mark.skipif(not is_root(), reason="BPF needs root")]
SPAWNER = Path(__file__).parent / "fixtures" / "bpf_spawner.py"


def test_spawn_child_after_attach_is_followed(tmp_path, spawn) -> None:
    count, size = 40, 1 << 20
    parent = spawn([sys.executable, SPAWNER, bpf_lib(), "10", count, size, "0.15"])
    out = tmp_path / "hunt"
    hunt = subprocess.Popen([sys.executable, "-m", "leaktrace", "hunt", "--pid", str(parent.pid), "--duration", "19",
                             "--interval", "1", "--out", str(out), "--no-gdb"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    child_line = parent.popen.stdout.readline()  # type: ignore[union-attr]
    assert child_line.startswith("child"), child_line
    child = int(child_line.split()[1])
    log, _ = hunt.communicate(timeout=120)
    assert hunt.returncode == 0, log
    report = json.loads((out / "report.json").read_text())
    assert report["ledger"]["lost_events"] == 0
    assert report["ledger"]["events"] > count
    named = [c for c in report["culprits"] if c["kind"] == "native-mmap" and c["pid"] == child]
    assert named, (report["culprits"], log)
    assert named[0]["library"] == "libbpfleak.so"
    assert named[0]["outstanding_bytes"] == count * size
    reader = SessionReader(out)
    reg = reader.table("ledger_regions")
    mine = reg[(reg["pid"] == child) & (reg["library"] == "libbpfleak.so") & (reg["kind"] == "anon")]
    assert int(mine["size"].sum()) == count * size
    assert mine["t_born"].min() >= 9.0  # born after the spawn, 10 s after attach
    traced = reg[(reg["pid"] == child) & ~reg["preexisting"].astype(bool) & (reg["kind"] == "anon")]
    proc_total = smaps_sizes(child, [(int(r.start), int(r.end)) for r in traced.itertuples()])
    assert abs(int(traced["size"].sum()) - proc_total) <= 0.01 * proc_total
    assert run_cli("report", out).returncode == 0
