"""A process's recent growth judged by the verdict rules of `hunt` (leaktrace.analysis: the robust rates,
steps and plateau shapes of analysis.growth, the rules of analysis.leaking, the thresholds of
analysis.thresholds), over the watch's rolling window, on numpy alone: the daemon never holds pandas for it. A
cheap slope filters first: most ticks of most processes need no more than that."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from leaktrace.analysis.thresholds import THRESHOLDS
from leaktrace.slope import theil_sen

MB = 1024 * 1024

# The full rules run only when the cheap slope reaches this share of the leak rate.
PREFILTER_SHARE = 0.5


@dataclass
class Judgement:
    rss: int = 0
    anon: int = 0
    rss_per_s: float = 0.0  # robust slope over the window (bytes/s)
    anon_per_s: float = 0.0
    leaking: bool = False  # the hunt's `leak` rule holds over the window
    growing: bool = False  # leaking, or growing at the leak rate without the confidence yet
    span_s: float = 0.0


def thresholds(leak_mb_per_min: float | None) -> dict[str, float]:
    th = dict(THRESHOLDS)
    if leak_mb_per_min is not None:
        th["leak_mb_per_min"] = float(leak_mb_per_min)
    return th


def judge(rows: list[dict[str, Any]], th: dict[str, float]) -> Judgement:
    """``rows``: the process's rollup rows over the window, oldest first."""
    if not rows:
        return Judgement()
    last = rows[-1]
    j = Judgement(rss=int(last["rss"]), anon=int(last["anon"]), span_s=float(last["t"] - rows[0]["t"]))
    if len(rows) < 3:
        return j
    t = np.fromiter((r["t"] for r in rows), dtype=float, count=len(rows))
    rss = np.fromiter((r["rss"] for r in rows), dtype=float, count=len(rows))
    anon = np.fromiter((r["anon"] for r in rows), dtype=float, count=len(rows))
    j.rss_per_s = float(theil_sen(t, rss)[0])
    j.anon_per_s = float(theil_sen(t, anon)[0])
    fast = max(j.rss_per_s, j.anon_per_s) * 60.0 / MB
    if fast < PREFILTER_SHARE * th["leak_mb_per_min"]:
        return j
    # The hunt's rules on the process's row (analysis.growth, analysis.leaking: numpy only, so the daemon never
    # loads pandas and pyarrow for them).
    from leaktrace.analysis.growth import series_rates
    from leaktrace.analysis.leaking import is_doubtful, is_leaking

    levels = {"rss": rss, "anon": anon}
    for col in ("uss", "pss"):
        levels[col] = np.fromiter((r[col] for r in rows), dtype=float, count=len(rows))
    row = series_rates(int(last.get("pid", 0)), t, levels)
    j.leaking = bool(is_leaking(row, th))
    j.growing = j.leaking or bool(is_doubtful(row, th))
    return j


def leaks_through(rows: list[dict[str, Any]], since: float, th: dict[str, float]) -> bool:
    """Whether the growth judged leaking since ``since`` is a leak by the hunt's rules over that stretch alone.
    The window a leak is judged over (300 s by default) outlasts --confirm-s: a cache that filled through most
    of it and stopped keeps the window's judgement leaking while the stretch under confirmation is flat."""
    return judge([r for r in rows if r["t"] >= since], th).leaking
