"""What a series' own noise says about its growth: whether it stopped inside the window, how well its rate is
known, and the rate of a series that only accumulates, in bursts. Used by ``analysis/growth.py``.

**stopped**: growth that stopped inside the window is no leak, whatever its rate before. :func:`growth_stop`
follows the series' record level (a new record must clear the previous one by ``STOP_NOISE_SIGMAS`` times
the series' own noise, and by ``STOP_RISE_SHARE`` of its range): the pause since the last record is a stop
when it is longer than ``STOP_PAUSE_FACTOR`` times the longest pause between earlier records (a leak that
grows in chunks pauses between them), than ``STOP_TOO_LATE_S`` and than ``STOP_TOO_LATE_SHARE`` of the
window. It is **bounded** (a plateau: no leak figure, the verdict says since when and at what size) when
it lasts ``STOP_MIN_S`` and ``STOP_SHARE`` of the window, else too late to tell (inconclusive). A stop
during which the server's traffic stopped too is the traffic's, not a plateau.

**significance**: :func:`rate_interval` gives the rate's interval from the series' own noise. Residuals
about the fitted line that persist from one sample to the next (lag-1 autocorrelation at least
``PERSISTENT_RHO``: a churner's random walk around its level, a staircase) make the trend no better known
than the drift of the increments, whose long-run variance (Bartlett weights over a few lags) sets the
interval; residuals that do not persist (noise about a trend) set it as an ordinary least-squares slope's,
with the samples counted once per block of correlated ones. A leak's lower bound must clear the leak rate.

**bursty accumulation**: a series that only accumulates (its decreases at most ``ACCUMULATION_DOWN_SHARE``
of its increases: a ledger of chunks that are never freed) and grows in bursts (flat stretches, then jumps)
has right-skewed increments, whose mean the median of pairwise slopes understates; its rate is then the
mean increment (last minus first, over the span), when that exceeds the robust slope by
``BURSTY_EXCESS``. Anything that also decreases (a churner) keeps the robust slope.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from leaktrace.slope import theil_sen

MB = 1024 * 1024
# Stopped growth (see the module docstring): a record clears the previous one by this many noise sigmas ...
STOP_NOISE_SIGMAS = 3.0
# ... and by this share of the series' range ...
STOP_RISE_SHARE = 0.02
# ... the pause since the last record is a stop when it is longer than this many times the longest earlier
# pause, this many seconds and this share of the window ...
STOP_PAUSE_FACTOR = 1.5
STOP_TOO_LATE_S = 5.0
STOP_TOO_LATE_SHARE = 0.1
# ... and bounded (a plateau, no leak) when it lasts this many seconds and this share of the window.
STOP_MIN_S = 10.0
STOP_SHARE = 0.25
# ... unless the work (requests) per second during the pause fell below this share of the rate before it.
STOP_WORK_SHARE = 0.2
# A pause is observed, not a gap between samples: at least this many samples after the last record, no
# gap between them longer than this share of the pause.
STOP_MIN_SAMPLES = 3
STOP_MAX_GAP_SHARE = 0.5
# Significance: one-sided z of the rate's interval (95 %); residuals this persistent are a random walk's.
INTERVAL_Z = 1.645
PERSISTENT_RHO = 0.5
# ... a block of correlated residuals ends where their autocorrelation falls below this.
BLOCK_ACF = 1.0 / np.e
INTERVAL_MIN_SAMPLES = 6
# Bursty accumulation: decreases at most this share of the increases; mean at least this times the slope.
ACCUMULATION_DOWN_SHARE = 0.05
BURSTY_EXCESS = 1.10
# Points a stop or an interval is read from (evenly subsampled beyond): bounded cost.
SERIES_MAX_POINTS = 1000


@dataclass
class Stop:
    """Growth that stopped inside the window (see the module docstring)."""

    t_stop: float  # the time of the last record (series clock)
    level: float  # the series' median since then (units)
    pause_s: float  # seconds from the last record to the end of the series
    longest_earlier_pause_s: float  # the longest pause between earlier records
    bounded: bool  # long enough to call a plateau; else too late to tell
    grew_per_s: float = 0.0  # the rate from the start of the series to the last record
    rise: float = 0.0  # the last record above the first sample (units)

    @property
    def grew_mb_per_min(self) -> float:
        return self.grew_per_s * 60.0 / MB


def _even(t: np.ndarray, y: np.ndarray, k: int = SERIES_MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    if len(t) <= k:
        return t, y
    idx = np.linspace(0, len(t) - 1, k).astype(int)
    return t[idx], y[idx]


def growth_stop(t: np.ndarray, y: np.ndarray, work: tuple[np.ndarray, np.ndarray] | None = None) -> Stop | None:
    """The stop of a growth inside the window (see the module docstring), None when it grows to the end or
    never grew."""
    t, y = _even(np.asarray(t, dtype=float), np.asarray(y, dtype=float))
    if len(t) < INTERVAL_MIN_SAMPLES or t[-1] <= t[0]:
        return None
    d = np.diff(y)
    sigma = 1.4826 * float(np.median(np.abs(d - np.median(d)))) / np.sqrt(2.0)
    margin = max(STOP_NOISE_SIGMAS * sigma, STOP_RISE_SHARE * float(y.max() - y.min()))
    record, highs = y[0], [float(t[0])]
    for ti, yi in zip(t[1:], y[1:], strict=True):
        if yi > record + margin:
            record = yi
            highs.append(float(ti))
    if len(highs) < 3:
        return None  # it never grew record after record: nothing stopped
    span, pause = float(t[-1] - t[0]), float(t[-1] - highs[-1])
    earlier = float(np.max(np.diff(highs)))
    if pause < max(STOP_TOO_LATE_S, STOP_TOO_LATE_SHARE * span, STOP_PAUSE_FACTOR * earlier):
        return None
    seen = t[t >= highs[-1]]
    if len(seen) < STOP_MIN_SAMPLES + 1 or float(np.max(np.diff(seen))) > STOP_MAX_GAP_SHARE * pause:
        return None  # the pause is a gap between samples: nothing was seen not to grow
    if work is not None:
        tw, done = (np.asarray(a, dtype=float) for a in work)
        if len(tw) >= 2 and tw[0] <= highs[-1] - 1.0 and tw[-1] >= t[-1] - 1.0:
            before = (np.interp(highs[-1], tw, done) - np.interp(t[0], tw, done)) / max(highs[-1] - t[0], 1e-9)
            during = (np.interp(t[-1], tw, done) - np.interp(highs[-1], tw, done)) / pause
            if before > 0 and during < STOP_WORK_SHARE * before:
                return None  # the traffic stopped: the growth with it
    level = float(np.median(y[t >= highs[-1]]))
    return Stop(highs[-1], level, pause, earlier, pause >= max(STOP_MIN_S, STOP_SHARE * span),
                float(record - y[0]) / max(highs[-1] - float(t[0]), 1e-9), float(record - y[0]))


def _block_length(r: np.ndarray) -> int:
    """Samples per block of correlated residuals: the first lag where their autocorrelation falls below
    ``BLOCK_ACF`` (at most a third of the series)."""
    v = float(r @ r)
    if v <= 0:
        return 1
    for k in range(1, len(r) // 3 + 1):
        if float(r[:-k] @ r[k:]) / v < BLOCK_ACF:
            return k
    return max(1, len(r) // 3)


def rate_interval(t: np.ndarray, y: np.ndarray, estimate: float) -> tuple[float, float]:
    """The (lower, upper) bounds of a rate ``estimate`` (units per second) of the series, from its own noise
    (see the module docstring); unbounded when the series is too short to tell."""
    t, y = _even(np.asarray(t, dtype=float), np.asarray(y, dtype=float))
    n = len(t)
    if n < INTERVAL_MIN_SAMPLES or t[-1] <= t[0]:
        return -np.inf, np.inf
    r = y - estimate * t
    r = r - r.mean()
    v = float(r @ r)
    rho = float(r[:-1] @ r[1:]) / v if v > 0 else 0.0
    if rho >= PERSISTENT_RHO:
        d = np.diff(y)
        dc = d - d.mean()
        m = len(d)
        lags = max(1, int(4 * (m / 100) ** (2 / 9)))
        lrv = float(dc @ dc) / m + 2 * sum((1 - k / (lags + 1)) * float(dc[:-k] @ dc[k:]) / m
                                           for k in range(1, min(lags, m - 1) + 1))
        se = float(np.sqrt(max(lrv, 0.0) * m) / (t[-1] - t[0]))
    else:
        tc = t - t.mean()
        se = float(np.sqrt(v / (n - 2) * _block_length(r) / float(tc @ tc)))
    return estimate - INTERVAL_Z * se, estimate + INTERVAL_Z * se


def bursty_rate(t: np.ndarray, y: np.ndarray, slope: float) -> float | None:
    """The mean increment of a bursty accumulation (see the module docstring), None for anything else."""
    d = np.diff(y)
    up, down = float(d[d > 0].sum()), float(-d[d < 0].sum())
    if len(t) < INTERVAL_MIN_SAMPLES or up <= 0 or down > ACCUMULATION_DOWN_SHARE * up or t[-1] <= t[0]:
        return None
    mean = float((y[-1] - y[0]) / (t[-1] - t[0]))
    return mean if mean > BURSTY_EXCESS * max(slope, 0.0) else None


# Step: one consecutive-sample jump carrying at least this share of the total rise ...
STEP_SHARE = 0.5
# ... with the rate on each side of it below this share of the overall rate.
STEP_FLAT_SHARE = 0.25


def is_step(t: np.ndarray, y: np.ndarray, slope: float) -> tuple[bool, float]:
    """(a step: one jump carries most of the rise and both sides of it are nearly flat, the jump)."""
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
