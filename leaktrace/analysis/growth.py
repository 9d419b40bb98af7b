"""Leak rates with a robust slope, a confidence measure, a warm-up cut and step detection.

Theil–Sen (median of pairwise slopes) instead of first-minus-last: one spike, a GC pause or a step at
start-up does not make a rate. ``confidence`` is the fraction of pairwise slopes that agree in sign with
the estimate: ~1 for steady growth, ~0.5 for noise around a flat line.

A *step* (memory allocated once — a cache filled, a pool reserved — then flat) is not a leak, even
though Theil–Sen gives it a positive slope when the step sits mid-series. :func:`rate` flags a step when
one jump between consecutive samples carries most of the rise and both sides of it are (nearly) flat.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from leaktrace.slope import theil_sen

MB = 1024 * 1024
# Warm-up: the first WARMUP_FRACTION of the span, at most WARMUP_MAX_S, is excluded (start-up
# allocations, imports, first-request caches).
WARMUP_FRACTION = 0.1
WARMUP_MAX_S = 30.0
# Step: one consecutive-sample jump carrying at least this share of the total rise ...
STEP_SHARE = 0.5
# ... with the rate on each side of it below this share of the overall rate.
STEP_FLAT_SHARE = 0.25


@dataclass
class Rate:
    per_s: float  # units per second (Theil–Sen slope after the warm-up cut)
    confidence: float  # 0..1: fraction of pairwise slopes with the sign of the estimate
    n: int  # samples used
    span_s: float  # seconds covered by the samples used
    step: bool = False  # the rise is one step, not a steady growth
    step_bytes: float = 0.0  # size of the largest jump (units)
    rise: float = 0.0  # last minus first (units), for the reader's sanity check

    @property
    def mb_per_min(self) -> float:
        return self.per_s * 60.0 / MB

    @property
    def steady_mb_per_min(self) -> float:
        """The rate as a leak figure: 0 when the rise is a step."""
        return 0.0 if self.step else self.mb_per_min


def warmup_cut(t: np.ndarray, warmup_s: float | None = None) -> float:
    """First time kept: the first 10% of the span (at most 30 s) is warm-up, unless given."""
    if len(t) == 0:
        return 0.0
    if warmup_s is not None:
        return float(t[0]) + warmup_s
    span = float(t[-1] - t[0])
    return float(t[0]) + min(span * WARMUP_FRACTION, WARMUP_MAX_S)


def _is_step(t: np.ndarray, y: np.ndarray, slope: float) -> tuple[bool, float]:
    if len(y) < 6 or slope <= 0:
        return False, 0.0
    d = np.diff(y)
    k = int(np.argmax(d))
    jump = float(d[k])
    rise = float(y[-1] - y[0])
    if rise <= 0 or jump < STEP_SHARE * rise:
        return False, jump
    before_t, before_y = t[: k + 1], y[: k + 1]
    after_t, after_y = t[k + 1:], y[k + 1:]
    flat = STEP_FLAT_SHARE * slope
    sides = []
    for st, sy in ((before_t, before_y), (after_t, after_y)):
        sides.append(theil_sen(st, sy)[0] if len(st) >= 3 else 0.0)
    return all(s <= flat for s in sides), jump


def rate(t: pd.Series | np.ndarray, y: pd.Series | np.ndarray, warmup_s: float | None = None) -> Rate:
    t = np.asarray(t, dtype=float)
    y = np.asarray(y, dtype=float)
    if len(t) and np.any(np.diff(t) < 0):
        order = np.argsort(t, kind="stable")
        t, y = t[order], y[order]
    cut = warmup_cut(t, warmup_s)
    keep = t >= cut
    if keep.sum() >= 3:
        t, y = t[keep], y[keep]
    slope, conf = theil_sen(t, y)
    step, jump = _is_step(t, y, slope)
    return Rate(slope, conf, len(t), float(t[-1] - t[0]) if len(t) else 0.0, step, jump,
                float(y[-1] - y[0]) if len(y) else 0.0)


def process_rates(rollup: pd.DataFrame, warmup_s: float | None = None) -> pd.DataFrame:
    """One row per pid: rss/anon/uss/pss rates (MB/min), their confidences and step flags."""
    rows = []
    for pid, g in rollup.groupby("pid", sort=True):
        g = g.sort_values("t")
        t = g["t"].to_numpy(dtype=float)
        row: dict[str, float | int | bool] = {"pid": int(pid), "samples": len(g),
                                              "t_first": float(t[0]), "t_last": float(t[-1])}
        for col in ("rss", "anon", "uss", "pss"):
            r = rate(t, g[col].to_numpy(dtype=float), warmup_s)
            row[f"{col}_mb_per_min"] = r.mb_per_min
            row[f"{col}_confidence"] = r.confidence
            row[f"{col}_step"] = r.step
        row["rss_first_mb"] = float(g["rss"].iloc[0]) / MB
        row["rss_last_mb"] = float(g["rss"].iloc[-1]) / MB
        row["anon_last_mb"] = float(g["anon"].iloc[-1]) / MB
        rows.append(row)
    return pd.DataFrame(rows)


def class_rate_table(class_usage: pd.DataFrame, warmup_s: float | None = None) -> pd.DataFrame:
    """One row per (pid, class): RSS rate (MB/min), confidence, step flag, last RSS (MB)."""
    cols = ["pid", "cls", "mb_per_min", "confidence", "step", "last_mb", "samples"]
    if class_usage.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for (pid, cls), g in class_usage.groupby(["pid", "cls"], sort=False):
        g = g.sort_values("t")
        r = rate(g["t"].to_numpy(dtype=float), g["rss"].to_numpy(dtype=float), warmup_s)
        rows.append((int(pid), str(cls), r.mb_per_min, r.confidence, r.step,
                     float(g["rss"].iloc[-1]) / MB, len(g)))
    return pd.DataFrame(rows, columns=cols)


def class_rates(class_usage: pd.DataFrame, warmup_s: float | None = None,
                table: pd.DataFrame | None = None) -> dict[str, float]:
    """MB/min of RSS per memory class, summed over processes (each process's own slope)."""
    tbl = class_rate_table(class_usage, warmup_s) if table is None else table
    if tbl.empty:
        return {}
    sums = tbl.groupby("cls")["mb_per_min"].sum()
    return {str(k): round(float(v), 4) for k, v in sorted(sums.items(), key=lambda kv: -kv[1])}
