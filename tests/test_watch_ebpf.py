"""The watch's eBPF ledger follows growing processes only, and lets them go: the rule on the watch's
judgements (a probe double that records what it is asked), and a real process untraced by the real probe
(root, BCC): its books forgotten, its later calls never seen, traced again from scratch."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
from fixtures.bpf_harness import Driver, Traced, is_root

from leaktrace.watch.ebpf import WatchLedger

WINDOW_S = 60.0
CHUNK = 256 * 1024


@dataclass
class Tr:
    root: int
    growing: bool = False
    leaking_since: float | None = None
    confirmed: bool = False
    last_grew: float = 0.0
    j: SimpleNamespace = field(default_factory=SimpleNamespace)

    def judged(self, now: float, growing: bool) -> None:
        self.growing = growing
        self.j.growing = growing
        if growing:
            self.last_grew = now


class ProbeDouble:
    def __init__(self) -> None:
        self.added: list[int] = []
        self.removed: list[int] = []

    def add_pid(self, pid: int) -> None:
        self.added.append(pid)

    def remove_pid(self, pid: int) -> bool:
        self.removed.append(pid)
        return True


def test_growing_processes_traced_and_let_go() -> None:
    led = WatchLedger(session=None, options=None, log=lambda s: None)  # type: ignore[arg-type]
    led.probe = probe = ProbeDouble()
    churner, leak, confirmed = Tr(1), Tr(2), Tr(3)
    tracked = {1: churner, 2: leak, 3: confirmed}
    live = {1, 2, 3}

    def tick(now: float, hunted: frozenset[int] = frozenset()) -> None:
        led.follow(tracked, {}, live, set(hunted), now, WINDOW_S)

    for tr in tracked.values():
        tr.judged(0.0, False)
    tick(0.0)
    assert probe.added == [] and not led.traced.pids, "nothing grows: nothing traced"
    for tr in tracked.values():
        tr.judged(10.0, True)
    leak.leaking_since = confirmed.leaking_since = 10.0
    tick(10.0)
    assert sorted(probe.added) == [1, 2, 3] and all(led.holds(p) for p in live)
    churner.judged(20.0, False)  # a moment of growth (at 10 s), then flat
    tick(10.0 + WINDOW_S - 1)
    assert probe.removed == [] and led.holds(1), "let go only after a whole window without growth"
    tick(10.0 + WINDOW_S + 1)
    assert probe.removed == [1] and not led.holds(1)
    # Under confirmation: kept however long; confirmed: kept while its deep hunt runs, then let go for good.
    leak.judged(200.0, False)
    confirmed.confirmed = True
    tick(400.0, hunted=frozenset({3}))
    assert led.holds(2) and led.holds(3) and probe.removed == [1]
    tick(410.0)
    assert probe.removed == [1, 3] and not led.holds(3)
    confirmed.judged(420.0, True)
    tick(420.0)
    assert 3 not in probe.added[3:], "a confirmed leak is not traced again: its deep hunt named it"
    # Growing again: traced again; an exited process leaves the set without an untrace (its exit settled it).
    churner.judged(430.0, True)
    tick(430.0)
    assert probe.added[-1] == 1 and led.holds(1)
    live.discard(1)
    tick(440.0)
    assert not led.holds(1) and probe.removed == [1, 3]
    # A child a traced process forked (the probe adds it from its fork event) is let go a window later.
    live.add(9)
    tracked[9] = Tr(2)
    tracked[9].judged(440.0, False)
    led.traced.pids[9] = 2
    tick(450.0)
    assert led.holds(9)
    tick(450.0 + WINDOW_S)
    assert probe.removed == [1, 3, 9] and not led.holds(9)


@pytest.mark.skipif(not is_root(), reason="BPF needs root")
def test_removed_process_is_forgotten_and_untraced(tmp_path) -> None:
    driver = Driver()
    tr = Traced(tmp_path / "s", [driver.pid])
    pid = driver.pid
    try:
        driver.cmd(f"leak 4 {CHUNK}")
        time.sleep(0.3)
        tr.tick()
        assert tr.ctx.live.bpf["outstanding_by_pid"].get(pid) == 4 * CHUNK
        with tr.targets.lock:
            del tr.targets.pids[pid]  # as the watch's follow() does before untracing
        assert tr.probe.remove_pid(pid)
        assert pid not in tr.probe.ledger.spaces and pid not in tr.probe.kernel.scan()
        calls = tr.probe._mapping_calls()
        driver.cmd(f"leak 3 {CHUNK}")
        driver.cmd("churn 200 8192")
        time.sleep(0.3)
        tr.tick()
        assert tr.probe._mapping_calls() == calls, "an untraced process's calls are not counted"
        assert pid not in tr.probe.ledger.spaces and pid not in tr.probe.kernel.scan()
        assert not tr.ctx.live.bpf["outstanding_by_pid"].get(pid)
        # Traced again: seeded afresh (all it holds is pre-existing), then its new calls counted exactly.
        with tr.targets.lock:
            tr.targets.pids[pid] = 0
        tr.tick()
        driver.cmd(f"leak 2 {CHUNK}")
        driver.cmd("churn 200 8192")
        time.sleep(0.3)
        tr.tick()
        assert tr.ctx.live.bpf["outstanding_by_pid"].get(pid) == 2 * CHUNK
        assert tr.probe._mapping_calls() >= calls + 2 + 200
    finally:
        tr.stop()
        driver.close()
