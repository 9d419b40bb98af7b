"""Joining what /proc sees grow to who mapped it, by address.

The watcher knows *which* memory grows (a class: shm, anonymous, heap…; regions that grow and move) but
not who mapped it; the eBPF ledger knows, for every mapping made since attach, its call site and stack.
Both describe the same address space, so the join is by address: every outstanding ledger region (at the
end of the hunt, or at the target's exit) falls in one of the watcher's last-seen mappings, whose class and
path it takes. A region that grew with mremap and moved is one ledger interval at its current address, so
the join follows moves without tracking them. shm, memfd and SysV segments — whose syscall carries no path
— get the call site that mapped them this way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

JOIN_COLUMNS = ["pid", "cls", "library", "stack_key", "bytes", "regions", "paths"]


@dataclass(frozen=True)
class JoinedSite:
    """One call site's share of a class's mappings in one process."""

    library: str
    stack_key: str
    bytes: int
    regions: int
    share: float  # of all ledger bytes joined to this (pid, class)
    paths: tuple[str, ...]


def _last_mappings(regions: pd.DataFrame) -> pd.DataFrame:
    """Each pid's mappings at its last full snapshot (the watcher writes ``first`` and ``last``)."""
    if regions.empty:
        return regions
    last = regions[regions["snapshot"] == "last"]
    if last.empty:
        last = regions[regions["t"] == regions.groupby("pid")["t"].transform("max")]
    return last


def _held(ledger_regions: pd.DataFrame) -> pd.DataFrame:
    """Ledger regions made since attach that were outstanding at the end, or at the exit of their pid."""
    if ledger_regions.empty:
        return ledger_regions
    lr = ledger_regions[~ledger_regions["preexisting"].astype(bool)]
    at_exit = lr["at_exit"].astype(bool)  # null (a session that predates the column): at stop
    exited = set(lr.loc[at_exit, "pid"])
    return lr[at_exit | ~lr["pid"].isin(exited)]


def join_by_address(regions: pd.DataFrame, ledger_regions: pd.DataFrame) -> pd.DataFrame:
    """Ledger bytes per (pid, watcher class, library, call site): each outstanding ledger region is placed
    in the watcher mapping that contains its start."""
    maps, held = _last_mappings(regions), _held(ledger_regions)
    if maps.empty or held.empty:
        return pd.DataFrame(columns=JOIN_COLUMNS)
    parts = []
    for pid, mine in held.groupby("pid"):
        vm = maps[maps["pid"] == pid].sort_values("start")
        if vm.empty:
            continue
        starts = vm["start"].to_numpy(dtype=np.uint64)
        ends = vm["end"].to_numpy(dtype=np.uint64)
        at = mine["start"].to_numpy(dtype=np.uint64)
        i = np.searchsorted(starts, at, side="right") - 1
        ok = (i >= 0) & (at < ends[np.clip(i, 0, None)])
        j = mine[ok].assign(cls=vm["cls"].to_numpy()[i[ok]], vma_path=vm["path"].fillna("").to_numpy()[i[ok]])
        parts.append(j)
    if not parts:
        return pd.DataFrame(columns=JOIN_COLUMNS)
    j = pd.concat(parts, ignore_index=True)
    out = (j.groupby(["pid", "cls", "library", "stack_key"])
           .agg(bytes=("size", "sum"), regions=("size", "count"),
                paths=("vma_path", lambda s: tuple(sorted({p for p in s if p})[:8])))
           .reset_index())
    return out.sort_values("bytes", ascending=False, kind="stable")[JOIN_COLUMNS]


def sites_for(joined: pd.DataFrame, pid: int, cls: str) -> list[JoinedSite]:
    """The call sites holding ``cls`` mappings of ``pid``, most bytes first."""
    if joined.empty:
        return []
    mine = joined[(joined["pid"] == pid) & (joined["cls"] == cls)]
    total = float(mine["bytes"].sum())
    return [JoinedSite(str(r.library), str(r.stack_key), int(r.bytes), int(r.regions),
                       float(r.bytes) / total if total else 0.0, tuple(r.paths))
            for r in mine.itertuples()]
