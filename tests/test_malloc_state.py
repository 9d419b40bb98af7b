"""Leak or retention, from glibc malloc's own books read from outside: the books match the mallinfo2() the
process computes on itself; a process staging ever larger batches of temporary buffers that glibc keeps is
allocator retention (verdict not leak) with its remedy, while a process that keeps what it mallocs beside it is
a malloc-heap leak with its memory in use rated as its own mallinfo2() counts it."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli
from fixtures.build import build

from leaktrace.probes.mallocstate.glibc import locate, read_malloc_state

MB = 1024 * 1024
STAGERS = ["8", "2", "250", "0"]  # 8 threads, +2 × 64 KiB a round each, a round every 250 ms: ~240 MB/min kept
LEAK_KIB_PER_S = 512


@pytest.fixture(scope="module")
def mallinfo_bin() -> Path:
    return build("mallinfo_self", ["mallinfo_self.c"], ldflags=["-lpthread"])


@pytest.fixture(scope="module")
def retain_bin() -> Path:
    return build("malloc_retain", ["malloc_retain.c"], ldflags=["-lpthread"])


def test_books_read_from_outside_match_mallinfo2(spawn, mallinfo_bin):
    target = spawn([mallinfo_bin, 4, 20000], ready=None)
    fields = target.popen.stdout.readline().split()
    assert fields[0] == "ready", fields
    arena, fordblks, fsmblks, uordblks, hblkhd = map(int, fields[1:])
    where = locate(target.pid)
    assert not isinstance(where, str), where
    st = read_malloc_state(target.pid, where)
    assert st["complete"] and st["arenas"] == 5  # the main arena and one per thread
    assert st["arena"] == arena and st["hblkhd"] == hblkhd and st["fsmblks"] == fsmblks
    # stdout's buffer is malloc'ed after the process's own mallinfo2(): a few KiB moved from free to in use
    assert st["fordblks"] == pytest.approx(fordblks, abs=16 << 10)
    assert st["uordblks"] == pytest.approx(uordblks, abs=16 << 10)
    assert st["free_chunks"] > 10_000


class Mallinfo:
    """A fixture's own mallinfo2() lines ("mi ARENA FORDBLKS UORDBLKS HBLKHD"), with the time each came."""

    def __init__(self, proc) -> None:
        self.rows: list[tuple[float, int, int, int, int]] = []
        threading.Thread(target=self._read, args=(proc.popen.stdout,), daemon=True).start()

    def _read(self, stream) -> None:
        for line in stream:
            if line.startswith("mi "):
                self.rows.append((time.monotonic(), *map(int, line.split()[1:])))

    def mb_per_min(self, col: int, t0: float, t1: float) -> float:
        a = np.array([r for r in self.rows if t0 <= r[0] <= t1], dtype=float)
        return float(np.polyfit(a[:, 0], a[:, col], 1)[0]) * 60.0 / MB


def _hunt(tmp_path: Path, name: str, *pids: int) -> dict:
    args = [a for p in pids for a in ("--pid", p)]
    r = run_cli("hunt", *args, "--duration", 32, "--format", "json", "--out", tmp_path / name)
    assert r.returncode == 0, r.stderr
    return json.loads((tmp_path / name / "report.json").read_text())


