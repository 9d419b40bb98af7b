"""Session tables against their declaration (leaktrace/session/tables.py): every table a probe writes is
declared; each round-trips through the writer and the reader with its declared columns and types; a part
with a column the declaration does not know, or without a required one, is a bad session (exit 7, one
line); a column added in a later version reads as its default from older parts; the recorded sessions of
the golden tests read."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import REPO, run_cli
from golden import GOLDEN, sessions
from ops_helpers import one_error_line

from leaktrace.errors import SessionError
from leaktrace.session import SessionReader, SessionWriter
from leaktrace.session.tables import META_KEY, TABLES, TableSchemaError

SAMPLE = {pa.int64(): -7, pa.uint64(): (1 << 63) + 5, pa.float64(): 1.5, pa.string(): "x", pa.bool_(): True}


def _probe_tables() -> set[str]:
    """Table names the probes append rows to: ``<session>.append("name", rows)`` or ``.append_columns("name",
    columns)`` (two arguments, a literal)."""
    names = set()
    for path in (REPO / "leaktrace" / "probes").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("append", "append_columns")
                    and len(node.args) == 2 and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[0].value, str)):
                names.add(node.args[0].value)
    return names


def test_every_table_a_probe_writes_is_declared():
    written = _probe_tables()
    assert len(written) >= 20, sorted(written)
    assert written - set(TABLES) == set()


@pytest.mark.parametrize("name", sorted(TABLES))
def test_declared_table_round_trips(tmp_path, name):
    table = TABLES[name]
    full = {c.name: SAMPLE[c.type] for c in table.columns}
    required = {c.name: SAMPLE[c.type] for c in table.columns if not c.optional}
    w = SessionWriter(tmp_path / "s", flush_interval=60)
    w.append(name, full)
    w.flush()
    w.append(name, required)  # a second part: close() merges the two
    w.close()
    (part,) = (tmp_path / "s" / "tables" / name).glob("part-*.parquet")
    assert pq.read_schema(part).metadata[META_KEY] == f"{name}/{table.version}".encode()
    df = SessionReader(tmp_path / "s").table(name)
    assert list(df.columns) == table.names
    for c in table.columns:
        assert df[c.name].iloc[0] == full[c.name], c.name
        second = df[c.name].iloc[1]
        if c.optional:
            assert second == c.default if c.default is not None else pd.isna(second), c.name
        else:
            assert second == full[c.name], c.name


def test_empty_declared_table_has_its_columns(tmp_path):
    SessionWriter(tmp_path / "s").close()
    r = SessionReader(tmp_path / "s")
    for name, table in TABLES.items():
        assert list(r.table(name).columns) == table.names, name


def test_writer_refuses_an_undeclared_column(tmp_path):
    w = SessionWriter(tmp_path / "s")
    with pytest.raises(TableSchemaError, match="rollup.*rss_bytes"):
        w.append("rollup", {"t": 0.0, "pid": 1, "rss_bytes": 4096})
    w.append("scratch", {"t": 0.0, "anything": 1})  # an undeclared table: inferred, not checked
    w.close()
    assert list(SessionReader(tmp_path / "s").table("scratch")["anything"]) == [1]


def _session_with_part(tmp_path: Path, name: str, columns: dict[str, list], metadata: dict | None = None) -> Path:
    s = tmp_path / "s"
    w = SessionWriter(s)
    w.append("rollup", {"t": 0.0, "pid": 1, "rss": 1, "pss": 1, "uss": 1, "anon": 1, "swap": 0, "shared": 0})
    w.close()
    d = s / "tables" / name
    d.mkdir(parents=True, exist_ok=True)
    tbl = pa.table(columns)
    pq.write_table(tbl.replace_schema_metadata(metadata) if metadata else tbl, d / "part-000009.parquet")
    return s


ROLLUP = {"t": [1.0], "pid": [1], "rss": [2], "pss": [2], "uss": [2], "anon": [2], "swap": [0], "shared": [0]}


def test_unknown_column_is_a_bad_session(tmp_path):
    s = _session_with_part(tmp_path, "rollup", {**ROLLUP, "rss_kb": [2]})
    with pytest.raises(TableSchemaError, match="rollup has undeclared column.*rss_kb") as e:
        SessionReader(s).table("rollup")
    assert isinstance(e.value, SessionError) and e.value.exit_code == 7
    assert "tables/rollup/part-000009.parquet" in str(e.value)


def test_unknown_column_from_a_newer_version_says_so(tmp_path):
    s = _session_with_part(tmp_path, "rollup", {**ROLLUP, "psi": [0.5]},
                           metadata={META_KEY: f"rollup/{TABLES['rollup'].version + 1}".encode()})
    with pytest.raises(TableSchemaError, match="written at table version 2, this leaktrace reads up to 1"):
        SessionReader(s).table("rollup")


def test_missing_required_column_is_a_bad_session(tmp_path):
    s = _session_with_part(tmp_path, "rollup", {k: v for k, v in ROLLUP.items() if k != "uss"})
    with pytest.raises(TableSchemaError, match="rollup lacks required column.*uss"):
        SessionReader(s).table("rollup")


def test_optional_columns_absent_from_an_older_part_read_as_their_default(tmp_path):
    s = _session_with_part(tmp_path, "ledger_exits", {"t": [2.0], "pid": [9], "outstanding_bytes": [4096],
                                                      "regions": [1]})
    d = s / "tables" / "processes"
    d.mkdir()
    pq.write_table(pa.table({"t": [0.0], "pid": [9], "ppid": [1], "event": ["seen"], "comm": ["a"], "label": ["a"],
                             "cmdline": ["[]"], "exe": [""], "root": [9]}), d / "part-000000.parquet")
    r = SessionReader(s)
    lx = r.table("ledger_exits")
    assert list(lx.columns) == TABLES["ledger_exits"].names
    assert lx["exit_code"].tolist() == [-1] and lx["oom"].tolist() == [False]
    assert r.table("processes")["exit_code"].isna().all()


def test_cli_report_on_a_renamed_column_exits_7_in_one_line(tmp_path):
    s = tmp_path / "demo"
    shutil.copytree(GOLDEN / "demo", s, ignore=shutil.ignore_patterns("expected"))
    (part,) = (s / "tables" / "rollup").glob("part-*.parquet")
    tbl = pq.read_table(part)
    pq.write_table(tbl.rename_columns(["rss_bytes" if n == "rss" else n for n in tbl.column_names]), part)
    r = run_cli("report", s, "--format", "json")
    assert r.returncode == 7, r.stderr
    line = one_error_line(r.stderr)
    assert "rollup" in line and "rss_bytes" in line, line
    assert not (s / "report.json").exists()


@pytest.mark.parametrize("name", sessions())
def test_recorded_sessions_read(name):
    r = SessionReader(GOLDEN / name)
    assert r.tables() and set(r.tables()) <= set(TABLES)
    for t in r.tables():
        df = r.table(t)
        assert len(df) and list(df.columns) == TABLES[t].names, t
    assert r.skipped_parts == []
