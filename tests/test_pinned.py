"""Locked memory: a real process whose library mmaps and mlock()s staging buffers it never releases is a
culprit of kind ``pinned`` with that library (the ledger's mapping, measured_kind native-mmap) at the rate
its own count gives; VmLck is read from /proc/PID/status by the host probe. One whose library locks slices
of a pool mapped before the hunt (nothing new mapped) is named by the call path of its mlock calls, which
the eBPF layer traces, beside a balanced decoy that locks and unlocks."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli
from fixtures.build import build

from leaktrace.session import SessionReader

MB = 1024 * 1024
CHUNK = 1 << 20
PERIOD_MS = 500  # 2 MiB/s of locked pages: 120 MB/min


@pytest.fixture(scope="module")
def pinbuf_bin() -> Path:
    lib = build("libpinbuf.so", ["pinbuf_lib.c"], shared=True)
    return build("pinbuf", ["pinbuf.c"], ldflags=[f"-L{lib.parent}", "-lpinbuf", f"-Wl,-rpath,{lib.parent}"])


def _held_samples(target) -> list[tuple[float, int]]:
    samples: list[tuple[float, int]] = []

    def read() -> None:
        for line in target.popen.stdout:
            if line.startswith("held "):
                samples.append((time.monotonic(), int(line.split()[1])))

    threading.Thread(target=read, daemon=True).start()
    return samples


@pytest.mark.bpf
def test_an_mlock_leak_is_pinned_with_its_library(spawn, pinbuf_bin, tmp_path):
    target = spawn([pinbuf_bin, CHUNK, PERIOD_MS])
    samples = _held_samples(target)
    r = run_cli("hunt", "--pid", target.pid, "--duration", 30, "--format", "json", "--out", tmp_path / "s")
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "s" / "report.json").read_text())
    assert rep["verdict"] == "leak", rep["verdict_reason"]
    c = rep["culprits"][0]
    assert c["kind"] == "pinned" and c["rule"] == "pinned-memory", rep["culprits"]
    assert c["pid"] == target.pid and c["library"] == "libpinbuf.so"
    assert c.get("measured_kind") == "native-mmap"
    assert any("VmLck" in e for e in c["evidence"])
    reader = SessionReader(tmp_path / "s")
    hp = reader.table("host_procs")
    t0 = reader.meta["t0_monotonic"]
    ts, held = (np.array(v, dtype=float) for v in zip(*samples, strict=True))
    keep = (ts >= t0 + float(hp["t"].min())) & (ts <= t0 + float(hp["t"].max()))
    truth = float(np.polyfit(ts[keep], held[keep], 1)[0]) * 60.0 / MB
    assert c["mb_per_min"] == pytest.approx(truth, rel=0.15)
    assert not [x for x in rep["culprits"] if x["pid"] == target.pid and x is not c and x["kind"] == "native-mmap"]


@pytest.fixture(scope="module")
def lockpool_bin() -> Path:
    lib = build("liblockslice.so", ["lockpool_lib.c"], shared=True)
    return build("lockpool", ["lockpool.c"], ldflags=[f"-L{lib.parent}", "-llockslice", f"-Wl,-rpath,{lib.parent}"])


@pytest.mark.bpf
def test_slices_of_an_old_pool_locked_are_named_by_the_mlock_call_path(spawn, lockpool_bin, tmp_path):
    target = spawn([lockpool_bin, CHUNK, PERIOD_MS, 512])
    samples = _held_samples(target)
    r = run_cli("hunt", "--pid", target.pid, "--duration", 30, "--format", "json", "--out", tmp_path / "s")
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "s" / "report.json").read_text())
    assert rep["verdict"] == "leak", rep["verdict_reason"]
    c = rep["culprits"][0]
    assert c["kind"] == "pinned" and c["pid"] == target.pid, rep["culprits"]
    assert c["library"] == "liblockslice.so", c
    assert any("lockslice_take" in f for f in c["stack"]), c["stack"]
    assert any(e.startswith("mlock from liblockslice.so") for e in c["evidence"]), c["evidence"]
    reader = SessionReader(tmp_path / "s")
    hp = reader.table("host_procs")
    t0 = reader.meta["t0_monotonic"]
    ts, held = (np.array(v, dtype=float) for v in zip(*samples, strict=True))
    inside = (ts >= t0 + float(hp["t"].min())) & (ts <= t0 + float(hp["t"].max()))
    truth = float(np.polyfit(ts[inside], held[inside], 1)[0]) * 60.0 / MB
    assert c["mb_per_min"] == pytest.approx(truth, rel=0.15)
    # what the library locked inside the hunt and still holds: its slices from the probes' attach to the last
    # snapshot (the decoy's are gone), give or take a slice at each end; the host probe reads from before the
    # eBPF layer attaches (seconds on a loaded machine), so its first read is no edge of what was traced
    t_last = float(reader.table("bpf_counters")["t"].max())
    traced = (ts >= t0 + reader.meta["attach_s"]) & (ts <= t0 + t_last)
    ev = reader.table("bpf_events")
    locks = ev[(ev["pid"] == target.pid) & (ev["type"] == "mlock")]
    # every mlock traced: the library's and the decoy's, two a round (a round printed just after attach may
    # have locked just before it)
    assert len(locks) >= 2 * (traced.sum() - 1), (len(locks), traced.sum())
    slices = float(np.interp(t0 + t_last, ts, held) - np.interp(t0 + reader.meta["attach_s"], ts, held))
    assert c["locked_by"]["library"] == "liblockslice.so"
    assert abs(c["locked_by"]["locked_bytes"] - slices) <= 2 * CHUNK, (c["locked_by"], slices)
    assert c["locked_by"]["calls"] == c["locked_by"]["locked_bytes"] // CHUNK, c["locked_by"]
    assert not [x for x in rep["culprits"] if x["library"] == "lockpool"], rep["culprits"]
