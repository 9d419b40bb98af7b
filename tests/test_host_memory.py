"""Host memory that no process holds: the host probe's parsers on recorded /proc files, driver mappings
classified, and a real hunt of a flat target while files nobody maps fill a tmpfs at a known rate — the
host's loss and the unattributed rate checked against the writer's own count."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli

from leaktrace.analysis.growth import rate
from leaktrace.memclass import classify
from leaktrace.procfs import parse_smaps
from leaktrace.procfs.meminfo import host_memory_row, parse_meminfo, parse_pcp_free_pages, pinned_from_status

DATA = Path(__file__).parent / "data" / "proc"
MB = 1024 * 1024
KIB = 1024


def test_meminfo_and_status_parse_to_bytes():
    """Recorded /proc/meminfo and /proc/PID/status (a process with 2 MiB mlock()ed and 4 threads)."""
    text = (DATA / "host.meminfo").read_text()
    mi = parse_meminfo(text)
    line = next(ln for ln in text.splitlines() if ln.startswith("MemAvailable:"))
    assert mi["MemAvailable"] == int(line.split()[1]) * KIB
    assert mi["HugePages_Total"] == 0  # a count without a unit stays a count
    row = host_memory_row(mi)
    assert set(row) == {"mem_total", "mem_available", "mem_free", "anon_pages", "shmem", "mapped", "unevictable",
                        "mlocked", "cached", "vmalloc_used", "slab_unreclaimable", "kernel_stack", "page_tables",
                        "pcp_free"}
    assert 0 < row["mem_available"] <= row["mem_total"] and row["anon_pages"] > 0
    assert host_memory_row({})["mem_available"] is None  # a kernel without the key: unknown, not 0
    assert pinned_from_status((DATA / "mlocked.status").read_text()) == {"vm_pin": 0, "vm_lck": 2 * MB, "threads": 4}
    assert pinned_from_status("VmPin:\t   6144 kB\nThreads:\t9\n") == {"vm_pin": 6 * MB, "vm_lck": 0, "threads": 9}


def test_per_cpu_free_pages_are_summed_over_every_zone_and_cpu():
    """A recorded /proc/zoneinfo (kernel 6.18, 2 CPUs, a busy allocator just run): each CPU's pageset count
    of each zone, nothing else (a zone's own ``pages free`` and the ``high``/``batch`` of a pageset are not)."""
    lines = (DATA / "host.zoneinfo").read_text().splitlines()
    per_cpu = [int(lines[i + 1].split()[1]) for i, ln in enumerate(lines) if ln.strip().startswith("cpu:")]
    assert len(per_cpu) >= 4 and sum(per_cpu) > 0
    assert parse_pcp_free_pages("\n".join(lines)) == sum(per_cpu)
    assert parse_pcp_free_pages("Node 0, zone   Normal\n  pages free     3\n        count: 7\n") == 0


def test_driver_mappings_are_driver_class():
    """smaps in the kernel's layout of a CUDA + RDMA process (composed: no driver on this host): the device
    mappings of /dev/nvidia*, /dev/nvidia-uvm and /dev/infiniband/uverbs* are the driver class, a locked
    anonymous staging buffer beside them stays anonymous."""
    maps = parse_smaps((DATA / "driver.smaps").read_text())
    got = {(m.path, classify(m.path, m.perms, m.start, m.end)) for m in maps}
    assert got == {("/dev/nvidiactl", "driver"), ("/dev/nvidia0", "driver"), ("/dev/nvidia-uvm", "driver"),
                   ("/dev/infiniband/uverbs0", "driver"), ("", "anon")}
    uvm = next(m for m in maps if m.path == "/dev/nvidia-uvm")
    assert (uvm.size, uvm.rss) == (128 * MB, 64 * MB)


WRITE_MB_PER_S = 150  # far above what other workloads of a shared host move in a few seconds
WRITE_MAX_S = 20  # the writer stops here whatever happens (at most 3 GB of the host's memory, for seconds)


class TmpfsFiller:
    """Writes a file in /dev/shm at a steady rate from a thread of this (unhunted) process, keeping no
    mapping of it: tmpfs pages that no process holds. The file is unlinked as soon as it is open: its pages
    go with the descriptor, when the writer closes it or this process dies. Its own count of the bytes
    written is the truth."""

    def __init__(self, path: Path, mb_per_s: float) -> None:
        self.path, self.mb_per_s = path, mb_per_s
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        chunk = b"\1" * MB
        with open(self.path, "wb") as f:
            self.path.unlink()
            t0, n = time.monotonic(), 0
            while not self._stop.is_set() and time.monotonic() - t0 < WRITE_MAX_S:
                while n < (time.monotonic() - t0) * self.mb_per_s:
                    f.write(chunk)
                    n += 1
                f.flush()
                self.samples.append((time.monotonic(), n * MB))
                self._stop.wait(0.05)
            self._stop.wait()  # the pages stay until the hunt is over

    def mb_per_min(self, t0: float, t1: float) -> float:
        """The rate written between two instants (time.monotonic())."""
        inside = [(t, b) for t, b in self.samples if t0 <= t <= t1]
        (ta, ba), (tb, bb) = inside[0], inside[-1]
        return (bb - ba) / (tb - ta) * 60 / MB

    def written_at(self, t: np.ndarray) -> np.ndarray:
        """Bytes written by each instant of ``t`` (time.monotonic())."""
        ts, n = zip(*self.samples, strict=True)
        return np.interp(t, ts, n)

    def __enter__(self) -> TmpfsFiller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def test_host_loss_no_process_holds_is_a_culprit(spawn, tmp_path):
    """A flat target is hunted while this test fills a tmpfs file nobody maps: no process grows, the host
    loses memory at the writer's rate, and the report says so — rates within 15% of the writer's count."""
    target = spawn(["sleep", "300"], ready=None)
    shm = Path("/dev/shm") / f"leaktrace-test-host-{os.getpid()}"
    with TmpfsFiller(shm, WRITE_MB_PER_S) as filler:
        r = run_cli("hunt", "--pid", target.pid, "--duration", 14, "--interval", 0.5, "--no-bpf", "--no-gdb",
                    "--format", "json", "--out", tmp_path / "s", timeout=90)
    assert r.returncode == 0, r.stderr
    from leaktrace.session import SessionReader

    reader = SessionReader(tmp_path / "s")
    t0 = reader.meta["t0_monotonic"]
    hm = reader.table("host_memory")
    truth = filler.mb_per_min(t0 + float(hm["t"].min()), t0 + float(hm["t"].max()))
    assert truth > 0.8 * WRITE_MB_PER_S * 60  # the writer kept its rate
    # Memory nobody holds besides the file, as the kernel counts it at the same samples: its own (other hunts'
    # BPF maps come and go by hundreds of MB in steps) and other workloads' shared memory (Shmem beyond the
    # file: a process holding a segment exits). The file's bytes and those, sample by sample, rated as the
    # report rates; without other workloads they are the file's alone.
    t = hm["t"].to_numpy(dtype=float)
    written = filler.written_at(t0 + t)
    others = hm[["vmalloc_used", "slab_unreclaimable", "kernel_stack", "page_tables"]].sum(axis=1).to_numpy(dtype=float)
    others += hm["shmem"].to_numpy(dtype=float) - written
    expected = rate(t, written + others).mb_per_min
    rep = json.loads((tmp_path / "s" / "report.json").read_text())
    host = rep["host"]
    assert abs(host["unattributed_mb_per_min"] - expected) <= 0.15 * truth, (host, truth, expected)
    assert host["mem_available_mb_per_min"] < 0, host  # by how much: the file's, less other workloads' frees
    assert rep["verdict"] == "leak", rep["verdict_reason"]
    assert "no process holds" in rep["verdict_reason"]
    (c,) = rep["culprits"]
    assert (c["kind"], c["library"], c["rule"], c["source"]) == ("other", None, "host-unattributed", "host"), c
    assert c["mb_per_min"] == host["unattributed_mb_per_min"]
    assert "tmpfs" in c["finding"], c["finding"]  # meminfo's Shmem grew with it
    assert "/dev/shm" in c["remedy"] and "pin_memory" in c["remedy"]
    procs = {p["pid"]: p for p in rep["processes"]}
    assert abs(procs[target.pid]["rss_mb_per_min"]) < 1.0  # the hunted target stayed flat


def test_a_few_mb_lost_in_a_short_hunt_is_no_host_culprit():
    """A flat target hunted 15 s on an idle VM saw MemAvailable + AnonPages fall 19 MB/min steadily with no
    meminfo figure moving (5 MB in all): no culprit. The same window losing 600 MB/min is one."""
    from leaktrace.analysis.host import HOST_MIN_LOSS_MB, HostMemory, host_candidate

    t = np.arange(0, 15.5, 1.0)
    noise = np.random.default_rng(7).normal(0, 0.05 * MB, len(t))
    for mb_per_min, culprit in ((19.0, False), (600.0, True)):
        lost = rate(t, mb_per_min * MB / 60 * t + noise)
        h = HostMemory(loss=lost, unheld=lost, hunted_mb_per_min=0.0, hunted_anon_mb_per_min=0.0,
                       meminfo_mb_per_min={"anon_pages": 0.0})
        assert h.unattributed_mb_per_min > 10, h.unattributed_mb_per_min  # above the rate threshold either way
        c = host_candidate(h)
        assert (c is not None) == culprit, (mb_per_min, lost.mb_per_min * 15 / 60, HOST_MIN_LOSS_MB)
        if culprit:
            assert (c.pid, c.kind) == (0, "other") and c.mb_per_min == pytest.approx(mb_per_min, rel=0.05)
