"""A session table's Parquet part files: names, reading order, and compaction (parts merged into range
files, tiered, so a long hunt keeps a bounded number of files). Used by the writer's flush thread and by
the reader; see leaktrace/session/__init__.py for the layout and the crash-safety argument."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

TABLES = "tables"

# Parts merged into one range file by the flush thread, and range files of one level merged into the
# next level: a table flushed twice a second has ~110 files after an hour, ~130 after ten.
COMPACT_FANOUT = 64
# A range file at least this large is not merged again during the hunt (bounded rewrite cost).
COMPACT_MAX_BYTES = 128 << 20
_PART_RE = re.compile(r"^part-(\d+)(?:-(\d+))?\.parquet$")


def part_files(d: Path) -> list[tuple[int, int, Path]]:
    """Every part (``part-N``) and range file (``part-A-B``) in a table directory as (first, last, path),
    in reading order: by first part, the widest range first."""
    out = []
    for p in d.glob("part-*.parquet") if d.is_dir() else []:
        m = _PART_RE.match(p.name)
        if m:
            first = int(m.group(1))
            out.append((first, int(m.group(2)) if m.group(2) else first, p))
    out.sort(key=lambda x: (x[0], -x[1]))
    return out


def _level(first: int, last: int) -> int:
    span, level = last - first + 1, 0
    while span > 1:
        span = -(-span // COMPACT_FANOUT)
        level += 1
    return level


def _merge_parts(d: Path, group: list[tuple[int, int, Path]]) -> None:
    """Stream ``group`` (consecutive files) into one range file, then unlink the files it replaces.
    One input is in memory at a time. Column types are unified (a part whose column was all null
    takes the type of the others); conflicting types raise, and the parts are left as they are."""
    first, last = group[0][0], group[-1][1]
    final = d / f"part-{first:06d}-{last:06d}.parquet"
    tmp = d / f".compact-{first:06d}-{last:06d}.tmp"
    # ParquetFile, not read_table: a part is a few hundred rows, and read_table's dataset machinery
    # (plus a second open for the schema) costs more than the rows themselves.
    files = [pq.ParquetFile(p) for _, _, p in group]
    try:
        schema = pa.unify_schemas([f.schema_arrow for f in files], promote_options="default")
        with pq.ParquetWriter(tmp, schema) as w:
            for pf in files:
                t = pf.read(use_threads=False)
                cols = [t.column(f.name).cast(f.type) if f.name in t.column_names
                        else pa.nulls(len(t), f.type) for f in schema]
                w.write_table(pa.Table.from_arrays(cols, schema=schema))
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        for pf in files:
            pf.close()
    # The rename publishes the merged rows; from then on the reader ignores the parts it covers, so a
    # SIGKILL between here and the last unlink leaves leftovers, never duplicates.
    os.replace(tmp, final)
    for _, _, p in group:
        if p != final:
            p.unlink(missing_ok=True)


def compact_table(path: Path, table: str, final: bool = True) -> None:
    """``final``: merge every file of the table into one. Otherwise one tiered step per level: the
    oldest run of COMPACT_FANOUT consecutive files of one level (each under COMPACT_MAX_BYTES)."""
    d = Path(path) / TABLES / table
    files: list[tuple[int, int, Path]] = []
    covered = -1
    for f in part_files(d):
        if f[0] <= covered:
            f[2].unlink(missing_ok=True)  # leftover of a compaction interrupted before its unlinks
            continue
        files.append(f)
        covered = f[1]
    if final:
        if len(files) > 1:
            _merge_parts(d, files)
        return
    level = 0
    while True:
        run: list[tuple[int, int, Path]] = []
        for f in files:
            if _level(f[0], f[1]) == level and f[2].stat().st_size < COMPACT_MAX_BYTES:
                run.append(f)
                if len(run) == COMPACT_FANOUT:
                    break
            else:
                run = []
        if len(run) < COMPACT_FANOUT:
            return
        _merge_parts(d, run)
        files = [f for f in files if f not in run]
        files.append((run[0][0], run[-1][1], d / f"part-{run[0][0]:06d}-{run[-1][1]:06d}.parquet"))
        files.sort(key=lambda x: (x[0], -x[1]))
        level += 1
