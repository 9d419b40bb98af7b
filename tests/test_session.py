"""Session directory: incremental Parquet parts, readable after SIGKILL, typed errors on bad sessions."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from leaktrace.errors import OutputNotWritable, SessionError
from leaktrace.session import SessionReader, SessionWriter


def test_roundtrip_and_compaction(tmp_path):
    w = SessionWriter(tmp_path / "s", flush_interval=0.05)
    for i in range(5):
        w.append("rollup", {"t": float(i), "pid": 1, "rss": i * 10, "pss": 0, "uss": 0, "anon": 0, "swap": 0,
                            "shared": 0})
        w.flush()
    w.append("custom_table", [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}])
    w.close()
    parts = list((tmp_path / "s" / "tables" / "rollup").glob("part-*.parquet"))
    assert len(parts) == 1  # compacted
    r = SessionReader(tmp_path / "s")
    assert r.complete
    df = r.table("rollup")
    assert list(df["rss"]) == [0, 10, 20, 30, 40]
    assert list(r.table("custom_table")["b"]) == ["x", "y"]
    assert r.table("region_events").empty and "start" in r.table("region_events").columns


WRITER = """
import sys, time
from leaktrace.session import SessionWriter
w = SessionWriter(sys.argv[1], flush_interval=0.2)
i = 0
print("ready", flush=True)
while True:
    w.append("rollup", {"t": float(i), "pid": 1, "rss": i, "pss": 0, "uss": 0, "anon": 0, "swap": 0, "shared": 0})
    i += 1
    time.sleep(0.01)
"""


def test_readable_after_sigkill(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path / "s")], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().startswith("ready")
    # Killed once ≥ 80 rows are on disk (several 0.2 s flushes), however fast this machine runs the writer.
    seen = 0
    deadline = time.monotonic() + 60
    while seen < 80:
        assert time.monotonic() < deadline, f"only {seen} rows flushed in 60 s"
        time.sleep(0.05)
        seen = len(SessionReader(tmp_path / "s").table("rollup"))
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    r = SessionReader(tmp_path / "s")
    assert not r.complete
    df = r.table("rollup")
    # Every row already flushed before the SIGKILL is still there, in order, nothing skipped.
    assert len(df) >= seen >= 80
    assert list(df["rss"]) == list(range(len(df)))
    assert r.skipped_parts == []


def test_bad_sessions(tmp_path):
    with pytest.raises(SessionError):
        SessionReader(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SessionError):
        SessionReader(tmp_path / "empty")
    (tmp_path / "corrupt").mkdir()
    (tmp_path / "corrupt" / "meta.json").write_text('{"schema": "leaktrace.sess')
    with pytest.raises(SessionError):
        SessionReader(tmp_path / "corrupt")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "meta.json").write_text(json.dumps({"schema": "something-else"}))
    with pytest.raises(SessionError):
        SessionReader(tmp_path / "other")


def test_truncated_part_is_skipped(tmp_path):
    w = SessionWriter(tmp_path / "s")
    w.append("rollup", {"t": 0.0, "pid": 1, "rss": 1, "pss": 0, "uss": 0, "anon": 0, "swap": 0, "shared": 0})
    w.flush()
    w.append("rollup", {"t": 1.0, "pid": 1, "rss": 2, "pss": 0, "uss": 0, "anon": 0, "swap": 0, "shared": 0})
    w.flush()
    w.close(compact=False)
    part = tmp_path / "s" / "tables" / "rollup" / "part-000001.parquet"
    part.write_bytes(part.read_bytes()[:20])
    r = SessionReader(tmp_path / "s")
    assert list(r.table("rollup")["rss"]) == [1]
    assert r.skipped_parts == ["tables/rollup/part-000001.parquet"]


def test_unwritable_output(tmp_path):
    with pytest.raises(OutputNotWritable):
        SessionWriter("/proc/leaktrace-cannot-write-here")


def test_names_that_are_not_utf8_are_written_escaped(tmp_path):
    """/proc names are bytes (read with surrogateescape): a file or process name that is not UTF-8 must
    not stop the flush thread (Arrow strings are UTF-8); its bytes are kept as \\xNN escapes."""
    w = SessionWriter(tmp_path / "s", flush_interval=0.05)
    odd = os.fsdecode(b"/tmp/lib\xff\xfeodd.so")
    w.append("regions", {"t": 0.0, "pid": 1, "snapshot": "first", "start": 4096, "end": 8192, "size": 4096,
                         "rss": 0, "anon": 0, "perms": "r-xp", "offset": 0, "path": odd, "cls": "lib"})
    w.append("custom", {"t": 0.0, "name": odd})
    w.flush()
    w.append("rollup", {"t": 1.0, "pid": 1, "rss": 1, "pss": 1, "uss": 1, "anon": 1, "swap": 0, "shared": 0})
    from conftest import wait_for

    # The flush thread is still alive: it writes the next rows on its own.
    assert wait_for(lambda: any((tmp_path / "s" / "tables" / "rollup").glob("part-*.parquet")), timeout=10)
    w.close()
    r = SessionReader(tmp_path / "s")
    assert list(r.table("regions")["path"]) == ["/tmp/lib\\xff\\xfeodd.so"]
    assert list(r.table("custom")["name"]) == ["/tmp/lib\\xff\\xfeodd.so"]
    assert len(r.table("rollup")) == 1 and w.write_error is None


def test_rows_with_different_columns_keep_them_all(tmp_path):
    # A table the writer knows no schema for: a part whose first row lacks a column keeps it for the others.
    w = SessionWriter(tmp_path / "s")
    w.append("probe_rows", [{"t": 0.0, "pid": 1}, {"t": 1.0, "pid": 1, "walked": 42}])
    w.close()
    df = SessionReader(tmp_path / "s").table("probe_rows")
    assert list(df["walked"].isna()) == [True, False] and df["walked"].iloc[1] == 42
