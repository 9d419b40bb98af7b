"""What a program keeps of the memory malloc hands it, from reads of malloc's books over time (numpy only:
the hunt's retention rules, analysis/retention.py, and the watch read it alike).

Memory in use is read at its troughs: the reads that caught no temporary buffers (those nearest a line under
the series, found by refitting the line to them), and where the troughs are too few to cover the window, as
its floor (the least of neighbouring reads). Temporary buffers held at the moment of a read are not kept."""

from __future__ import annotations

import dataclasses

import numpy as np

from leaktrace.analysis.growth import Rate, rate
from leaktrace.analysis.leaking import clears
from leaktrace.slope import theil_sen

FLOOR_READS = 3
# Books that judge a growth: at least this many reads, covering at least this share of its window.
BOOKS_MIN_READS = 6
BOOKS_MIN_COVER = 0.5


def kept_in_use(t: np.ndarray, in_use: np.ndarray) -> tuple[Rate, np.ndarray]:
    """(the rate of the memory in use the program keeps, its floor at each read) of one process's reads of
    malloc's books (``in_use``: uordblks + hblkhd, at times ``t`` in order). In use at a read includes the
    temporary buffers of that moment; what the program keeps is read at the troughs (``_troughs``), else as the
    floor of each read and its neighbours: it grows with a leak, not with bigger temporary batches."""
    keep = _troughs(t, in_use)
    if keep is None:
        floor = _neighbours_min(in_use)
        live = rate(t, floor, warmup_s=0.0)
    else:
        live = rate(t[keep], in_use[keep], warmup_s=0.0)
        if not np.isfinite(live.lower_per_s):  # too few troughs for the series' noise: their own spread
            i, j = np.triu_indices(int(keep.sum()), k=1)
            tk, yk = t[keep], in_use[keep]
            live = dataclasses.replace(live, lower_per_s=float(np.min((yk[j] - yk[i]) / np.maximum(tk[j] - tk[i], 1e-9))))
        slope = theil_sen(t[keep], in_use[keep])[0]
        line = float(np.median(in_use[keep] - slope * t[keep])) + slope * t
        floor = np.minimum(line, in_use)
    return live, floor


def _neighbours_min(y: np.ndarray) -> np.ndarray:
    """Each read's least with its neighbours (FLOOR_READS centred; fewer at the ends)."""
    half = FLOOR_READS // 2
    padded = np.concatenate([np.full(half, np.inf), y, np.full(half, np.inf)])
    return np.min(np.lib.stride_tricks.sliding_window_view(padded, FLOOR_READS), axis=1) if len(y) else y


# A read is a trough (no temporary buffers held) when its excess over the line under the series is within
# this share of the way from the least excess to the median one, or within TROUGH_BAND of the least read's
# memory in use (where most reads are troughs, the median excess is their own noise); the line is refitted
# to the troughs.
TROUGH_SHARE = 0.25
TROUGH_BAND = 0.05
TROUGH_ROUNDS = 3
# The troughs speak for the window when at least this many reads cover this share of it.
TROUGH_MIN_READS = 3
TROUGH_MIN_COVER = 1 / 3
# Troughs are read only where temporaries dominate: the median read holds at least this many times the least
# read's memory in use above it. A churner's in use walks a few percent about its level, where the reads
# nearest a line are a chosen few of its noise, not what it keeps.
TEMPORARIES_DOMINATE = 1.0


def _troughs(t: np.ndarray, y: np.ndarray) -> np.ndarray | None:
    """The reads of memory in use that held no temporary buffers, or None when they do not cover the window
    or temporaries do not dominate the series. A stager's batches lift most reads by hundreds of MB and leave
    a few at what the program keeps: the least of neighbouring reads then still holds a batch, the troughs
    do not. The first line is flat (the
    lowest reads), each next one the Theil–Sen fit of the troughs under the previous: a steady growth of
    what is kept tilts it, and a series without temporaries keeps the lower half of its noise."""
    least_read = float(y.min()) if len(y) else 0.0
    if len(y) < TROUGH_MIN_READS or float(np.median(y)) - least_read < TEMPORARIES_DOMINATE * max(least_read, 0.0):
        return None
    base = np.zeros(len(y))
    keep = np.ones(len(y), dtype=bool)
    band = TROUGH_BAND * least_read
    for _ in range(TROUGH_ROUNDS):
        excess = y - base
        least, middle = float(excess.min()), float(np.median(excess))
        keep = excess <= least + max(TROUGH_SHARE * (middle - least), band)
        if keep.sum() < 2:
            return None
        slope = theil_sen(t[keep], y[keep])[0]
        base = float(np.median(y[keep] - slope * t[keep])) + slope * t
    covered = float(t[keep].max() - t[keep].min())
    if keep.sum() < TROUGH_MIN_READS or covered < TROUGH_MIN_COVER * float(t[-1] - t[0]):
        return None
    return keep


def in_use_grows(live: Rate, leak_mb_per_min: float) -> bool:
    """What the program keeps grows at the leak rate: its rate clears it with its interval (a churner's live
    set walks about its bound, and a minute of that walk has a slope), and is no single step."""
    return clears(live.lower_mb_per_min, leak_mb_per_min) and (0.0 if live.step else live.mb_per_min) >= leak_mb_per_min


def untouched_line(grows_mb_per_min: float, live: Rate, reads: int, other_mb_per_min: float) -> str:
    """Why an RSS growth is no leak when nothing the process holds grows (the verdict's and the watch's line)."""
    return (f"RSS grows {grows_mb_per_min:.2f} MB/min but nothing it holds does: malloc's memory in use "
            f"{live.mb_per_min:+.2f} MB/min ({reads} reads of its books), other mappings the eBPF "
            f"ledger traced {other_mb_per_min:+.2f} MB/min: pages of memory malloc already holds being touched, "
            "or free memory it keeps; not a leak")
