"""Growth by touching pages: a region mapped before attach whose resident pages grow, named by the code that
writes them.

A library may reserve one large region early (a 1 GiB MAP_NORESERVE arena) and then hand out pieces of it and
write them: no syscall during the hunt, so the eBPF ledger holds nothing of it, and the only mappings it sees made
are other code's (a host program's balanced churn). /proc sees the region's resident pages grow (the watcher's
first and last full smaps, ``regions``); the write faults of the hunted processes (``fault_sites``, from
leaktrace/probes/bpf/faults.py) say whose code touched its pages. The culprit is that code's library, with the
region (its address, size and VmFlags: ``nr`` is MAP_NORESERVE), ``mapped_before_attach`` and the region's
resident growth as its rate.

A culprit joined by address (analysis/attribution.py) must hold what grew: :func:`joined_holds_growth` says
whether the ledger bytes one library holds in a class explain its growth (net growth in the ledger, or at least
half the bytes that grew), so balanced churn in the same class names nobody.
"""

from __future__ import annotations

import pandas as pd

from leaktrace.analysis.candidates import KIND_OF_CLASS, Candidate
from leaktrace.analysis.growth import MB
from leaktrace.memclass import LIBC_LIBRARY
from leaktrace.session import TableSource

# The classes of regions named this way: malloc's arenas and thread stacks grow by touching too, but the ledger
# (heap growth's callers) and the thread-stack analysis name those.
TOUCHED_CLASSES = frozenset({"anon", "shm"})
# A toucher names a region's growth when it made at least this share of the faults counted there.
TOUCH_SHARE = 0.5
# A region is a candidate when its resident pages grow at least this fast (MB/min) over the hunt.
MIN_REGION_MB_PER_MIN = 0.5
# The joined library holds what grew when its ledger net growth, or the bytes it holds, is this share of it.
JOIN_SHARE = 0.5


def _grown_regions(regions: pd.DataFrame) -> pd.DataFrame:
    """Regions in both the first and the last full smaps of their process (same start and end), with their
    resident growth: pid, start, end, size, cls, rss_first, rss_last, t_first, t_last."""
    first = regions[regions["snapshot"] == "first"]
    last = regions[regions["snapshot"] == "last"]
    if first.empty or last.empty:
        return pd.DataFrame()
    m = first.merge(last, on=["pid", "start", "end"], suffixes=("_first", "_last"))
    m = m[m["t_last"] > m["t_first"]]
    return m.assign(size=m["size_last"], cls=m["cls_last"])


def touch_candidates(reader: TableSource, info: dict[int, dict], th: dict[str, float]) -> list[Candidate]:
    """One candidate per region mapped before attach whose resident pages grew, named by the library whose code
    made most of the write faults counted in it (see the module doc)."""
    tables = reader.tables()
    if "fault_sites" not in tables or "regions" not in tables:
        return []
    faults = reader.table("fault_sites")
    faults = faults[faults["preexisting"].astype(bool)]
    if faults.empty:
        return []
    grown = _grown_regions(reader.table("regions"))
    if grown.empty:
        return []
    out = []
    floor = max(MIN_REGION_MB_PER_MIN, 0.5 * th.get("leak_mb_per_min", 1.0))
    for r in grown.itertuples():
        if str(r.cls) not in TOUCHED_CLASSES:
            continue
        span_min = (r.t_last - r.t_first) / 60.0
        rate = (int(r.rss_last) - int(r.rss_first)) / MB / span_min
        if rate < floor:
            continue
        mine = faults[(faults["pid"] == r.pid) & (faults["region_start"] < r.end) & (faults["region_end"] > r.start)]
        if mine.empty:
            continue
        weight = mine["faults"] * mine["sample"].clip(lower=1)
        by_lib = weight.groupby(mine["library"]).sum().sort_values(ascending=False)
        lib = str(by_lib.index[0])
        total = float(by_lib.sum())
        if by_lib.iloc[0] < TOUCH_SHARE * total or LIBC_LIBRARY.match(lib) or lib.startswith(("?", "[")):
            continue
        top = mine[mine["library"] == lib]
        symbol = str(top.loc[weight[top.index].idxmax(), "symbol"])
        flags = str(top["vmflags"].iloc[-1] or "").split()
        p = info.get(int(r.pid), {})
        kind = KIND_OF_CLASS.get(str(r.cls), "native-mmap")
        evidence = [
            f"region 0x{int(r.start):x} ({int(r.size) / MB:.0f} MB, VmFlags {' '.join(flags) or '?'}) was mapped "
            f"before attach, and no syscall of the hunt mapped it; its resident pages grew from "
            f"{int(r.rss_first) / MB:.1f} MB to {int(r.rss_last) / MB:.1f} MB ({rate:.2f} MB/min)",
            f"page faults: {by_lib.iloc[0] / total:.0%} of the ~{int(total):,} write faults in it (1 in "
            f"{int(top['sample'].max())} counted) were made by "
            f"{lib} ({symbol}" + (", through libc (memset, memcpy, read, recv)" if bool((top["ip"] != top["caller"]).any()) else "")
            + ")",
        ]
        if "nr" in flags:
            evidence.append("mapped MAP_NORESERVE: no commit is charged when it is mapped, only as pages are touched")
        out.append(Candidate(
            kind=kind, pid=int(r.pid), mb_per_min=rate, source="faults", library=lib, stack=[symbol],
            evidence=evidence, outstanding_bytes=int(r.size), cls=str(r.cls),
            label=p.get("label", "other"), title=p.get("title", "?"),
            # the region's size did not change: its address space did not grow, only what is resident
            extra={"touched_by": lib, "mapped_before_attach": True, "mapped_mb_per_min": 0.0,
                   "outstanding_resident_bytes": int(r.rss_last),
                   "region": {"start": f"0x{int(r.start):x}", "size": int(r.size), "flags": flags,
                              "rss_first": int(r.rss_first), "rss_last": int(r.rss_last)}}))
    return out


def joined_holds_growth(reader: TableSource, pid: int, library: str, joined_bytes: int, mb_per_min: float) -> bool:
    """Do the ledger bytes ``library`` holds in a class of ``pid`` (``joined_bytes``) explain that class's
    growth of ``mb_per_min``? Yes when the library's outstanding bytes grew in the ledger at least
    :data:`JOIN_SHARE` as fast, or when it holds at least that share of the bytes grown over the hunt."""
    if mb_per_min <= 0 or "ledger_snapshots" not in reader.tables():
        return True
    snaps = reader.table("ledger_snapshots")
    if snaps.empty:
        return True
    span_min = (float(snaps["t"].max()) - float(snaps["t"].min())) / 60.0
    if span_min <= 0:
        return True
    if joined_bytes >= JOIN_SHARE * mb_per_min * MB * span_min:
        return True
    mine = snaps[(snaps["pid"] == pid) & (snaps["library"] == library)]
    if mine.empty:
        return False
    per_t = mine.groupby("t")["outstanding_bytes"].sum().sort_index()
    net = (float(per_t.iloc[-1]) - float(per_t.iloc[0])) / MB / span_min
    return net >= JOIN_SHARE * mb_per_min
