"""What a hunt spends on real processes: the watcher's full smaps reads only where something moved, the Python
heap walks after the hunt is live and one at a time, and each probe's attach recorded."""

from __future__ import annotations

import os
import sys

import pytest
from conftest import REPO

from leaktrace.analysis.load import python_heap
from leaktrace.hunt import run_hunt
from leaktrace.probes import HuntOptions
from leaktrace.probes.pyheap.probe import PyHeapProbe
from leaktrace.sched import HUNT_NICE
from leaktrace.session import SessionReader

sys.path.insert(0, str(REPO / "tests"))
from fixtures.build import build

PY_TARGET = """
import gc, time
keep = [[i] for i in range(60000)]
gc.freeze()
print("ready", flush=True)
while True:
    time.sleep(0.2)
"""


def test_full_smaps_skipped_where_nothing_moved(spawn, leaker_bin, tmp_path) -> None:
    idle = spawn([build("many_maps", ["many_maps.c"]), "2000"])
    grower = spawn([leaker_bin, "--leak-kib-per-s", "2048"])
    out = tmp_path / "h"
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    run_hunt([idle.pid, grower.pid], HuntOptions(duration=8, interval=0.5, smaps_every=2, bpf=False, gdb=False,
                                                 pyheap=False, live=False), out, write_reports=False)
    rdr = SessionReader(out)
    # its ticks ran at the hunt's priority (tests run as root), and the caller's is back
    assert os.getpriority(os.PRIO_PROCESS, 0) == nice
    if os.geteuid() == 0 and nice > HUNT_NICE:
        assert rdr.meta["scheduling"]["nice"] == HUNT_NICE, rdr.meta["scheduling"]
    reads = rdr.table("class_usage").groupby("pid")["t"].nunique()
    summary = rdr.meta["probe_summaries"]["watcher"]
    assert summary["smaps_skipped"] >= 2, summary
    # the idle process: its first read, at most one more (FULL_SMAPS_MAX_SKIPS) and the last one at stop;
    # the growing one at every due time
    assert reads[idle.pid] <= 3 and reads[grower.pid] >= 5, reads.to_dict()
    ev = rdr.table("region_events")
    grown = ev[(ev["pid"] == grower.pid) & ev["event"].isin(["grown", "born"])]
    assert len(grown) >= 3, ev[ev["pid"] == grower.pid][["t", "event", "size"]]
    assert not (ev["pid"] == idle.pid).any(), ev[ev["pid"] == idle.pid]
    # rollups: the idle process's statm did not move, its figures reused (re-read every ROLLUP_MAX_SKIPS
    # ticks); the grower's moved every tick: read, or carried forward by statm, its RSS new every tick
    from leaktrace.probes.watcher import ROLLUP_MAX_SKIPS

    ro = rdr.table("rollup")
    ticks = ro.groupby("pid")["t"].nunique()
    assert summary["rollups_skipped"] >= ticks[idle.pid] - 2 - ticks[idle.pid] // ROLLUP_MAX_SKIPS, summary
    grower_rss = ro[ro["pid"] == grower.pid]["rss"]
    assert grower_rss.nunique() >= len(grower_rss) - 2, list(grower_rss)
    attach = rdr.meta["probe_attach_s"]
    assert set(attach) == set(rdr.meta["probes"]) and all(v >= 0 for v in attach.values()), attach


def test_no_full_read_in_the_window_last_tick(spawn, leaker_bin, tmp_path) -> None:
    """The stop reads every process in full: the ticks within one interval of the window's end do not (a full
    read there waits behind the target's mmap/munmap and only makes the end later)."""
    grower = spawn([leaker_bin, "--leak-kib-per-s", "4096"])
    out = tmp_path / "h"
    run_hunt([grower.pid], HuntOptions(duration=4, interval=0.5, smaps_every=1, bpf=False, gdb=False,
                                       pyheap=False, live=False), out, write_reports=False)
    rdr = SessionReader(out)
    window_end = float(rdr.meta["attach_s"]) + 4
    reads = sorted(rdr.table("class_usage").groupby("t").size().index)
    # a full read at every tick before, as it grew 2 MiB a tick; after the window's end only the stop's
    assert len(reads) >= 5, reads
    assert len([t for t in reads if t >= window_end]) == 1, (window_end, reads)


