"""The series model of analysis/drift.py on the shapes it must tell apart: a leak whose traffic stalls in
the middle of the window is no plateau forming; a plateau forming still is; growth in repeated batches is
rated a batch per period, one batch is a step."""

from __future__ import annotations

import numpy as np

from leaktrace.analysis.drift import poisson_bounds, rate_trend, staircase
from leaktrace.analysis.growth import rate

MB = 1024 * 1024


def _from_rates(per_min: list[float], seg_s: float = 10.0, noise_mb: float = 0.05, seed: int = 1):
    """A series sampled every second whose rate is ``per_min[k]`` MB/min in its k-th segment."""
    rnd = np.random.default_rng(seed)
    t = np.arange(0.0, seg_s * len(per_min) + 1e-9, 1.0)
    rates = np.array(per_min)[np.minimum((t // seg_s).astype(int), len(per_min) - 1)] / 60.0
    y = 100.0 + np.concatenate([[0.0], np.cumsum(rates[1:])]) + rnd.normal(0, noise_mb, len(t))
    return t, y * MB


def test_a_leak_with_a_stall_and_a_slower_end_is_no_plateau():
    # like the real pair's worker by ninths of a 90 s hunt: 10 s without traffic in the middle, a slower end
    # (its thirds fall 20 -> 16 -> 9 MB/min: a plateau's by the thirds alone)
    for seed in range(1, 5):
        t, y = _from_rates([20.0, 20.0, 20.0, 0.0, 16.0, 16.0, 16.0, 8.7, 7.6], seed=seed, noise_mb=0.1)
        r = rate(t, y, warmup_s=0.0)
        assert not r.decelerating, r.shape
        assert r.steady_mb_per_min > 10.0
        tr = rate_trend(t, y)
        assert tr is not None and tr.fall_z < 2.576


def test_a_plateau_forming_still_decelerates():
    t = np.arange(0.0, 91.0)
    y = (100.0 + 30.0 * (1.0 - np.exp(-t / 30.0))) * MB
    r = rate(t, y, warmup_s=0.0)
    assert r.decelerating and r.steady_mb_per_min == 0.0
    tr = rate_trend(t, y)
    assert tr is not None and tr.fall_z > 3.0


def test_batches_are_rated_a_batch_per_period():
    t = np.arange(0.0, 61.0)
    period, batch = 23.4, 19.5
    y = (50.0 + batch * np.floor((t + 7.0) / period)) * MB
    st = staircase(t, y)
    assert st is not None and st.jumps == 2
    assert abs(st.rate_per_s * 60 / MB - batch / period * 60) < 0.05 * batch / period * 60
    r = rate(t, y, warmup_s=0.0)
    assert not r.step and r.estimator == "staircase" and r.confidence > 0.9


def test_three_like_batches_in_a_minute_clear_the_leak_rate():
    """A 50 MB/min leak in 19.5 MB batches: three of them in a minute, flat between. The line's residuals
    read the flat stretches as noise and put the rate's lower bound below zero; counted as batches (three
    seen: a Poisson count of at least 0.82 at 95%) it clears the leak rate by far, and its upper bound holds
    the rate."""
    t = np.arange(0.0, 60.0)
    y = (2.0 + 19.5 * np.floor((t + 20.0) / 23.4)) * MB
    r = rate(t, y, warmup_s=0.0)
    assert r.estimator == "staircase" and not r.step
    assert r.lower_mb_per_min > 10.0, r
    assert r.lower_mb_per_min < r.mb_per_min < r.upper_per_s * 60 / MB


def test_poisson_bounds_of_a_count():
    # the exact one-sided 95% bounds of a Poisson mean from one count (tabulated: Garwood's intervals)
    for k, lo, hi in ((0, 0.0, 2.996), (1, 0.0513, 4.744), (3, 0.8177, 7.754), (10, 5.425, 16.962)):
        got = poisson_bounds(k, 0.05)
        assert abs(got[0] - lo) < 1e-3 and abs(got[1] - hi) < 1e-3, (k, got)


def test_one_batch_is_a_step_and_a_walk_no_staircase():
    t = np.arange(0.0, 61.0)
    y = np.where(t < 30, 50.0, 53.0) * MB
    assert staircase(t, y) is None and rate(t, y, warmup_s=0.0).step
    rnd = np.random.default_rng(3)
    walk = (80.0 + np.cumsum(rnd.normal(0.0, 0.2, len(t)))) * MB
    assert staircase(t, walk) is None


def test_a_steady_line_of_few_reads_is_no_staircase():
    """Eleven reads 3 s apart of a steady growth, in whole bytes: every increment is near a tenth of the range,
    some a byte under it. Not batches with flat stretches between: rated whole, at its slope."""
    t = np.arange(0.4, 33.0, 3.0)
    y = np.floor((150.0 + 236.0 / 60.0 * t) * MB)
    assert staircase(t, y) is None
    assert abs(rate(t, y, warmup_s=0.0).mb_per_min - 236.0) < 0.5


def test_batches_that_fall_back_are_no_staircase():
    t = np.arange(0.0, 61.0)
    y = (50.0 + 10.0 * np.floor(t / 20.0)) * MB
    y[45:] -= 25.0 * MB  # a pool shrinks: not a leak's staircase
    assert staircase(t, y) is None


def test_temporaries_that_come_and_go_are_no_staircase():
    """A server's memory in use, read every 10 s: two lumps of requests' buffers ~15 MB each, the first gone
    again in three smaller steps (none a jump down). Batches that are not kept are no leak in batches (this
    series was rated 9 MB/min as one, and held a clean server's RSS creep out of the books' rule)."""
    t = np.arange(0.0, 121.0, 10.0)
    y = np.array([135.1, 150.5, 151.3, 147.8, 138.9, 134.6, 138.6, 136.5, 141.1, 141.8, 138.4, 153.5, 157.5]) * MB
    assert staircase(t, y) is None
    kept = np.array([135.1, 150.5, 151.3, 150.8, 150.9, 150.6, 150.6, 150.5, 151.1, 150.8, 150.4, 165.5, 166.5]) * MB
    assert staircase(t, kept) is not None  # the same lumps, kept: a leak in batches


def _jumps_then_line(first: list[float], per_min: float, n: int = 51, seed: int = 3):
    """Reads every second: the first third's levels given (MB, in jumps), then a line at ``per_min``."""
    rnd = np.random.default_rng(seed)
    t = np.arange(0.0, float(n))
    k = len(first)
    y = np.empty(n)
    y[:k] = first
    y[k:] = first[-1] + per_min / 60.0 * (t[k:] - t[k - 1])
    return t, (y + rnd.normal(0, 0.02, n)) * MB


def test_arenas_reserved_in_jumps_then_a_steady_leak_is_a_warm_up():
    """Like a heap whose staging threads reserve arenas in chunks as the hunt starts while a leak goes on:
    the first third jumps (and falls back a little: a trim), the later two grow alike: a warm-up, rated and
    bounded by the later thirds."""
    first = [4.0, 154.0, 151.0, 205.0, 210.0, 262.0, 212.0, 270.0, 272.0, 273.0, 275.0, 276.0, 277.0, 278.0,
             280.0, 281.0, 282.0]
    t, y = _jumps_then_line(first, 30.0)
    r = rate(t, y, warmup_s=0.0)
    assert r.shape is not None and r.shape.kind == "warm-up", r.shape
    assert abs(r.mb_per_min - 30.0) < 1.5 and r.lower_mb_per_min > 25.0, r


def test_jumps_that_fall_back_or_rise_no_more_than_the_line_are_no_warm_up():
    # a sawtooth's release inside the first third: no shape to read, as before
    saw = [100.0, 140.0, 180.0, 60.0, 62.0, 63.0, 64.0, 65.0, 66.0, 67.0, 68.0, 69.0, 70.0, 71.0, 72.0, 73.0, 74.0]
    t, y = _jumps_then_line(saw, 30.0)
    r = rate(t, y, warmup_s=0.0)
    assert r.shape is None or r.shape.kind != "warm-up", r.shape
    # a batch leak's one jump in the first third, no bigger than what the line grows in a third: not a warm-up
    batch = [10.0] * 8 + [15.0] * 9
    t, y = _jumps_then_line(batch, 30.0)
    r = rate(t, y, warmup_s=0.0)
    assert r.shape is None or r.shape.kind != "warm-up", r.shape
