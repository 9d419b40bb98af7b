"""Regions that grow, and regions that grow while changing address (seed 002's signature).

The watcher's ``region_events`` table describes each full-smaps diff: born, grown, shrunk, gone, moved.
A *chain* follows one region through those events: a ``moved`` or overlap-paired ``grown`` event carries
the old start address, so the chain continues at the new one. A region born during the hunt starts its
chain at 0 bytes (all of it is growth); one that existed at the first snapshot starts at its old size.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from leaktrace.analysis.growth import MB

CHAIN_COLUMNS = ["pid", "start", "end", "path", "cls", "perms", "first_rss", "last_rss", "first_size",
                 "last_size", "growth_rss", "growth_size", "moves", "events", "born_t", "last_t", "alive"]


def region_chains(events: pd.DataFrame) -> pd.DataFrame:
    """One row per region chain (see module doc)."""
    if events.empty:
        return pd.DataFrame(columns=CHAIN_COLUMNS)
    ev = events.sort_values(["t"], kind="stable")
    chains: list[dict[str, Any]] = []
    current: dict[tuple[int, int], int] = {}  # (pid, start address now) -> index into chains
    for pid, t, kind, start, end, size, rss, old_start, old_size, old_rss, perms, path, cls in zip(
            ev["pid"].to_numpy(), ev["t"].to_numpy(), ev["event"].to_numpy(), ev["start"].to_numpy(),
            ev["end"].to_numpy(), ev["size"].to_numpy(), ev["rss"].to_numpy(), ev["old_start"].to_numpy(),
            ev["old_size"].to_numpy(), ev["old_rss"].to_numpy(), ev["perms"].to_numpy(), ev["path"].to_numpy(),
            ev["cls"].to_numpy(), strict=True):
        pid = int(pid)
        if kind == "born":
            current[(pid, int(start))] = len(chains)
            chains.append({"pid": pid, "start": int(start), "end": int(end), "path": path, "cls": cls,
                           "perms": perms, "first_rss": 0, "last_rss": int(rss), "first_size": 0,
                           "last_size": int(size), "moves": 0, "events": 1, "born_t": float(t),
                           "last_t": float(t), "alive": True})
            continue
        key_old = (pid, int(old_start) if old_start is not None and not pd.isna(old_start) else int(start))
        idx = current.pop(key_old, None)
        if idx is None:
            # A region that existed before the first snapshot (or whose chain we lost): start a chain
            # at the size it had before this event.
            idx = len(chains)
            chains.append({"pid": pid, "start": key_old[1], "end": int(end), "path": path, "cls": cls,
                           "perms": perms, "first_rss": int(old_rss) if _num(old_rss) else int(rss),
                           "last_rss": 0, "first_size": int(old_size) if _num(old_size) else int(size),
                           "last_size": 0, "moves": 0, "events": 0, "born_t": None, "last_t": float(t),
                           "alive": True})
        c = chains[idx]
        c["events"] += 1
        c["last_t"] = float(t)
        if kind == "gone":
            c["last_rss"], c["last_size"], c["alive"] = 0, 0, False
            continue
        if kind == "moved":
            c["moves"] += 1
        c["start"], c["end"], c["last_rss"], c["last_size"] = int(start), int(end), int(rss), int(size)
        current[(pid, int(start))] = idx
    df = pd.DataFrame(chains)
    df["growth_rss"] = df["last_rss"] - df["first_rss"]
    df["growth_size"] = df["last_size"] - df["first_size"]
    return df[CHAIN_COLUMNS]


def _num(v: Any) -> bool:
    return v is not None and not pd.isna(v)


def _fmt(row: Any, span_s: float) -> dict[str, Any]:
    growth = int(row.growth_rss) if row.growth_rss else int(row.growth_size)
    return {
        "pid": int(row.pid), "start": f"0x{int(row.start):x}", "path": row.path or "[anon]", "cls": row.cls,
        "perms": row.perms, "first_mb": round(row.first_rss / MB, 3), "last_mb": round(row.last_rss / MB, 3),
        "size_mb": round(row.last_size / MB, 3), "growth_mb": round(growth / MB, 3),
        "mb_per_min": round(growth / MB / (span_s / 60.0), 4) if span_s > 0 else 0.0,
        "moves": int(row.moves), "alive": bool(row.alive),
    }


def top_regions(chains: pd.DataFrame, span_s: float, n: int = 10) -> dict[str, list[dict[str, Any]]]:
    """``growing``: largest RSS growth (size growth when RSS did not change); ``growing_and_moving``:
    growing chains that changed address at least once."""
    if chains.empty:
        return {"growing": [], "growing_and_moving": []}
    c = chains.assign(score=chains["growth_rss"].where(chains["growth_rss"] != 0, chains["growth_size"]))
    c = c[c["score"] > 0]
    growing = c.nlargest(n, "score")
    moving = c[c["moves"] > 0].nlargest(n, "score")
    return {"growing": [_fmt(r, span_s) for r in growing.itertuples()],
            "growing_and_moving": [_fmt(r, span_s) for r in moving.itertuples()]}


def shm_segments(regions: pd.DataFrame, chains: pd.DataFrame) -> pd.DataFrame:
    """Shared-memory segments alive at the end (last snapshot, else chains): pid, path, size, rss."""
    rows = []
    if not regions.empty:
        last = regions[(regions["snapshot"] == "last") & (regions["cls"] == "shm")]
        first = regions[(regions["snapshot"] == "first") & (regions["cls"] == "shm")]
        born_paths = set(zip(last["pid"], last["path"], strict=True)) - set(zip(first["pid"], first["path"],
                                                                                strict=True))
        for r in last.itertuples():
            rows.append({"pid": int(r.pid), "path": r.path, "size": int(r.size), "rss": int(r.rss),
                         "new": (r.pid, r.path) in born_paths})
    if not rows and not chains.empty:
        for r in chains[(chains["cls"] == "shm") & chains["alive"]].itertuples():
            rows.append({"pid": int(r.pid), "path": r.path, "size": int(r.last_size), "rss": int(r.last_rss),
                         "new": r.first_size == 0})
    return pd.DataFrame(rows, columns=["pid", "path", "size", "rss", "new"])
