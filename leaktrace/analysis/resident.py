"""Two named figures on every culprit: what it maps and what of that is resident.

``outstanding_bytes`` is address space (the ledger's intervals, mapped since attach and still held);
``outstanding_resident_bytes`` the part of it present in RAM. ``mb_per_min`` is the growth that costs RAM
and ``mapped_mb_per_min`` the address-space growth; both are on every culprit, equal where the source
measures one figure only (the Python heap, memory held by descriptors, /proc's resident growth).

Where the resident bytes of a ledger culprit come from, best first (the evidence names which):

1. ``pagemap``: the eBPF probe's ``resident_bytes`` of the culprit's (pid, library, kind) rows of
   ``ledger_snapshots``, read from /proc/PID/pagemap at the same tick as the mapped figure; at a
   process's exit (the pages are gone then) the last tick that read them.
2. ``smaps``: the watcher's last full smaps, each mapping's Rss apportioned over the ledger regions
   inside it by their overlap (sessions recorded before the probe read pagemap, or a tick over its bound).
3. none: the mapped bytes, said so.

A mapping culprit's ``mb_per_min`` (kind native-mmap) is its mapped rate times the share of its growth that
is resident: the Theil-Sen slope of its group's resident bytes over that of its mapped bytes, on the ticks
that read pagemap for every row of the group, less those that raced a move of its memory. A library that maps
memory and never writes it grows the address space, not RAM: it stays a culprit (``mapped_mb_per_min``), rated
by what it costs.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from leaktrace.analysis.candidates import Candidate
from leaktrace.analysis.growth import MB
from leaktrace.session import TableSource
from leaktrace.slope import theil_sen

LEDGER_KIND = {"native-mmap": "anon", "thread-stacks": "anon", "malloc-heap": "heap"}


def _ledger_group(c: Candidate) -> tuple[str | None, str] | None:
    """(library or None for the whole heap, ledger kind) of a ledger culprit's rows; None for others."""
    if not c.source.startswith("ledger") and c.source != "watcher+ledger":
        return None
    measured = c.extra.get("measured_kind", c.kind)
    kind = LEDGER_KIND.get(measured) or LEDGER_KIND.get(c.kind)
    if kind is None:
        return None
    if kind == "heap":
        return None, "heap"
    return c.extra.get("thread_runtime") or c.library, "anon"


def pagemap_share(snaps: pd.DataFrame, pid: int, library: str | None, kind: str) -> tuple[float, float] | None:
    """(resident share of the group's outstanding bytes, t) at the last tick that read pagemap for every row
    of the group; None when no tick did."""
    known = _complete_ticks(snaps, pid, library, kind)
    known = known[known["mapped"] > 0]
    if known.empty:
        return None
    last = known.iloc[-1]
    return min(1.0, float(last["resident"]) / float(last["mapped"])), float(known.index[-1])


# Ticks with pagemap read for every row of the group that a resident growth share needs.
MIN_RESIDENT_TICKS = 5


def _complete_ticks(snaps: pd.DataFrame, pid: int, library: str | None, kind: str) -> pd.DataFrame:
    """The group's (mapped, resident) per tick, at the ticks that read pagemap for every row of it."""
    if snaps.empty or "resident_bytes" not in snaps:
        return pd.DataFrame(columns=["mapped", "resident"])
    sel = (snaps["pid"] == pid) & (snaps["kind"] == kind)
    if library is not None:
        sel &= snaps["library"] == library
    mine = snaps[sel]
    if mine.empty:
        return pd.DataFrame(columns=["mapped", "resident"])
    known = mine.groupby("t").agg(mapped=("outstanding_bytes", "sum"), resident=("resident_bytes", "sum"),
                                  unread=("resident_bytes", lambda s: int(s.isna().sum())))
    known = known[known["unread"] == 0][["mapped", "resident"]]
    return _unraced(known)


# A tick whose resident share is below this share of the group's median one raced a move: pagemap read the
# buffer's old address after mremap moved it (a read can only miss pages, never find more). On a loaded box
# a buffer moved on every grow read 0 at a third of its ticks.
RACED_SHARE = 0.75


def _unraced(known: pd.DataFrame) -> pd.DataFrame:
    """``known`` (mapped, resident per tick) without the ticks that raced a move of the group's memory."""
    mapped = known["mapped"].to_numpy(dtype=float)
    if not len(known) or not (mapped > 0).any():
        return known
    share = known["resident"].to_numpy(dtype=float) / np.maximum(mapped, 1.0)
    return known[(mapped <= 0) | (share >= RACED_SHARE * float(np.median(share[mapped > 0])))]


def growth_resident_share(snaps: pd.DataFrame, pid: int, library: str | None, kind: str) -> tuple[float, int] | None:
    """(share of the group's mapped growth that is resident, ticks it is read from): the Theil-Sen slope of its
    resident bytes over that of its mapped bytes, in [0, 1]; None with too few complete ticks or no growth."""
    known = _complete_ticks(snaps, pid, library, kind)
    if len(known) < MIN_RESIDENT_TICKS:
        return None
    t = known.index.to_numpy(dtype=float)
    grew = theil_sen(t, known["mapped"].to_numpy(dtype=float))[0]
    if grew <= 0:
        return None
    held = theil_sen(t, known["resident"].to_numpy(dtype=float))[0]
    return min(1.0, max(0.0, held / grew)), len(known)


