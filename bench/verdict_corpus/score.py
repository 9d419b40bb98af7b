"""The figures of `python -m bench verdicts` from the replayed windows (windows.replay_all), and the replay of
a day of clean serving through watch's judging (leaktrace.watch.judge).

Definitions (per split and window length):
- false_alarm_rate: of the clean and bounded windows, the share called a leak (verdict `leak` with a culprit
  in the process).
- detection_rate: of the leak windows whose truth rate is >= 2 MB/min, the share called a leak.
- library_right_rate: of those called, the share whose first culprit is the leak's library.
- rate_error_median / _p90: |reported - truth| / truth of the leak culprit, over the windows called with the
  library right (truth: the slope of the bytes the generator leaked over the window).
Each with a 95% interval: Wilson for shares, a seeded bootstrap for the rate errors. False alarms are also
given apart for the quiet windows whose held memory rose through the window (``filling``: windows.held_filling)
and the rest (``settled``)."""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pandas as pd

from bench.verdict_corpus.windows import LENGTHS, Split

DETECT_MB_PER_MIN = 2.0
BANDS = ((0.0, 1.0), (1.0, 2.0), (2.0, 10.0), (10.0, 100.0), (100.0, math.inf))
CALIBRATION_BINS = ((0.0, 0.5), (0.5, 0.75), (0.75, 0.9), (0.9, 1.0001))


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, c - h), min(1.0, c + h))


def boot(x: np.ndarray, q: float, n: int = 400, seed: int = 42) -> tuple[float, float]:
    if len(x) == 0:
        return (math.nan, math.nan)
    rnd = np.random.default_rng(seed)
    qs = np.quantile(rnd.choice(x, size=(n, len(x)), replace=True), q, axis=1)
    return (float(np.quantile(qs, 0.025)), float(np.quantile(qs, 0.975)))


def rate_errors(df: pd.DataFrame) -> np.ndarray:
    ok = df[df["called"] & df["library_right"] & (df["truth_mb_per_min"] > 0)]
    return (np.abs(ok["mb_per_min"].to_numpy(float) - ok["truth_mb_per_min"].to_numpy(float))
            / ok["truth_mb_per_min"].to_numpy(float))


def figures(df: pd.DataFrame) -> dict[str, Any]:
    """One split's windows of one length -> the contract's figures, and their intervals."""
    quiet = df[df["label"] != "leak"]
    leaks = df[(df["label"] == "leak") & (df["truth_mb_per_min"] >= DETECT_MB_PER_MIN)]
    called = leaks[leaks["called"]]
    err = rate_errors(leaks)
    fa, det, lib = int(quiet["called"].sum()), int(leaks["called"].sum()), int(called["library_right"].sum())
    out = {"windows": int(len(df)),
           "false_alarm_rate": fa / len(quiet) if len(quiet) else 0.0,
           "detection_rate": det / len(leaks) if len(leaks) else 0.0,
           "library_right_rate": lib / len(called) if len(called) else 0.0,
           "rate_error_median": float(np.median(err)) if len(err) else 0.0,
           "rate_error_p90": float(np.quantile(err, 0.9)) if len(err) else 0.0}
    ci = {"false_alarm_rate": wilson(fa, len(quiet)), "detection_rate": wilson(det, len(leaks)),
          "library_right_rate": wilson(lib, len(called)), "rate_error_median": boot(err, 0.5),
          "rate_error_p90": boot(err, 0.9)}
    counts = {"quiet": len(quiet), "false_alarms": fa, "leaks": len(leaks), "detected": det}
    filling = quiet["filling"].astype(bool) if "filling" in quiet else pd.Series(False, index=quiet.index)
    parts = {"clean": quiet["label"] == "clean", "bounded": quiet["label"] == "bounded",
             "filling": filling, "settled": ~filling}
    by_class = {c: (float(quiet.loc[m, "called"].mean()) if m.any() else math.nan,
                    f"{int(quiet.loc[m, 'called'].sum())}/{int(m.sum())}") for c, m in parts.items()}
    return {"figures": out, "ci": ci, "counts": counts, "by_class": by_class}


