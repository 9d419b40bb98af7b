"""Locked and pinned memory: a process whose VmLck (mlock, mlockall, MAP_LOCKED) or VmPin (pages a driver
pinned: RDMA registrations, GPU host-pinned buffers) grows at the leak rate holds memory the kernel can
neither reclaim nor swap. Its growth is named ``pinned``: the ledger's candidate of the same process that
maps what is locked keeps its library and call path under that kind (the measured kind kept as
``measured_kind``); pinned growth no ledger candidate explains is a candidate of its own, library unknown.

Read from the host probe's per-target samples (``host_procs``: VmPin, VmLck of /proc/PID/status).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from leaktrace.analysis.candidates import THRESHOLDS, Candidate
from leaktrace.analysis.growth import Rate, per_process, rate
from leaktrace.analysis.leaking import leaks_steadily
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


def recognise(reader: TableSource, ledger: list[Candidate], info: dict[int, dict[str, Any]],
              th: dict[str, float] = THRESHOLDS) -> tuple[list[Candidate], list[Candidate]]:
    """(``ledger`` with the candidates whose memory is locked re-labelled ``pinned``, the pinned candidates no
    ledger candidate explains)."""
    alone: list[Candidate] = []
    for pid, (col, r) in pinned_rates(reader, th).items():
        line = (f"{COLUMNS[col]} grows {r.mb_per_min:.2f} MB/min (/proc/{pid}/status, confidence "
                f"{r.confidence:.2f} over {r.span_s:.0f} s): these pages cannot be reclaimed or swapped")
        mine = [c for c in ledger if c.pid == pid and c.mb_per_min >= LOCKED_SHARE * r.mb_per_min]
        if mine:
            c = max(mine, key=lambda c: c.mb_per_min)
            c.extra["measured_kind"] = c.kind
            c.kind = "pinned"
            c.evidence.insert(0, line + f"; {c.library or 'its caller'} maps them")
            continue
        pi = info.get(pid, {})
        alone.append(Candidate(kind="pinned", pid=pid, mb_per_min=r.mb_per_min, source="status", cls="pinned",
                               evidence=[line, "no mapping the eBPF ledger saw grows with it: pages locked or "
                                               "pinned where they were (mlock of memory mapped before, a driver's "
                                               "registration of existing buffers)"],
                               python=pi.get("python", False), label=pi.get("label", "other"),
                               title=pi.get("title", "?"), extra={"confidence": round(r.confidence, 3)}))
    return ledger, alone
