"""The rates of growth.py over a session's per-process tables (pandas): one row per process or per
(process, memory class)."""

from __future__ import annotations

from collections.abc import Iterator

import pandas as pd

from leaktrace.analysis.growth import MB, rate, series_rates


def per_process(table: pd.DataFrame, min_rows: int = 4) -> Iterator[tuple[int, pd.DataFrame]]:
    """(pid, its rows in time order) of a per-process table, for each process with at least ``min_rows``."""
    if table.empty:
        return
    for pid, rows in table.groupby("pid"):
        if len(rows) >= min_rows:
            yield int(pid), rows.sort_values("t")


def process_rates(rollup: pd.DataFrame, warmup_s: float | None = None) -> pd.DataFrame:
    """One row per pid: rss/anon/uss/pss rates (MB/min), their confidences and step flags."""
    rows = []
    for pid, g in rollup.groupby("pid", sort=True):
        g = g.sort_values("t")
        levels = {col: g[col].to_numpy(dtype=float) for col in ("rss", "anon", "uss", "pss")}
        rows.append(series_rates(int(pid), g["t"].to_numpy(dtype=float), levels, warmup_s))
    return pd.DataFrame(rows)


def class_rate_table(class_usage: pd.DataFrame, warmup_s: float | None = None) -> pd.DataFrame:
    """One row per (pid, class): RSS rate (MB/min), confidence, step flag, last RSS (MB)."""
    cols = ["pid", "cls", "mb_per_min", "confidence", "step", "last_mb", "samples", "decelerating"]
    if class_usage.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for (pid, cls), g in class_usage.groupby(["pid", "cls"], sort=False):
        g = g.sort_values("t")
        r = rate(g["t"].to_numpy(dtype=float), g["rss"].to_numpy(dtype=float), warmup_s)
        rows.append((int(pid), str(cls), r.mb_per_min, r.confidence, r.step,
                     float(g["rss"].iloc[-1]) / MB, len(g), r.decelerating))
    return pd.DataFrame(rows, columns=cols)


def class_rates(class_usage: pd.DataFrame, warmup_s: float | None = None,
                table: pd.DataFrame | None = None) -> dict[str, float]:
    """MB/min of RSS per memory class, summed over processes (each process's own slope)."""
    tbl = class_rate_table(class_usage, warmup_s) if table is None else table
    if tbl.empty:
        return {}
    sums = tbl.groupby("cls")["mb_per_min"].sum()
    return {str(k): round(float(v), 4) for k, v in sorted(sums.items(), key=lambda kv: -kv[1])}
