"""What the eBPF ledger names for a process under confirmation: the library and kind whose outstanding bytes
grow fastest over the judging window (the watch's ``ledger_snapshots`` rows), so watch.json says who leaks
while the leak is confirmed, before any deep hunt."""

from __future__ import annotations

from typing import Any

import numpy as np

from leaktrace.memclass import KIND_OF_CLASS
from leaktrace.slope import theil_sen

MB = 1024 * 1024
MIN_SNAPSHOTS = 3


def suspect(rows: list[dict[str, Any]], min_mb_per_min: float) -> dict[str, Any] | None:
    """``{"library", "kind", "mb_per_min"}`` of the fastest-growing (library, ledger kind) in ``rows`` (one
    process's ledger snapshots), when it grows at least ``min_mb_per_min``; else None."""
    series: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for r in rows:
        series.setdefault((str(r["library"]), str(r["kind"])), []).append((float(r["t"]), float(r["outstanding_bytes"])))
    best: dict[str, Any] | None = None
    for (library, kind), points in series.items():
        if len(points) < MIN_SNAPSHOTS:
            continue
        t, y = (np.array(v) for v in zip(*sorted(points), strict=True))
        mb_per_min = theil_sen(t, y)[0] * 60.0 / MB
        if mb_per_min >= min_mb_per_min and (best is None or mb_per_min > best["mb_per_min"]):
            best = {"library": library, "kind": KIND_OF_CLASS.get(kind, "other"), "mb_per_min": round(mb_per_min, 3)}
    return best
