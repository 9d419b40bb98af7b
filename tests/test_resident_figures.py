"""Where a ledger culprit's resident bytes come from when the probe could not read them at the end: the last
tick that read pagemap (a process whose exit took its pages), else the last full smaps apportioned over its
regions — on recorded-shape tables (the live reads are tested in test_bpf_probe and test_thread_stacks)."""

from __future__ import annotations

import pandas as pd
from test_ledger_held import Tables

from leaktrace.analysis.candidates import Candidate
from leaktrace.analysis.resident import add_figures, growth_resident_share, pagemap_share, smaps_share

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


def _growth(mapped_per_tick: float, resident_per_tick: float, ticks: int = 20,
            racing: tuple[int, ...] = ()) -> pd.DataFrame:
    """A group mapping ``mapped_per_tick`` MB a tick, ``resident_per_tick`` MB of it written; the ticks in
    ``racing`` read 0 resident (a read that raced a move of the buffer)."""
    return pd.DataFrame([{"t": float(k), "pid": 5, "library": LIB, "kind": "anon",
                          "outstanding_bytes": int(k * mapped_per_tick * MB), "regions": k,
                          "resident_bytes": 0 if k in racing else int(k * resident_per_tick * MB)}
                         for k in range(1, ticks + 1)])


def test_a_mapping_culprit_is_rated_by_what_of_its_growth_is_resident():
    """mb_per_min is the mapped rate times the share of the growth written: all, half, none; a few reads
    that raced a move do not move the slope; the culprit stays, its mapped rate named."""
    for written, share in ((2.0, 1.0), (1.0, 0.5), (0.0, 0.0)):
        got = growth_resident_share(_growth(2.0, written, racing=(17, 18, 19)), 5, LIB, "anon")
        assert got is not None and abs(got[0] - share) < 0.02 and got[1] == (17 if written else 20), (written, got)
        c = Candidate(kind="native-mmap", pid=5, mb_per_min=120.0, source="ledger", library=LIB,
                      outstanding_bytes=40 * MB)
        add_figures(Tables({"ledger_snapshots": _growth(2.0, written)}), [c])
        assert abs(c.mb_per_min - 120.0 * share) < 0.5 and c.extra["mapped_mb_per_min"] == 120.0, c.evidence
        assert ("never written" in c.evidence[-1]) == (share < 0.5), c.evidence
    # a buffer moved on every grow, read on a loaded box: a third of its ticks raced a move (0), a few partly
    racing = (17, 21, 29, 30, 31, 32, 33, 35, 36, 37, 38)
    series = _growth(1.0, 0.962, ticks=41, racing=racing)
    partly = series["t"].isin([24.0, 25.0, 28.0])
    series.loc[partly, "resident_bytes"] = (series.loc[partly, "resident_bytes"] * 0.4).astype(int)
    got = growth_resident_share(series, 5, LIB, "anon")
    assert got is not None and abs(got[0] - 0.962) < 0.02 and got[1] == 41 - len(racing) - 3, got
    assert pagemap_share(series.iloc[:-3], 5, LIB, "anon")[1] == 34.0  # the last tick that did not race
    # too few ticks read: the mapped rate stands
    assert growth_resident_share(_growth(2.0, 0.0, ticks=4), 5, LIB, "anon") is None
    unread = _growth(2.0, 0.0).assign(resident_bytes=None)
    c = Candidate(kind="native-mmap", pid=5, mb_per_min=120.0, source="ledger", library=LIB, outstanding_bytes=40 * MB)
    add_figures(Tables({"ledger_snapshots": unread}), [c])
    assert c.mb_per_min == 120.0


def test_the_verdict_says_when_the_address_space_leaks_and_not_ram():
    from leaktrace.analysis.culprits import Findings
    from leaktrace.analysis.summary import _verdict

    c = {"pid": 5, "kind": "native-mmap", "library": LIB, "source": "ledger", "mb_per_min": 0.0,
         "mapped_mb_per_min": 119.9}
    verdict, why = _verdict(pd.DataFrame(columns=["pid"]), Findings([c], [], True, set(), set(), {}, {}), 60.0)
    assert verdict == "leak" and "libjournal.so maps 119.90 MB/min but only 0.00 MB/min of it is resident" in why, why
