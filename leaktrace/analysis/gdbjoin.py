"""Joins gdb stack samples (the ``gdb_samples`` table, see leaktrace/probes/gdb/rows.py) to memory regions.

The address an mmap/mremap returned identifies the region it created: a region ``[start, end)`` of
the same pid that contains a sampled address gets that sample's full stack. This is how a raw-syscall
mmap made inside a hook library is traced back through the hook to the code that caused it.

Regions come from the eBPF ledger's ``ledger_regions`` table (pid, start, end, size, library, ...)
when it has rows, else from the watcher's last full smaps (``regions`` table, snapshot "last").
Pure functions over a SessionReader or DataFrames: no I/O besides reading the session.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import numpy as np
import pandas as pd

from leaktrace.analysis.frames import code_frames
from leaktrace.session import TableSource

MAPPING_SYSCALLS = ("mmap", "mremap")


def _json_list(value: Any) -> list:
    if isinstance(value, list):
        return value
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return []
    try:
        out = json.loads(value)
    except (TypeError, ValueError):
        return []
    return out if isinstance(out, list) else []


def gdb_samples(reader: TableSource) -> pd.DataFrame:
    """The ``gdb_samples`` table with ``frames`` and ``stack`` decoded into Python lists."""
    df = reader.table("gdb_samples")
    if df.empty:
        return df
    df = df.copy()
    df["frames"] = df["frames"].map(_json_list)
    df["stack"] = df["stack"].map(lambda s: code_frames(_json_list(s)))
    py = df["python_stack"] if "python_stack" in df.columns else pd.Series([None] * len(df), index=df.index)
    df["python_stack"] = py.map(lambda s: [str(f) for f in _json_list(s)])
    return df


def candidate_regions(reader: TableSource) -> pd.DataFrame:
    """Regions to attach stacks to: the ledger's when present, else the watcher's last smaps."""
    ledger = reader.table("ledger_regions")
    if not ledger.empty:
        out = ledger.copy()
        out["source"] = "ledger"
        return out
    regions = reader.table("regions")
    if regions.empty:
        return pd.DataFrame(columns=["pid", "start", "end", "source"])
    last = regions[regions["snapshot"] == "last"]
    out = last.copy()
    out["source"] = "smaps"
    return out


def join_samples_to_regions(samples: pd.DataFrame, regions: pd.DataFrame) -> pd.DataFrame:
    """``regions`` (pid, start, end, …) plus, for each region holding the address of at least one
    successful mmap/mremap sample of the same pid: ``gdb_samples`` (how many), ``gdb_t``,
    ``gdb_syscall``, ``gdb_addr``, ``gdb_length`` and ``gdb_stack`` (list of "lib!sym+0x…") of the
    latest such sample. Regions without one keep ``gdb_samples == 0`` and an empty stack."""
    out = regions.copy().reset_index(drop=True)
    n = len(out)
    count = np.zeros(n, dtype=np.int64)
    latest: list[dict[str, Any] | None] = [None] * n
    if n and not samples.empty:
        mapped = samples[samples["syscall"].isin(MAPPING_SYSCALLS) & (samples["error"] == 0)
                         & (samples["addr"] != 0)]
        for pid, group in mapped.groupby("pid"):
            idx = np.flatnonzero(out["pid"].to_numpy() == pid)
            if not len(idx):
                continue
            starts = out["start"].to_numpy()[idx].astype(np.uint64)
            ends = out["end"].to_numpy()[idx].astype(np.uint64)
            order = np.argsort(starts, kind="stable")
            starts, ends, idx = starts[order], ends[order], idx[order]
            addrs = group["addr"].to_numpy().astype(np.uint64)
            pos = np.searchsorted(starts, addrs, side="right") - 1
            for row, p, addr in zip(group.itertuples(index=False), pos, addrs, strict=True):
                if p < 0 or addr >= ends[p]:
                    continue
                r = idx[p]
                count[r] += 1
                if latest[r] is None or row.t >= latest[r]["t"]:
                    latest[r] = row._asdict()
    out["gdb_samples"] = count
    out["gdb_t"] = [s["t"] if s else np.nan for s in latest]
    out["gdb_syscall"] = [s["syscall"] if s else None for s in latest]
    out["gdb_addr"] = [int(s["addr"]) if s else 0 for s in latest]
    out["gdb_length"] = [int(s["length"]) if s else 0 for s in latest]
    out["gdb_stack"] = [code_frames(_json_list(s["stack"])) if s else [] for s in latest]
    return out


def join_regions(reader: TableSource, regions: pd.DataFrame | None = None) -> pd.DataFrame:
    """:func:`join_samples_to_regions` over a session (regions: the ledger's, else the watcher's)."""
    return join_samples_to_regions(gdb_samples(reader), candidate_regions(reader) if regions is None else regions)


def _frames_name_library(frames: list[dict[str, Any]], library: str) -> bool:
    return any(f.get("library") == library or (f.get("path") or "").endswith("/" + library) for f in frames)


def gdb_stack_for(reader: TableSource, pid: int, library: str | None) -> list[str]:
    """The gdb stack to show for a culprit: among this pid's successful mmap/mremap samples whose
    frames include ``library`` (any sample when ``library`` is None), the most frequent stack (the
    latest on a tie), as "libfoo.so!func+0x12" strings, innermost first. [] when none."""
    df = gdb_samples(reader)
    if df.empty:
        return []
    df = df[(df["pid"] == pid) & df["syscall"].isin(MAPPING_SYSCALLS) & (df["error"] == 0)]
    if library:
        df = df[df["frames"].map(lambda fr: _frames_name_library(fr, library))]
    if df.empty:
        return []
    stacks = [tuple(s) for s in df.sort_values("t")["stack"]]
    counts = Counter(stacks)
    best = max(counts.values())
    for stack in reversed(stacks):
        if counts[stack] == best:
            return list(stack)
    return []


def python_stack_of(stacks: list[tuple[list[str], list[str]]], native: list[str]) -> list[str]:
    """The Python stack most often seen (the latest on a tie) among ``stacks`` ((native stack, Python
    stack) of samples, oldest first) with the native stack ``native``; [] when none had one."""
    pythons = [tuple(py) for st, py in stacks if list(st) == list(native) and py]
    if not pythons:
        return []
    counts = Counter(pythons)
    best = max(counts.values())
    return list(next(py for py in reversed(pythons) if counts[py] == best))


def gdb_python_stack_for(reader: TableSource, pid: int, native: list[str]) -> list[str]:
    """:func:`python_stack_of` over ``pid``'s successful mmap/mremap samples."""
    df = gdb_samples(reader)
    if df.empty:
        return []
    df = df[(df["pid"] == pid) & df["syscall"].isin(MAPPING_SYSCALLS) & (df["error"] == 0)].sort_values("t")
    return python_stack_of(list(zip(df["stack"], df["python_stack"], strict=True)), native)


def libraries_in_order(frames: list[dict[str, Any]]) -> list[str]:
    """The libraries of a stack, innermost first, consecutive repeats collapsed."""
    out: list[str] = []
    for f in frames:
        lib = f.get("library")
        if lib and (not out or out[-1] != lib):
            out.append(lib)
    return out
