"""Leak or retention: glibc malloc's books (the ``malloc_state`` table, leaktrace/probes/mallocstate) split a
process's heap growth into memory in use (``uordblks`` + ``hblkhd``: what the program holds) and free memory
the allocator keeps (``fordblks``: bins, fast bins, the top chunk).

Memory in use is read at its troughs, else as its floor (analysis/inuse.py). Each malloc-heap candidate of a process whose books were read carries both rates (``live_mb_per_min``,
``retained_mb_per_min``: the process's, malloc keeping one set of books per process). When the memory in use
does not grow at the leak rate and the kept free memory explains the heap's growth, the growth is the
allocator's retention, not a leak: the candidate becomes ``allocator-retention`` (never a leak verdict on its
own), with the facts a remedy needs — the arenas in use, the container's CPU limit, the threads that grew
malloc's heap (the eBPF layer's brk and arena commits: one arena per thread that allocates at once), the remedy
read from the process's own settings (MALLOC_ARENA_MAX, MALLOC_TRIM_THRESHOLD_).
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from leaktrace.analysis.candidates import THRESHOLDS, Candidate
from leaktrace.analysis.growth import Rate, rate
from leaktrace.analysis.inuse import (
    BOOKS_MIN_COVER,
    BOOKS_MIN_READS,
    in_use_grows,
    kept_in_use,
    untouched_line,
)
from leaktrace.analysis.resident import growth_resident_share
from leaktrace.session import TableSource

# The kept free memory explains a heap's growth when it grows at least this share of the candidate's rate.
RETAINED_SHARE = 0.5
SAME_MOMENT_S = 1.0


def books(reader: TableSource) -> dict[int, dict[str, Any]]:
    """pid -> {"live": Rate, "retained": Rate, "last": the last read} for each process read at least 3 times."""
    ms = reader.table("malloc_state") if "malloc_state" in reader.tables() else pd.DataFrame()
    out: dict[int, dict[str, Any]] = {}
    if ms.empty:
        return out
    for pid, rows in ms.groupby("pid"):
        rows = _one_per_moment(rows[rows["complete"].astype(bool)].sort_values("t"))
        if len(rows) < 3:
            continue
        live, retained_at = _kept(rows)
        retained = rate(rows["t"], retained_at, warmup_s=0.0)
        out[int(pid)] = {"live": live, "retained": retained, "last": rows.iloc[-1].to_dict(), "reads": len(rows)}
    return out


def _one_per_moment(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` (sorted by time) with reads within SAME_MOMENT_S of a moment's first taken as that moment, the
    read with the least in use standing for it: the stop's read follows the last tick's by milliseconds, and a
    batch of temporary buffers caught by both would count twice at the window's end."""
    rows = rows.reset_index(drop=True)
    moment, first = [], None
    for i, t in enumerate(rows["t"].tolist()):
        if first is None or t - rows["t"].iat[first] >= SAME_MOMENT_S:  # measured from the moment's first read
            first = i
        moment.append(first)
    return rows.loc[(rows["uordblks"] + rows["hblkhd"]).groupby(moment).idxmin()].reset_index(drop=True)


def _kept(rows: pd.DataFrame) -> tuple[Rate, pd.Series]:
    """(the rate of the memory in use the program keeps, the free memory malloc keeps at each read): see
    analysis/inuse.py. The temporaries came out of malloc's free memory: it keeps them back once freed."""
    in_use = (rows["uordblks"] + rows["hblkhd"]).to_numpy(dtype=float)
    live, floor = kept_in_use(rows["t"].to_numpy(dtype=float), in_use)
    return live, pd.Series(rows["fordblks"].to_numpy(dtype=float) + (in_use - floor), index=rows.index)


def other_allocators(reader: TableSource) -> dict[int, dict[str, str]]:
    """pid -> the allocator the malloc probe found serving malloc in glibc's place (name, library, how,
    settings: leaktrace/probes/mallocstate/allocators.py), from the session's probe summaries."""
    summaries = reader.meta.get("probe_summaries") or {}
    found = (summaries.get("malloc") or {}).get("allocators") or {}
    return {int(pid): a for pid, a in found.items() if isinstance(a, dict)}


def allocator_of(reader: TableSource) -> dict[int, str]:
    """pid -> the allocator serving malloc, where the malloc probe knows: glibc's (its books were read) or
    the one found in its place."""
    ms = reader.table("malloc_state") if "malloc_state" in reader.tables() else pd.DataFrame()
    out = dict.fromkeys((int(p) for p in ms["pid"].unique()), "glibc") if not ms.empty else {}
    out.update({pid: a.get("name", "?") for pid, a in other_allocators(reader).items()})
    return out


def _steady(r: Rate) -> float:
    return 0.0 if r.step else r.mb_per_min


# A heap's growth whose resident share is below this is address space, not memory malloc holds (resident).
UNHELD_RESIDENT_SHARE = 0.5


