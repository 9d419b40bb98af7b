"""Which processes leak: the verdict's thresholds and its rules on a process's rates (a row of
``growth.process_rates``): leaking, doubtful (hunt longer), or the shape line that says why not."""

from __future__ import annotations

from typing import Any

import pandas as pd

# Verdict thresholds (stated in the report so a reader can judge the verdict).
THRESHOLDS: dict[str, float] = {
    "leak_mb_per_min": 1.0,        # a process growing at least this fast (RSS or anonymous) ...
    "min_confidence": 0.75,        # ... with this fraction of pairwise slopes agreeing in sign ...
    "min_span_s": 8.0,             # ... over at least this many seconds (after the warm-up cut),
                                   # and not one step (a step is an allocation, not a leak)
    "short_lived_min_span_s": 3.0,  # a target that exited: this much (≥ 4 samples) is enough for a verdict
    "no_leak_span_s": 15.0,        # a clean verdict needs at least this much observation
    "inconclusive_confidence": 0.6,  # growth above the rate with confidence between this and min_confidence
    "class_mb_per_min": 0.5,       # a memory class of a leaking process counts from this rate ...
    "class_confidence": 0.6,       # ... and this confidence
    "ledger_mb_per_min": 1.0,      # a library named by the eBPF ledger counts from this rate
}


def is_short_lived(row: Any, th: dict[str, float] = THRESHOLDS) -> bool:
    """It exited after less than ``min_span_s`` of samples, but with enough of them for a verdict from what
    exists (stated with lower confidence)."""
    exited = row.get("exited_s") if hasattr(row, "get") else None
    span = row["t_last"] - row["t_first"]
    return (exited is not None and not pd.isna(exited) and span < th["min_span_s"]
            and span >= th["short_lived_min_span_s"] and int(row.get("samples", 0)) >= 4)


def _decelerating(row: Any, col: str) -> bool:
    v = row.get(f"{col}_decelerating", False) if hasattr(row, "get") else False
    return bool(v) and not pd.isna(v)


def is_leaking(row: Any, th: dict[str, float] = THRESHOLDS) -> bool:
    """Growth at the leak rate, confident, long enough, neither one step nor a plateau forming."""
    span = row["t_last"] - row["t_first"]
    long_enough = span >= th["min_span_s"] or is_short_lived(row, th)
    for col in ("rss", "anon"):
        if (row[f"{col}_mb_per_min"] >= th["leak_mb_per_min"] and row[f"{col}_confidence"] >= th["min_confidence"]
                and long_enough and not row[f"{col}_step"] and not _decelerating(row, col)):
            return True
    return False


def is_doubtful(row: Any, th: dict[str, float] = THRESHOLDS) -> bool:
    """Growth above the leak rate but without the confidence (or span) to call it; or decelerating growth
    (a plateau forming) still at the leak rate at the end of the window: a longer hunt tells."""
    for col in ("rss", "anon"):
        if (row[f"{col}_mb_per_min"] >= th["leak_mb_per_min"] and not row[f"{col}_step"]
                and row[f"{col}_confidence"] >= th["inconclusive_confidence"]):
            if not _decelerating(row, col) or float(row[f"{col}_last_mb_per_min"]) >= th["leak_mb_per_min"]:
                return True
    return False


def plateau_evidence(row: Any, th: dict[str, float] = THRESHOLDS) -> str | None:
    """The shape line of a process whose RSS (else anonymous) growth at the leak rate is decelerating."""
    for col in ("rss", "anon"):
        if _decelerating(row, col) and row[f"{col}_mb_per_min"] >= th["leak_mb_per_min"]:
            ev = row.get(f"{col}_shape_evidence")
            if isinstance(ev, str):
                return f"{'RSS' if col == 'rss' else 'anonymous'} {ev}"
    return None
