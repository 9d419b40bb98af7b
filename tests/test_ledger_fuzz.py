"""The eBPF ledger proven against /proc/PID/maps by the mapping-operation fuzzer (tests/ledger_fuzz.py has the
oracle and what the ledger is held to): the operation lists that once made the ledger differ, replayed, then
100,000 operations over fixed seeds, every process compared byte for byte at each checkpoint. A failure prints the
shortest operation list that reproduces it."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from conftest import is_root
from ledger_fuzz import Fuzzer, Traced, describe, fuzz

pytestmark = [pytest.mark.bpf, pytest.mark.skipif(not is_root(), reason="BPF needs root")]

# Operation lists ("OP THREAD R1 R2 R3", tests/fixtures/mapfuzz.c) the shrinker reduced failures to, each fixed
# since; the commit that fixed it says what went wrong.
REGRESSIONS = {
    # a plain mmap reusing the start of a kernel region a pending munmap had cut: its key was overwritten
    "mmap over a cut region's key": ["17 0 1260726674 2868910329 259670425", "17 0 2746698577 815430317 1852087273"],
    # a forked child maps, moves and unmaps before its FORK is applied: its seed already held those calls
    "child events before its seed": ["0 1 3279681348 633479404 531488065", "0 1 2072428121 390314233 789240530",
                                     "7 2 2873196239 2327421794 4216149386", "7 0 1445297991 2805595526 3212440683",
                                     "0 2 1214829853 760323673 2722877453", "13 0 1753952938 3985931068 2598227696",
                                     "14 0 914994754 3023562249 1977894449"],
    # shmdt at the start of what is left of a segment whose head was unmapped: the kernel detaches nothing
    "shmdt past an unmapped head": ["11 0 3665888380 858513437 2112384727", "6 2 3704979773 813874293 2145913111",
                                    "12 0 4272600215 3387568192 2860656209"],
    # a segment cut by MAP_FIXED before its attach was sized: sized by what was left
    "segment cut before it was sized": ["1 0 3810278808 1420612089 2672534594",
                                        "11 0 217987512 4133240025 161772253",
                                        "6 0 2944670148 3290842975 401835355",
                                        "3 1 4116233597 4133894006 236991098"],
    # an SHM_REMAP attach over an anonymous mapping, destroyed before /proc was read: what it replaced stayed
    "SHM_REMAP attach gone before sizing": ["4 1 3768518376 215710655 3823123867",
                                            "11 3 445545297 1025101785 4006467966"],
    # an exec'd child commits, moves and maps a page PROT_NONE before its EXEC is applied: the commit re-applied
    "mprotect older than an exec's seed": ["13 1 2846750039 2234530053 576584159",
                                           "13 0 3184251028 1373973016 438436572",
                                           "13 2 3800592779 1931137382 4052398822",
                                           "14 2 1166103638 1053828590 1810407646",
                                           "14 2 4022218258 2424803311 2570845334",
                                           "14 2 1922889889 2206244520 3003042595"],
}

SEEDS = [11, 12, 13, 14, 15]
OPS_PER_SEED = 20_000  # 100,000 operations: ~40 s traced on two cores


@pytest.fixture(scope="module")
def traced():
    fz = Fuzzer()  # the probe needs a first target; the replays are added as they start
    tr = Traced([fz.pid])
    yield tr
    fz.close()
    tr.close()


@pytest.mark.parametrize("name", list(REGRESSIONS))
def test_regression_replays_exactly(traced, name: str) -> None:
    ops = REGRESSIONS[name]
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "ops"
        path.write_text("".join(x + "\n" for x in ops))
        fz = Fuzzer()
        traced.add(fz.pid)
        try:
            pids = fz.replay(path)
            problems = traced.check(pids)
        finally:
            fz.close()
    assert not problems, "\n".join(problems + ["operations:"] + [describe(x) for x in ops])


def test_fuzzed_operations_match_proc_maps() -> None:
    res = fuzz(SEEDS, OPS_PER_SEED)
    assert not res.mismatches, res.report()
    assert res.ops == len(SEEDS) * OPS_PER_SEED and res.checkpoints >= res.ops // 2000
