"""Where a ledger culprit's resident bytes come from when the probe could not read them at the end: the last
tick that read pagemap (a process whose exit took its pages), else the last full smaps apportioned over its
regions — on recorded-shape tables (the live reads are tested in test_bpf_probe and test_thread_stacks)."""

from __future__ import annotations

import pandas as pd
from test_ledger_held import Tables

from leaktrace.analysis.candidates import Candidate
from leaktrace.analysis.resident import add_figures, pagemap_share, smaps_share

MB = 1 << 20
LIB = "libjournal.so"


def _snaps(resident_at_exit: float | None) -> pd.DataFrame:
    # 10, 20, 30 MB mapped, a quarter resident at each tick; the exit's row (t 40) keeps what it held
    rows = [{"t": t, "pid": 5, "library": LIB, "kind": "anon", "outstanding_bytes": int(m * MB), "regions": 1,
             "resident_bytes": int(m * MB / 4)} for t, m in ((10.0, 10), (20.0, 20), (30.0, 30))]
    rows.append({"t": 40.0, "pid": 5, "library": LIB, "kind": "anon", "outstanding_bytes": 32 * MB, "regions": 1,
                 "resident_bytes": resident_at_exit})
    return pd.DataFrame(rows)


def test_an_exit_takes_the_last_tick_that_read_pagemap():
    share, t = pagemap_share(_snaps(None), 5, LIB, "anon")
    assert (share, t) == (0.25, 30.0)
    assert pagemap_share(_snaps(8 * MB), 5, LIB, "anon") == (0.25, 40.0)
    c = Candidate(kind="native-mmap", pid=5, mb_per_min=40.0, source="ledger", library=LIB,
                  outstanding_bytes=32 * MB)
    add_figures(Tables({"ledger_snapshots": _snaps(None)}), [c])
    assert c.extra["outstanding_resident_bytes"] == 8 * MB
    assert c.extra["mapped_mb_per_min"] == 40.0
    assert "pagemap" in c.evidence[-1] and "last read at t=30.0 s" in c.evidence[-1], c.evidence


def test_without_pagemap_the_last_smaps_is_apportioned_by_overlap():
    """Two ledger regions in one 8 MB mapping with 2 MB resident, one alone in a fully resident 4 MB one:
    (2 MB × 6/8 + 4 MB) / (6 MB + 4 MB) resident."""
    lr = pd.DataFrame({"pid": 5, "start": [0x10000000, 0x10300000, 0x20000000],
                       "end": [0x10300000, 0x10600000, 0x20400000], "size": [3 * MB, 3 * MB, 4 * MB],
                       "library": LIB, "kind": "anon", "preexisting": False, "at_exit": False, "resident": None})
    regions = pd.DataFrame({"t": 50.0, "pid": 5, "snapshot": "last", "start": [0x10000000, 0x20000000],
                            "end": [0x10800000, 0x20400000], "rss": [2 * MB, 4 * MB]})
    snaps = _snaps(None).assign(resident_bytes=None)
    reader = Tables({"ledger_snapshots": snaps, "ledger_regions": lr, "regions": regions})
    assert pagemap_share(snaps, 5, LIB, "anon") is None
    assert smaps_share(reader, 5, LIB, "anon") == (2 * 6 / 8 + 4) / 10
    c = Candidate(kind="native-mmap", pid=5, mb_per_min=1.0, source="ledger", library=LIB,
                  outstanding_bytes=10 * MB)
    py = Candidate(kind="python-heap", pid=5, mb_per_min=2.0, source="pyheap", outstanding_bytes=3 * MB)
    add_figures(reader, [c, py])
    assert c.extra["outstanding_resident_bytes"] == int(5.5 * MB)
    assert "apportioned from the last full smaps" in c.evidence[-1]
    # one figure measured: both named alike
    assert (py.extra["outstanding_resident_bytes"], py.extra["mapped_mb_per_min"]) == (3 * MB, 2.0)