def by_band(df: pd.DataFrame) -> list[dict[str, Any]]:
    rows = []
    for lo, hi in BANDS:
        w = df[(df["label"] == "leak") & (df["truth_mb_per_min"] >= lo) & (df["truth_mb_per_min"] < hi)]
        k = int(w["called"].sum())
        rows.append({"band": f"{lo:g}-{hi:g}", "windows": len(w), "detected": k,
                     "rate": k / len(w) if len(w) else math.nan, "ci": wilson(k, len(w))})
    return rows


def calibration(df: pd.DataFrame) -> list[dict[str, Any]]:
    """Of the windows called a leak, by the confidence the analysis gave: the share that are leaks."""
    called = df[df["called"]]
    rows = []
    for lo, hi in CALIBRATION_BINS:
        w = called[(called["confidence"] >= lo) & (called["confidence"] < hi)]
        share = float((w["label"] == "leak").mean()) if len(w) else 0.0
        rows.append({"confidence_from": lo, "confidence_to": min(hi, 1.0), "windows": int(len(w)),
                     "leak_share": share})
    return rows


def split_figures(df: pd.DataFrame) -> dict[str, dict[str, Any]]:
    return {str(n): figures(df[df["length"] == n]) for n in LENGTHS if (df["length"] == n).any()}


# --- watch: a day of clean serving, and the time to confirm a leak -------------------------------------------

_ROLLUP = ("t", "pid", "rss", "pss", "uss", "anon", "swap", "shared")
_LEVELS = ("rss", "pss", "uss", "anon")
MB = 1024 * 1024


def _ticks(ser: pd.DataFrame, interval: float, phase: float) -> pd.DataFrame:
    """The rollup as watch samples it: one row every ``interval`` seconds."""
    ser = ser.sort_values("t")
    grid = np.arange(float(ser["t"].min()) + phase, float(ser["t"].max()), interval)
    idx = np.searchsorted(ser["t"].to_numpy(float), grid)
    return ser.iloc[np.unique(np.clip(idx, 0, len(ser) - 1))][list(_ROLLUP)].reset_index(drop=True)


def _at(df: pd.DataFrame | None, times: np.ndarray) -> list[dict[str, Any] | None]:
    """The row of ``df`` (sorted by t) last read at or before each of ``times``, re-timed to it (None before
    its first read): what a read at each watch tick would have seen."""
    if df is None or df.empty:
        return [None] * len(times)
    t = df["t"].to_numpy(float)
    idx = np.searchsorted(t, times, side="right") - 1
    recs = df.to_dict("records")
    return [None if i < 0 else {**recs[i], "t": float(x)} for i, x in zip(idx, times, strict=True)]


def _evidence(split: Split, pid: int, kind: str, times: np.ndarray) -> tuple[list, list]:
    """At each watch tick: the read of malloc's books (watch/books.py reads them only for a C process: a Python
    interpreter's objects are outside them) and the eBPF ledger's outstanding bytes outside malloc's heap (with
    it where the books are not read: a Python interpreter's heap is what it holds)."""
    tabs = split.by_pid.get(pid, {})
    ms = tabs.get("malloc_state") if kind == "c" else None
    if ms is not None:
        ms = ms[ms["complete"].astype(bool)].sort_values("t")
    ls = tabs.get("ledger_snapshots")
    other = None
    if ls is not None and not ls.empty:
        from leaktrace.watch.books import HEAP_KINDS

        if ms is not None:
            ls = ls[~ls["kind"].astype(str).isin(HEAP_KINDS)]
        o = ls.groupby("t", as_index=False)["outstanding_bytes"].sum()
        other = o.assign(kind="other").sort_values("t")
    return _at(ms, times), _at(other, times)


