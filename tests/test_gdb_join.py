"""gdb samples joined to regions (pure functions over DataFrames / a session written by SessionWriter),
and the same join on a real hunt with the eBPF ledger."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess

import pandas as pd
import pytest
from conftest import LEAKTRACE, REPO, wait_for
from fixtures.gdb_target import HOOK_LIB, LEAK_LIB, build_gdb_target
from ops_helpers import wait_rollup

from leaktrace.analysis.frames import code_frames
from leaktrace.analysis.gdbjoin import gdb_samples, gdb_stack_for, join_regions, join_samples_to_regions
from leaktrace.analysis.ledger import stack_frames
from leaktrace.probes.gdb.checks import tracer_of
from leaktrace.probes.gdb.rows import sample_row, stack_strings
from leaktrace.session import SessionReader, SessionWriter


def frames(*libs_syms):
    return [{"pc": 0x1000 + i, "library": lib, "path": f"/x/{lib}", "symbol": sym, "offset": 4 if sym else None,
             "file_offset": 0x1138} for i, (lib, sym) in enumerate(libs_syms)]


HOOKED = frames(("libc.so.6", "syscall"), ("libleak.so", None), ("libhook.so", "dispatch"), ("app", "main"))
OTHER = frames(("libc.so.6", "mmap64"), ("libother.so", "grow"))


def sample(t, pid, syscall, addr, fr, length=4096, error=0):
    rec = {"pid": pid, "tid": pid, "syscall": syscall, "addr": addr, "length": length, "result": addr,
           "error": error, "frames": fr, "stop_us": 100.0}
    return sample_row(rec, t, 0)


def test_stack_strings_format():
    assert stack_strings(HOOKED) == ["libc.so.6!syscall+0x4", "libleak.so+0x1138", "libhook.so!dispatch+0x4",
                                     "app!main+0x4"]
    py = [{**HOOKED[0], "python": [{"func": "f", "file": "a.py", "line": 3}]}]
    assert stack_strings(py)[1] == "python!f (a.py:3)"


def test_a_stack_is_cut_at_its_first_frame_that_is_no_code_address(tmp_path):
    """A session whose gdb unwind guessed past libffi (small integers and stack addresses as frames) and whose
    frame-pointer walk ran into data: what reads those stacks keeps the frames below the first guess only."""
    guessed = ["libxfer.so!xfer_send+0x3d", "libffi.so.8+0x6f7a", "?!0x7", "?!0x7ffe8589cf60",
               "libffi.so.8+0x640e", "?!0x1"]
    w = SessionWriter(tmp_path / "s")
    row = sample(1.0, 7, "mmap", 0x10000, HOOKED)
    w.append("gdb_samples", [{**row, "stack": json.dumps(guessed)}])
    w.append("bpf_stacks", [{"stack_key": "7:0x1000", "pid": 7, "site": 0x1000, "stack_id": 1, "library": "libx.so",
                             "symbol": "libx.so!f+0x1",
                             "frames": "libc.so.6!syscall+0x19\nlibx.so!f+0x1\n?@0x7\nlibx.so+0x40\n[stack]+0x10"}])
    w.close()
    r = SessionReader(tmp_path / "s")
    assert list(gdb_samples(r)["stack"].iloc[0]) == guessed[:2]
    assert stack_frames(r)["7:0x1000"] == ["libc.so.6!syscall+0x19", "libx.so!f+0x1"]
    assert code_frames(["[vdso]!__vdso_clock_gettime+0x5", "[anon]@0x7f0000001000", "[heap]+0x10", "a!b"]) == \
        ["[vdso]!__vdso_clock_gettime+0x5", "[anon]@0x7f0000001000"]


def test_join_picks_the_region_holding_the_address():
    samples = pd.DataFrame([sample(1.0, 7, "mmap", 0x10000, HOOKED), sample(2.0, 7, "mmap", 0x23000, OTHER),
                            sample(2.5, 7, "mmap", 0x10800, HOOKED), sample(3.0, 8, "mmap", 0x10000, OTHER),
                            sample(3.5, 7, "mmap", 0x30000, HOOKED, error=12),
                            sample(4.0, 7, "munmap", 0x20000, OTHER)])
    regions = pd.DataFrame({"pid": [7, 7, 7, 9], "start": [0x10000, 0x20000, 0x30000, 0x10000],
                            "end": [0x11000, 0x24000, 0x31000, 0x11000]})
    j = join_samples_to_regions(samples, regions)
    assert list(j["gdb_samples"]) == [2, 1, 0, 0]  # errors, munmaps and other pids do not count
    assert j["gdb_t"].iloc[0] == 2.5 and j["gdb_stack"].iloc[0][1] == "libleak.so+0x1138"
    assert j["gdb_stack"].iloc[1][1] == "libother.so!grow+0x4"
    assert j["gdb_stack"].iloc[2] == [] and j["gdb_addr"].iloc[3] == 0


def test_gdb_stack_for_reads_a_session(tmp_path):
    w = SessionWriter(tmp_path / "s")
    w.append("gdb_samples", [sample(1.0, 7, "mmap", 0x10000, HOOKED), sample(2.0, 7, "mmap", 0x11000, HOOKED),
                             sample(3.0, 7, "mmap", 0x12000, OTHER)])
    w.append("ledger_regions", [{"pid": 7, "start": 0x10000, "end": 0x12000, "size": 0x2000,
                                 "library": "libleak.so"}])
    w.close()
    r = SessionReader(tmp_path / "s")
    assert gdb_stack_for(r, 7, "libleak.so")[:3] == ["libc.so.6!syscall+0x4", "libleak.so+0x1138",
                                                     "libhook.so!dispatch+0x4"]
    assert gdb_stack_for(r, 7, "libother.so")[1] == "libother.so!grow+0x4"
    assert gdb_stack_for(r, 7, None)[1] == "libleak.so+0x1138"  # the most frequent
    assert gdb_stack_for(r, 8, "libleak.so") == [] and gdb_stack_for(r, 7, "libnone.so") == []
    j = join_regions(r)
    assert j["source"].iloc[0] == "ledger" and j["gdb_samples"].iloc[0] == 2


@pytest.mark.gdb
@pytest.mark.bpf
@pytest.mark.skipif(shutil.which("gdb") is None or os.geteuid() != 0, reason="needs gdb and root (eBPF ledger)")
def test_sampled_addresses_are_ledger_regions(spawn, tmp_path):
    target = spawn([build_gdb_target(), "--threads", "4", "--per-thread-per-s", "5"])
    out = tmp_path / "s"
    # Stopped (SIGTERM) once gdb took its 10 samples and let go of the target, however long that took.
    hunt = subprocess.Popen([*LEAKTRACE, "hunt", "--pid", str(target.pid), "--duration", "300", "--gdb-samples",
                             "10", "-q", "--out", str(out), "--format", "json"], cwd=str(REPO),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def sampled() -> int:
            return sum(p.read_text().count('"type":"sample"') for p in out.glob("gdb/*/samples-*"))

        assert wait_for(lambda: sampled() >= 10 and tracer_of(target.pid) == 0, timeout=120), sampled()
        # A leak verdict (the culprit asserted below) needs min_span_s of watcher samples after the warm-up
        # cut: wait for 14 s of rows on disk, not for a wall-clock sleep.
        assert wait_rollup(out, rows=10, span_s=14.0, timeout=120)
        hunt.send_signal(signal.SIGTERM)
        _, stderr = hunt.communicate(timeout=120)
    finally:
        if hunt.poll() is None:
            hunt.kill()
            hunt.communicate()
    assert hunt.returncode == 0, stderr
    reader = SessionReader(out)
    assert "bpf" in reader.meta.get("probes", []), reader.meta.get("warnings")  # root: the probe must run
    samples = reader.table("gdb_samples")
    ledger = reader.table("ledger_regions")
    mmaps = samples[samples["syscall"] == "mmap"]
    assert len(mmaps) >= 10
    starts = {(int(p), int(s)): lib for p, s, lib in zip(ledger["pid"], ledger["start"], ledger["library"],
                                                         strict=True)}
    for addr in mmaps["addr"]:  # every returned address is an outstanding region the ledger blames on LEAK_LIB
        assert starts.get((target.pid, int(addr))) == LEAK_LIB, hex(int(addr))
    joined = join_regions(reader)
    assert joined["source"].iloc[0] == "ledger"
    hit = joined[joined["gdb_samples"] > 0]
    assert len(hit) == len(mmaps) and (hit["library"] == LEAK_LIB).all()
    assert all(any(f.startswith(f"{HOOK_LIB}!") for f in st) for st in hit["gdb_stack"])
    culprit = json.loads((out / "report.json").read_text())["culprits"][0]
    assert culprit["library"] == LEAK_LIB
