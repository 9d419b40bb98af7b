"""The eBPF probe under a stream of ring-buffer events faster than Python can apply them: the hunt's tick
(watcher, ledger snapshots, metrics) must keep its pace, so drains are bounded: an unbounded
ring_buffer_consume() lasts as long as the stream does, and every tick waits behind it for the rest of the
hunt (a long gap in the watcher makes a leak rate several times too high)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import is_root, run_cli
from fixtures.build import build

from leaktrace.session import SessionReader

pytestmark = [pytest.mark.bpf, pytest.mark.skipif(not is_root(), reason="BPF needs root")]
HUNT_S = 20


def test_tick_keeps_its_pace_under_an_event_stream(spawn, tmp_path):
    target = spawn([build("brk_stream", ["brk_stream.c"])])
    r = run_cli("hunt", "--pid", target.pid, "--duration", str(HUNT_S), "--no-gdb", "--format", "json",
                "--out", tmp_path / "s")
    assert r.returncode == 0, r.stderr
    reader = SessionReader(tmp_path / "s")
    counters = reader.table("bpf_counters")
    # The stream really was there: hundreds of thousands of brk events reached user space.
    assert int(counters["syscalls"].max()) > 200_000, counters.tail(1).to_dict("records")
    # 1 s ticks. A drain that waits for the stream to end blocks the ticks for the rest of the hunt (the
    # stream runs all through it): the bound is a quarter of the hunt, so a tick delayed by a busy machine
    # (the stream and the hunt share its two cores) is no failure, a tick waiting behind the stream is.
    bound = HUNT_S / 4
    t = np.sort(reader.table("rollup")["t"].to_numpy())
    gaps = np.diff(t)
    assert len(t) >= HUNT_S / 2 and gaps.max() < bound, gaps
    # ... and so are the eBPF probe's snapshots in the ticks. The last row is the stop's, written once the ring
    # has been drained of all it held at stop (up to ~280,000 records: seconds with this stream).
    assert np.diff(np.sort(counters["t"].to_numpy())[:-1]).max() < bound