def recognise(reader: TableSource, ledger: list[Candidate], th: dict[str, float] = THRESHOLDS,
              warnings: list[str] | None = None) -> list[Candidate]:
    """``ledger`` with each malloc-heap candidate given its process's live and retained rates, and re-labelled
    ``allocator-retention`` where kept free memory, not memory in use, makes the growth. One whose books show
    nothing malloc holds growing (neither in use nor free and kept) while its growth is mostly not resident
    is left out, with a warning: arenas committed past what they hold (mprotect reaches a churn's new
    high-water mark; a shrink by MADV_DONTNEED leaves the range mapped) grow the address space only."""
    by_pid = books(reader)
    others = other_allocators(reader)
    snaps = reader.table("ledger_snapshots") if "ledger_snapshots" in reader.tables() else pd.DataFrame()
    unheld: list[Candidate] = []
    split: list[Candidate] = []
    for c in ledger:
        if c.kind == "malloc-heap" and c.pid in others:
            c.extra["allocator"] = str(others[c.pid].get("name", "?"))
            c.evidence.insert(0, str(others[c.pid].get("line", "")))
        b = by_pid.get(c.pid)
        if c.kind != "malloc-heap" or b is None:
            continue
        live, kept = _steady(b["live"]), _steady(b["retained"])
        c.extra["live_mb_per_min"] = round(live, 4)
        c.extra["retained_mb_per_min"] = round(kept, 4)
        last = b["last"]
        line = (f"glibc malloc's books ({b['reads']} reads of its {int(last['arenas'])} arena(s), as mallinfo2() "
                f"counts): in use {live:+.2f} MB/min, free memory malloc keeps {kept:+.2f} MB/min; at the end "
                f"{int(last['uordblks'] + last['hblkhd']) / 2**20:.1f} MB in use, {int(last['fordblks']) / 2**20:.1f} "
                "MB free and kept")
        c.evidence.insert(0, line)
        flat = live < th["leak_mb_per_min"] and kept < th["leak_mb_per_min"]
        share = growth_resident_share(snaps, c.pid, None, "heap") if flat else None
        if share is not None and share[0] < UNHELD_RESIDENT_SHARE:
            unheld.append(c)
            if warnings is not None:
                warnings.append(f"pid {c.pid}: its malloc heap's address space grew {c.mb_per_min:.2f} MB/min, {share[0]:.0%} "
                                f"of it resident, while nothing malloc holds grew (in use {live:+.2f}, free and kept "
                                f"{kept:+.2f} MB/min): arenas committed past what they hold, no leak")
            continue
        if live < th["leak_mb_per_min"] and kept >= RETAINED_SHARE * c.mb_per_min:
            c.extra["measured_kind"] = c.kind
            c.kind = "allocator-retention"
            c.extra["rule_fields"] = {**c.extra.get("rule_fields", {}), **_facts(last),
                                      "grew_threads": growing_threads(reader, c.pid)}
        elif live >= th["leak_mb_per_min"] and c.mb_per_min > OUTGROWS_IN_USE * live:
            rest = _held_part(c, live, kept, th)
            if rest is not None:
                rest.extra["rule_fields"] = {**_facts(last), "grew_threads": growing_threads(reader, c.pid)}
                split.append(rest)
    return [c for c in ledger if not any(c is u for u in unheld)] + split


# A heap whose growth is more than this many times that of the memory in use grows by more than its leak;
# a caller's own growth of the heap within this factor of the memory in use matches it.
OUTGROWS_IN_USE = 1.5


def _held_part(c: Candidate, live: float, kept: float, th: dict[str, float]) -> Candidate | None:
    """A heap that grows more than what malloc holds in use (a caller's batches grow arenas beside a leak),
    where another caller than the one named grows its own rows of the heap (the ledger keeps them by caller,
    ledger._caller_rates) steadily at about the rate of the memory in use: that caller is the leak, at its own
    rate. The rest, where the free memory malloc keeps explains it, is returned as a second candidate,
    ``allocator-retention``, named by the fastest other caller. A heap of one caller, or whose matching
    caller is the one named, is left as the ledger judged it."""
    heap, callers = c.mb_per_min, list(c.extra.get("callers") or [])
    fits = [k for k in callers if k["mb_per_min"] > 0 and float(k["confidence"]) >= th["min_confidence"]
            and 1 / OUTGROWS_IN_USE <= k["mb_per_min"] / live <= OUTGROWS_IN_USE]
    match = min(fits, key=lambda k: abs(math.log(k["mb_per_min"] / live)), default=None)
    if match is None or match["library"] == c.library:
        return None
    c.extra["mapped_mb_per_min"] = round(heap, 4)
    c.mb_per_min = float(match["mb_per_min"])
    c.library, c.outstanding_bytes, c.extra["sites"] = match["library"], match["outstanding_bytes"], match["sites"]
    c.stack = list(match["sites"][0]["stack"]) if match["sites"] else []
    for k in ("python_stack", "ledger_stack"):
        c.extra.pop(k, None)
    old = c.extra.pop("site_line", None)
    c.evidence = [e for e in c.evidence if e != old] + ([match["site_line"]] if match.get("site_line") else [])
    c.evidence.insert(1, f"the heap grows {heap:.2f} MB/min, more than malloc's memory in use ({live:.2f} MB/min): "
                         f"the leak is what is in use; {match['library']} grew its rows of the heap "
                         f"{match['mb_per_min']:.2f} MB/min steadily (confidence {float(match['confidence']):.2f}), "
                         "the caller whose growth matches it")
    rest = heap - c.mb_per_min
    if rest < th["leak_mb_per_min"] or kept < RETAINED_SHARE * rest:
        return None
    other = max((k for k in callers if k is not match), key=lambda k: k["mb_per_min"], default=None)
    library = other["library"] if other is not None else c.library
    sites = other["sites"] if other is not None else []
    return Candidate(
        kind="allocator-retention", pid=c.pid, mb_per_min=rest, source=c.source, library=library,
        stack=list(sites[0]["stack"]) if sites else [], outstanding_bytes=other["outstanding_bytes"] if other else 0,
        cls="heap", python=c.python, label=c.label, title=c.title,
        evidence=[c.evidence[0], f"the heap grows {heap:.2f} MB/min, of which {c.mb_per_min:.2f} MB/min is "
                  f"{c.library}'s leak (its own culprit); the other {rest:.2f} MB/min is free memory malloc keeps "
                  f"({kept:+.2f} MB/min), grown by {library}"],
        extra={"measured_kind": "malloc-heap", "live_mb_per_min": round(live, 4), "retained_mb_per_min": round(kept, 4),
               "confidence": c.extra.get("confidence", 1.0), "sites": sites, "mapped_mb_per_min": round(rest, 4)})


