"""Which gdb stack a ledger culprit takes (analysis/culprits._add_gdb_stacks), on recorded tables: only one
through the culprit's call site *and* that site's caller. On the vintage P/D pair UCX's raw-mmap
trampoline is the call site of the rcache's leaking chunks and, through UCX's malloc hook, of every malloc
chunk of the worker: a gdb sample of a malloc chunk must not replace the rcache path."""

from __future__ import annotations

import json

import pandas as pd
from test_ledger_held import Tables

from leaktrace.analysis.candidates import Candidate
from leaktrace.analysis.culprits import _add_gdb_stacks

UCM, UCS = "libucm-39cc26dc.so.0.0.0", "libucs-432059c7.so.0.0.0"
SITE = f"{UCM}!ucm_orig_mmap_syscall+0x22"
RCACHE = ["libc.so.6!syscall+0x19", SITE, f"{UCS}+0x3b7bc", f"{UCS}!ucs_mpool_grow+0x64",
          f"{UCS}!ucs_mpool_get_grow+0x15"]
MALLOC = ["libc.so.6!syscall+0x19", SITE, f"{UCM}+0x5bd1", f"{UCM}!ucm_event_dispatch+0x3b",
          f"{UCM}!ucm_mmap+0x6a", "libc.so.6!sysmalloc_mmap+0x48", "libc.so.6!sysmalloc+0x1dc",
          "libc.so.6!_int_malloc+0xd9e", "libc.so.6!malloc+0x1d9"]


def _tables(*stacks: list[str]) -> Tables:
    rows = [{"t": 1.0 + i, "pid": 7, "tid": 7, "run": 0, "syscall": "mmap", "addr": 0, "length": 4096,
             "old_addr": 0, "old_length": 0, "result": 0x7f0000000000, "error": 0, "stop_us": 100,
             "frames": "[]", "stack": json.dumps(st), "python": None} for i, st in enumerate(stacks)]
    return Tables({"gdb_samples": pd.DataFrame(rows)})


def _ucx_culprit(method: str) -> Candidate:
    return Candidate(kind="native-mmap", pid=7, mb_per_min=7.2, source="ledger", library=UCM,
                     stack=list(RCACHE), extra={"stack_method": method})


def test_a_gdb_stack_through_the_site_but_not_its_caller_is_not_taken() -> None:
    for method in ("stack-scan", "frame-pointer"):
        c = _ucx_culprit(method)
        _add_gdb_stacks(_tables(MALLOC, MALLOC), [c], [])
        assert c.stack == RCACHE, (method, c.stack)
        assert not any("gdb" in e for e in c.evidence), c.evidence


def test_a_gdb_stack_through_the_site_and_its_caller_is_taken() -> None:
    deeper = [*RCACHE, f"{UCS}+0x3bc78", f"{UCS}!ucs_rcache_check_inv_queue+0x31"]
    c = _ucx_culprit("stack-scan")
    _add_gdb_stacks(_tables(MALLOC, MALLOC, MALLOC, deeper), [c], [])
    assert c.stack == deeper, c.stack
    assert c.extra["ledger_stack"] == RCACHE
    assert any("gdb (DWARF unwinding) confirms" in e for e in c.evidence), c.evidence


def test_a_gdb_stack_stopped_at_the_sites_caller_goes_under_the_ledgers_inner_frames() -> None:
    """gdb stopped by a breakpoint on the growing path (the site's own caller in libucs, past the hook): its
    stack starts there; the culprit keeps the ledger's frames below (syscall, site) and takes gdb's above."""
    at_caller = [f"{UCS}+0x3b7bc", f"{UCS}!ucs_mpool_grow+0x64", f"{UCS}!ucs_mpool_get_grow+0x15",
                 f"{UCS}!ucs_rcache_unmapped_callback+0x9a", f"{UCM}!ucm_event_dispatch+0x3b",
                 f"{UCM}!ucm_munmap+0x41"]
    elsewhere = [f"{UCM}+0x5bd1", f"{UCM}!ucm_event_dispatch+0x3b"]  # another path's stop: not this culprit's
    c = _ucx_culprit("stack-scan")
    _add_gdb_stacks(_tables(elsewhere, at_caller), [c], [])
    assert c.stack == RCACHE[:2] + at_caller, c.stack
    assert any("gdb (DWARF unwinding) confirms" in e for e in c.evidence), c.evidence
