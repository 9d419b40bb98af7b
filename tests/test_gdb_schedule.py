"""Which process gdb samples next (leaktrace/probes/gdb/probe.py): the live figures the watcher and the eBPF
probe publish each tick decide, no process is attached here."""

from __future__ import annotations

from types import SimpleNamespace

from leaktrace.probes import HuntOptions, LiveFigures
from leaktrace.probes.gdb.probe import GROWTH_TRIGGER_BYTES, LEDGER_TRIGGER_BYTES, GdbProbe

MB = 1 << 20


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
    live.bpf = {"outstanding_by_pid": {server: 0, worker: 0, quiet: 0}}
    probe._enqueue_due()  # first figures: nothing grew yet
    assert probe.next_due() is None
    live.rollup = {server: {"rss": 500 * MB + GROWTH_TRIGGER_BYTES, "anon": 100 * MB},
                   worker: {"rss": 505 * MB, "anon": 105 * MB}, quiet: {"rss": 501 * MB, "anon": 100 * MB}}
    live.bpf = {"outstanding_by_pid": {server: 1 * MB, worker: 3 * LEDGER_TRIGGER_BYTES, quiet: 0}}
    probe._enqueue_due()
    assert [probe.next_due(), probe.next_due(), probe.next_due()] == [worker, server, None]


def test_a_process_is_sampled_once() -> None:
    probe, live = _probe([7])
    live.bpf = {"outstanding_by_pid": {7: 0}}
    probe._enqueue_due()
    live.bpf = {"outstanding_by_pid": {7: LEDGER_TRIGGER_BYTES}}
    probe._enqueue_due()
    assert probe.next_due() == 7
    live.bpf = {"outstanding_by_pid": {7: 10 * LEDGER_TRIGGER_BYTES}}
    probe._enqueue_due()
    assert probe.next_due() is None


def test_with_gdb_samples_every_process_is_due_in_order() -> None:
    probe = GdbProbe(HuntOptions(gdb_samples=3))
    probe.ctx = SimpleNamespace(targets=SimpleNamespace(live=lambda: [5, 3, 9]), live=LiveFigures())
    probe._enqueue_due()
    assert [probe.next_due() for _ in range(4)] == [5, 3, 9, None]
