"""The ``bpf_events`` row of one event, field by field as the table documents it (leaktrace/probes/bpf/snapshots.py):
the reference the probe's column-by-column rows are checked against (test_event_columns) and measured against
(bench/bench_event_rows.py)."""

from __future__ import annotations

from leaktrace.probes.bpf.layout import EV_FORK, EVENT_NAMES, SITE_EVENTS, Event
from leaktrace.probes.bpf.snapshots import _i64


def row_of(e: Event, t0: float) -> dict:
    """``t0``: the session's t0_monotonic (``t`` is seconds since it)."""
    return {"t": e.seq / 1e9 - t0, "type": EVENT_NAMES.get(e.type, str(e.type)), "pid": e.tgid, "tid": e.tid,
            "addr": _i64(e.addr), "len": _i64(e.len), "new_addr": _i64(e.new_addr), "new_len": _i64(e.new_len),
            "flags": _i64(e.flags), "prot": _i64(e.prot), "fd": _i64(e.fd), "site": _i64(e.site),
            "stack_key": f"{e.tgid}:{e.site:#x}" if e.type in SITE_EVENTS else "", "result": e.result,
            "child": e.aux_pid if e.type == EV_FORK else 0}
