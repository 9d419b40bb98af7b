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

from leaktrace.session import TableSource

PAGE = 4096
REPLACED_COLUMNS = ["t", "bytes", "library"]


def _library_at(maps: pd.DataFrame, addr: int) -> str:
    """The file name of the mapping (sorted by start, with a path) that holds ``addr``; "?" when none."""
    i = int(np.searchsorted(maps["start"].to_numpy(dtype=np.int64), addr, side="right")) - 1
    if i < 0 or addr >= int(maps["end"].iloc[i]):
        return "?"
    return os.path.basename(str(maps["path"].iloc[i]))


def replaced_preexisting(reader: TableSource, pid: int) -> pd.DataFrame:
    """Each release, since attach, of anonymous memory that existed before it: (t, bytes, library of the
    call site that unmapped it). The pre-existing anonymous mappings are the watcher's first full snapshot
    of the process; each of their pages counts once, at the first traced munmap that covers it (its
    address may be reused by a new mapping later). Munmaps of memory the kernel side does not know
    (pre-existing) always reach the event stream."""
    regions, events = reader.table("regions"), reader.table("bpf_events")
    empty = pd.DataFrame(columns=REPLACED_COLUMNS)
    if regions.empty or events.empty:
        return empty
    mine = regions[regions["pid"] == pid]
    first = mine[mine["snapshot"] == "first"]
    pre = first[first["cls"] == "anon"].sort_values("start")
    un = events[(events["pid"] == pid) & (events["type"] == "munmap") & (events["result"] == 0)]
    if pre.empty or un.empty:
        return empty
    starts = pre["start"].to_numpy(dtype=np.int64)
    ends = pre["end"].to_numpy(dtype=np.int64)
    base = np.concatenate([[0], np.cumsum((ends - starts) // PAGE)])
    held = np.ones(int(base[-1]), dtype=bool)
    un = un.sort_values("t")
    a = un["addr"].to_numpy(dtype=np.int64)
    b = a + (un["len"].to_numpy(dtype=np.int64) + PAGE - 1) // PAGE * PAGE
    first_after = np.searchsorted(ends, a, side="right")
    hit = (first_after < len(starts)) & (starts[np.minimum(first_after, len(starts) - 1)] < b)
    ts, sites = un["t"].to_numpy(dtype=float), un["site"].to_numpy(dtype=np.int64)
    rows, left = [], len(held)
    remaining = [int(n) for n in np.diff(base)]  # pages of each pre-existing mapping not yet released
    for k in np.flatnonzero(hit):
        j, got = int(first_after[k]), 0
        while j < len(starts) and starts[j] < b[k]:
            lo, hi = max(a[k], starts[j]), min(b[k], ends[j])
            if hi > lo and remaining[j]:  # an address reused since its release counts nothing
                pages = slice(int(base[j] + (lo - starts[j]) // PAGE), int(base[j] + (hi - starts[j]) // PAGE))
                n = int(held[pages].sum())
                held[pages] = False
                remaining[j] -= n
                got += n
            j += 1
        if got:
            rows.append((float(ts[k]), got * PAGE, int(sites[k])))
            left -= got
            if left <= 0:
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
