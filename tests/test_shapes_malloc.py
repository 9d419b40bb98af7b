"""Malloc-heap growth named by the library that called malloc: the shapes fixture's stripped, frame-pointer-
less libshape.so mallocs and keeps 1000-byte blocks, in the main thread (the brk heap grows) or in four
library threads (glibc arena heaps: PROT_NONE reservations committed by mprotect, no mmap or brk). The
hunt (default flags: eBPF + gdb) must report a malloc-heap culprit in libshape.so, with the heap's growth
since attach and its rate as the fixture's own bookkeeping says; balanced churn must report none."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from conftest import is_root, run_cli
from shapes_helpers import MB, Truth, TruthLog, shape_argv

from leaktrace.session import SessionReader

pytestmark = [pytest.mark.bpf, pytest.mark.skipif(not is_root(), reason="BPF needs root")]
BLOCK = 1000
CHUNK = 1008  # malloc(1000) takes a 1008-byte chunk (8-byte size header, 16-byte alignment)


def _hunt(spawn, shapes_bin: Path, tmp_path: Path, shape: str, kib_per_s: float, *extra: str,
          duration: int = 30, env: dict[str, str] | None = None) -> tuple[dict, TruthLog, Path]:
    truth = tmp_path / "truth"
    target = spawn(shape_argv(shapes_bin, shape, kib_per_s, truth, *extra), env=env)
    Truth.read(truth)
    out = tmp_path / "hunt"
    with TruthLog(truth) as log:
        r = run_cli("hunt", "--pid", target.pid, "--duration", duration, "--out", out)
    assert r.returncode == 0, r.stderr
    return json.loads((out / "report.json").read_text()), log, out


def _check_heap_culprit(rep: dict, log: TruthLog, out: Path, chunk: int = CHUNK) -> None:
    heap = [c for c in rep["culprits"] if c["kind"] == "malloc-heap"]
    assert heap, rep["culprits"]
    top = heap[0]
    assert top["library"] == "libshape.so", top
    # The stack holds the caller of malloc in the stripped library, found by scanning the raw stack.
    assert any(f.startswith("libshape.so") for f in top["stack"]), top["stack"]
    assert any("scanning the raw user stack" in e for e in top["evidence"]), top["evidence"]
    # Outstanding: what the heap grew between the probe's attach and its last snapshot, against the bytes
    # the fixture added meanwhile (in malloc chunks: 1000-byte blocks take 1008 bytes; a page when mmapped).
    meta = json.loads((out / "meta.json").read_text())
    snaps = SessionReader(out).table("ledger_snapshots")
    t_end = float(snaps[snaps["pid"] == top["pid"]]["t"].max())
    t0 = meta["t0_monotonic"]
    grown = (log.held_at(t0 + t_end) - log.held_at(t0 + meta["attach_s"])) * chunk / BLOCK
    assert top["outstanding_bytes"] == pytest.approx(grown, rel=0.05), (top["outstanding_bytes"], grown)
    # Rate: against the fixture's own over the hunt.
    truth_rate = log.mb_per_min(log.samples[0][0], log.samples[-1][0]) * chunk / BLOCK
    assert top["mb_per_min"] == pytest.approx(truth_rate, rel=0.15), (top["mb_per_min"], truth_rate)
    assert truth_rate > 30, "the fixture did not leak as asked"


def test_arena_heap_growth_is_named_by_the_calling_library(spawn, shapes_bin, tmp_path):
    rep, log, out = _hunt(spawn, shapes_bin, tmp_path, "arena", 1024, "--threads", "4")
    _check_heap_culprit(rep, log, out)
    assert rep["ledger"]["lost_events"] == 0


def test_main_heap_growth_is_named_by_the_calling_library(spawn, shapes_bin, tmp_path):
    rep, log, out = _hunt(spawn, shapes_bin, tmp_path, "malloc", 1024)
    _check_heap_culprit(rep, log, out)


def test_mmapped_malloc_chunks_are_named_by_the_calling_library(spawn, shapes_bin, tmp_path):
    """Above the mmap threshold (fixed at 512 bytes here) every malloc is an mmap made by libc: it leaves
    the kernel's fast path with a stack window and counts as malloc-heap of the caller, a page per block;
    the watcher's anonymous growth of the process is the same memory, not a second culprit."""
    rep, log, out = _hunt(spawn, shapes_bin, tmp_path, "malloc", 512, env={"MALLOC_MMAP_THRESHOLD_": "512"})
    _check_heap_culprit(rep, log, out, chunk=4096)
    assert [c["kind"] for c in rep["culprits"]] == ["malloc-heap"], rep["culprits"]
    # gdb samples mmaps: when one went through the caller, its (DWARF) stack is the second opinion
    gdb = [e for e in rep["culprits"][0]["evidence"] if e.startswith("gdb")]
    assert all("libshape.so!shape_malloc_tick" in e for e in gdb), gdb


def test_balanced_churn_has_no_malloc_heap_culprit(spawn, shapes_bin, tmp_path):
    rep, log, _out = _hunt(spawn, shapes_bin, tmp_path, "churn", 0, duration=20)
    assert log.samples[-1][1] == 0
    assert [c for c in rep["culprits"] if c["kind"] == "malloc-heap"] == [], rep["culprits"]
    assert rep["verdict"] == "no-leak", rep["culprits"]
    assert abs(rep["ledger"]["outstanding_bytes"]) < 4 * MB


def test_arenas_born_under_the_probe(tmp_path):
    """Arenas created while traced (tests/fixtures/malloc_rounds.c, 2 threads, first round): the 128 MiB
    PROT_NONE reservations hold nothing, the heap grows by the bytes kept (in 1008-byte chunks, plus at most
    the top chunk's slack per arena), and the thread stacks glibc commits by mprotect too are anonymous
    memory of the code that created the threads, not malloc heap."""
    from fixtures.bpf_harness import Traced
    from fixtures.build import build

    exe = build("malloc_rounds", ["malloc_rounds.c"], ldflags=["-lpthread"])
    work = subprocess.Popen([str(exe), "4000000", "1024", "2"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert work.stdout is not None and work.stdin is not None
        assert work.stdout.readline().startswith("ready")
        traced = Traced(tmp_path / "s", [work.pid])
        work.stdin.write("go\n")
        work.stdin.flush()
        kept = int(work.stdout.readline().split()[2])
        time.sleep(0.3)
        traced.tick()
        reader = traced.stop()
    finally:
        work.kill()
        work.wait()
    snaps = reader.table("ledger_snapshots")
    last = snaps[snaps["t"] == snaps["t"].max()]
    by_kind = last.groupby("kind")["outstanding_bytes"].sum().to_dict()
    assert set(last["library"]) == {"malloc_rounds"}, last
    heap = by_kind.get("heap", 0)
    assert kept * CHUNK / BLOCK <= heap <= kept * CHUNK / BLOCK + 2 * 256 * 1024, (heap, kept)
    # two 8 MiB thread stacks (glibc's default, less the guard page), nothing of the reservations
    assert 2 * 8 * MB - 2 * 64 * 1024 <= by_kind.get("anon", 0) <= 2 * 8 * MB + 2 * 64 * 1024, by_kind
    events = reader.table("bpf_events")
    assert (events["type"] == "mprotect").sum() > 0
