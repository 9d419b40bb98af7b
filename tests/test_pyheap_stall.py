"""The pyheap walks never starve the hunt: they run in the walker process, not in the hunt's interpreter
(a walk of a vLLM process takes 3-49 s under load and, holding the GIL there, would stall the tick thread
for as long and let the eBPF ring overflow). Real processes: a Python target with ~700k GC-tracked objects,
a busy loop on every CPU, a real hunt."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from conftest import LEAKTRACE, REPO, wait_for

from leaktrace.hunt import run_hunt
from leaktrace.probes import HuntOptions
from leaktrace.probes.pyheap.client import WalkerGone, WalkerProcess
from leaktrace.probes.pyheap.interpreter import Interpreter, locate
from leaktrace.probes.pyheap.probe import PyHeapProbe
from leaktrace.session import SessionReader

BIG = """
import gc, time
keep = [[i] for i in range(600000)]  # lists: always GC-tracked
gc.freeze()
live = [(i, [i]) for i in range(50000)]
print("ready", gc.get_freeze_count(), flush=True)
i = 0
while True:  # busy: the young generations change under the walks
    live[i % len(live)] = (i, [i])
    i += 1
    if i % 20000 == 0:
        time.sleep(0.01)
"""
INTERVAL = 1.0
SLACK_S = 1.5  # a loaded 2-core CI machine delays a sleeping thread's wake-up by this much at worst


def _walkers(parent: int) -> list[int]:
    """Processes whose parent is ``parent`` running the pyheap walker."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == parent and b"pyheap.worker" in cmd:
            out.append(int(d))
    return out


def test_ticks_not_starved_by_walks(spawn, tmp_path, monkeypatch) -> None:
    p = spawn([sys.executable, "-c", BIG])
    for _ in range(os.cpu_count() or 2):  # every CPU kept busy, as CI's other jobs keep them
        spawn([sys.executable, "-c", "while True: pass"], ready=None)
    # walks back to back (at most every 1 s): the worst case for the ticks, as one long walk is
    monkeypatch.setattr(PyHeapProbe, "MIN_WALK_GAP_S", 1.0)
    monkeypatch.setattr(PyHeapProbe, "WALK_DUTY", 1.0)
    monkeypatch.setattr(PyHeapProbe, "TOTAL_WALK_DUTY", 1.0)  # and at stop, within the share: walked again
    ticks: list[float] = []
    # a thread waking every 50 ms, as the eBPF ring's consumer does (bpf-poll; the hunt runs without eBPF
    # here: no compile under this load): how late it woke while the hunt ticked
    woke: list[tuple[float, float]] = []
    done = threading.Event()

    def poll() -> None:
        nxt = time.monotonic() + 0.05
        while not done.is_set():
            time.sleep(max(0.0, nxt - time.monotonic()))
            now = time.monotonic()
            woke.append((now, now - nxt))
            nxt = max(nxt + 0.05, now)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    out = tmp_path / "h"
    opts = HuntOptions(duration=20, interval=INTERVAL, bpf=False, gdb=False, pyheap=True, live=False)
    span: list[float] = []
    try:
        run_hunt([p.pid], opts, out, write_reports=False,
                 on_tick=lambda _ctx, now: (ticks.append(now), span.append(time.monotonic())))
    finally:
        done.set()
        poller.join()
    gaps = [b - a for a, b in zip(ticks, ticks[1:], strict=False)]
    assert len(ticks) >= 18 and max(gaps) <= 2 * INTERVAL + SLACK_S, [round(g, 2) for g in gaps]
    late = [x for t, x in woke if span[0] <= t <= span[-1]]
    assert max(late) <= 2 * INTERVAL + SLACK_S, sorted(late)[-5:]
    rdr = SessionReader(out)
    ph = rdr.table("pyheap")
    walked = ph[ph["walk_ms"].notna()]
    assert len(walked) >= 2, ph[["t", "frozen", "tracked", "walk_ms"]]  # after attach, at stop: a niced walk is slow
    assert (walked["frozen"] >= 600_000).all(), walked[["t", "frozen"]]
    types = rdr.table("pyheap_types")
    lists = types[(types["pid"] == p.pid) & (types["type"] == "list")]
    # every walk typed the frozen lists (kept from the first walk of the set while it did not move)
    assert len(lists) >= 2 and (lists["frozen"] >= 600_000).all(), lists
    assert (types[types["type"] == "tuple"]["count"] > 0).any()
    assert not _walkers(os.getpid())  # the walker process ended with the hunt


def test_walker_dies_with_a_killed_hunt(spawn, tmp_path) -> None:
    p = spawn([sys.executable, "-c", BIG])
    hunt = subprocess.Popen([*LEAKTRACE, "hunt", "--pid", str(p.pid), "--duration", "120", "--no-bpf", "--no-gdb",
                             "--out", str(tmp_path / "h")], cwd=str(REPO), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: _walkers(hunt.pid), timeout=60), "no walker process started"
        walker = _walkers(hunt.pid)[0]
        time.sleep(1.0)
        hunt.send_signal(signal.SIGKILL)
        hunt.wait(timeout=10)
        # PR_SET_PDEATHSIG: gone with the hunt, even mid-walk (re-parented, then killed)
        assert wait_for(lambda: not os.path.exists(f"/proc/{walker}") or _zombie(walker), timeout=10)
    finally:
        if hunt.poll() is None:
            hunt.kill()
            hunt.wait()


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_cancel_ends_the_walk_and_keeps_the_frozen_set(spawn) -> None:
    """The hunt's stop cancels a walk under way (its answer would be dropped, and the stop's own walks would
    queue behind it for its whole budget); the worker and its walk of each frozen set stay for those."""
    p = spawn([sys.executable, "-c", BIG.replace("600000", "1500000")])
    where = locate(p.pid)
    assert isinstance(where, Interpreter), where
    w = WalkerProcess()
    try:
        first = w.walk(p.pid, where, budget=60)
        assert first["frozen"] >= 1_500_000 and first["frozen_walked"] is True, first
        given_up = threading.Event()
        threading.Timer(0.05, given_up.set).start()
        with pytest.raises(WalkerGone):  # the frozen set walked again: 1.5M objects, ~1 s at least
            w.walk(p.pid, where, budget=60, stop=given_up, frozen_max_age=0)
        assert w.busy()
        starts = w.starts
        w.cancel()
        again = w.walk(p.pid, where, budget=60, frozen_max_age=1e9)
        assert w.dropped is not None and w.dropped["ok"]["frozen"] == -1, w.dropped  # cut short, not finished
        # the same worker, and the frozen set's walk from before the cancelled one kept
        assert w.starts == starts and again["frozen_walked"] is False and again["frozen"] == first["frozen"], again
        assert not w.busy()
    finally:
        w.close()
