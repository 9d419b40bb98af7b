"""Every table a hunt writes, declared once: its columns, their Arrow types, and the table's version.

The declaration is the contract between the probes and the analysis. ``SessionWriter.append`` refuses a
row that carries a column its table does not declare, and writes every declared column (absent keys
null, or the column's default); ``SessionReader.table`` checks each part it loads against it (see
:func:`conform`). So the analysis reads any declared column without testing that it exists, and a
column renamed on one side fails loudly (:class:`TableSchemaError`, a bad session: exit 7) instead of
quietly leaving a figure out of the report.

Versions: a table's version is the highest ``since`` of its columns, and every part records the
version it was written at (Parquet schema metadata ``leaktrace.table``). A column added after a table's
first version is optional: parts written before it lack it, and the reader fills it with its default,
so sessions recorded by earlier versions still read. Columns that older writers left out of a part
when none of its rows carried them (the Python heap's walk figures, a failed scrape's counters) are
optional too. Adding a column: append it with ``since`` one above the table's version. Renaming or
removing one breaks every recorded session: keep the old name.

Tables not declared here (scratch tables of tests and benches) are written and read with inferred
types and not checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from leaktrace.errors import SessionError

META_KEY = b"leaktrace.table"
_TYPES = {"i": pa.int64(), "u": pa.uint64(), "f": pa.float64(), "s": pa.string(), "b": pa.bool_()}


class TableSchemaError(SessionError):
    """A table's columns disagree with its declaration: an unknown column, or a required one missing."""

    default_remedy = ("re-render it with the leaktrace that recorded it; a session written by leaktrace "
                      "is never edited by hand")


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    since: int = 1  # the table version that added it
    optional: bool = False  # may be absent from a part (then filled with ``default``)
    default: Any = None


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[Column, ...]

    @property
    def version(self) -> int:
        return max(c.since for c in self.columns)

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    @property
    def schema(self) -> pa.Schema:
        return pa.schema([(c.name, c.type) for c in self.columns],
                         metadata={META_KEY: f"{self.name}/{self.version}".encode()})


def _cols(spec: str, since: int = 1, optional: bool = False, default: Any = None) -> tuple[Column, ...]:
    """Columns from ``"name:type ..."`` (types: i int64, u uint64, f float64, s string, b bool). A column
    added after the table's first version (``since`` > 1) is optional."""
    return tuple(Column(n, _TYPES[k], since, optional or since > 1, default)
                 for n, k in (c.split(":") for c in spec.split()))


def _gc(g: int) -> str:
    return " ".join(f"gen{g}_{k}:i" for k in ("count", "threshold", "collections", "collected", "uncollectable"))