def _watch(rows: list[dict[str, Any]], interval: float, window_s: float, confirm_s: float,
           th: dict[str, float], books: list | None = None, ledger: list | None = None,
           fast_mb_per_min: float = 0.0) -> list[float]:
    """watch's per-process loop (leaktrace/watch/daemon.py _judge) over a series: the times of its incidents
    (a leak held for confirm_s, or a fast one sooner when what it holds grows with it; a new one after the
    judgement has let go). ``books``, ``ledger``: per row, the read of malloc's books and the ledger's
    outstanding bytes (outside the heap where books are read; None: none), for the daemon's hold on a growth
    nothing the process holds explains and its early confirmation (watch/books.py)."""
    from leaktrace.watch import FAST_CONFIRM_S
    from leaktrace.watch.books import held_growth, held_line, not_held
    from leaktrace.watch.judge import judge, leaks_through

    def reads(t0: float) -> tuple[list, list]:
        assert books is not None and ledger is not None
        mine = range(lo, i + 1)
        return ([books[k] for k in mine if books[k] is not None and rows[k]["t"] >= t0],
                [ledger[k] for k in mine if ledger[k] is not None and rows[k]["t"] >= t0])

    incidents: list[float] = []
    since: float | None = None
    growing_since: float | None = None
    confirmed = False
    lo = 0
    for i, r in enumerate(rows):
        now = r["t"]
        while rows[lo]["t"] < now - window_s:
            lo += 1
        j = judge(rows[lo:i + 1], th)
        growing_since = (growing_since if growing_since is not None else now) if j.growing else None
        if not j.leaking:
            since, confirmed = None, False
            continue
        if since is None:
            since = now
        if confirmed:
            continue
        evidence = books is not None and ledger is not None
        if now - since < confirm_s:
            grows = max(j.rss_per_s, j.anon_per_s) * 60 / MB
            if not evidence or growing_since is None or now - since < FAST_CONFIRM_S or grows < fast_mb_per_min:
                continue
            if held_line(grows, held_growth(*reads(max(growing_since, now - window_s))), fast_mb_per_min) is None:
                continue
        elif not leaks_through(rows[lo:i + 1], since, th):
            since = now  # the daemon's confirmation starts over
            continue
        elif evidence:
            if not_held(*reads(max(since, now - window_s)), j.rss_per_s * 60 / MB, j.anon_per_s * 60 / MB,
                        now - max(since, now - window_s), th["leak_mb_per_min"]) is not None:
                since = now  # the daemon's confirmation starts over
                continue
        confirmed = True
        incidents.append(now)
    return incidents


