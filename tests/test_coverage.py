"""Which /proc-only (watcher) candidates the ledger's already explain (analysis/culprits.uncovered_watcher):
one memory is one culprit, whatever shape each source reads in it."""

from __future__ import annotations

from leaktrace.analysis.candidates import Candidate
from leaktrace.analysis.culprits import uncovered_watcher


def _ledger(steady: float, raw: float, kind: str = "native-mmap") -> Candidate:
    return Candidate(kind=kind, pid=7, mb_per_min=steady, source="ledger", library="libinvq_leak.so",
                     extra={"raw_mb_per_min": raw})


def _watcher(rate: float) -> Candidate:
    return Candidate(kind="native-mmap", pid=7, mb_per_min=rate, source="watcher", cls="anon")


def test_a_warm_up_read_by_the_ledger_still_covers_the_same_growth_in_proc() -> None:
    # The ledger reads its series as a warm-up then 6 MB/min steady; over the window it grew 16.8, as /proc
    # saw (17.5): the same memory. Compared with the steady 6, /proc's 17.5 would look unexplained, and a
    # duplicate taking the library by address would rank above the ledger's own culprit.
    assert uncovered_watcher([_watcher(17.5)], [_ledger(6.0, 16.8)], []) == []


def test_growth_the_ledger_does_not_explain_stays_a_watcher_candidate() -> None:
    # The ledger grew 6 MB/min over the window, /proc 17.5: most of the growth is not the ledger's.
    w = _watcher(17.5)
    assert uncovered_watcher([w], [_ledger(6.0, 6.0)], []) == [w]
    # ... nor is it covered by a ledger candidate of another kind.
    assert uncovered_watcher([w], [_ledger(16.8, 16.8, kind="shm")], []) == [w]


def test_the_malloc_heap_covers_anonymous_growth_by_its_window_rate_too() -> None:
    # malloc chunks above the mmap threshold are anonymous mappings to /proc: the heap candidate's window
    # rate (not its steady one) accounts for them.
    assert uncovered_watcher([_watcher(17.5)], [_ledger(3.0, 16.0, kind="malloc-heap")], []) == []
    assert uncovered_watcher([_watcher(17.5)], [_ledger(3.0, 3.0, kind="malloc-heap")], []) != []
