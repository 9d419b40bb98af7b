"""Leak rates with a robust slope, a confidence measure, a warm-up cut and step detection.

Theil–Sen (median of pairwise slopes) instead of first-minus-last: one spike, a GC pause or a step at
start-up does not make a rate. ``confidence`` is the fraction of pairwise slopes that agree in sign with
the estimate: ~1 for steady growth, ~0.5 for noise around a flat line.

A *step* (memory allocated once — a cache filled, a pool reserved — then flat) is not a leak, even
though Theil–Sen gives it a positive slope when the step sits mid-series. :func:`rate` flags a step when
one jump between consecutive samples carries most of the rise and both sides of it are (nearly) flat.

A *plateau* (warm-up, fragmentation, arenas filling) is not a leak either: growth that keeps slowing down
converges. :func:`growth_shape` compares the Theil–Sen slopes s1, s2, s3 of the first, middle and last
thirds of the series: **decelerating** when the last third grows at most ``DECEL_LAST_SHARE`` of the first
third's rate, each third is slower than the one before by at least ``1 - DECEL_STILL_FALLING``, *and* the
slowing is not about to stop at a constant rate: the rate the thirds converge to when their excess over it
decays geometrically (an exponential warm-up on top of a steady leak: c = (s1·s3 − s2²)/(s1 + s3 − 2·s2))
stays below ``SUSTAINED_SHARE`` of the last third's rate, and the rates of a few segments fall along a trend by
more than their scatter about it explains (``analysis/drift.py``: a stall of traffic is no plateau). Such a rate is no leak figure
(:attr:`Rate.steady_mb_per_min` is 0): the verdict calls it a plateau when the last third is already
below the leak rate, inconclusive otherwise ("hunt longer"), and states the projected plateau (the last
third's rate falling on by the same ratio per third: a geometric series). **warm-up** when, not decelerating, the
first third is at least ``WARMUP_FIRST_SHARE`` times steeper than the last: the warm-up is over and the
rate is the mean of the last two thirds' slopes when they agree (within ``STEADY_AGREE``), else the last
third's (a leak on top of a warm-up keeps its own rate); while the middle third still grows faster than
the last, what is left of the warm-up still adds to both, and the rate is the one they converge to (c
above, at least ``SUSTAINED_SHARE`` of the last third's): a malloc leak beside a churn whose heaps still
fragment a little is rated at the leak's pace, not the two's. When the last two do not agree, the first third
must also be ``WARMUP_FIRST_SHARE`` times steeper than the middle one: a warm-up is over in the first third
or settling through the second, while a rate drifting by about as much between each pair of thirds
(8.7, 7.2, 5.3 MB/min: a leak that follows traffic) has no warm-up to cut, and its last third alone would
understate it. A first third that rose in jumps, then two that grow alike: a warm-up too (_coarse_warmup).
Otherwise
**steady**: the Theil–Sen slope of the whole series (after the warm-up cut).

**load-following**: a decelerating or warm-up shape whose slowing the traffic explains. With the
cumulative work of the process's server (requests, from /metrics) on the same clock, the growth per unit of
work in the last third is at least ``LOAD_FOLLOW_SHARE`` of the first third's: the traffic fell and the
growth with it (a leak per request under a load that varies: UCX's queue grows per munmap, the munmaps come
with requests). The rate is then the whole series' Theil–Sen slope (the mean rate under the hunt's load). A
warm-up under steady traffic still reads as one: its growth per request falls.

**staircase**: repeated jumps of like size, never one down (``analysis/drift.py``), are a leak in batches, rated a
batch per period between them; one jump is a step.

**stopped**, **significance** and **bursty accumulation**: see ``analysis/series.py`` (growth that stopped
inside the window is no leak; a rate's interval from the series' own noise; the mean rate of a series that
only accumulates, in bursts).

Why thirds and not one fitted curve: over a minute, a saturating exponential, a 1/t slowdown and a warm-up on
a linear leak all fit within noise; what tells them apart is whether the rate is *still falling at the end*.
A slow warm-up on a leak may read as decelerating: inconclusive, never no-leak; a longer hunt settles it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from leaktrace.analysis.drift import STAIR_EXACT_BELOW, rate_trend, staircase
from leaktrace.analysis.series import INTERVAL_Z, Stop, bursty_rate, growth_stop, is_step, rate_interval
from leaktrace.slope import theil_sen

MB = 1024 * 1024
# Warm-up: the first WARMUP_FRACTION of the span, at most WARMUP_MAX_S, is excluded (start-up
# allocations, imports, first-request caches).
WARMUP_FRACTION = 0.1
WARMUP_MAX_S = 30.0
# Shape (see the module docstring): at least this many samples and seconds (after the warm-up cut) ...
SHAPE_MIN_SAMPLES = 9
SHAPE_MIN_SPAN_S = 20.0
# ... and the first third clearly growing (this fraction of its pairwise slopes positive) ...
SHAPE_FIRST_CONFIDENCE = 0.75
# ... and no later third moving by one jump of at least this share of its range and of the first's (a pool
# grown in big chunks is no slowing down; a first third that does is read by _coarse_warmup) ...
SHAPE_JUMP_SHARE = 0.5
# ... decelerating: last third at most this share of the first third's rate, each third at most this share
# of the one before ...
DECEL_LAST_SHARE = 0.6
DECEL_STILL_FALLING = 0.9
# ... warm-up: first third at least this many times the last third's rate, last two within this share.
WARMUP_FIRST_SHARE = 1.5
STEADY_AGREE = 0.1
# Load-following: the last third's growth per unit of work at least this share of the first third's.
LOAD_FOLLOW_SHARE = 0.6
# The rate the thirds converge to (exponential excess over a constant) at least this share of the last
# third's: the slowing is over, what grows on is steady.
SUSTAINED_SHARE = 0.9
# A shape (warm-up, decelerating) needs its first and last thirds' rates this many standard errors apart.
SHAPE_Z = 2.576


@dataclass
class Shape:
    kind: str  # "steady" | "decelerating" | "warm-up" | "load-following"
    thirds_per_s: tuple[float, float, float]  # Theil–Sen slope of each third (units per second)
    t_split: float  # start of the second third (a warm-up's rate is taken from here)
    plateau: float | None = None  # decelerating: the level the growth converges to (units), projected
    sustained_per_s: float = 0.0  # the rate the thirds converge to (see the module docstring)
    rate_per_s: float = 0.0  # warm-up: the rate after it (see the module docstring)
    work_per_s: tuple[float, float, float] | None = None  # load-following: the work done per second, by third

    @property
    def first_mb_per_min(self) -> float:
        return self.thirds_per_s[0] * 60.0 / MB

    @property
    def last_mb_per_min(self) -> float:
        return self.thirds_per_s[2] * 60.0 / MB


def growth_shape(t: np.ndarray, y: np.ndarray, mean_thirds: bool = False) -> Shape | None:
    """Steady, decelerating (a plateau forming) or a warm-up then steady: see the module docstring. None
    when the series is too short to tell, or does not grow at first. ``mean_thirds``: each third's rate is
    its mean increment (a bursty accumulation's), not its robust slope."""
    t = np.asarray(t, dtype=float)
    y = np.asarray(y, dtype=float)
    if len(t) < SHAPE_MIN_SAMPLES or t[-1] - t[0] < SHAPE_MIN_SPAN_S:
        return None
    w = (t[-1] - t[0]) / 3.0
    edges = (t[0], t[0] + w, t[0] + 2 * w, t[-1])
    s, se, conf1, rise1 = [], [], 0.0, 0.0
    coarse_first = False
    for k in range(3):
        sel = (t >= edges[k]) & (t <= edges[k + 1])
        if sel.sum() < 3:
            return None
        ys = y[sel]
        rise = float(ys.max() - ys.min())
        rise1 = rise if k == 0 else rise1
        if rise > 0 and rise >= SHAPE_JUMP_SHARE * rise1 and float(np.max(np.abs(np.diff(ys)))) >= SHAPE_JUMP_SHARE * rise:
            if k > 0:
                return None  # this third moves by one jump: growth in chunks this coarse has no shape to read
            coarse_first = True  # readable only if what follows is
        slope, conf = theil_sen(t[sel], ys)
        if mean_thirds:
            ts = t[sel]
            slope = float(ys[-1] - ys[0]) / float(ts[-1] - ts[0]) if ts[-1] > ts[0] else slope
        s.append(slope)
        upper = rate_interval(t[sel], ys, slope)[1]
        se.append((upper - slope) / INTERVAL_Z if np.isfinite(upper) else 0.0)
        conf1 = conf if k == 0 else conf1
    s1, s2, s3 = s
    thirds = (s1, s2, s3)
    if coarse_first:
        first = y[(t >= edges[0]) & (t <= edges[1])]
        return _coarse_warmup(thirds, first, w, edges[1])
    if s1 <= 0 or conf1 < SHAPE_FIRST_CONFIDENCE:  # no clear growth at first: nothing slows down
        return Shape("steady", thirds, edges[1])
    if s1 - s3 < SHAPE_Z * float(np.hypot(se[1], se[2])):
        # the first third's rate exceeds the last's by less than the noise of the later thirds' (the steady
        # part a shape is read against; a knee inside the first third makes its own noise no reference)
        return Shape("steady", thirds, edges[1])
    sustained = sustained_rate(s1, s2, s3)
    falling = s3 <= DECEL_LAST_SHARE * s1 and s2 <= DECEL_STILL_FALLING * s1 and s3 <= DECEL_STILL_FALLING * s2
    trend = rate_trend(t, y)
    if falling and sustained < SUSTAINED_SHARE * s3 and (trend is None or trend.fall_z >= SHAPE_Z):
        # each further third grows by the ratio of the last two (geometric): what is left to grow
        r = s3 / s2 if s2 > 0 else 0.0
        left = s3 * w * r / (1.0 - r) if s3 > 0 and 0 < r < 1 else 0.0
        return Shape("decelerating", thirds, edges[1], float(y[-1] + left), sustained)
    agree = abs(s2 - s3) <= STEADY_AGREE * max(abs(s2), abs(s3), 0.1 * s1)
    if s1 >= WARMUP_FIRST_SHARE * max(s3, 0.0) and (agree or s1 >= WARMUP_FIRST_SHARE * s2):
        after = (s2 + s3) / 2 if agree else s3
        if 0 < s3 < s2:  # still settling: the mean of the two, even the last alone, carries its tail
            after = min(after, max(sustained, SUSTAINED_SHARE * s3))
        return Shape("warm-up", thirds, edges[1] if agree else edges[2], sustained_per_s=sustained,
                     rate_per_s=after)
    return Shape("steady", thirds, edges[1], sustained_per_s=sustained)


def _coarse_warmup(thirds: tuple[float, float, float], first: np.ndarray, w: float, t_split: float) -> Shape | None:
    """A first third (``first``: its samples) that rose in jumps (arenas or pools reserved in chunks as a
    process starts working) followed by two thirds that grow alike: a warm-up, rated by the later two, when
    the first third rose by at least ``WARMUP_FIRST_SHARE`` times what their rate makes in a third and fell by
    no jump of ``SHAPE_JUMP_SHARE`` of that rise (a sawtooth's release is no warm-up); else no shape to read
    (None)."""
    _, s2, s3 = thirds
    agree = abs(s2 - s3) <= STEADY_AGREE * max(abs(s2), abs(s3))
    rise = float(first[-1] - first[0])
    if not agree or s3 <= 0 or rise < WARMUP_FIRST_SHARE * s3 * w:
        return None
    if float(-np.min(np.diff(first))) >= SHAPE_JUMP_SHARE * rise:
        return None
    return Shape("warm-up", thirds, t_split, sustained_per_s=(s2 + s3) / 2, rate_per_s=(s2 + s3) / 2)


def sustained_rate(s1: float, s2: float, s3: float) -> float:
    """The rate three consecutive windows' rates converge to when their excess over it decays
    geometrically (Aitken's extrapolation: s3 + d2·q/(1 − q), q = d2/d1 the ratio of the two decreases),
    at least 0; 0 when the rate falls by as much or more each time (it reaches zero at that pace); the
    last rate when it does not fall twice."""
    d1, d2 = s2 - s1, s3 - s2
    if not (d1 < 0 and d2 < 0):
        return s3
    q = d2 / d1
    if q >= 1.0:
        return 0.0
    return max(s3 + d2 * q / (1.0 - q), 0.0)


@dataclass
class Rate:
    per_s: float  # units per second (Theil–Sen slope after the warm-up cut, or a bursty series' mean)
    confidence: float  # 0..1: fraction of pairwise slopes with the sign of the estimate
    n: int  # samples used
    span_s: float  # seconds covered by the samples used
    step: bool = False  # the rise is one step, not a steady growth
    step_bytes: float = 0.0  # size of the largest jump (units)
    rise: float = 0.0  # last minus first (units), for the reader's sanity check
    shape: Shape | None = None  # steady / decelerating / warm-up (None: too short to tell)
    lower_per_s: float = -np.inf  # the rate's interval from the series' own noise (rate_interval)
    upper_per_s: float = np.inf
    stop: Stop | None = None  # the growth stopped inside the window (growth_stop)
    estimator: str = "theil-sen"  # or "mean-increment" (a bursty accumulation)

    @property
    def decelerating(self) -> bool:
        return self.shape is not None and self.shape.kind == "decelerating"

    @property
    def bounded(self) -> bool:
        """The growth stopped early enough in the window to call it a plateau."""
        return self.stop is not None and self.stop.bounded

    @property
    def mb_per_min(self) -> float:
        return self.per_s * 60.0 / MB

    @property
    def lower_mb_per_min(self) -> float:
        return self.lower_per_s * 60.0 / MB

    @property
    def steady_mb_per_min(self) -> float:
        """The rate as a leak figure: 0 when the rise is a step, a plateau forming (decelerating) or growth
        that stopped inside the window."""
        return 0.0 if self.step or self.decelerating or self.stop is not None else self.mb_per_min


def warmup_cut(t: np.ndarray, warmup_s: float | None = None) -> float:
    """First time kept: the first 10% of the span (at most 30 s) is warm-up, unless given."""
    if len(t) == 0:
        return 0.0
    if warmup_s is not None:
        return float(t[0]) + warmup_s
    span = float(t[-1] - t[0])
    return float(t[0]) + min(span * WARMUP_FRACTION, WARMUP_MAX_S)


def load_following(t: np.ndarray, shape: Shape, work: tuple[np.ndarray, np.ndarray]) -> tuple[float, float, float] | None:
    """The work done per second in each third of the series (t: its times, after the warm-up cut) when the
    traffic explains the shape's slowing (see the module docstring), else None. ``work``: (times, cumulative
    work) on the same clock; it must cover the series' first and last thirds."""
    tw, done = (np.asarray(a, dtype=float) for a in work)
    w = (t[-1] - t[0]) / 3.0
    if len(tw) < 2 or w <= 0 or tw[0] > t[0] + w / 2 or tw[-1] < t[-1] - w / 2:
        return None
    edges = t[0] + w * np.arange(4)
    per_s = np.diff(np.interp(edges, tw, done)) / w
    (s1, _, s3), (w1, _, w3) = shape.thirds_per_s, per_s
    if s1 <= 0 or w1 <= 0 or w3 <= 0 or s3 / w3 < LOAD_FOLLOW_SHARE * s1 / w1:
        return None
    return float(per_s[0]), float(per_s[1]), float(per_s[2])


def rate(t: ArrayLike, y: ArrayLike, warmup_s: float | None = None,
         work: tuple[np.ndarray, np.ndarray] | None = None) -> Rate:
    """The leak rate of a series (see the module docstring); ``work``: the cumulative work (requests) of the
    process's server, (times, counts) on the series' clock, to tell a slowing traffic from a plateau."""
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
    stair = staircase(t, y)
    step, jump = is_step(t, y, slope) if stair is None else (False, 0.0)
    mean = bursty_rate(t, y, slope) if not step and len(t) >= 2 else None
    shape = growth_shape(t, y, mean_thirds=mean is not None) if not step else None
    if shape is not None and work is not None and shape.kind in ("decelerating", "warm-up"):
        per_work = load_following(t, shape, work)
        if per_work is not None:  # the traffic slowed, the growth with it: the whole series' rate stands
            shape = Shape("load-following", shape.thirds_per_s, shape.t_split, work_per_s=per_work)
    fit = np.ones(len(t), dtype=bool)
    estimator = "theil-sen"
    if shape is not None and shape.kind == "warm-up":
        # the warm-up is over: the rate is the last thirds' (a leak on top of a warm-up keeps its rate)
        fit = t >= shape.t_split
        slope, conf = shape.rate_per_s, theil_sen(t[fit], y[fit])[1]
    elif stair is not None:  # a batch per period between batches (drift.staircase)
        slope, conf, estimator = stair.rate_per_s, stair.confidence, "staircase"
    elif mean is not None:
        slope, estimator = mean, "mean-increment"
    if estimator == "staircase" and stair is not None and stair.jumps < STAIR_EXACT_BELOW:  # batches counted
        lower, upper = stair.interval(float(t[-1] - t[0]), 0.5 * math.erfc(INTERVAL_Z / math.sqrt(2)))
    else:
        lower, upper = rate_interval(t[fit], y[fit], slope) if fit.sum() >= 2 else (-np.inf, np.inf)
    stop = growth_stop(t, y, work) if not step else None
    return Rate(slope, conf, len(t), float(t[-1] - t[0]) if len(t) else 0.0, step, jump,
                float(y[-1] - y[0]) if len(y) else 0.0, shape, lower, upper, stop, estimator)


def stop_evidence(r: Rate, unit_mb: bool = True) -> str | None:
    """One line on growth that stopped inside the window (None when it did not)."""
    st = r.stop
    if st is None:
        return None
    size = f"{st.level / MB:.0f} MB" if unit_mb else f"{st.level:,.0f}"
    if st.bounded:
        return (f"bounded: plateau of {size} since t={st.t_stop:.0f} s (no growth for the last {st.pause_s:.0f} s "
                f"of the window, after growing {st.grew_mb_per_min:.1f} MB/min): not a leak")
    return (f"growth stopped at t={st.t_stop:.0f} s at {size}, {st.pause_s:.0f} s before the end of the window: "
            "too late to tell a plateau from a pause (hunt longer)")


def shape_evidence(r: Rate, unit_mb: bool = True) -> str | None:
    """One line on the shape of a growth, for evidence and verdict reasons (None when steady or unknown)."""
    sh = r.shape
    if sh is None or sh.kind == "steady":
        return None
    if sh.kind == "decelerating":
        plateau = f", projected plateau ~{sh.plateau / MB:.0f} MB" if sh.plateau is not None and unit_mb else ""
        return (f"growth decelerating: rate fell from {sh.first_mb_per_min:.1f} to {sh.last_mb_per_min:.1f} "
                f"MB/min over the thirds of the window (still falling at the end){plateau}: a plateau forming "
                "(warm-up, fragmentation, arenas filling), not a steady leak")
    if sh.kind == "load-following" and sh.work_per_s is not None:
        w1, _, w3 = (w * 60.0 for w in sh.work_per_s)
        return (f"growth slowed with the traffic: {sh.first_mb_per_min:.1f} then {sh.last_mb_per_min:.1f} MB/min "
                f"over the first and last thirds of the window while requests went from {w1:.1f} to {w3:.1f} a "
                f"minute (per request: {sh.first_mb_per_min / w1 * 1024:.0f} then {sh.last_mb_per_min / w3 * 1024:.0f} "
                "KB): a leak that follows load, not a plateau; the rate given is the whole window's")
    return (f"warm-up then steady: the first third of the window grew {sh.first_mb_per_min:.1f} MB/min, "
            f"what follows the warm-up {r.mb_per_min:.1f} MB/min (the rate given)")


def series_rates(pid: int, t: np.ndarray, levels: Mapping[str, np.ndarray],
                 warmup_s: float | None = None) -> dict[str, float | int | bool | str | None]:
    """One process's row of rates: ``t`` its sample times in order, ``levels`` its rss/anon/uss/pss bytes at
    those times. What the verdict rules (analysis/leaking.py) read, without pandas (the watch judges with it)."""
    row: dict[str, float | int | bool | str | None] = {"pid": int(pid), "samples": len(t),
                                                       "t_first": float(t[0]), "t_last": float(t[-1])}
    for col in ("rss", "anon", "uss", "pss"):
        r = rate(t, levels[col], warmup_s)
        row[f"{col}_mb_per_min"] = r.mb_per_min
        row[f"{col}_confidence"] = r.confidence
        row[f"{col}_step"] = r.step
        row[f"{col}_shape"] = r.shape.kind if r.shape is not None else "unknown"
        row[f"{col}_decelerating"] = r.decelerating
        row[f"{col}_last_mb_per_min"] = r.shape.last_mb_per_min if r.shape is not None else r.mb_per_min
        row[f"{col}_shape_evidence"] = shape_evidence(r)
        row[f"{col}_lower_mb_per_min"] = r.lower_mb_per_min
        row[f"{col}_stop"] = ("bounded" if r.bounded else "stopping") if r.stop is not None else None
        row[f"{col}_stop_evidence"] = stop_evidence(r)
        row[f"{col}_stop_grew_mb_per_min"] = r.stop.grew_mb_per_min if r.stop is not None else 0.0
        row[f"{col}_stop_rise_share"] = r.stop.rise / r.stop.level if r.stop is not None and r.stop.level > 0 else 0.0
    row["rss_first_mb"] = float(levels["rss"][0]) / MB
    row["rss_last_mb"] = float(levels["rss"][-1]) / MB
    row["anon_last_mb"] = float(levels["anon"][-1]) / MB
    return row