def test_heap_walks_after_attach_one_at_a_time(spawn, tmp_path) -> None:
    targets = [spawn([sys.executable, "-c", PY_TARGET]) for _ in range(3)]
    out = tmp_path / "h"
    run_hunt([t.pid for t in targets], HuntOptions(duration=8, interval=0.5, bpf=False, gdb=False, live=False),
             out, write_reports=False)
    rdr = SessionReader(out)
    attach = float(rdr.meta["attach_s"])
    ph = rdr.table("pyheap")
    walks = ph[ph["walk_ms"].notna()].sort_values("t")
    # walks of the targets only, each walk's frozen set the target's own (the stop walks a process the hunt did
    # not walk only within the walks' CPU share: test_stop_walks_again_the_growing_processes_walked_in_the_hunt)
    assert len(walks) and set(walks["pid"]) <= {t.pid for t in targets}, walks[["t", "pid"]]
    assert (walks["frozen"] >= 60000).all(), walks[["t", "pid", "frozen"]]
    starts = walks["t"] - walks["walk_ms"] / 2000  # t: the middle of the walk
    assert (starts >= attach).all(), (attach, list(starts))
    ends = walks["t"] + walks["walk_ms"] / 2000
    # one walk at a time: none starts before the one before it ended (10 ms of stamping slack)
    assert all(s >= e - 0.01 for s, e in zip(starts.iloc[1:], ends.iloc[:-1], strict=True)), walks[["t", "walk_ms"]]


PY_GROWING = """
import gc, time
keep = [[i] for i in range(60000)]
gc.freeze()
grown = []
print("ready", flush=True)
while True:
    grown.append([bytearray(65536) for _ in range(8)])  # 2 MiB/s of objects and anonymous memory
    time.sleep(0.25)
"""


@pytest.mark.parametrize("growing", [True, False], ids=["growing", "flat"])
def test_stop_walks_again_the_growing_processes_walked_in_the_hunt(spawn, tmp_path, monkeypatch, growing) -> None:
    """At stop a process walked during the hunt is walked again (its frozen set kept: the young lists only),
    the second point its growth needs, when its memory grew; a flat one, and one the hunt never walked, get
    their counters once the walks have had their CPU share (objects counted again where nothing grew explain
    no growth; one point shows none, and a vLLM process's frozen set is ~0.7 s of CPU)."""
    # after the first walk the next waits minutes, and the share is spent
    monkeypatch.setattr(PyHeapProbe, "TOTAL_WALK_DUTY", 1e-4)
    first = spawn([sys.executable, "-c", PY_GROWING if growing else PY_TARGET])
    targets = [first]
    while len(targets) < 3:  # the hunt walks the lowest pid first: the others above it (pids wrap at pid_max)
        other = spawn([sys.executable, "-c", PY_TARGET])
        if other.pid > first.pid:
            targets.append(other)
    out = tmp_path / "h"
    run_hunt([t.pid for t in targets], HuntOptions(duration=10, interval=0.5, bpf=False, gdb=False, live=False),
             out, write_reports=False)
    rdr = SessionReader(out)
    window_end = float(rdr.meta["attach_s"]) + 10
    ph = rdr.table("pyheap")
    walks = ph[ph["walk_ms"].notna()].sort_values("t")
    assert walks["pid"].nunique() == 1 and walks["t"].iloc[0] < window_end, walks[["t", "pid", "walk_ms"]]
    walked = int(walks["pid"].iloc[0])
    assert walked == first.pid, (walked, [t.pid for t in targets])  # the first target: walked longest ago
    heap = python_heap(rdr)
    assert heap[walked]["heap_frozen"] is True, heap[walked]
    if growing:
        assert len(walks) == 2 and walks["t"].iloc[1] > window_end, (window_end, list(walks["t"]))
        assert walks["frozen"].iloc[0] == walks["frozen"].iloc[1] >= 60000, walks[["t", "frozen"]]
    else:
        assert len(walks) == 1, walks[["t", "pid", "walk_ms"]]
        rows = ph[ph["pid"] == walked]
        assert rows["t"].max() > window_end and rows["gen2_count"].notna().all(), rows  # its counters to the end
    for t in targets:
        if t.pid != walked:
            rows = ph[ph["pid"] == t.pid]
            # read to the end (the stop's counters), never walked: the frozen set not counted, not said empty
            assert rows["t"].max() > window_end and rows["gen2_count"].notna().all(), rows
            assert rows["frozen"].isna().all() and heap[t.pid]["heap_frozen"] is None, heap[t.pid]


def test_compact_smaps_parser_without_vmflags_and_on_garbage() -> None:
    """The searches by literal prefix need the VmFlags line that ends each mapping; without it (older
    kernels) the line loop gives the same mappings, and a malformed file is refused, not misread."""
    from leaktrace import procfs

    text = (REPO / "tests" / "data" / "proc" / "python.smaps").read_text()
    want = [(m.start, m.end, m.perms, m.path, m.rss, m.anonymous) for m in procfs.parse_smaps(text)]
    assert procfs.parse_smaps_compact(text) == want
    no_flags = "\n".join(line for line in text.split("\n") if not line.startswith("VmFlags:"))
    assert procfs.parse_smaps_compact(no_flags) == want
    with pytest.raises(procfs.ParseError):
        procfs.parse_smaps_compact("garbage without a header\n")
