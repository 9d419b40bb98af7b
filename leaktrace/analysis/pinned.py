"""Locked and pinned memory: a process whose VmLck (mlock, mlockall, MAP_LOCKED) or VmPin (pages a driver
pinned: RDMA registrations, GPU host-pinned buffers) grows at the leak rate holds memory the kernel can
neither reclaim nor swap. Its growth is named ``pinned``: the ledger's candidate of the same process that
maps what is locked keeps its library and call path under that kind (the measured kind kept as
``measured_kind``); pinned growth no ledger candidate explains is a candidate of its own, named by the call
path of the mlock calls whose pages are still locked (analysis/locks.py: pages mapped long before, locked
slice by slice), library unknown where no lock call explains it (a driver's pins, a lock before attach).

Read from the host probe's per-target samples (``host_procs``: VmPin, VmLck of /proc/PID/status) and the
eBPF layer's lock calls (``bpf_events``).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from leaktrace.analysis.candidates import THRESHOLDS, Candidate, frame_library
from leaktrace.analysis.growth import MB, Rate, rate
from leaktrace.analysis.growth_tables import per_process
from leaktrace.analysis.leaking import leaks_steadily
from leaktrace.analysis.locks import MCL_FUTURE, LockSite, ProcessLocks, lockall_words, process_locks
from leaktrace.session import TableSource

# A ledger candidate whose rate is at least this share of the locked growth is the memory that is locked.
LOCKED_SHARE = 0.5
COLUMNS = {"vm_lck": "VmLck (locked: mlock, mlockall, MAP_LOCKED)", "vm_pin": "VmPin (pinned by a driver)"}


def pinned_rates(reader: TableSource, th: dict[str, float] = THRESHOLDS) -> dict[int, tuple[str, Rate]]:
    """pid -> (column, rate) of each process whose VmLck or VmPin grows at the leak rate, steadily."""
    hp = reader.table("host_procs") if "host_procs" in reader.tables() else pd.DataFrame()
    out: dict[int, tuple[str, Rate]] = {}
    for pid, rows in per_process(hp):
        for col in COLUMNS:
            r = rate(rows["t"], rows[col])
            if not leaks_steadily(r, th):
                continue
            if pid not in out or r.mb_per_min > out[pid][1].mb_per_min:
                out[pid] = (col, r)
    return out


def _site_frame(site: LockSite) -> str:
    """The call site's frame in its library (the frame after the syscall instruction otherwise)."""
    return next((f for f in site.frames if frame_library(f) == site.library),
                site.frames[1] if len(site.frames) > 1 else site.stack_key)


def _lock_lines(pl: ProcessLocks | None) -> tuple[LockSite | None, list[str]]:
    """(the lock call site that holds the most still locked, the evidence lines of the process's lock calls)."""
    if pl is None:
        return None, []
    lines = []
    top = pl.sites[0] if pl.sites and pl.sites[0].locked_bytes > 0 else None
    if top is not None:
        lines.append(f"mlock from {top.library} ({_site_frame(top)}): {top.locked_bytes / MB:.1f} MB it locked during "
                     f"the hunt are still locked ({top.calls} calls; traced by the eBPF layer)")
    for flags, key in pl.lockall[-1:]:
        who = next((s for s in pl.sites if s.stack_key == key), None)
        where = f"{who.library} ({_site_frame(who)})" if who is not None else key
        lines.append(f"mlockall({lockall_words(flags)}) from {where}"
                     + (": every page the process maps from then on is locked" if flags & MCL_FUTURE else ""))
    return top, lines


def _locked_by(site: LockSite) -> dict[str, Any]:
    return {"library": site.library, "stack_key": site.stack_key, "locked_bytes": int(site.locked_bytes),
            "calls": int(site.calls)}


def recognise(reader: TableSource, ledger: list[Candidate], info: dict[int, dict[str, Any]],
              th: dict[str, float] = THRESHOLDS) -> tuple[list[Candidate], list[Candidate]]:
    """(``ledger`` with the candidates whose memory is locked re-labelled ``pinned``, the pinned candidates no
    ledger candidate explains)."""
    alone: list[Candidate] = []
    rates = pinned_rates(reader, th)
    locks = process_locks(reader) if rates else {}
    for pid, (col, r) in rates.items():
        line = (f"{COLUMNS[col]} grows {r.mb_per_min:.2f} MB/min (/proc/{pid}/status, confidence "
                f"{r.confidence:.2f} over {r.span_s:.0f} s): these pages cannot be reclaimed or swapped")
        top, lock_lines = _lock_lines(locks.get(pid)) if col == "vm_lck" else (None, [])
        mine = [c for c in ledger if c.pid == pid and c.mb_per_min >= LOCKED_SHARE * r.mb_per_min]
        if mine:
            c = max(mine, key=lambda c: c.mb_per_min)
            c.extra["measured_kind"] = c.kind
            c.kind = "pinned"
            c.evidence[:0] = [line + f"; {c.library or 'its caller'} maps them", *lock_lines]
            if top is not None:
                c.extra["locked_by"] = _locked_by(top)
            continue
        pi = info.get(pid, {})
        if top is not None:
            why = [line, *lock_lines, "no mapping the eBPF ledger saw grows with it: the pages were mapped before "
                                      "and are locked where they are"]
        else:
            why = [line, *lock_lines, "no mapping the eBPF ledger saw grows with it, and no lock call it traced "
                                      "explains it: pages locked or pinned where they were (a lock before the "
                                      "hunt with MCL_FUTURE or MAP_LOCKED, a driver's registration of existing "
                                      "buffers)"]
        c = Candidate(kind="pinned", pid=pid, mb_per_min=r.mb_per_min, source="status", cls="pinned",
                      library=top.library if top is not None else None,
                      stack=list(top.frames) if top is not None else [], evidence=why,
                      outstanding_bytes=int(top.locked_bytes) if top is not None else 0,
                      python=pi.get("python", False), label=pi.get("label", "other"),
                      title=pi.get("title", "?"), extra={"confidence": round(r.confidence, 3)})
        if top is not None:
            c.extra["locked_by"] = _locked_by(top)
        alone.append(c)
    return ledger, alone
