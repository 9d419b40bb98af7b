"""The one robust slope: Theil–Sen (median of pairwise slopes) with the fraction of pairs that agree.

One spike, a GC pause or a step does not make a rate. Used by the analysis (leak rates, growth per
request) and by the live figures of a running hunt (terminal view, Prometheus exporter).
"""

from __future__ import annotations

import numpy as np

# Points used for the pairwise slope (O(n²) pairs): enough for a stable median, bounded cost.
MAX_POINTS = 300


def _subsample(t: np.ndarray, y: np.ndarray, k: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    if len(t) <= k:
        return t, y
    idx = np.linspace(0, len(t) - 1, k).astype(int)
    return t[idx], y[idx]


def theil_sen(t: np.ndarray, y: np.ndarray, max_points: int = MAX_POINTS) -> tuple[float, float]:
    """(slope, fraction of pairwise slopes agreeing in sign). Subsamples evenly beyond ``max_points``."""
    if len(t) < 2:
        return 0.0, 0.0
    t, y = _subsample(t, y, max_points)
    i, j = np.triu_indices(len(t), k=1)
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