# t: seconds since the hunt started (time.monotonic() - meta["t0_monotonic"]). Sizes are bytes.
_DECLARED = (
    # watcher. One row when a process is first seen, one when it exec()s and one when it is seen gone
    # (exit_code: its wait status when it was still an unreaped zombie then, else -1; null on other rows).
    Table("processes", _cols("t:f pid:i ppid:i event:s comm:s label:s cmdline:s exe:s root:i")
          + _cols("exit_code:i", since=2)),
    # /proc/PID/smaps_rollup every tick.
    Table("rollup", _cols("t:f pid:i rss:i pss:i uss:i anon:i swap:i shared:i")),
    # Full smaps every N ticks, summed by memory class.
    Table("class_usage", _cols("t:f pid:i cls:s size:i rss:i anon:i count:i")),
    # Region diffs between two full smaps: born, grown, shrunk, gone, moved.
    Table("region_events", _cols("t:f pid:i event:s start:u end:u size:i rss:i old_start:u old_size:i "
                                 "old_rss:i perms:s path:s cls:s")),
    # The first and the last full smaps of each process (snapshot "first" | "last").
    Table("regions", _cols("t:f pid:i snapshot:s start:u end:u size:i rss:i anon:i perms:s offset:u path:s "
                           "cls:s")),
    # eBPF probe (leaktrace/probes/bpf). Its counters at every snapshot.
    Table("bpf_counters", _cols("t:f syscalls:i fast_maps:i settled:i slow_events:i lost_events:i map_full:i "
                                "stacks:i failed:i") + _cols("shm_unsized:i", since=2)
          + _cols("ring_pending:i kernel_regions:i header_kind:s")),
    # Outstanding bytes and regions by (pid, library, kind) at every snapshot and at each target's exit.
    # resident_bytes: of those, present in RAM (pagemap); null where not read (probes/bpf/resident.py).
    Table("ledger_snapshots", _cols("t:f pid:i library:s kind:s outstanding_bytes:i regions:i")
          + _cols("resident_bytes:i", since=2)),
    # Outstanding regions at stop, and what each target held at its exit (at_exit; null: not recorded);
    # resident: its bytes present in RAM then (null: pre-existing, or the process gone).
    Table("ledger_regions", _cols("pid:i start:i end:i size:i library:s kind:s stack_key:s preexisting:b "
                                  "t_born:f path:s") + _cols("at_exit:b", since=2) + _cols("resident:i", since=3)),
    # Slow-path events, as the ring buffer delivered them.
    Table("bpf_events", _cols("t:f type:s pid:i tid:i addr:i len:i new_addr:i new_len:i flags:i prot:i fd:i "
                              "site:i stack_key:s result:i child:i")),
    # One row per call site of an outstanding region (frames: one per line, innermost first).
    Table("bpf_stacks", _cols("stack_key:s pid:i site:i stack_id:i library:s symbol:s frames:s")
          + _cols("method:s", since=2)),
    # Targets that ended while the program compiled (t: when the probe went live).
    Table("bpf_missed", _cols("t:f pid:i exit_code:i")),
    # What each target held when it exited, and how it ended (oom: marked by the OOM killer).
    Table("ledger_exits", _cols("t:f pid:i outstanding_bytes:i regions:i")
          + _cols("exit_code:i", since=2, default=-1) + _cols("oom:b", since=2, default=False)),
    # Write faults of the targets, named by the code that touched the pages (leaktrace/probes/bpf/faults.py).
    Table("fault_sites", _cols("t:f pid:i ip:i site:i caller:i library:s symbol:s start:u end:u faults:i sample:i "
                               "preexisting:b region_start:u region_end:u vmflags:s")),
    Table("fault_stats", _cols("t:f writes:i sampled:i dropped:i windows:i")),
    # gdb probe: columns described in leaktrace/probes/gdb/rows.py.
    Table("gdb_samples", _cols("t:f pid:i tid:i run:i syscall:s addr:i length:i old_addr:i old_length:i "
                               "result:i error:i stop_us:f frames:s stack:s python:b")
          + _cols("python_stack:s", since=2, default="[]") + _cols("python_us:f", since=2, default=0.0)),
    Table("gdb_runs", _cols("t_start:f t_end:f pid:i run:i stops:i samples:i paused_s:f handler_s:f "
                            "attach_s:f symbols_s:f threads:i reason:s python:s state_after:s tracer_after:i "
                            "sigcont:b")),
    # host probe: the host's memory every tick (/proc/meminfo; bytes), and what each target pins (VmPin: pages
    # pinned by drivers; VmLck: mlock()ed) with its live threads.
    Table("host_memory", _cols("t:f mem_total:i mem_available:i mem_free:i anon_pages:i shmem:i mapped:i "
                               "unevictable:i mlocked:i cached:i vmalloc_used:i slab_unreclaimable:i "
                               "kernel_stack:i page_tables:i") + _cols("pcp_free:i", since=2)),
    Table("host_procs", _cols("t:f pid:i vm_pin:i vm_lck:i threads:i")),
    # glibc malloc's books (probes/mallocstate): mallinfo2()'s figures; complete: every list walked through.
    # host_cpus, cpu_limit (cgroup cpu.max in CPUs, -1 none) and settings (MALLOC_*): read once per process.
    Table("malloc_state", _cols("t:f pid:i arena:i fordblks:i fsmblks:i top:i uordblks:i hblkhd:i arenas:i "
                                "free_chunks:i complete:b host_cpus:i cpu_limit:f settings:s")),
    # Memory held open by descriptor and not mapped (probes/heldfiles.py): names is a JSON list of
    # [name, files, bytes], largest first.
    Table("held_files", _cols("t:f pid:i bytes:i files:i names:s")),
    # ucx probe: effective UCX state (leaktrace.vllm.ucx.UcxConfig.as_row).
    Table("ucx_state", _cols("pid:i ucx_loaded:b ucx_version:s hooks_active:b hooked_functions:s hook_mode:s "
                             "rcache_max_unreleased:s rcache_enable:s hook_mode_source:s "
                             "rcache_max_unreleased_source:s rcache_enable_source:s ucx_libs:s leak_prone:b "
                             "remedy:s errors:s t:f")),
    # pyheap probe: GC state per tick; the walk's figures (frozen, gen*_tracked, tracked) only on walks, and
    # a process whose state could not be read has ``error`` instead of the counters.
    Table("pyheap", _cols("pid:i python:b version:s")
          + _cols(f"offsets_source:s error:s gc_enabled:b collecting:b {_gc(0)} {_gc(1)} {_gc(2)} frozen:i "
                  "gen0_tracked:i gen1_tracked:i gen2_tracked:i tracked:i approximate:b", optional=True)
          + _cols("walk_ms:f", since=2) + _cols("t:f")),
    # Objects counted by type at each complete walk (frozen: of them, in the gc.freeze() set).
    Table("pyheap_types", _cols("t:f pid:i type:s count:i frozen:i")),
    # vllm probe: the vLLM processes among the targets, once each (config: JSON).
    Table("vllm_processes", _cols("t:f pid:i ppid:i label:s title:s instance:i role:s role_source:s port:i "
                                  "model:s libs:s lib_groups:s config:s")),
    # metrics probe: one row per scrape (ok false: the scrape failed, no counters) ...
    Table("metrics_summary", _cols("t:f url:s instance:i ok:b")
          + _cols("requests:f prompt_tokens:f generation_tokens:f kv_external_prompt_tokens:f nixl_transfers:f "
                  "nixl_bytes:f nixl_failed:f running:f waiting:f kv_cache_usage:f api_rss:f", optional=True)),
    # ... and the samples kept from it (labels: JSON).
    Table("metrics", _cols("t:f url:s instance:i name:s labels:s value:f")),
)
TABLES: dict[str, Table] = {t.name: t for t in _DECLARED}
SCHEMAS: dict[str, pa.Schema] = {name: t.schema for name, t in TABLES.items()}


