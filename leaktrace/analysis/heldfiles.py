"""Memory held by descriptors (the ``held_files`` table, see leaktrace/probes/heldfiles.py): a process whose
memfds, /dev/shm files or dma-bufs, held open and not mapped, grow steadily is a culprit of kind ``shm``
(``held_by: "fd"``): that memory never shows in its RSS, so no other candidate names it. The rate is read as
every other (analysis/growth.py: warm-up, steps, slowing, stops) and must clear the leak rate."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from leaktrace.analysis.candidates import THRESHOLDS, Candidate
from leaktrace.analysis.growth import MB, per_process, rate
from leaktrace.analysis.leaking import leaks_steadily
from leaktrace.session import TableSource


def held_candidates(reader: TableSource, info: dict[int, dict[str, Any]],
                    th: dict[str, float] = THRESHOLDS) -> list[Candidate]:
    out: list[Candidate] = []
    for pid, rows in per_process(reader.table("held_files")):
        r = rate(rows["t"], rows["bytes"])
        if not leaks_steadily(r, th):
            continue
        last = rows.iloc[-1]
        named = _names(last["names"])
        names = [n for n, _files, _size in named]
        pi = info.get(pid, {})
        ev = [f"{int(last['files'])} file(s) held open by descriptor and not mapped: {int(last['bytes']) / MB:.1f} MB "
              f"at the end, growing {r.mb_per_min:.2f} MB/min (confidence {r.confidence:.2f}, "
              f"{int(rows['files'].iloc[0])} → {int(last['files'])} files over {r.span_s:.0f} s); none of it is in "
              "the process's RSS (the host's Shmem holds it)"]
        if named:
            ev.append("held most by: " + "; ".join(f"{n}: {files} file(s), {size / MB:.1f} MB" for n, files, size in named))
        out.append(Candidate(kind="shm", pid=pid, mb_per_min=r.mb_per_min, source="fd", cls="fd",
                             evidence=ev, outstanding_bytes=int(last["bytes"]), paths=names,
                             python=pi.get("python", False), label=pi.get("label", "other"),
                             title=pi.get("title", "?"),
                             extra={"held_by": "fd", "confidence": round(r.confidence, 3)}))
    return out


def _names(raw: Any) -> list[tuple[str, int, int]]:
    """The probe's [name, files, bytes] list (empty when unreadable)."""
    if not isinstance(raw, str) or pd.isna(raw):
        return []
    try:
        named = json.loads(raw)
        return [(str(n), int(files), int(size)) for n, files, size in named]
    except (ValueError, TypeError):
        return []