def smaps_share(reader: TableSource, pid: int, library: str | None, kind: str) -> float | None:
    """The resident share of the group's ledger regions (the last ones recorded) apportioned from the
    watcher's last full smaps: each mapping's Rss over the regions inside it by overlap."""
    if "ledger_regions" not in reader.tables() or "regions" not in reader.tables():
        return None
    lr, maps = reader.table("ledger_regions"), reader.table("regions")
    if lr.empty or maps.empty:
        return None
    sel = (lr["pid"] == pid) & (lr["kind"] == kind) & ~lr["preexisting"].astype(bool)
    if library is not None:
        sel &= lr["library"] == library
    held = lr[sel]
    if "at_exit" in held and held["at_exit"].notna().any() and held["at_exit"].astype(bool).any():
        held = held[held["at_exit"].astype(bool)]
    m = maps[maps["pid"] == pid]
    last = m[m["snapshot"] == "last"] if (m["snapshot"] == "last").any() else m[m["t"] == m["t"].max()]
    if held.empty or last.empty:
        return None
    last = last.sort_values("start")
    ms = last["start"].to_numpy(dtype=np.float64)
    me = last["end"].to_numpy(dtype=np.float64)
    density = last["rss"].to_numpy(dtype=np.float64) / np.maximum(me - ms, 1.0)
    covered = resident = 0.0
    for a, b in zip(held["start"].to_numpy(dtype=np.float64), held["end"].to_numpy(dtype=np.float64), strict=True):
        lo = max(int(np.searchsorted(me, a, side="right")), 0)
        hi = int(np.searchsorted(ms, b, side="left"))
        for j in range(lo, hi):
            overlap = min(b, me[j]) - max(a, ms[j])
            if overlap > 0:
                covered += overlap
                resident += overlap * density[j]
    if covered <= 0:
        return None
    return min(1.0, resident / covered)


def add_figures(reader: TableSource, cands: list[Candidate]) -> None:
    """Give every candidate ``outstanding_resident_bytes`` and ``mapped_mb_per_min`` (in ``extra``)."""
    snaps = reader.table("ledger_snapshots") if "ledger_snapshots" in reader.tables() else pd.DataFrame()
    for c in cands:
        c.extra.setdefault("mapped_mb_per_min", round(c.mb_per_min, 4))
        if "outstanding_resident_bytes" in c.extra:
            continue
        group = _ledger_group(c)
        if group is None or not c.outstanding_bytes:
            c.extra["outstanding_resident_bytes"] = int(c.outstanding_bytes)
            continue
        _ledger_resident(reader, snaps, c, *group)


def _ledger_resident(reader: TableSource, snaps: pd.DataFrame, c: Candidate, library: str | None, kind: str) -> None:
    pm = pagemap_share(snaps, c.pid, library, kind)
    share: float | None
    if pm is not None:
        share, t = pm
        when = "" if t >= float(snaps.loc[snaps["pid"] == c.pid, "t"].max()) - 1e-9 else \
            f", last read at t={t:.1f} s (the process exited after it: its pages went with it)"
        how = f"read from /proc/{c.pid}/pagemap (pages present){when}"
    else:
        share = smaps_share(reader, c.pid, library, kind)
        how = "apportioned from the last full smaps (each mapping's Rss over the ledger regions in it)"
    if share is None:
        c.extra["outstanding_resident_bytes"] = int(c.outstanding_bytes)
        c.evidence.append("resident bytes not recorded (no pagemap read, no smaps covering the regions): "
                          "counted as mapped")
        return
    resident = int(round(share * c.outstanding_bytes))
    c.extra["outstanding_resident_bytes"] = resident
    c.evidence.append(f"{c.outstanding_bytes / MB:.1f} MB mapped, {resident / MB:.1f} MB resident ({share:.1%}) {how}")
    if c.kind == "native-mmap" and pm is not None:
        _resident_rate(snaps, c, library, kind)


def _resident_rate(snaps: pd.DataFrame, c: Candidate, library: str | None, kind: str) -> None:
    """``mb_per_min`` of a mapping culprit: what of its mapped growth is resident (growth_resident_share)."""
    got = growth_resident_share(snaps, c.pid, library, kind)
    if got is None:
        return
    share, n = got
    mapped = c.mb_per_min
    c.mb_per_min = mapped * share
    line = (f"resident growth {c.mb_per_min:.2f} MB/min = the mapped growth {mapped:.2f} MB/min × {share:.1%} "
            f"(slope of its resident bytes over that of its mapped bytes, {n} ticks read from pagemap)")
    if share < 0.5:
        line += ": most of what it maps is never written, so it grows the address space more than RAM"
    c.evidence.append(line)