# Threads named in full up to this many.
THREADS_NAMED = 8


def growing_threads(reader: TableSource, pid: int) -> str:
    """The threads that grew malloc's heap during the hunt, in words: those whose brk or arena commit (an
    mprotect making pages readable or writable) the eBPF layer saw."""
    if "bpf_events" not in reader.tables():
        return "not traced"
    ev = reader.table("bpf_events")
    if ev.empty:
        return "none seen"
    mine = ev[(ev["pid"] == pid) & ((ev["type"] == "brk") | ((ev["type"] == "mprotect") & ((ev["prot"] & 3) != 0)))]
    tids = sorted(int(t) for t in mine["tid"].unique())
    if not tids:
        return "none seen"
    shown = ", ".join(str(t) for t in tids[:THREADS_NAMED]) + (", …" if len(tids) > THREADS_NAMED else "")
    return f"{len(tids)} (tid {shown})"


def _facts(last: dict[str, Any]) -> dict[str, str]:
    """What the remedy rests on, as the probe read it: arenas in use, the CPUs glibc sizes its arena limit
    by (8 per CPU of the host, whatever the container's limit), the container's limit, malloc's settings."""
    limit = last.get("cpu_limit")
    return {"arenas": str(int(last["arenas"])), "cpus": str(int(last.get("host_cpus") or 0) or "?"),
            "cpu_limit": "none" if limit is None or pd.isna(limit) or limit < 0 else f"{limit:.1f} CPUs",
            "malloc_settings": str(last.get("settings") or "none set")}


# A process's books speak for its whole window when this many complete reads cover this share of it.


def in_use_flat(reader: TableSource, procs: pd.DataFrame, info: dict[int, dict[str, Any]],
                other_growth: dict[int, float], th: dict[str, float] = THRESHOLDS) -> dict[int, str]:
    """pid -> the line that says why, for each process whose RSS grows at the leak rate while nothing it
    holds does: malloc's memory in use does not grow at the leak rate (its books cover the window) and the
    eBPF ledger saw no other memory (mappings outside the heap, ``other_growth``: MB/min) grow at it. The RSS
    then grows by first touch of memory malloc already handed out, or by free memory it keeps: no leak. A
    process whose RSS outgrows its anonymous memory at the leak rate (shared memory, files) is not judged by
    malloc's books. Python
    interpreters are left out (their object arenas are mapped outside malloc's books: the Python heap's own
    probe judges them), and so is every process when the ledger did not run (``other_growth`` is None)."""
    out: dict[int, str] = {}
    by_pid = books(reader)
    for _, p in procs.iterrows():
        pid = int(p["pid"])
        b = by_pid.get(pid)
        grows = max(float(p["rss_mb_per_min"]), float(p["anon_mb_per_min"]))
        if b is None or info.get(pid, {}).get("python") or grows < th["leak_mb_per_min"]:
            continue
        if float(p["rss_mb_per_min"]) - float(p["anon_mb_per_min"]) >= th["leak_mb_per_min"]:
            continue  # shared or file memory grows too: outside malloc's books, not judged by them
        live: Rate = b["live"]
        span = float(p["t_last"] - p["t_first"])
        if b["reads"] < BOOKS_MIN_READS or live.span_s < BOOKS_MIN_COVER * span:
            continue
        other = other_growth.get(pid, 0.0)
        if in_use_grows(live, th["leak_mb_per_min"]) or other >= th["leak_mb_per_min"]:
            continue
        out[pid] = untouched_line(grows, live, b["reads"], other)
    return out
