"""Which processes leak: the verdict's thresholds and its rules on a process's rates (a row of
``growth.series_rates``): leaking, doubtful (hunt longer), or the shape line that says why not.

A leak grows at the leak rate with a confident slope, long enough, not as one step, not decelerating, not
stopped inside the window (``analysis/series.py``), and its rate's lower bound from the series' own noise
clears the leak rate. Growth that stopped early enough is bounded (no leak, the reason says since when and
at what size); growth that stopped too late to tell, or grows above the rate without the confidence, is
doubtful; growth its own noise explains (lower bound not above zero) is neither."""

from __future__ import annotations

import math
from typing import Any

from leaktrace.analysis.thresholds import THRESHOLDS


def _missing(v: Any) -> bool:
    """No value: None or NaN (a pandas row's empty cell or a dict row's None; pandas is not needed here, the
    watch judges dict rows without it)."""
    return v is None or (isinstance(v, float) and math.isnan(v))


# A stop is stated in the verdict for a process whose growth before it is at least this share of its level.
STOP_TOLD_SHARE = 0.05


def is_short_lived(row: Any, th: dict[str, float] = THRESHOLDS) -> bool:
    """It exited after less than ``min_span_s`` of samples, but with enough of them for a verdict from what
    exists (stated with lower confidence)."""
    exited = row.get("exited_s") if hasattr(row, "get") else None
    span = row["t_last"] - row["t_first"]
    return (exited is not None and not _missing(exited) and span < th["min_span_s"]
            and span >= th["short_lived_min_span_s"] and int(row.get("samples", 0)) >= 4)


def _decelerating(row: Any, col: str) -> bool:
    v = row.get(f"{col}_decelerating", False) if hasattr(row, "get") else False
    return bool(v) and not _missing(v)


def _stop(row: Any, col: str) -> str | None:
    """"bounded" or "stopping" when the column's growth stopped inside the window (growth.growth_stop)."""
    v = row.get(f"{col}_stop") if hasattr(row, "get") else None
    return v if isinstance(v, str) else None


def _lower(row: Any, col: str) -> float:
    """The lower bound of the column's rate from its own noise (growth.rate_interval); unbounded when the
    row has none."""
    v = row.get(f"{col}_lower_mb_per_min") if hasattr(row, "get") else None
    return float(v) if not _missing(v) else -float("inf")


def clears(lower: float | None, threshold: float) -> bool:
    """A rate's lower bound clears ``threshold``; a series too short for an interval (unbounded) is judged by
    its other rules alone."""
    return lower is None or not math.isfinite(lower) or lower >= threshold


def leaks_steadily(r: Any, th: dict[str, float] = THRESHOLDS) -> bool:
    """One series' growth.Rate is a leak's: at the leak rate, confident, long enough, neither one step nor a
    plateau forming nor stopped inside the window, its lower bound clearing the leak rate."""
    return not (r.step or r.decelerating or r.stop is not None or r.span_s < th["min_span_s"]
                or r.confidence < th["min_confidence"] or r.mb_per_min < th["leak_mb_per_min"]
                or not clears(r.lower_mb_per_min, th["leak_mb_per_min"]))


def is_leaking(row: Any, th: dict[str, float] = THRESHOLDS) -> bool:
    """Growth at the leak rate, confident, long enough, neither one step nor a plateau forming nor stopped
    inside the window, and clearing the leak rate with its uncertainty (a short-lived target's few samples
    excepted: judged on what exists)."""
    span = row["t_last"] - row["t_first"]
    short = is_short_lived(row, th)
    long_enough = span >= th["min_span_s"] or short
    for col in ("rss", "anon"):
        if (row[f"{col}_mb_per_min"] >= th["leak_mb_per_min"] and row[f"{col}_confidence"] >= th["min_confidence"]
                and long_enough and not row[f"{col}_step"] and not _decelerating(row, col)
                and _stop(row, col) is None and (short or clears(_lower(row, col), th["leak_mb_per_min"]))):
            return True
    return False


def is_doubtful(row: Any, th: dict[str, float] = THRESHOLDS) -> bool:
    """Growth above the leak rate but without the confidence (or span) to call it; decelerating growth (a
    plateau forming) still at the leak rate at the end of the window; or growth that stopped too late in the
    window to tell a plateau from a pause: a longer hunt tells. Growth that stopped early enough (bounded),
    or that its own noise explains (its lower bound not above zero), is neither."""
    for col in ("rss", "anon"):
        stop = _stop(row, col)
        if stop == "bounded":
            continue
        if (row[f"{col}_mb_per_min"] >= th["leak_mb_per_min"] and not row[f"{col}_step"]
                and row[f"{col}_confidence"] >= th["inconclusive_confidence"]):
            if stop == "stopping":
                return True
            if not clears(_lower(row, col), 0.0) or _lower(row, col) == 0.0:
                continue  # its own noise explains it
            if not _decelerating(row, col) or float(row[f"{col}_last_mb_per_min"]) >= th["leak_mb_per_min"]:
                return True
    return False


def plateau_evidence(row: Any, th: dict[str, float] = THRESHOLDS) -> str | None:
    """The shape line of a process whose RSS (else anonymous) growth at the leak rate stopped inside the
    window or is decelerating."""
    for col in ("rss", "anon"):
        what = "RSS" if col == "rss" else "anonymous"
        # a stop is told when the growth before it counts: at the leak rate, and a visible share of the level
        # (a churner's RSS sets records by chance, then stops setting them)
        grew = row.get(f"{col}_stop_grew_mb_per_min") or 0.0
        told = grew >= th["leak_mb_per_min"] and (row[f"{col}_mb_per_min"] >= th["leak_mb_per_min"]
                                                  or (row.get(f"{col}_stop_rise_share") or 0.0) >= STOP_TOLD_SHARE)
        ev = row.get(f"{col}_stop_evidence") if _stop(row, col) and told else None
        if isinstance(ev, str):
            return f"{what} {ev}"
        if row[f"{col}_mb_per_min"] < th["leak_mb_per_min"]:
            continue
        if _decelerating(row, col):
            ev = row.get(f"{col}_shape_evidence")
            if isinstance(ev, str):
                return f"{what} {ev}"
    return None
