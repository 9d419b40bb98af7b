"""``first_named_s``: the earliest tick at which each culprit would already have been named, the naming
step re-run on prefixes of the session (every table cut at ``t <= T``): a scan of a ledger culprit's own
snapshots, else a binary search over the ticks (see :func:`first_named`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from leaktrace.analysis.candidates import THRESHOLDS, clears, is_leaking, ledger_candidates, process_info
from leaktrace.analysis.growth_tables import process_rates
from leaktrace.analysis.load import requests_by_pid
from leaktrace.session import TableSource

_SNAPSHOT_KIND = {"native-mmap": "anon", "malloc-heap": "heap"}


def _first_named_from_snapshots(snaps: pd.DataFrame, c: dict[str, Any], th: dict[str, float],
                                work: tuple[np.ndarray, np.ndarray] | None = None) -> float | None:
    """The ledger's per-tick outstanding bytes of (pid, library): the earliest tick at which the rate
    over the snapshots so far passes the ledger thresholds (the naming rule of ledger_candidates).
    None when the ledger has no snapshot of it (the caller then re-runs the analysis on prefixes)."""
    from leaktrace.analysis.growth import rate

    if snaps.empty:
        return None
    mine = snaps[(snaps["pid"] == c["pid"]) & (snaps["library"] == c["library"])]
    kind = _SNAPSHOT_KIND.get(c.get("measured_kind") or c["kind"])
    if kind is not None and (mine["kind"] == kind).any():
        mine = mine[mine["kind"] == kind]
    if mine.empty:
        return None
    series = mine.groupby("t")["outstanding_bytes"].sum().sort_index()
    t, y = series.index.to_numpy(dtype=float), series.to_numpy(dtype=float)

    def named(i: int) -> bool:  # first i+1 snapshots
        if i < 2:
            return False
        r = rate(t[: i + 1], y[: i + 1], warmup_s=0.0, work=work)
        return (r.steady_mb_per_min >= th["ledger_mb_per_min"] and r.confidence >= th["min_confidence"]
                and clears(r.lower_mb_per_min, th["ledger_mb_per_min"]))

    # A scan from the start, not a binary search: for a leak that follows traffic, whether a prefix names it
    # is not monotone (a lull mid-hunt makes the prefixes ending in it read as a plateau forming), and a
    # binary search then lands after the lull (on a vLLM P/D pair, a minute late).
    # Each step is one rate() on at most slope.MAX_POINTS samples: cheap.
    i = next((k for k in range(len(t)) if named(k)), None)
    return None if i is None else float(t[i])


def _earliest(n: int, holds: Callable[[int], bool]) -> int | None:
    """The first index in range(n) where ``holds`` (monotone: once true, true after) is true; None when it
    is not even true at the end. Binary search: the naming step is costly to re-run."""
    lo, hi = 0, n - 1
    if n == 0 or not holds(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if holds(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


class PrefixReader:
    """A read-only view of a session cut at ``t <= t_max`` (what the analysis knew at that moment)."""

    def __init__(self, reader: TableSource, t_max: float) -> None:
        self._base = reader
        self.t_max = t_max
        self.path = reader.path
        self.meta = reader.meta
        self.skipped_parts: list[str] = []
        self.complete = False

    def tables(self) -> list[str]:
        return self._base.tables()

    def table(self, name: str) -> pd.DataFrame:
        df = self._base.table(name)
        if "t" in df.columns and not df.empty:
            return df[df["t"] <= self.t_max]
        return df


def culprit_key(c: dict[str, Any]) -> tuple[Any, ...]:
    if c.get("library"):
        return (c["pid"], c["library"])
    return (c["pid"], c.get("source"), c.get("cls"))


def first_named(reader: TableSource, culprits: list[dict[str, Any]], th: dict[str, float] = THRESHOLDS,
                max_culprits: int = 8) -> None:
    """Sets ``first_named_s`` (seconds from attach) on each culprit: the earliest watcher tick at which
    re-running the naming step on the session prefix names it. A ledger culprit: a scan of its own
    snapshots from the start. Otherwise a binary search over the ticks (the whole naming step is costly to
    re-run; monotone in practice, since rates firm up as samples accumulate)."""
    rollup = reader.table("rollup")
    if rollup.empty or not culprits:
        return
    attach = float(reader.meta.get("attach_s") or 0.0)
    ticks = sorted(t for t in rollup["t"].unique() if t >= attach)
    if not ticks:
        return
    info = process_info(reader)
    memo: dict[int, set[tuple[Any, ...]]] = {}
    by_pid = {pid: g for pid, g in rollup.groupby("pid")}

    def named_at(i: int, pid: int, want_ledger: bool) -> set[tuple[Any, ...]]:
        t_max = ticks[i]
        keys: set[tuple[Any, ...]] = set()
        if want_ledger:
            if i not in memo:
                cands, _ = ledger_candidates(PrefixReader(reader, t_max), info, [], th)
                memo[i] = {c.key for c in cands}
            keys |= memo[i]
        g = by_pid.get(pid)
        if g is not None:
            pr = process_rates(g[g["t"] <= t_max])
            if not pr.empty and is_leaking(pr.iloc[0], th):
                keys |= {("leaking", pid)}
        return keys

    snaps = reader.table("ledger_snapshots")
    work = requests_by_pid(reader)
    for c in culprits[:max_culprits]:
        if c.get("first_named_s") is not None:
            continue
        key = culprit_key(c)
        via_ledger = c.get("source") == "ledger"
        if via_ledger:
            t_named = _first_named_from_snapshots(snaps, c, th, work.get(c["pid"]))
            if t_named is not None:
                c["first_named_s"] = round(max(t_named - attach, 0.0), 2)
                continue

        def ok(i: int, key: tuple[Any, ...] = key, c: dict[str, Any] = c, via_ledger: bool = via_ledger) -> bool:
            keys = named_at(i, c["pid"], via_ledger)
            return key in keys if via_ledger else ("leaking", c["pid"]) in keys

        i = _earliest(len(ticks), ok)
        if i is not None:
            c["first_named_s"] = round(ticks[i] - attach, 2)

