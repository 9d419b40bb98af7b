"""Memory held by descriptors and never mapped: a real process that writes into new memfds and keeps their
descriptors grows no RSS, yet its memfds are a culprit (kind shm, held_by fd) at the rate its own count
gives; the same process closing each memfd is no culprit. The descriptor links are classified by a pure
function, checked on the forms /proc shows."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli
from fixtures.build import build

from leaktrace.procfs.heldfiles import held_kind, read_held_files
from leaktrace.session import SessionReader

MB = 1024 * 1024
CHUNK = 256 * 1024
PERIOD_MS = 125  # 2 MiB/s


@pytest.fixture(scope="module")
def keeper_bin() -> Path:
    return build("memfd_keeper", ["memfd_keeper.c"])


class HeldLog:
    """The fixture's own count of the bytes it holds ("held N" lines), with the monotonic time each came."""

    def __init__(self, proc) -> None:
        self.samples: list[tuple[float, int]] = []
        self._thread = threading.Thread(target=self._read, args=(proc.popen.stdout,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            if line.startswith("held "):
                self.samples.append((time.monotonic(), int(line.split()[1])))

    def mb_per_min(self, t0: float, t1: float) -> float:
        ts, held = (np.array(v, dtype=float) for v in zip(*self.samples, strict=True))
        keep = (ts >= t0) & (ts <= t1)
        return float(np.polyfit(ts[keep], held[keep], 1)[0]) * 60.0 / MB


def test_held_kind_reads_the_links_proc_shows():
    assert held_kind("/memfd:kv-staging (deleted)") == "memfd"
    assert held_kind("/dev/shm/psm_1a2b") == "shm"
    assert held_kind("anon_inode:dmabuf") == "dmabuf"
    assert held_kind("/dmabuf:") == "dmabuf"
    for other in ("/tmp/x", "socket:[1234]", "pipe:[99]", "anon_inode:[eventfd]", "/dev/nvidia0", "/memfdx"):
        assert held_kind(other) is None


def _hunt(spawn, keeper_bin: Path, tmp_path: Path, mode: str) -> tuple[dict, int, HeldLog, SessionReader]:
    target = spawn([keeper_bin, mode, CHUNK, PERIOD_MS])
    log = HeldLog(target)
    r = run_cli("hunt", "--pid", target.pid, "--duration", 24, "--format", "json", "--out", tmp_path / mode)
    assert r.returncode == 0, r.stderr
    return json.loads((tmp_path / mode / "report.json").read_text()), target.pid, log, SessionReader(tmp_path / mode)


@pytest.mark.bpf
def test_memfds_kept_by_descriptor_are_a_culprit_at_their_rate(spawn, keeper_bin, tmp_path):
    rep, pid, log, reader = _hunt(spawn, keeper_bin, tmp_path, "keep")
    held = [c for c in rep["culprits"] if c.get("held_by") == "fd"]
    assert rep["verdict"] == "leak", rep["verdict_reason"]
    assert [c["pid"] for c in held] == [pid], rep["culprits"]
    c = held[0]
    assert c["kind"] == "shm" and c["rule"] == "held-by-descriptor"
    assert rep["culprits"][0].get("held_by") == "fd"  # the host's loss is this process's, not a culprit above it
    rows = reader.table("held_files")
    t0 = reader.meta["t0_monotonic"]
    truth = log.mb_per_min(t0 + float(rows["t"].min()), t0 + float(rows["t"].max()))
    assert truth == pytest.approx(120.0, rel=0.2)  # the fixture keeps its pace
    assert c["mb_per_min"] == pytest.approx(truth, rel=0.15)
    assert c["outstanding_bytes"] >= 0.9 * int(rows["bytes"].max())
    assert any("kv-staging" in e for e in c["evidence"])
    # named by the call path of its memfd_create calls, every one of them traced by the eBPF layer
    assert c["library"] == "memfd_keeper" and any(f.startswith("memfd_keeper!main") for f in c["stack"]), c
    created = reader.table("bpf_events").query(f"type == 'memfd' and pid == {pid}")
    since = rows[rows["t"] >= float(created["t"].min())]  # the probe's first second comes before its first event
    assert len(created) >= int(since["files"].iloc[-1]) - int(since["files"].iloc[0])
    proc = next(p for p in rep["processes"] if p["pid"] == pid)
    assert proc["rss_mb_per_min"] < 0.2 * truth  # none of it is in the process's RSS


@pytest.mark.bpf
def test_memfds_closed_after_use_are_no_culprit(spawn, keeper_bin, tmp_path):
    rep, pid, _log, reader = _hunt(spawn, keeper_bin, tmp_path, "close")
    assert not [c for c in rep["culprits"] if c.get("held_by") == "fd"], rep["culprits"]
    assert reader.table("held_files").empty or int(reader.table("held_files")["bytes"].max()) <= 2 * CHUNK


def test_a_mapped_memfd_is_not_held_by_descriptor():
    """Mapped memory is the mapping's (RSS, the shm class): only unmapped files are held by descriptor."""
    import mmap
    import os

    fd = os.memfd_create("mapped-here")
    os.write(fd, b"x" * CHUNK)
    m = mmap.mmap(fd, CHUNK)
    try:
        names = [f.name for f in read_held_files(os.getpid())]
        assert not any("mapped-here" in n for n in names)
        m.close()
        names = [f.name for f in read_held_files(os.getpid())]
        assert any("mapped-here" in n for n in names)
    finally:
        os.close(fd)
