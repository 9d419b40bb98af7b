"""The eBPF probe on the real kernel and real processes (root, BCC). Each test checks the ledger's
exact byte counts against the fixture's ground truth and against /proc/PID/maps or smaps."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fixtures.bpf_harness import PAGE, Driver, Traced, bpf_lib, is_root, maps_ranges, smaps_sizes

from leaktrace.analysis.ledger import ledger_summary, native_culprits
from leaktrace.analysis.resident import pagemap_share

pytestmark = [pytest.mark.bpf, pytest.mark.skipif(not is_root(), reason="BPF needs root")]


@pytest.fixture
def driver():
    d = Driver()
    yield d
    d.close()


def traced_regions(reader, pid: int, library: str | None = None, kind: str = "anon"):
    reg = reader.table("ledger_regions")
    reg = reg[(reg["pid"] == pid) & ~reg["preexisting"].astype(bool) & (reg["kind"] == kind)]
    if library is not None:
        reg = reg[reg["library"] == library]
    return reg


def assert_smaps_agrees(pid: int, reg) -> None:
    """Ledger total of traced anonymous mappings vs /proc/PID/smaps over the same ranges (within 1%)."""
    ranges = [(int(r.start), int(r.end)) for r in reg.itertuples()]
    ledger_total = int(reg["size"].sum())
    proc_total = smaps_sizes(pid, ranges)
    assert abs(ledger_total - proc_total) <= 0.01 * max(ledger_total, 1), (ledger_total, proc_total)


def fault_unit(size: int) -> int:
    """The bytes one write fault makes resident in an anonymous region of ``size``: a page, or the largest
    transparent huge page folio enabled always (mTHP sizes) that fits."""
    thp = Path("/sys/kernel/mm/transparent_hugepage")
    top_always = "[always]" in (thp / "enabled").read_text() if (thp / "enabled").exists() else False
    unit = PAGE
    for d in thp.glob("hugepages-*kB"):
        if not (d / "enabled").is_file():  # a size for shmem only
            continue
        mode = (d / "enabled").read_text()
        n = int(d.name[len("hugepages-"):-2]) * 1024
        if n <= size and ("[always]" in mode or ("[inherit]" in mode and top_always)):
            unit = max(unit, n)
    return unit


def test_stripped_library_raw_syscalls_exact(tmp_path, driver) -> None:
    lib = bpf_lib()
    assert b".symtab" not in lib.read_bytes(), "fixture library must be stripped"
    tr = Traced(tmp_path / "s", [driver.pid])
    rounds, count, size = 8, 6, 256 * 1024
    for _ in range(rounds):
        driver.cmd(f"leak {count} {size}")
        driver.cmd("churn 300 8192")  # balanced noise, settled in the kernel
        time.sleep(0.25)
        tr.tick()
    reader = tr.stop()
    truth = rounds * count * size
    mine = traced_regions(reader, driver.pid, "libbpfleak.so")
    assert int(mine["size"].sum()) == truth
    assert len(mine) == rounds * count
    assert_smaps_agrees(driver.pid, traced_regions(reader, driver.pid))
    summary = ledger_summary(reader)
    assert summary["lost_events"] == 0
    assert summary["events"] >= rounds * (count + 600)
    assert summary["settled_in_kernel"] >= rounds * 300
    snaps = reader.table("ledger_snapshots")
    last = snaps[(snaps["t"] == snaps["t"].max()) & (snaps["library"] == "libbpfleak.so")]
    assert int(last[last["kind"] == "anon"]["outstanding_bytes"].sum()) == truth
    # Resident: lt_leak writes one byte of each region, so one page (one folio) of each is in RAM, the
    # rest only mapped — read from pagemap each tick and for each region at stop.
    unit = fault_unit(size)
    assert int(last[last["kind"] == "anon"]["resident_bytes"].sum()) == rounds * count * unit
    assert (mine["resident"] == unit).all(), mine["resident"].tolist()
    assert snaps.loc[snaps["library"] == "libbpfleak.so", "resident_bytes"].notna().all()
    assert pagemap_share(snaps, driver.pid, "libbpfleak.so", "anon")[0] == pytest.approx(unit / size)
    culprits = [c for c in native_culprits(reader) if c["kind"] == "native-mmap"]
    assert culprits and culprits[0]["library"] == "libbpfleak.so" and culprits[0]["pid"] == driver.pid
    assert culprits[0]["outstanding_bytes"] == truth
    assert culprits[0]["mb_per_min"] > 0
    assert any("libbpfleak.so!lt_map" in f for f in culprits[0]["stack"]), culprits[0]["stack"]
    # One stack per call site, not per call.
    assert reader.table("bpf_counters")["stacks"].max() <= 10


def test_shapes_match_proc_maps(tmp_path, driver) -> None:
    tr = Traced(tmp_path / "s", [driver.pid])
    base, base_end, moved, moved_end = driver.cmd("shapes")
    tr.tick()
    # Compare while the process is alive: the ledger's view of both ranges equals /proc/PID/maps.
    with tr.probe.lock:
        space = tr.probe.ledger.space(driver.pid)
        kernel = tr.probe.kernel.regions().get(driver.pid, [])
        pieces = sorted([(iv.start, iv.end) for iv in space if not iv.origin.preexisting]
                        + [(a, b) for a, b, _s, _v in kernel])
        heap_start, heap_end = space.heap_start, space.heap_end
    merged: list[tuple[int, int]] = []
    for a, b in pieces:
        if merged and merged[-1][1] == a:
            merged[-1] = (merged[-1][0], b)
        else:
            merged.append((a, b))
    for lo, hi in ((base, base_end), (moved, moved_end)):
        want = maps_ranges(driver.pid, lo, hi)
        got = [(max(a, lo), min(b, hi)) for a, b in merged if a < hi and b > lo]
        assert got == want, (hex(lo), [(hex(a), hex(b)) for a, b in got], [(hex(a), hex(b)) for a, b in want])
    # 64 pages: -2 head, -2 tail, -3 middle, -10 hole, mremap 4->12 pages, 4->1 shrink, -5 spanning
    pages = {p for a, b in merged for p in range(a // PAGE, b // PAGE)
             if base <= p * PAGE < base_end or moved <= p * PAGE < moved_end}
    assert len(pages) == 47
    heap = maps_ranges(driver.pid, heap_start, heap_end + 64 * PAGE)
    assert heap and heap[-1][1] == heap_end
    reader = tr.stop()
    heap_rows = traced_regions(reader, driver.pid, "libbpfleak.so", kind="heap")
    assert int(heap_rows["size"].sum()) == 33 * PAGE
    ev = reader.table("bpf_events")
    assert set(ev["type"]) >= {"munmap", "mremap", "mmap", "brk"}
    assert ledger_summary(reader)["lost_events"] == 0
    assert_smaps_agrees(driver.pid, traced_regions(reader, driver.pid))


def test_balanced_churn_is_flat(tmp_path, driver) -> None:
    tr = Traced(tmp_path / "s", [driver.pid])
    for _ in range(10):
        driver.cmd("churn 3000 65536")
        time.sleep(0.1)
        tr.tick()
    reader = tr.stop()
    snaps = reader.table("ledger_snapshots")
    lib = snaps[(snaps["library"] == "libbpfleak.so") & (snaps["kind"] == "anon")] if not snaps.empty else snaps
    # Snapshots list only what is outstanding: every churned region was unmapped before its tick.
    assert lib.empty, lib
    assert not [c for c in native_culprits(reader) if c["library"] == "libbpfleak.so"]
    summary = ledger_summary(reader)
    assert summary["settled_in_kernel"] >= 30000 and summary["lost_events"] == 0
    assert summary["slow_events"] < 100  # exact unmaps never leave the kernel
    assert_smaps_agrees(driver.pid, traced_regions(reader, driver.pid))


def test_stop_while_the_target_keeps_mapping_leaves_nothing_half_applied(tmp_path, driver) -> None:
    """The target maps 3 pages (a region the kernel keeps) and unmaps 2 of them (events, not exact), ~5,000
    times a second, right through the probe's stop: the final ledger must hold one page per 2 traced unmaps,
    plus at most the call in flight when tracing ended. The stop untargets every process before its last
    drain: with the targets still traced, the kernel's regions (read at the final snapshot) run ahead of the
    events drained, and a stop thread that loses its core between the two counts regions whose unmaps are
    still in the ring."""
    tr = Traced(tmp_path / "s", [driver.pid])
    driver.p.stdin.write("pairs 3000\n")  # type: ignore[union-attr]
    driver.p.stdin.flush()  # type: ignore[union-attr]
    time.sleep(1.5)
    tr.tick()
    final_snapshot = tr.probe._snapshot

    def preempted() -> None:  # the stop's thread loses its core between the drain and the snapshot
        time.sleep(0.3)
        final_snapshot()

    tr.probe._snapshot = preempted
    reader = tr.stop()
    reply = driver.p.stdout.readline().split()  # type: ignore[union-attr]
    assert reply[0] == "ok" and int(reply[1]) > 3000, reply  # still mapping when the probe stopped
    assert ledger_summary(reader)["lost_events"] == 0
    ev = reader.table("bpf_events")
    munmaps = int(((ev["pid"] == driver.pid) & (ev["type"] == "munmap")).sum())
    held = int(traced_regions(reader, driver.pid, "libbpfleak.so")["size"].sum())
    assert munmaps > 2000 and 0 <= held - PAGE * munmaps // 2 <= 3 * PAGE, (held, munmaps)


def test_stop_applies_everything_the_ring_held(tmp_path, driver, monkeypatch) -> None:
    """At stop every record the ring held is applied before the ledger is written, however long the
    drain takes (under load a hunt can stop with munmap events still in the ring).
    Small batches: the ring still empties."""
    from leaktrace.probes import HuntContext, HuntOptions, TargetSet
    from leaktrace.probes.bpf import probe as bpf_probe
    from leaktrace.session import SessionReader, SessionWriter

    monkeypatch.setattr(bpf_probe, "MAX_BATCH", 64)
    session = SessionWriter(tmp_path / "s", meta={"target": {"pids": [driver.pid]}})
    ctx = HuntContext(session, TargetSet(roots=[driver.pid], pids={driver.pid: 0}), HuntOptions(), lambda s: None)
    probe = bpf_probe.BpfProbe(poll_interval=3600)  # nothing drained before the stop
    probe.start(ctx)
    count = 600
    first = driver.cmd("brk 0")[0]  # the heap's end before (brk events: slow path, through the ring)
    for _ in range(count):
        driver.cmd("brk 4096")
    probe.stop()
    session.close()
    reader = SessionReader(tmp_path / "s")
    assert ledger_summary(reader)["lost_events"] == 0
    ev = reader.table("bpf_events")
    grows = ev[(ev["pid"] == driver.pid) & (ev["type"] == "brk") & (ev["result"] > first)]
    assert len(grows) == count, len(grows)  # every one applied, none left in the ring
    snaps = reader.table("ledger_snapshots")
    heap = snaps[(snaps["pid"] == driver.pid) & (snaps["kind"] == "heap")]
    assert int(heap[heap["t"] == heap["t"].max()]["outstanding_bytes"].sum()) == count * 4096, heap.tail(3)


def test_child_added_before_its_fork_event_keeps_what_it_mapped(tmp_path, driver) -> None:
    """A child the hunt's process tree names before the ring's FORK event is applied is seeded then (its
    kernel-owned regions taken into the ledger with their call sites); the FORK applied afterwards must not
    seed it again: a second seed would mark those regions pre-existing, and the child's leak would lose them."""
    count, size = 6, 1 << 20
    tr = Traced(tmp_path / "s", [driver.pid], poll_interval=3600.0)  # only ticks drain the ring
    tr.tick()
    (child,) = driver.cmd(f"forkleak {count} {size} 20")
    assert driver.cmd("forkwait") == [count]
    tr.probe.add_pid(child)  # as a tick does for a child the process tree shows: its FORK is still in the ring
    tr.tick()
    reader = tr.stop()
    mine = traced_regions(reader, child, "libbpfleak.so")
    assert int(mine["size"].sum()) == count * size and len(mine) == count, mine
    snaps = reader.table("ledger_snapshots")
    last = snaps[(snaps["pid"] == child) & (snaps["t"] == snaps["t"].max()) & (snaps["library"] == "libbpfleak.so")]
    assert int(last["outstanding_bytes"].sum()) == count * size, last
