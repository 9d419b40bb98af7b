"""Culprits ranked by evidence (analysis/culprits.py ``_order``): rate and confidence together, and growth
that is slowing down (JIT code, allocator caches warming) never above a steady leak, whatever its rate."""

from __future__ import annotations

from leaktrace.analysis.candidates import Candidate
from leaktrace.analysis.culprits import _order


def _c(pid: int, lib: str, mbm: float, conf: float, slowing: bool = False, source: str = "ledger") -> Candidate:
    return Candidate(kind="native-mmap", pid=pid, mb_per_min=mbm, source=source, library=lib,
                     extra={"confidence": conf, "decelerating": slowing})


def test_slowing_growth_never_outranks_a_steady_leak():
    jit = _c(1, "libjit.so", 14.0, 0.80, slowing=True)
    ucx = _c(2, "libucm.so", 6.0, 0.96)
    assert [c.library for c in _order([jit, ucx])] == ["libucm.so", "libjit.so"]
    same = _c(2, "libjit.so", 30.0, 0.99, slowing=True)  # in the same process too
    assert [c.library for c in _order([same, ucx])] == ["libucm.so", "libjit.so"]


def test_confidence_weighs_with_the_rate():
    sure = _c(1, "a.so", 5.0, 1.0)
    doubtful = _c(2, "b.so", 6.0, 0.5)
    assert [c.library for c in _order([doubtful, sure])] == ["a.so", "b.so"]


def test_attributed_before_proc_only_in_one_process():
    proc_only = _c(1, None, 20.0, 1.0, source="watcher")
    named = _c(1, "lib.so", 10.0, 1.0)
    assert [c.source for c in _order([proc_only, named])] == ["ledger", "watcher"]
