"""Rows written column by column: the eBPF probe's ``bpf_events`` (thousands a second on a busy target) go to the
session as columns, not a dict per row. Each sink must keep exactly what the rows would have given it: the
session's parquet parts the same rows, the watch's ring the same last rows per process."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from event_rows import row_of

from leaktrace.probes.bpf.layout import EVENT_NAMES, Event, WindowEvent
from leaktrace.probes.bpf.snapshots import SnapshotRows
from leaktrace.session import SessionReader, SessionWriter
from leaktrace.session.tables import TableSchemaError, to_arrow
from leaktrace.watch.ring import RingSession

T0 = 12345.678


def _row_of(e: Event) -> dict:
    return row_of(e, T0)


def _events(rng: random.Random, n: int) -> list[Event]:
    types = [*EVENT_NAMES, 99]  # and a type no name is known for
    words = [0, 1, 4096, (1 << 63) - 1, 1 << 63, (1 << 64) - 1]
    out = []
    for i in range(n):
        e = WindowEvent() if rng.random() < 0.2 else Event()  # an event the ring gave with a stack window
        if isinstance(e, WindowEvent):
            e.sp, e.win_len, e.data[0] = rng.getrandbits(64), 512, 0xAB
        e.seq = 10**15 + i * rng.randrange(1, 10**6)
        e.type = rng.choice(types)
        e.tgid, e.tid, e.aux_pid = rng.randrange(1, 1 << 22), rng.randrange(1, 1 << 22), rng.randrange(1 << 22)
        for f in ("addr", "len", "new_addr", "new_len", "flags", "prot", "fd", "site", "ip"):
            setattr(e, f, rng.choice(words) if rng.random() < 0.3 else rng.getrandbits(64))
        e.result = rng.choice([0, -12, rng.getrandbits(47)])
        e.stack_id = rng.randrange(-1, 100)
        out.append(e)
    return out


def _columns(events: list[Event]) -> dict:
    me = SimpleNamespace(ctx=SimpleNamespace(session=SimpleNamespace(meta={"t0_monotonic": T0})))
    return SnapshotRows.event_columns(me, events)


@pytest.mark.parametrize("seed", range(5))
def test_event_columns_give_each_event_its_row(seed):
    events = _events(random.Random(seed), 700)
    cols = _columns(events)
    got = pd.DataFrame(cols).to_dict("records")
    want = [_row_of(e) for e in events]
    assert got == want
    # and written, the same part as the rows would have made
    assert to_arrow("bpf_events", want).equals(to_arrow("bpf_events", got))


def test_session_keeps_rows_given_by_column_with_rows_given_as_dicts(tmp_path):
    events = _events(random.Random(7), 300)
    w = SessionWriter(tmp_path / "s", flush_interval=60)
    w.append("bpf_events", [_row_of(e) for e in events[:100]])
    w.append_columns("bpf_events", _columns(events[100:250]))
    w.flush()  # a part of both kinds, then one of columns only: close() merges them
    w.append_columns("bpf_events", _columns(events[250:]))
    w.close()
    df = SessionReader(tmp_path / "s").table("bpf_events")
    assert df.to_dict("records") == [_row_of(e) for e in events]


def test_columns_need_a_declared_table_and_one_length(tmp_path):
    w = SessionWriter(tmp_path / "s")
    with pytest.raises(TableSchemaError, match="declared table"):
        w.append_columns("scratch", {"t": [0.0]})
    with pytest.raises(TableSchemaError, match="rss_bytes"):
        w.append_columns("rollup", {"t": [0.0], "rss_bytes": [1]})
    with pytest.raises(TableSchemaError, match="length"):
        w.append_columns("rollup", {"t": [0.0, 1.0], "pid": np.array([1])})
    w.close()


@pytest.mark.parametrize("seed", range(4))
def test_ring_keeps_what_the_rows_would_have_left(seed):
    rng = random.Random(seed)
    by_rows, by_cols = RingSession(), RingSession()
    for _ in range(6):  # batches of a few processes, some longer than the table's limit of 500 rows each
        events = _events(rng, rng.randrange(1, 1500))
        pids = [rng.randrange(1, 4) for _ in events]
        for e, p in zip(events, pids, strict=True):
            e.tgid = p
        by_rows.append("bpf_events", [_row_of(e) for e in events])
        by_cols.append_columns("bpf_events", _columns(events))
    for pid in (1, 2, 3):
        assert by_cols.since("bpf_events", pid, float("-inf")) == by_rows.since("bpf_events", pid, float("-inf"))
    assert by_cols.since("bpf_events", 1, float("-inf")), "the ring kept rows"
