"""The replay of lock calls (analysis/locks.py) on built event rows: what is still locked at the end, by the
call that locked it, after unlocks, unmaps, moves, munlockall and unmaps the kernel settled unseen."""

from __future__ import annotations

import pandas as pd

from leaktrace.analysis.locks import LockedRanges, lockall_words, replay

P = 4096


def test_ranges_split_and_relabel():
    lr = LockedRanges()
    lr.add(0, 10 * P, "a")
    lr.add(4 * P, 6 * P, "b")  # locked again by another call: that call's
    assert list(zip(lr.starts, lr.ends, lr.keys, strict=True)) == [(0, 4 * P, "a"), (4 * P, 6 * P, "b"),
                                                                  (6 * P, 10 * P, "a")]
    removed = lr.remove(3 * P, 7 * P)
    assert removed == [(3 * P, 4 * P, "a"), (4 * P, 6 * P, "b"), (6 * P, 7 * P, "a")]
    assert lr.by_key() == {"a": 6 * P}
    assert lr.by_key([(0, 2 * P), (9 * P, 20 * P)]) == {"a": 3 * P}  # only what is still mapped


def test_replay_unlocks_unmaps_moves_and_resets():
    ev = pd.DataFrame([
        {"type": "mlock", "addr": 0, "len": 8 * P, "new_addr": 0, "new_len": 0, "flags": 0, "stack_key": "1:0xa"},
        {"type": "mlock", "addr": 100 * P, "len": 4 * P, "new_addr": 0, "new_len": 0, "flags": 0, "stack_key": "1:0xb"},
        {"type": "munlock", "addr": 0, "len": 2 * P, "new_addr": 0, "new_len": 0, "flags": 0, "stack_key": "1:0xc"},
        {"type": "munmap", "addr": 7 * P, "len": 1 * P, "new_addr": 0, "new_len": 0, "flags": 0, "stack_key": ""},
        # the locked buffer at 100 moves to 200 and shrinks to 3 pages: the lock follows what is left
        {"type": "mremap", "addr": 100 * P, "len": 4 * P, "new_addr": 200 * P, "new_len": 3 * P, "flags": 1,
         "stack_key": ""},
        {"type": "mlockall", "addr": 0, "len": 0, "new_addr": 0, "new_len": 0, "flags": 3, "stack_key": "1:0xd"},
    ])
    locked, calls, lockall = replay(ev)
    assert locked == {"1:0xa": 5 * P, "1:0xb": 3 * P}
    assert calls == {"1:0xa": 1, "1:0xb": 1, "1:0xd": 1}
    assert lockall == [(3, "1:0xd")] and lockall_words(3) == "MCL_CURRENT | MCL_FUTURE"
    # the buffer at 200 unmapped by a munmap the kernel settled (no event): the ledger no longer holds it
    locked, _, _ = replay(ev, held=[(0, 50 * P)])
    assert locked == {"1:0xa": 5 * P}
    reset = pd.concat([ev, pd.DataFrame([{"type": "munlockall", "addr": 0, "len": 0, "new_addr": 0, "new_len": 0,
                                          "flags": 0, "stack_key": ""}])])
    assert replay(reset)[0] == {}
