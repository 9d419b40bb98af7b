"""Which process gdb samples next (leaktrace/probes/gdb/probe.py): the live figures the watcher and the eBPF
probe publish each tick decide, no process is attached here."""

from __future__ import annotations

from types import SimpleNamespace

from leaktrace.probes import HuntOptions, LiveFigures
from leaktrace.probes.gdb.probe import GROWTH_TRIGGER_BYTES, LEDGER_TRIGGER_BYTES, GdbProbe

MB = 1 << 20


def _ledger(since_attach: dict[int, int]) -> dict[str, dict[int, int]]:
    """The eBPF probe's per-process figures for processes that mapped ``since_attach`` on top of 900 MB."""
    return {"outstanding_by_pid": since_attach, "mapped_by_pid": {p: 900 * MB + n for p, n in since_attach.items()}}


def _probe(pids: list[int]) -> tuple[GdbProbe, LiveFigures]:
    probe = GdbProbe(HuntOptions())
    live = LiveFigures()
    probe.ctx = SimpleNamespace(targets=SimpleNamespace(live=lambda: list(pids)), live=live)
    return probe, live


def test_the_process_growing_most_past_its_trigger_is_sampled_first() -> None:
    """An API server and a worker both due at one tick (in a vintage P/D hunt gdb reads the server's symbols
    for ~85 s: served first, the leaking worker's turn would come after the load): the worker, grown
    furthest, goes first."""
    server, worker, quiet = 101, 202, 303
    probe, live = _probe([server, worker, quiet])
    live.rollup = {p: {"rss": 500 * MB, "anon": 100 * MB} for p in (server, worker, quiet)}
    live.bpf = _ledger({server: 0, worker: 0, quiet: 0})
    probe._enqueue_due()  # first figures: nothing grew yet
    assert probe.next_due() is None
    live.rollup = {server: {"rss": 500 * MB + GROWTH_TRIGGER_BYTES, "anon": 100 * MB},
                   worker: {"rss": 505 * MB, "anon": 105 * MB}, quiet: {"rss": 501 * MB, "anon": 100 * MB}}
    live.bpf = _ledger({server: LEDGER_TRIGGER_BYTES * 3 // 2, worker: 3 * LEDGER_TRIGGER_BYTES, quiet: 1 * MB})
    probe._enqueue_due()
    assert [probe.next_due(), probe.next_due(), probe.next_due()] == [worker, server, None]


def test_rss_growth_alone_is_due_only_without_the_ledger() -> None:
    """With the eBPF ledger live, growth it does not hold came without a mapping call: gdb's stacks at those
    calls would be of other work. Without eBPF, RSS growth is what there is."""
    for ledger_live, due in ((True, None), (False, 7)):
        probe, live = _probe([7])
        live.rollup = {7: {"rss": 500 * MB, "anon": 100 * MB}}
        live.bpf = _ledger({7: 0}) if ledger_live else {}
        probe._enqueue_due()
        live.rollup = {7: {"rss": 500 * MB + 4 * GROWTH_TRIGGER_BYTES, "anon": 100 * MB + 4 * GROWTH_TRIGGER_BYTES}}
        probe._enqueue_due()
        assert probe.next_due() == due, ledger_live


def test_a_process_is_sampled_once() -> None:
    probe, live = _probe([7])
    live.bpf = _ledger({7: 0})
    probe._enqueue_due()
    live.bpf = _ledger({7: LEDGER_TRIGGER_BYTES})
    probe._enqueue_due()
    assert probe.next_due() == 7
    live.bpf = _ledger({7: 10 * LEDGER_TRIGGER_BYTES})
    probe._enqueue_due()
    assert probe.next_due() is None


def test_with_gdb_samples_every_process_is_due_in_order() -> None:
    probe = GdbProbe(HuntOptions(gdb_samples=3))
    probe.ctx = SimpleNamespace(targets=SimpleNamespace(live=lambda: [5, 3, 9]), live=LiveFigures())
    probe._enqueue_due()
    assert [probe.next_due() for _ in range(4)] == [5, 3, 9, None]


def _site(pid: int, site: int, n: int, kind: str = "anon") -> dict:
    return {"pid": pid, "site": site, "ip": 0x1000, "kind": kind, "bytes": n, "break_at": site + 0x10,
            "frames": ["libc.so.6!syscall+0x19", "libucm.so.0!ucm_orig_mmap_syscall+0x20", "libucs.so.0+0x3b7bc",
                       "libstdc++.so.6+0x9e1a", "?@0x7f0000001000"]}


def test_a_call_site_that_keeps_growing_makes_its_process_due_with_that_site() -> None:
    """The ledger's top sites, published per tick: a site reaching new highs at 3 ticks (not in a row: a slow
    leak's pool chunks come every few ticks) and holding 1 MiB more makes the process due before the 4 MB
    ledger trigger, and gdb is given that site and its stack's libraries; a site that churns back below its
    first reading (malloc chunks mapped and unmapped) does not."""
    from leaktrace.probes.gdb.probe import SITE_TRIGGER_BYTES, stack_libraries

    leak, churn = 0x7f00_0000_1000, 0x7f00_0000_2000
    probe, live = _probe([7])
    steps = [(0, 4 * MB), (MB // 2, 0), (MB // 2, 4 * MB), (MB, 1 * MB), (SITE_TRIGGER_BYTES + MB // 2, 5 * MB)]
    for i, (grown, churned) in enumerate(steps):
        live.bpf = {**_ledger({7: grown + churned}), "top_sites": [_site(7, leak, grown), _site(7, churn, churned)]}
        probe._enqueue_due()
        due = probe.next_due()
        assert due == (7 if i == len(steps) - 1 else None), (i, due)
    site = probe.growing_site(7)
    assert site is not None and site["site"] == leak and site["break_at"] == leak + 0x10
    assert stack_libraries(site["frames"]) == {"libc.so.6", "libucm.so.0", "libucs.so.0", "libstdc++.so.6"}


def test_a_churner_replacing_what_it_held_at_attach_is_not_due() -> None:
    """A ring of sixteen 256 KiB buffers, each unmapped and mapped again, held at attach: what it mapped since
    attach climbs from 0 to 4 MiB as the ring is replaced (in as many ticks as the first snapshot is late),
    its call site reaching a new high at each, while all the process maps stays flat. Nothing grew."""
    probe, live = _probe([7])
    held_at_attach = 16 * (MB // 4)
    for replaced in range(0, 17, 4):
        since = replaced * (MB // 4)
        live.bpf = {"outstanding_by_pid": {7: since}, "mapped_by_pid": {7: 900 * MB + held_at_attach},
                    "top_sites": [_site(7, 0x5000, since)]}
        probe._enqueue_due()
        assert probe.next_due() is None, replaced
    # the same site going on past the ring, the process's mappings with it: a leak, due
    for extra in (1, 2, 3, 4):
        live.bpf = {"outstanding_by_pid": {7: held_at_attach + extra * MB},
                    "mapped_by_pid": {7: 900 * MB + held_at_attach + extra * MB}, "top_sites": [_site(7, 0x5000, held_at_attach + extra * MB)]}
        probe._enqueue_due()
    assert probe.next_due() == 7


def test_a_heap_site_gives_no_breakpoint() -> None:
    """A heap growth's site is malloc's caller: a breakpoint there would stop at every malloc it makes."""
    probe, live = _probe([7])
    for n in (0, MB, 2 * MB, 3 * MB):
        live.bpf = {**_ledger({7: n}), "top_sites": [_site(7, 0x5000, n, kind="heap")]}
        probe._enqueue_due()
    assert probe.growing_site(7) is None


def test_a_full_symbol_read_that_would_outlast_the_hunt_is_not_started(spawn) -> None:
    """A process due on growth with no growing call site gets a full symbol read (a minute for a vLLM process on
    a loaded node): with less of the hunt left than that read takes, it is not started (the stop would cut it
    before any stack). The estimate is from the sizes of the real process's mapped code files."""
    import os
    import sys

    from leaktrace.probes.gdb import probe as gdb_probe
    from leaktrace.probes.gdb.symbolfiles import symbol_files

    target = spawn([sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"])
    size = sum(os.path.getsize(p) for p, _ in symbol_files(target.pid))
    assert size > 0
    clock = {"now": 100.0}
    probe, _live = _probe([target.pid])
    probe.ctx.session = SimpleNamespace(meta={"attach_s": 10.0}, now=lambda: clock["now"])
    # 60 s hunt from 10 s: at 100 s, no time left at all; at 20 s, 50 s left
    need = size / gdb_probe.FULL_READ_BYTES_PER_S
    why = probe._read_outlasts_hunt(target.pid)
    assert why.startswith("-30 s of the hunt left") and f"{size >> 20} MB" in why, why
    clock["now"] = 20.0
    assert (probe._read_outlasts_hunt(target.pid) == "") == (need <= 50.0), (need, size)
    # a growing call site (its stack's libraries only) and asked-for samples are never held back
    probe._growing = {target.pid: SimpleNamespace(highs=2, entry={"site": 1})}
    clock["now"] = 100.0
    assert probe._read_outlasts_hunt(target.pid) == ""
    asked = GdbProbe(HuntOptions(gdb_samples=3))
    asked.ctx = probe.ctx
    assert asked._read_outlasts_hunt(target.pid) == ""
