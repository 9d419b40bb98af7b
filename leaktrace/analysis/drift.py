"""The series' rate as it moves through the window: the rate of each of a few equal segments (its mean
increment), and whether it trends down by more than the segments' own scatter explains.

A plateau forming slows smoothly: its segments' rates fall along a trend, with little scatter about it. A
leak under a traffic that stalls and resumes, or whose load swings, has segments at zero (the stall) and
back at its rate after: its rates scatter about any trend by as much as the trend moves, and a third of
the window that held the stall is no evidence of a plateau. :func:`rate_trend` fits a line to the segments'
rates (ordinary least squares on the segments' mid-times) and gives the fall of the rate in standard errors
of that fit's slope, the scatter of the segments about the line setting the error."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import numpy as np

# Segments of the window a trend is read from, and the samples each needs.
SEGMENTS = 9
MIN_SEGMENT_SAMPLES = 2


@dataclass
class RateTrend:
    rates_per_s: np.ndarray  # each segment's mean increment (units per second)
    slope: float  # the fitted change of rate per second (negative: slowing)
    se: float  # its standard error, from the segments' scatter about the fit

    @property
    def fall_z(self) -> float:
        """How many standard errors the rate falls by (positive: slowing; 0 when not measurable)."""
        if self.se <= 0:
            return np.inf if self.slope < 0 else 0.0
        return -self.slope / self.se


def rate_trend(t: np.ndarray, y: np.ndarray, segments: int = SEGMENTS) -> RateTrend | None:
    """The segments' rates and their trend (see the module docstring); None when the series has too few
    samples for ``segments`` of them."""
    t = np.asarray(t, dtype=float)
    y = np.asarray(y, dtype=float)
    k = min(segments, len(t) // MIN_SEGMENT_SAMPLES)
    if k < 4 or t[-1] <= t[0]:
        return None
    edges = np.linspace(t[0], t[-1], k + 1)
    rates = np.diff(np.interp(edges, t, y)) / np.diff(edges)
    mid = (edges[:-1] + edges[1:]) / 2 - t[0]
    mc = mid - mid.mean()
    slope = float(mc @ (rates - rates.mean()) / (mc @ mc))
    resid = rates - rates.mean() - slope * mc
    se = float(np.sqrt(float(resid @ resid) / (k - 2) / float(mc @ mc)))
    return RateTrend(rates, slope, se)


# A staircase: growth in jumps (a batch of leaked buffers at a time) with flat stretches between.
# A jump is an increment of at least STAIR_NOISE_SIGMAS times the increments' robust noise and at least
# STAIR_RANGE_SHARE of the series' range; ...
STAIR_NOISE_SIGMAS = 8.0
STAIR_RANGE_SHARE = 0.1
# ... at least STAIR_MIN_JUMPS of them, none down, carrying at least STAIR_RISE_SHARE of the rise, the
# largest at most STAIR_SIZE_RATIO times the smallest.
STAIR_MIN_JUMPS = 2
STAIR_RISE_SHARE = 0.8
STAIR_SIZE_RATIO = 4.0
# The stretches between jumps are flat: their typical increment is at most STAIR_FLAT_SHARE of the jump
# threshold. A steady line of a few samples has every increment near 1/n of its range, on either side of the
# threshold by a rounding: not a staircase (its rate would count only the increments that came out above).
STAIR_FLAT_SHARE = 0.5
# Each batch stays: after a jump the series never falls back below its level before it plus this share of
# the jump. Temporaries that come and go in like lumps (a server's requests) jump as high and fall back in a
# few smaller steps, none of them a jump down.
STAIR_KEEP_SHARE = 0.5
# A staircase of fewer jumps than this has its rate's interval from the count of its batches (exact Poisson
# bounds), not from the series' noise: a count this small is no normal variable.
STAIR_EXACT_BELOW = 5


@dataclass
class Staircase:
    jumps: int
    rate_per_s: float  # the jumps after the first, over the time from the first jump to the last
    confidence: float  # of sample pairs at least one jump period apart, the share that rose
    batch: float = 0.0  # the mean jump (units)

    def interval(self, span_s: float, p: float) -> tuple[float, float]:
        """The rate's (lower, upper) bounds (units per second) at one-sided level ``p`` each, over a window of
        ``span_s`` seconds: the count of batches in it as a Poisson count (its exact bounds for the jumps
        seen), each the mean batch. For the few batches of STAIR_EXACT_BELOW, where a normal approximation of
        the count fails: a line's residuals read the flat stretches and the jumps as noise about the slope,
        and three like batches as no evidence at all."""
        if span_s <= 0:
            return -np.inf, np.inf
        lo, hi = poisson_bounds(self.jumps, p)
        return lo * self.batch / span_s, hi * self.batch / span_s


def _poisson_cdf(k: int, mean: float) -> float:
    """P(X <= k) for X ~ Poisson(mean)."""
    term = total = math.exp(-mean)
    for i in range(1, k + 1):
        term *= mean / i
        total += term
    return total


@cache
def poisson_bounds(k: int, p: float) -> tuple[float, float]:
    """The exact one-sided bounds of a Poisson mean from one count ``k``: the lower, a mean under which
    ``k`` or more would be seen with probability ``p``; the upper, one under which ``k`` or fewer would."""

    def solve(f, target: float) -> float:  # f rises with the mean from 0
        a, b = 0.0, 4.0 * k + 10.0
        for _ in range(60):
            m = (a + b) / 2
            a, b = (m, b) if f(m) < target else (a, m)
        return (a + b) / 2

    lower = 0.0 if k <= 0 else solve(lambda m: 1.0 - _poisson_cdf(k - 1, m), p)
    upper = solve(lambda m: 1.0 - _poisson_cdf(k, m), 1.0 - p)
    return lower, upper


def staircase(t: np.ndarray, y: np.ndarray) -> Staircase | None:
    """A series that grows in repeated jumps of like size with flat stretches between, never falls by one and
    never falls back from one (STAIR_KEEP_SHARE): one jump is an allocation, several of them a leak in
    batches. Its rate is a batch per period between batches, not the window's mean slope (which counts whole
    batches in a window that holds a fraction of a period more or less). None for anything else."""
    t = np.asarray(t, dtype=float)
    y = np.asarray(y, dtype=float)
    if len(t) < 6 or t[-1] <= t[0]:
        return None
    d = np.diff(y)
    rng = float(y.max() - y.min())
    sigma = 1.4826 * float(np.median(np.abs(d - np.median(d))))
    thr = max(STAIR_NOISE_SIGMAS * sigma, STAIR_RANGE_SHARE * rng)
    if rng <= 0 or thr <= 0:
        return None
    up = np.flatnonzero(d >= thr)
    flat = d[d < thr]
    if not len(flat) or float(np.median(np.abs(flat))) > STAIR_FLAT_SHARE * thr:
        return None
    rise = float(y[-1] - y[0])
    if (len(up) < STAIR_MIN_JUMPS or np.any(d <= -thr) or rise <= 0
            or float(d[up].sum()) < STAIR_RISE_SHARE * rise
            or float(d[up].max()) > STAIR_SIZE_RATIO * float(d[up].min())):
        return None
    if any(float(y[u + 1:].min()) < float(y[u]) + STAIR_KEEP_SHARE * float(d[u]) for u in up):
        return None
    t_jump = t[up + 1]
    period = float(t_jump[-1] - t_jump[0]) / (len(up) - 1)
    if period <= 0:
        return None
    rate = float(d[up[1:]].sum()) / float(t_jump[-1] - t_jump[0])
    i, j = np.triu_indices(len(t), k=1)
    far = (t[j] - t[i]) >= period
    conf = float(np.mean(y[j][far] > y[i][far])) if far.any() else 0.0
    return Staircase(len(up), rate, conf, float(d[up].mean()))