def check_rows(name: str, rows: list[dict[str, Any]]) -> None:
    """Raise when a row for a declared table carries a column the table does not declare."""
    table = TABLES.get(name)
    if table is None:
        return
    known = set(table.names)
    unknown = {k for r in rows if not r.keys() <= known for k in r if k not in known}
    if unknown:
        raise TableSchemaError(f"rows for table {name} carry undeclared column(s) {', '.join(sorted(unknown))}",
                               "declare them in leaktrace/session/tables.py")


def check_columns(name: str, columns: dict[str, Any]) -> None:
    """Raise unless ``name`` is a declared table, every one of ``columns`` is its and all are of one length."""
    table = TABLES.get(name)
    if table is None:
        raise TableSchemaError(f"rows given by column need a declared table, not {name}",
                               "declare it in leaktrace/session/tables.py")
    check_rows(name, [dict.fromkeys(columns)])
    if len({len(v) for v in columns.values()}) > 1:
        raise TableSchemaError(f"columns for table {name} differ in length", "give every column one value a row")


def columns_to_arrow(name: str, columns: dict[str, Any]) -> pa.Table:
    """Rows of a declared table given column by column (see :func:`check_columns`) as one part: a declared column
    left out takes its default."""
    table = TABLES[name]
    n = len(next(iter(columns.values()), ()))
    return pa.Table.from_pydict({c.name: columns[c.name] if c.name in columns else [c.default] * n
                                 for c in table.columns}, schema=table.schema)


def to_arrow(name: str, rows: list[dict[str, Any]]) -> pa.Table:
    """The rows as one part: every declared column (a key a row lacks is null, or the column's default),
    or, for a table not declared, every key of every row (pyarrow takes the columns from the first row
    alone, and rows of one part may differ)."""
    table = TABLES.get(name)
    if table is not None:
        # column by column: a drained batch of eBPF events is thousands of rows, and a dict per row costs more
        return pa.Table.from_pydict({c.name: [r.get(c.name, c.default) for r in rows] for c in table.columns},
                                    schema=table.schema)
    keys = list(dict.fromkeys(k for r in rows for k in r))
    return pa.Table.from_pylist([{k: r.get(k) for k in keys} for r in rows])


def _written_version(tbl: pa.Table) -> int | None:
    tag = (tbl.schema.metadata or {}).get(META_KEY, b"")
    try:
        return int(tag.rsplit(b"/", 1)[1])
    except (IndexError, ValueError):
        return None


def conform(name: str, tbl: pa.Table, where: str) -> pa.Table:
    """A part of a declared table with exactly the declared columns, in order, of the declared types.

    Raises :class:`TableSchemaError` for a column the declaration does not know (a newer writer, or a
    rename) and for a required column missing; an optional column missing is filled with its default.
    Values that cannot take the declared type (a damaged part) raise Arrow's error: the caller skips
    the part and says so. ``where``: the part, as the error names it."""
    table = TABLES[name]
    unknown = [n for n in tbl.column_names if n not in table.names]
    if unknown:
        written = _written_version(tbl)
        newer = (f"; written at table version {written}, this leaktrace reads up to {table.version}"
                 if written is not None and written > table.version else "")
        raise TableSchemaError(f"{where}: table {name} has undeclared column(s) {', '.join(unknown)}{newer}")
    cols = {c.name: tbl.column(c.name).cast(c.type) for c in table.columns if c.name in tbl.column_names}
    missing = [c.name for c in table.columns if c.name not in cols and not c.optional]
    if missing:
        raise TableSchemaError(f"{where}: table {name} lacks required column(s) {', '.join(missing)}")
    n = len(tbl)
    arrays = [cols[c.name] if c.name in cols
              else pa.nulls(n, c.type) if c.default is None else pa.array([c.default] * n, c.type)
              for c in table.columns]
    return pa.Table.from_arrays(arrays, schema=table.schema)