@pytest.mark.bpf
def test_retention_is_no_leak_and_a_live_leak_beside_it_stays_one(spawn, retain_bin, tmp_path):
    stager = spawn([retain_bin, *STAGERS])
    rep = _hunt(tmp_path, "alone", stager.pid)
    assert rep["verdict"] != "leak", rep["verdict_reason"]
    kept = [c for c in rep["culprits"] if c["pid"] == stager.pid]
    assert [c["kind"] for c in kept] == ["allocator-retention"], rep["culprits"]
    c = kept[0]
    assert c["rule"] == "allocator-retention" and "MALLOC_ARENA_MAX" in c["remedy"]
    assert abs(c["live_mb_per_min"]) < 1.0 and c["retained_mb_per_min"] > 100
    # its eight staging threads, each in an arena of its own, grew malloc's heap (the eBPF layer's arena commits)
    assert any(e.startswith("threads that grew malloc's heap during the hunt: 8 (tid ") for e in c["evidence"]), \
        c["evidence"]
    assert "allocator retention" in rep["verdict_reason"]

    leaker = spawn([retain_bin, "0", "0", "0", LEAK_KIB_PER_S])
    truth = Mallinfo(leaker)
    t0 = time.monotonic()
    rep = _hunt(tmp_path, "both", stager.pid, leaker.pid)
    t1 = time.monotonic()
    assert rep["verdict"] == "leak", rep["verdict_reason"]
    by_pid = {c["pid"]: c for c in rep["culprits"]}
    assert by_pid[stager.pid]["kind"] == "allocator-retention", rep["culprits"]
    live = by_pid[leaker.pid]
    assert live["kind"] == "malloc-heap", rep["culprits"]
    in_use = truth.mb_per_min(3, t0 + 5, t1)  # its own mallinfo2() uordblks
    assert in_use == pytest.approx(LEAK_KIB_PER_S * 60 / 1024 * 272 / 256, rel=0.2)  # the fixture kept its pace
    assert live["live_mb_per_min"] == pytest.approx(in_use, rel=0.10)
    assert live["mb_per_min"] == pytest.approx(in_use, rel=0.15)


@pytest.fixture(scope="module")
def mixed_bin() -> Path:
    lib = build("libretainindex.so", ["retain_index_lib.c"], shared=True)
    return build("malloc_mixed", ["malloc_retain.c"], cflags=["-DKEEP_LIB"],
                 ldflags=["-lpthread", f"-L{lib.parent}", "-lretainindex", f"-Wl,-rpath,{lib.parent}"])


@pytest.mark.bpf
def test_a_live_leak_inside_a_retaining_process_is_named_by_its_library(spawn, mixed_bin, tmp_path):
    """One process: eight staging threads grow malloc's heap with free memory it keeps, and a token index in
    a library of its own keeps what it mallocs. The heap grows several times faster than the leak; the leak
    is the memory in use, named by the caller whose own growth of the heap matches it, and the stagers'
    growth is allocator retention beside it."""
    both = spawn([mixed_bin, *STAGERS[:3], LEAK_KIB_PER_S])
    rep = _hunt(tmp_path, "mixed", both.pid)
    assert rep["verdict"] == "leak", rep["verdict_reason"]
    by_kind = {c["kind"]: c for c in rep["culprits"] if c["pid"] == both.pid}
    leak = by_kind["malloc-heap"]
    assert leak["library"] == "libretainindex.so", rep["culprits"]
    assert rep["culprits"][0] is leak  # the leak first: retention is no leak, whatever its rate
    kept_per_min = LEAK_KIB_PER_S * 60 / 1024 * 272 / 256  # 256-byte entries in 272-byte chunks
    assert leak["live_mb_per_min"] == pytest.approx(kept_per_min, rel=0.10)
    assert leak["mb_per_min"] == pytest.approx(kept_per_min, rel=0.15)
    assert leak["mapped_mb_per_min"] > 2 * leak["mb_per_min"]  # the whole heap's growth, stagers' included
    assert any("libretainindex.so!index_keep" in f for f in leak["stack"]), leak["stack"]
    kept = by_kind["allocator-retention"]
    assert kept["library"] == "malloc_mixed" and kept["retained_mb_per_min"] > 100, rep["culprits"]


@pytest.mark.bpf
def test_first_touch_of_memory_malloc_holds_is_no_leak(spawn, retain_bin, tmp_path):
    # a 256 MiB pool malloc'ed at start, its pages written at 12 MB/min: the RSS grows, nothing held does
    toucher = spawn([retain_bin, "0", "0", "0", "0", "200"])
    truth = Mallinfo(toucher)
    t0 = time.monotonic()
    rep = _hunt(tmp_path, "touch", toucher.pid)
    t1 = time.monotonic()
    assert abs(truth.mb_per_min(3, t0, t1)) < 0.1  # its own books: in use flat
    proc = next(p for p in rep["processes"] if p["pid"] == toucher.pid)
    assert proc["rss_mb_per_min"] > 8.0, proc  # the RSS did grow at about the touch rate
    assert rep["verdict"] == "no-leak", rep["verdict_reason"]
    assert not [c for c in rep["culprits"] if c["pid"] == toucher.pid], rep["culprits"]
    assert "nothing it holds does" in rep["verdict_reason"]
