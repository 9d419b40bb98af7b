"""What the reporters plot besides report.json, taken from the session by the analysis so that no
reporter reopens the session: memory over time, the eBPF ledger's outstanding bytes by library over time,
and its outstanding regions by call stack (the flame graph)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from leaktrace.analysis.ledger import stack_frames
from leaktrace.session import TableSource

Stacks = list[tuple[list[str], int]]  # (frames root first, bytes)

def clean_frame(f: str) -> str:
    return str(f).replace(";", ",").replace("\n", " ").strip() or "?"


@dataclass
class Figures:
    rollup: pd.DataFrame = field(default_factory=pd.DataFrame)  # smaps_rollup rows: t, pid, rss, anon, ...
    ledger_by_library: pd.DataFrame | None = None  # t, library, bytes (the top libraries at the end)
    ledger_stacks: Stacks = field(default_factory=list)  # outstanding bytes by pid and call stack
    ledger_sites: list[LedgerSite] = field(default_factory=list)  # the same with library, kind and regions
    start_wall: float | None = None  # the hunt's start, Unix seconds (a pprof profile's time)


@dataclass(frozen=True)
class LedgerSite:
    """The outstanding regions of one process mapped through one call stack (and library, kind)."""

    pid: int
    library: str | None
    kind: str | None
    frames: list[str]  # root first, as in ``ledger_stacks`` without the process frame
    bytes: int
    regions: int


def build_figures(reader: TableSource) -> Figures:
    try:
        by_library = ledger_by_library(reader)
    except Exception:  # an optional plot: the report stands without it
        by_library = None
    return Figures(rollup=reader.table("rollup"), ledger_by_library=by_library, ledger_stacks=ledger_stacks(reader),
                   ledger_sites=ledger_sites(reader), start_wall=reader.meta.get("start_wall"))


def ledger_by_library(reader: TableSource, top: int = 8) -> pd.DataFrame | None:
    """Outstanding bytes per library per tick from ``ledger_snapshots`` (summed over processes)."""
    snaps = reader.table("ledger_snapshots")
    if snaps.empty:
        return None
    snaps = snaps[snaps["kind"] != "preexisting"]
    df = snaps.groupby(["t", "library"], as_index=False)["outstanding_bytes"].sum()
    last = df[df["t"] == df["t"].max()].nlargest(top, "outstanding_bytes")["library"]
    return df[df["library"].isin(set(last))].rename(columns={"outstanding_bytes": "bytes"})


def ledger_stacks(reader: TableSource) -> Stacks:
    """Outstanding regions the bpf probe wrote at stop (``ledger_regions``, not pre-existing ones) by
    call stack (``bpf_stacks``): :func:`ledger_sites` summed over their kinds. Absent when the hunt was
    killed before the probe stopped."""
    out: dict[tuple[str, ...], int] = {}
    for s in ledger_sites(reader):
        key = (f"pid {s.pid}", *s.frames)
        out[key] = out.get(key, 0) + s.bytes
    return [(list(k), n) for k, n in out.items()]


def ledger_sites(reader: TableSource) -> list[LedgerSite]:
    """``ledger_stacks`` with the region count, library and kind of each (pid, stack, library, kind): the
    interactive flame graph's hover and the pprof profile's ``inuse_objects``."""
    if reader is None:
        return []
    regs = reader.table("ledger_regions")
    if regs.empty:
        return []
    regs = regs[~regs["preexisting"].astype(bool)]
    frames = stack_frames(reader)
    out: list[LedgerSite] = []
    by = regs.groupby(["pid", "stack_key", "library", "kind"], dropna=False)["size"].agg(["sum", "count"])
    for (pid, skey, lib, kind), row in by.iterrows():
        lib = None if pd.isna(lib) or lib == "" else str(lib)
        stack = frames.get(str(skey)) or ([f"{lib} (no stack)"] if lib else [str(skey)])
        out.append(LedgerSite(int(pid), lib, None if pd.isna(kind) else str(kind),
                              [clean_frame(f) for f in reversed(stack)], int(row["sum"]), int(row["count"])))
    return out
