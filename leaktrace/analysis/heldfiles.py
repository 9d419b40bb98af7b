"""Memory held by descriptors (the ``held_files`` table, see leaktrace/probes/heldfiles.py): a process whose
memfds, /dev/shm files or dma-bufs, held open and not mapped, grow steadily is a culprit of kind ``shm``
(``held_by: "fd"``): that memory never shows in its RSS, so no other candidate names it. The rate is read as
every other (analysis/growth.py: warm-up, steps, slowing, stops) and must clear the leak rate. Its library and
call path are those of the process's memfd_create calls the eBPF layer saw during the hunt (``bpf_events``),
the call site that made the most of them."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from leaktrace.analysis.candidates import THRESHOLDS, Candidate, frame_library
from leaktrace.analysis.growth import MB, rate
from leaktrace.analysis.growth_tables import per_process
from leaktrace.analysis.leaking import leaks_steadily
from leaktrace.analysis.ledger import stack_frames
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
        library, stack, line = _created_by(reader, pid)
        ev.append(line)
        out.append(Candidate(kind="shm", pid=pid, mb_per_min=r.mb_per_min, source="fd", cls="fd", library=library,
                             stack=stack, evidence=ev, outstanding_bytes=int(last["bytes"]), paths=names,
                             python=pi.get("python", False), label=pi.get("label", "other"),
                             title=pi.get("title", "?"),
                             extra={"held_by": "fd", "confidence": round(r.confidence, 3)}))
    return out


def _created_by(reader: TableSource, pid: int) -> tuple[str | None, list[str], str]:
    """(library, stack, evidence line) of the call site that made most of ``pid``'s memfd_create calls during
    the hunt; library None and no stack when none was traced (memfds made before attach, files opened)."""
    ev = reader.table("bpf_events") if "bpf_events" in reader.tables() else pd.DataFrame()
    mine = ev[(ev["pid"] == pid) & (ev["type"] == "memfd")] if not ev.empty else ev
    if mine.empty:
        return None, [], ("no memfd_create call of this process traced during the hunt (made before attach, or "
                          "files opened rather than created): its call path is unknown")
    calls = mine.groupby("stack_key").size().sort_values(ascending=False)
    key, n = str(calls.index[0]), int(calls.iloc[0])
    stacks = reader.table("bpf_stacks")
    row = stacks[stacks["stack_key"].astype(str) == key] if not stacks.empty else stacks
    library = str(row["library"].iloc[0]) if not row.empty else None
    frames = stack_frames(reader).get(key, [])
    site = next((f for f in frames if library and frame_library(f) == library), key)
    return (library if library and not library.startswith(("?", "(")) else None, frames,
            f"memfd_create called {len(mine)} time(s) during the hunt, {n} of them from {site} (traced by the eBPF layer)")


def _names(raw: Any) -> list[tuple[str, int, int]]:
    """The probe's [name, files, bytes] list (empty when unreadable)."""
    if not isinstance(raw, str) or pd.isna(raw):
        return []
    try:
        named = json.loads(raw)
        return [(str(n), int(files), int(size)) for n, files, size in named]
    except (ValueError, TypeError):
        return []