def watch_day(split: Split, hours: float = 24.0, skip_s: float = 60.0,
              fast_mb_per_min: float | None = None) -> dict[str, Any]:
    """Clean and bounded series of ``split`` strung end to end (each piece after its first ``skip_s``, level
    matched at the joins: its books' memory in use and its ledger's outstanding bytes too) to >= ``hours``,
    judged as one process with watch's defaults (``fast_mb_per_min``: --fast-confirm-mb-per-min, if not its
    default); and each leak of >= 10 MB/min judged alone: seconds from its first leaked byte to its
    confirmation."""
    from leaktrace.watch import DEFAULT_CONFIRM_S, DEFAULT_FAST_CONFIRM_MB_PER_MIN, DEFAULT_INTERVAL_S
    from leaktrace.watch.judge import thresholds

    interval, confirm_s = DEFAULT_INTERVAL_S, DEFAULT_CONFIRM_S
    window_s = max(60.0, 30.0 * interval)  # the daemon's judging window
    th = thresholds(None)
    rnd = random.Random(1)
    pieces = []
    for s in split.specs:
        if s["label"] == "leak":
            continue
        ser = split.series(int(s["pid"]))
        ser = ser[ser["t"] >= ser["t"].min() + skip_s]
        if len(ser) > 30:
            pieces.append((s, ser))
    rows: list[dict[str, Any]] = []
    books: list[dict[str, Any] | None] = []
    ledger: list[dict[str, Any] | None] = []
    t_end, level = 0.0, dict.fromkeys(_LEVELS, 0.0)
    held = {"in_use": None, "other": None}  # the last book and ledger levels, for the joins
    while pieces and t_end < hours * 3600:
        s, ser = pieces[rnd.randrange(len(pieces))]
        ser = _ticks(ser, interval, rnd.uniform(0, interval))
        bk, ld = _evidence(split, int(s["pid"]), s["kind"], ser["t"].to_numpy(float))
        first = ser.iloc[0]
        t_first = float(first["t"])
        shift = {k: (level[k] - float(first[k])) if rows else 0.0 for k in _LEVELS}
        b0 = next((b for b in bk if b is not None), None)
        l0 = next((x for x in ld if x is not None), None)
        b_shift = (held["in_use"] - (b0["uordblks"] + b0["hblkhd"])) if b0 is not None and held["in_use"] is not None else 0.0
        l_shift = (held["other"] - l0["outstanding_bytes"]) if l0 is not None and held["other"] is not None else 0.0
        for r, b, x in zip(ser.to_dict("records"), bk, ld, strict=True):
            r["t"] = t_end + (r["t"] - t_first) + (interval if rows else 0.0)
            r["pid"] = 1
            for k in _LEVELS:
                r[k] = r[k] + shift[k]
            rows.append(r)
            books.append(None if b is None else {**b, "t": r["t"], "uordblks": b["uordblks"] + b_shift})
            ledger.append(None if x is None else {**x, "t": r["t"], "outstanding_bytes": x["outstanding_bytes"] + l_shift})
        t_end = rows[-1]["t"]
        level = {k: float(rows[-1][k]) for k in _LEVELS}
        lb = next((b for b in reversed(books) if b is not None), None)
        lx = next((x for x in reversed(ledger) if x is not None), None)
        held = {"in_use": None if lb is None else lb["uordblks"] + lb["hblkhd"],
                "other": None if lx is None else lx["outstanding_bytes"]}
    fast = DEFAULT_FAST_CONFIRM_MB_PER_MIN if fast_mb_per_min is None else fast_mb_per_min
    false_incidents = len(_watch(rows, interval, window_s, confirm_s, th, books, ledger, fast)) if rows else 0

    truth = {int(p): g.sort_values("t") for p, g in split.truth.groupby("pid")}
    confirm: list[float] = []
    missed = 0
    for s in split.specs:
        if s["label"] != "leak" or float(s["args"].get("leak_mb_min", 0)) < 10:
            continue
        pid = int(s["pid"])
        tr = truth[pid]
        started = tr[tr["leaked"] > 0]
        if started.empty:
            continue
        t_leak = float(started["t"].iloc[0])
        ticks = _ticks(split.series(pid), interval, 0.0)
        bk, ld = _evidence(split, pid, s["kind"], ticks["t"].to_numpy(float))
        inc = [t for t in _watch(ticks.to_dict("records"), interval, window_s, confirm_s, th, bk, ld, fast)
               if t >= t_leak]
        if inc:
            confirm.append(inc[0] - t_leak)
        else:
            missed += 1
    return {"hours": round(t_end / 3600, 2), "false_incidents": false_incidents,
            "confirm_s_median": float(np.median(confirm)) if confirm else math.nan,
            "confirm_s": sorted(round(c, 1) for c in confirm), "leaks_not_confirmed": missed}


def watch_alone(split: Split, skip_s: float = 60.0, fast_mb_per_min: float | None = None) -> dict[str, Any]:
    """Each clean and bounded recording of ``split`` judged alone as watch judges one process (after its first
    ``skip_s``, at two tick phases), with no joins between recordings: its incidents per day of clean series.
    The strung day (``watch_day``) runs a 300 s window across joins of different processes; this one never
    does, and no recording outlives a few confirmations."""
    from leaktrace.watch import DEFAULT_CONFIRM_S, DEFAULT_FAST_CONFIRM_MB_PER_MIN, DEFAULT_INTERVAL_S
    from leaktrace.watch.judge import thresholds

    interval, confirm_s = DEFAULT_INTERVAL_S, DEFAULT_CONFIRM_S
    window_s = max(60.0, 30.0 * interval)
    fast = DEFAULT_FAST_CONFIRM_MB_PER_MIN if fast_mb_per_min is None else fast_mb_per_min
    th = thresholds(None)
    seconds, incidents = 0.0, 0
    for s in split.specs:
        if s["label"] == "leak":
            continue
        ser = split.series(int(s["pid"]))
        ser = ser[ser["t"] >= ser["t"].min() + skip_s]
        if len(ser) <= 30:
            continue
        for phase in (0.0, interval / 2):
            ticks = _ticks(ser, interval, phase)
            bk, ld = _evidence(split, int(s["pid"]), s["kind"], ticks["t"].to_numpy(float))
            incidents += len(_watch(ticks.to_dict("records"), interval, window_s, confirm_s, th, bk, ld, fast))
            seconds += float(ticks["t"].iloc[-1] - ticks["t"].iloc[0])
    return {"hours": round(seconds / 3600, 2), "incidents": incidents,
            "per_day": round(incidents * 86400 / seconds, 1) if seconds else math.nan}
