"""Pre-existing anonymous memory a process released during the hunt.

A library's ledger growth is net of the anonymous memory that existed at attach and that it unmapped since
(analysis/ledger.py): a churner whose live set was mapped before attach replaces it with new mappings, so
"mapped since attach and still held" rises to the live set while the total does not grow.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pandas as pd

from leaktrace.probes.bpf.addrspace import AddressSpace
from leaktrace.session import TableSource

PAGE = 4096
REPLACED_COLUMNS = ["t", "bytes", "library"]


def _library_at(maps: pd.DataFrame, addr: int) -> str:
    """The file name of the mapping (sorted by start, with a path) that holds ``addr``; "?" when none."""
    i = int(np.searchsorted(maps["start"].to_numpy(dtype=np.int64), addr, side="right")) - 1
    if i < 0 or addr >= int(maps["end"].iloc[i]):
        return "?"
    return os.path.basename(str(maps["path"].iloc[i]))


MAP_FIXED = 0x10
MREMAP_DONTUNMAP = 4


def _space(ranges: list[tuple[int, int]]) -> AddressSpace:
    """The ranges as one address space (its intervals are disjoint: a range put over another replaces it)."""
    space = AddressSpace()
    for lo, hi in ranges:
        space.put(int(lo), int(hi), 0, 0)
    return space


def _bounds(space: AddressSpace) -> tuple[np.ndarray, np.ndarray]:
    starts, ends, _, _ = space.columns()
    return np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)


def _bytes(pieces: list[tuple[int, int, int, int]]) -> int:
    return sum(e - s for s, e, _, _ in pieces)


def _releases(events: pd.DataFrame) -> pd.DataFrame:
    """The successful calls that can take memory away from a range, in time order, with the range they act
    on as (a, b): munmap; mremap (its old range; ``result`` is where it is now); mmap MAP_FIXED (what it
    overlays is replaced)."""
    ok_remap = (events["type"] == "mremap") & (events["result"] > 0) & (events["result"] % PAGE == 0)
    fixed = ((events["type"] == "mmap") & ((events["flags"] & MAP_FIXED) != 0)
             & (events["result"] == events["addr"]))
    ev = events[((events["type"] == "munmap") & (events["result"] == 0)) | ok_remap | fixed].sort_values("t")
    a = ev["addr"].to_numpy(dtype=np.int64)
    length = (ev["len"].to_numpy(dtype=np.int64) + PAGE - 1) // PAGE * PAGE
    return ev.assign(a=a, b=a + length)


def _overlaps(a: np.ndarray, b: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Which [a, b) overlap any of the sorted, disjoint [starts, ends)."""
    if not len(starts):
        return np.zeros(len(a), dtype=bool)
    k = np.searchsorted(ends, a, side="right")
    return (k < len(starts)) & (starts[np.minimum(k, len(starts) - 1)] < b)


def replaced_preexisting(reader: TableSource, pid: int) -> pd.DataFrame:
    """Each release, since attach, of anonymous memory that existed before it: (t, bytes, library of the
    call site that released it). The pre-existing anonymous mappings are the watcher's first full snapshot
    of the process; each byte counts once, at the first traced munmap that covers it, the mremap shrink
    that trims it or the MAP_FIXED mapping that overlays it. An mremap that moves pre-existing memory
    releases nothing: the memory moves with it (a later release at its new address counts), and its old
    addresses, free then and reused by new mappings, are no longer pre-existing. Calls on memory the kernel
    side does not know (pre-existing) always reach the event stream."""
    regions, events = reader.table("regions"), reader.table("bpf_events")
    empty = pd.DataFrame(columns=REPLACED_COLUMNS)
    if regions.empty or events.empty:
        return empty
    mine = regions[regions["pid"] == pid]
    first = mine[mine["snapshot"] == "first"]
    pre = first[first["cls"] == "anon"].sort_values("start")
    ev = _releases(events[events["pid"] == pid])
    if pre.empty or ev.empty:
        return empty
    held = _space(list(zip(pre["start"], pre["end"], strict=True)))
    # Only calls on a range pre-existing memory can be in (where it was at attach, or where a move put it)
    # are walked: moved memory can land only in some mremap's new range.
    remap = ev[ev["type"] == "mremap"]
    dest = _space([*zip(*_bounds(held), strict=True),
                   *((int(r), int(r) + (int(n) + PAGE - 1) // PAGE * PAGE)
                     for r, n in zip(remap["result"], remap["new_len"], strict=True))])
    ds, de = _bounds(dest)
    a, b = ev["a"].to_numpy(dtype=np.int64), ev["b"].to_numpy(dtype=np.int64)
    walk = np.flatnonzero(_overlaps(a, b, ds, de))
    types, ts = ev["type"].to_numpy(), ev["t"].to_numpy(dtype=float)
    sites, flags = ev["site"].to_numpy(dtype=np.int64), ev["flags"].to_numpy(dtype=np.int64)
    results, new_len = ev["result"].to_numpy(dtype=np.int64), ev["new_len"].to_numpy(dtype=np.int64)
    rows = []
    for k in walk:
        lo, hi, got = int(a[k]), int(b[k]), 0
        if types[k] != "mremap":
            got = _bytes(held.cut(lo, hi))
        else:
            keep = (int(new_len[k]) + PAGE - 1) // PAGE * PAGE
            to = int(results[k])
            if to == lo:  # in place: a shrink releases its tail, a grow adds memory of the hunt
                got = _bytes(held.cut(lo + keep, hi)) if keep < hi - lo else 0
            else:
                got = _bytes(held.cut(to, to + keep))  # MREMAP_FIXED replaces what was there
                pieces = held.pieces(lo, hi) if flags[k] & MREMAP_DONTUNMAP else held.cut(lo, hi)
                got += sum(max(0, e - max(s, lo + keep)) for s, e, _, _ in pieces)  # a shrinking move drops its tail
                for s, e, _, _ in pieces:
                    if s < lo + keep:
                        held.put(s - lo + to, min(e, lo + keep) - lo + to, 0, 0)
        if got:
            rows.append((float(ts[k]), got, int(sites[k])))
        if not len(held):
            break
    if not rows:
        return empty
    df = pd.DataFrame(rows, columns=["t", "bytes", "site"])
    maps = mine[mine["snapshot"] == "last"]
    maps = (maps if not maps.empty else first).sort_values("start")
    maps = maps[maps["path"].fillna("").astype(str).str.len() > 0]
    libs = {s: _library_at(maps, s) for s in df["site"].unique()} if not maps.empty else {}
    df["library"] = df["site"].map(lambda s: libs.get(s, "?"))
    return df[REPLACED_COLUMNS]


def no_release(t: np.ndarray) -> np.ndarray:
    return np.zeros(len(t))


def released_by(replaced: pd.DataFrame, library: str, t_end: float) -> Any:
    """t -> the pre-existing bytes ``library`` had unmapped by each time of ``t`` (``replaced_preexisting``)."""
    rep = replaced[(replaced["library"] == library) & (replaced["t"] <= t_end)]
    if rep.empty:
        return no_release
    times, cum = rep["t"].to_numpy(dtype=float), np.cumsum(rep["bytes"].to_numpy(dtype=float))

    def gone(t: np.ndarray) -> np.ndarray:
        idx = np.searchsorted(times, np.asarray(t, dtype=float), side="right")
        return np.where(idx > 0, cum[np.maximum(idx - 1, 0)], 0.0)

    return gone
