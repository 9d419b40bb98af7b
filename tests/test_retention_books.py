"""glibc malloc's books as the analysis reads them (analysis/retention.books): what a program keeps is the floor
of what it has in use, and the reads of one moment (the last tick's and the stop's, milliseconds apart) count
once, so a batch of temporary buffers caught by both at the window's end is not read as growth. Real
processes' books are read in tests/test_malloc_state.py; these series are built from a stager's and a
leaker's pattern, each with its truth."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from leaktrace.analysis.candidates import Candidate
from leaktrace.analysis.retention import books, recognise
from leaktrace.session import SessionReader, SessionWriter

MB = 1 << 20
KEPT_MB_PER_MIN = 236.0  # free memory a stager's growing batches leave malloc keeping
BATCH_MB_PER_S = 1.0  # the temporaries a read catches grow with the batches


def _books(tmp_path: Path, leak_mb_per_min: float, caught: set[int]) -> dict:
    """Reads every 3 s over 31 s, then the stop's 10 ms after the last tick's: in use grows at
    ``leak_mb_per_min``, free memory kept at KEPT_MB_PER_MIN; the reads numbered in ``caught`` land while a
    batch of temporaries is held (a moment's batch: the stop's read catches what the last tick's did)."""
    t = [*np.arange(0.4, 33, 3.0)]
    t.append(t[-1] + 0.01)
    jitter = np.random.default_rng(len(caught)).normal(0, 0.2 * MB, (len(t), 2))  # a real heap's small churn
    w = SessionWriter(tmp_path / "s")
    for i, x in enumerate(t):
        held = int(4 * MB + leak_mb_per_min * MB / 60 * x + jitter[i, 0])
        free = int(150 * MB + KEPT_MB_PER_MIN * MB / 60 * x + jitter[i, 1])
        batch = int(BATCH_MB_PER_S * MB * x) if i in caught or (i == len(t) - 1 and i - 1 in caught) else 0
        w.append("malloc_state", {"t": x, "pid": 7, "complete": True, "arenas": 9, "arena": held + free,
                                  "uordblks": held + batch, "hblkhd": 0, "fordblks": free - batch})
    w.close()
    return books(SessionReader(tmp_path / "s"))[7]


@pytest.mark.parametrize("caught", [set(), {5}, {10, 11}, {4, 10, 11}])
def test_a_stager_caught_holding_its_batches_keeps_nothing_more(tmp_path, caught):
    b = _books(tmp_path, 0.0, caught)
    assert b["reads"] == 11  # the stop's read and the last tick's are one moment
    assert abs(b["live"].mb_per_min) < 1.0, (caught, b["live"])
    assert b["retained"].mb_per_min == pytest.approx(KEPT_MB_PER_MIN, rel=0.05)


@pytest.mark.parametrize("caught", [set(), {5}, {10, 11}])
def test_a_leak_under_the_batches_keeps_its_rate(tmp_path, caught):
    b = _books(tmp_path, 30.0, caught)
    assert b["live"].mb_per_min == pytest.approx(30.0, rel=0.1), (caught, b["live"])
    assert b["retained"].mb_per_min == pytest.approx(KEPT_MB_PER_MIN, rel=0.05)


@pytest.mark.parametrize("written", [0.0, 1.0])
def test_arenas_committed_past_what_malloc_holds_are_no_leak(tmp_path, written):
    """A churner's heap: the ledger sees its arenas committed further (2 MB/min of address space: mprotect
    reaches each new high-water mark) while malloc's books hold still. Unwritten, that growth is no leak
    (left out, with a warning); written, it is what a leak looks like to the ledger and stays a candidate."""
    w = SessionWriter(tmp_path / "s")
    for x in np.arange(0.5, 31.0, 1.0):
        grown = int(2.0 * MB / 60 * x)
        w.append("ledger_snapshots", {"t": float(x), "pid": 7, "library": "verdicts", "kind": "heap",
                                      "outstanding_bytes": grown, "regions": 1, "resident_bytes": int(written * grown)})
        if int(x) % 3 == 0:
            w.append("malloc_state", {"t": float(x), "pid": 7, "complete": True, "arenas": 2, "arena": 16 * MB,
                                      "uordblks": 6 * MB, "hblkhd": 0, "fordblks": 10 * MB})
    w.close()
    c = Candidate(kind="malloc-heap", pid=7, mb_per_min=2.0, source="ledger", library="verdicts",
                  outstanding_bytes=MB)
    warnings: list[str] = []
    kept = recognise(SessionReader(tmp_path / "s"), [c], warnings=warnings)
    if written:
        assert kept == [c] and not warnings
    else:
        assert kept == [] and "arenas committed past what they hold" in warnings[0], warnings


def test_a_leak_read_mostly_at_its_troughs_keeps_its_rate(tmp_path):
    """Most reads find the stagers idle and a few catch a batch of hundreds of MB: the troughs are most of
    the series, their own noise its median excess, and every one of them is what the program keeps."""
    rng = np.random.default_rng(7)
    t = np.arange(0.5, 52.0, 3.0)
    caught = {0, 3, 4, 6, 11, 14, 16, 17}
    w = SessionWriter(tmp_path / "s")
    for i, x in enumerate(t):
        held = int(10 * MB + 30.0 * MB / 60 * x + rng.normal(0, 0.05 * MB))
        batch = int(rng.uniform(150, 270) * MB) if i in caught else 0
        w.append("malloc_state", {"t": float(x), "pid": 7, "complete": True, "arenas": 9, "arena": 1700 * MB,
                                  "uordblks": held + batch, "hblkhd": 0, "fordblks": 1700 * MB - held - batch})
    w.close()
    live = books(SessionReader(tmp_path / "s"))[7]["live"]
    assert live.mb_per_min == pytest.approx(30.0, rel=0.05), live
    assert live.lower_mb_per_min > 25.0, live
