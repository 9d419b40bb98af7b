"""The verdict's reason in figures a person can check against the report: which process grew, from what RSS to
what over how long, and what it holds by library and by which measurement, then the rule that made it a leak.
A reason that only restates the rule ("1 process(es) grow ≥ 1.0 MB/min steadily …") cannot be checked; these
figures are the report's own (processes[], culprits[])."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from leaktrace.analysis.growth import MB

MAX_PROCESSES_NAMED = 3  # the rest are counted: the reason stays one readable line on a node of twenty workers

SOURCE_WORDS = {"ledger": "eBPF ledger", "watcher": "smaps", "pyheap": "Python-heap walks", "fd": "descriptors held",
                "host": "host memory", "status": "locked memory in /proc status", "faults": "page faults"}


def rule_line(th: dict[str, float]) -> str:
    return (f"the rule: ≥ {th['leak_mb_per_min']} MB/min steadily, slope confidence ≥ {th['min_confidence']}, over "
            f"≥ {th['min_span_s']:.0f} s, not a step, not decelerating")


def _sources(source: str) -> str:
    return " and ".join(SOURCE_WORDS.get(s, s) for s in str(source or "").split("+") if s) or "unknown"


def process_fact(p: pd.Series | dict[str, Any]) -> str:
    """'pid P (title): RSS A → B MB over S s, its slope R MB/min (≥ L at 95%, slope confidence C)'. The slope is
    the rate the rule judged (after a warm-up, by batches where it grows in batches: analysis/growth.py), so it
    can differ from the end points' difference."""
    name = str(p.get("title") or p.get("comm") or "?")
    span = float(p["t_last"]) - float(p["t_first"])
    lower = p.get("rss_lower_mb_per_min")
    bound = (f"≥ {float(lower):.1f} at 95%, " if lower is not None and math.isfinite(float(lower)) else "")
    return (f"pid {int(p['pid'])} ({name}): RSS {float(p['rss_first_mb']):.1f} → {float(p['rss_last_mb']):.1f} MB "
            f"over {span:.0f} s, its slope {float(p['rss_mb_per_min']):.1f} MB/min ({bound}slope confidence "
            f"{float(p['rss_confidence']):.2f})")


def culprit_fact(c: dict[str, Any]) -> str:
    """'LIB: KIND at R MB/min (by MEASUREMENT), X MB outstanding'."""
    what = c.get("library") or c.get("cls") or c["kind"]
    held = int(c.get("outstanding_bytes") or 0)
    return (f"{what}: {c['kind']} at {float(c['mb_per_min']):.1f} MB/min (by {_sources(c.get('source', ''))})"
            + (f", {held / MB:.1f} MB outstanding" if held > 0 else ""))


def leak_reason(procs: pd.DataFrame, leaks: list[dict[str, Any]], th: dict[str, float]) -> str:
    """The leak verdict's reason: per process with a culprit (report order, the first MAX_PROCESSES_NAMED), its
    RSS figures and its first culprit's; then the rule."""
    by_pid: dict[int, list[dict[str, Any]]] = {}
    for c in leaks:
        by_pid.setdefault(int(c["pid"]), []).append(c)
    rows = {int(r["pid"]): r for _, r in procs.iterrows()} if not procs.empty else {}
    parts = []
    for pid, cs in list(by_pid.items())[:MAX_PROCESSES_NAMED]:
        fact = culprit_fact(cs[0]) + (f" (+{len(cs) - 1} more culprit(s))" if len(cs) > 1 else "")
        parts.append(f"{process_fact(rows[pid])}; {fact}" if pid in rows else fact)
    more = len(by_pid) - MAX_PROCESSES_NAMED
    return (f"{len(by_pid)} process(es) leak: " + "; ".join(parts)
            + (f"; and {more} more process(es) with a culprit" if more > 0 else "") + f" — {rule_line(th)}")


def fastest_line(procs: pd.DataFrame) -> str:
    """'; the fastest, pid P (title): RSS …' — the process closest to a leak, for a reason that says none leaks."""
    rates = procs["rss_mb_per_min"].astype(float).dropna() if "rss_mb_per_min" in procs else pd.Series(dtype=float)
    if rates.empty:
        return ""
    p = procs.loc[rates.idxmax()]
    return f"; the fastest, {process_fact(p)}"


def facts_of(procs: pd.DataFrame, pids: set[int] | list[int]) -> str:
    """'; pid P (title): RSS …' for each of ``pids`` (the first MAX_PROCESSES_NAMED, fastest first): the figures
    behind an inconclusive verdict."""
    if procs.empty or not pids:
        return ""
    mine = procs[procs["pid"].isin(list(pids))].sort_values("rss_mb_per_min", ascending=False)
    return "".join(f"; {process_fact(p)}" for _, p in mine.head(MAX_PROCESSES_NAMED).iterrows())
