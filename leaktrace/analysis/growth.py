"""Leak rates with a robust slope.

Theil–Sen (median of pairwise slopes) instead of first-minus-last: one spike, a GC pause or a step at
start-up does not make a rate. A step change (allocation once, then flat) gives a small slope because
most pairs lie on the flat parts; the confidence measure says how consistently pairs agree.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

MB = 1024 * 1024
# Points used for the pairwise slope (O(n²) pairs): enough for a stable median, bounded cost.
MAX_POINTS = 400


@dataclass
class Rate:
    per_s: float  # units per second
    confidence: float  # 0..1: fraction of pairwise slopes with the sign of the estimate
    n: int
    span_s: float

    @property
    def mb_per_min(self) -> float:
        return self.per_s * 60.0 / MB


def theil_sen(t: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(slope, fraction of pairwise slopes agreeing in sign). Subsamples evenly beyond MAX_POINTS."""
    n = len(t)
    if n < 2:
        return 0.0, 0.0
    if n > MAX_POINTS:
        idx = np.linspace(0, n - 1, MAX_POINTS).astype(int)
        t, y = t[idx], y[idx]
        n = MAX_POINTS
    i, j = np.triu_indices(n, k=1)
    dt = t[j] - t[i]
    ok = dt > 0
    if not ok.any():
        return 0.0, 0.0
    slopes = (y[j] - y[i])[ok] / dt[ok]
    slope = float(np.median(slopes))
    if slope == 0:
        agree = float(np.mean(slopes == 0))
    else:
        agree = float(np.mean(np.sign(slopes) == np.sign(slope)))
    return slope, agree


def warmup_cut(t: np.ndarray, warmup_s: float | None = None) -> float:
    """Seconds excluded at the start: the first 10% of the span, at most 30 s, unless given."""
    if len(t) == 0:
        return 0.0
    if warmup_s is not None:
        return float(t[0]) + warmup_s
    span = float(t[-1] - t[0])
    return float(t[0]) + min(span * 0.1, 30.0)


def rate(t: pd.Series | np.ndarray, y: pd.Series | np.ndarray, warmup_s: float | None = None) -> Rate:
    t = np.asarray(t, dtype=float)
    y = np.asarray(y, dtype=float)
    order = np.argsort(t, kind="stable")
    t, y = t[order], y[order]
    cut = warmup_cut(t, warmup_s)
    keep = t >= cut
    if keep.sum() >= 3:
        t, y = t[keep], y[keep]
    slope, conf = theil_sen(t, y)
    return Rate(slope, conf, len(t), float(t[-1] - t[0]) if len(t) else 0.0)


def process_rates(rollup: pd.DataFrame, warmup_s: float | None = None) -> pd.DataFrame:
    """One row per pid: rss/anon/uss/pss rates (MB/min) and their confidences."""
    rows = []
    for pid, g in rollup.groupby("pid"):
        row: dict[str, float | int] = {"pid": int(pid), "samples": len(g),
                                       "t_first": float(g["t"].min()), "t_last": float(g["t"].max())}
        for col in ("rss", "anon", "uss", "pss"):
            r = rate(g["t"], g[col], warmup_s)
            row[f"{col}_mb_per_min"] = r.mb_per_min
            row[f"{col}_confidence"] = r.confidence
        row["rss_first_mb"] = float(g.sort_values("t")["rss"].iloc[0]) / MB
        row["rss_last_mb"] = float(g.sort_values("t")["rss"].iloc[-1]) / MB
        rows.append(row)
    return pd.DataFrame(rows)


def class_rates(class_usage: pd.DataFrame, warmup_s: float | None = None) -> dict[str, float]:
    """MB/min of RSS per memory class, summed over processes (each process's own slope)."""
    out: dict[str, float] = {}
    if class_usage.empty:
        return out
    for (_pid, cls), g in class_usage.groupby(["pid", "cls"]):
        r = rate(g["t"], g["rss"], warmup_s)
        out[str(cls)] = out.get(str(cls), 0.0) + r.mb_per_min
    return {k: round(v, 4) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}
