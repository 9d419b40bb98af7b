"""Nothing lost at exit: a target that exits during the hunt (here on its own; in production the worker the
OOM killer just took) keeps, in the session and the report, what it held at its exit — its last ledger
snapshot, its regions and their call stacks — and the report names the leak."""

from __future__ import annotations

import json

import pytest
from conftest import is_root, run_cli

from leaktrace.session import SessionReader

pytestmark = [pytest.mark.bpf, pytest.mark.skipif(not is_root(), reason="BPF needs root")]
CHUNK = 64 * 1024


def test_leak_of_a_target_that_exits_is_kept(spawn, leaker_bin, tmp_path):
    target = spawn([leaker_bin, "--leak-kib-per-s", "4096", "--chunk-kib", "64", "--duration", "12"])
    r = run_cli("hunt", "--pid", target.pid, "--duration", "60", "--gdb-samples", "0", "--format", "json",
                "--out", tmp_path / "s")
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "s" / "report.json").read_text())
    assert rep["stop_reason"] == "all targets exited"
    (proc,) = rep["processes"]
    assert proc["pid"] == target.pid and proc["exited_s"] is not None
    (ex,) = rep["ledger"]["exits"]
    assert ex["pid"] == target.pid and ex["t"] == pytest.approx(proc["exited_s"], abs=1.5)
    # What it held at exit, exactly: whole 64 KiB chunks, one per leak mmap after attach (~10 s of them).
    assert ex["outstanding_bytes"] == ex["regions"] * CHUNK and ex["regions"] >= 8 * 64, ex
    reader = SessionReader(tmp_path / "s")
    regions = reader.table("ledger_regions")
    held = regions[regions["at_exit"].astype(bool) & ~regions["preexisting"].astype(bool)]
    assert int(held["size"].sum()) == ex["outstanding_bytes"] and set(held["library"]) == {"leaker"}
    assert len(reader.table("bpf_stacks")) >= 1
    # The report names it: the library, the outstanding bytes at exit, the rate (4 MiB/s = 240 MB/min).
    assert rep["verdict"] == "leak"
    top = rep["culprits"][0]
    assert top["pid"] == target.pid and top["library"] == "leaker" and top["kind"] == "native-mmap"
    assert top["outstanding_bytes"] == ex["outstanding_bytes"]
    assert top["mb_per_min"] == pytest.approx(240, rel=0.15)
