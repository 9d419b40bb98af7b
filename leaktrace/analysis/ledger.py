"""Pure functions over a session's eBPF ledger tables (written by leaktrace/probes/bpf/snapshots.py).

``ledger_summary`` fills report.json's ``ledger``; ``native_culprits`` names the libraries whose
outstanding mappings grow, with their rate (Theil–Sen over the per-tick ledger snapshots), the bytes
still outstanding at the end, and the call stack holding most of them. Mappings that existed before
tracing began are never blamed (the probe does not count them in snapshots).

A library's growth is the **net** change of what the process holds through it: the anonymous mappings it
made since attach, less the pre-existing anonymous memory it unmapped since (analysis/preexisting.py).
A churner whose live set was mapped before attach replaces it with new mappings: "mapped since attach and
still held" rises to the live set while the total does not grow.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from leaktrace.analysis.frames import code_frames
from leaktrace.analysis.growth import MB, Rate, rate, shape_evidence, stop_evidence
from leaktrace.analysis.load import requests_by_pid
from leaktrace.analysis.preexisting import no_release, released_by, replaced_preexisting
from leaktrace.memclass import LIBC_LIBRARY
from leaktrace.session import TableSource
from leaktrace.slope import theil_sen

# Snapshot kinds that make a culprit, and the culprit kind each becomes.
CULPRIT_KINDS = {"anon": "native-mmap", "heap": "malloc-heap"}


def _last_tick(df: pd.DataFrame) -> pd.DataFrame:
    if df.empty:
        return df
    return df[df["t"] == df["t"].max()]


def ledger_summary(reader: TableSource) -> dict[str, Any]:
    snaps = reader.table("ledger_snapshots")
    counters = reader.table("bpf_counters")
    regions = reader.table("ledger_regions")
    out: dict[str, Any] = {"outstanding_bytes": 0, "events": 0, "lost_events": 0}
    last = _last_tick(snaps)
    if not counters.empty and not last.empty and float(counters["t"].max()) > float(last["t"].iloc[0]) + 1e-6:
        # The probe writes a snapshot with every counters row: no rows at the last one means nothing was
        # outstanding then (all unmapped, or every target exited: what each held at its exit is in ``exits``).
        last = last.iloc[0:0]
    if not snaps.empty:
        out["outstanding_bytes"] = int(last["outstanding_bytes"].sum())
        out["regions"] = int(last["regions"].sum())
        by_lib = last.groupby("library")["outstanding_bytes"].sum().sort_values(ascending=False)
        out["by_library"] = {str(k): int(v) for k, v in by_lib.head(20).items()}
        anon = last[last["kind"] == "anon"]
        out["anon_outstanding_bytes"] = int(anon["outstanding_bytes"].sum())
    if not counters.empty:
        c = counters.sort_values("t").iloc[-1]
        out["events"] = int(c.get("syscalls", 0))
        out["lost_events"] = int(c.get("lost_events", 0))
        out["slow_events"] = int(c.get("slow_events", 0))
        out["settled_in_kernel"] = int(c.get("settled", 0))
        out["kernel_map_full"] = int(c.get("map_full", 0))
        out["headers"] = str(c.get("header_kind", ""))
    exits = reader.table("ledger_exits")
    if not exits.empty:
        # Targets that exited during the hunt (normally, by a signal, OOM-killed): what each held then.
        out["exits"] = [{"pid": int(r.pid), "t": round(float(r.t), 3), "outstanding_bytes": int(r.outstanding_bytes),
                         "regions": int(r.regions)} for r in exits.sort_values("t").itertuples()]
    if not regions.empty:
        pre = regions[regions["preexisting"].astype(bool)]
        out["preexisting_bytes"] = int(pre["size"].sum())
    return out


def _series(snaps: pd.DataFrame, ticks: np.ndarray, pid: int, library: str | None, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """Outstanding bytes of (pid, library, kind) at every tick of the pid's life (absent = 0); library None:
    all libraries."""
    mine = snaps[snaps["pid"] == pid]
    lo, hi = mine["t"].min(), mine["t"].max()
    grid = ticks[(ticks >= lo) & (ticks <= hi)]
    sel = mine["kind"] == kind
    if library is not None:
        sel &= mine["library"] == library
    g = mine[sel].set_index("t")["outstanding_bytes"]
    g = g.groupby(level=0).sum()
    y = g.reindex(grid, fill_value=0).to_numpy(dtype=float)
    return grid, y


BIRTH_STEP_S = 0.25  # grid of the birth-time series of a short-lived process
# A live process whose outstanding series swings this much (pairwise-slope agreement below this) is also
# rated from what it still held at the hunt's end, by birth time: one call path can carry both short-lived
# mappings and a leak (UCX's hooked mmap: every malloc mmap of the process *and* the rcache's chunks).
HELD_SWITCH_CONFIDENCE = 0.75
HELD_MIN_RISE_SHARE = 0.5  # ... and when the outstanding total rose by at least this share of what they hold
HELD_YOUNG_S = 5.0  # regions born this close to the end may be short-lived ones caught in flight: left out


def _birth_series(regions: pd.DataFrame, pid: int, library: str | None, kind: str, t_start: float,
                  t_exit: float, at_exit: bool = True) -> tuple[np.ndarray, np.ndarray, int] | None:
    """What a process held at its exit, by birth time: bytes born by each instant of a regular grid from the
    start of tracing to the exit (the growth of what it still held then: memory mapped and freed before is
    not in it). (grid, bytes, regions), or None when it held nothing of (library, kind) or lived < 1 s.
    library None: every library (the malloc heap is judged whole). ``at_exit`` False: what a live process
    held at the hunt's stop instead (``t_exit`` then ends the grid; later births are left out)."""
    if regions.empty or regions["at_exit"].isna().all() or t_exit - t_start < 1.0:
        return None  # at_exit all null: a session that predates it (what was held when is not known)
    sel = (regions["pid"] == pid) & (regions["kind"] == kind)
    if library is not None:
        sel &= regions["library"] == library
    sel &= regions["at_exit"].astype(bool) == at_exit
    if not at_exit:
        sel &= regions["t_born"] <= t_exit
    mine = regions[sel & ~regions["preexisting"].astype(bool)]
    if mine.empty:
        return None
    mine = mine.sort_values("t_born")
    born = mine["t_born"].to_numpy(dtype=float)
    total = np.cumsum(mine["size"].to_numpy(dtype=float))
    grid = np.append(np.arange(t_start, t_exit, BIRTH_STEP_S), t_exit)
    idx = np.searchsorted(born, grid, side="right")
    y = np.where(idx > 0, total[np.maximum(idx - 1, 0)], 0.0)
    return grid, y, len(mine)


def stack_frames(reader: TableSource) -> dict[str, list[str]]:
    """The ``bpf_stacks`` table as stack_key → frames (one frame per line in the session)."""
    stacks = reader.table("bpf_stacks")
    if stacks.empty:
        return {}
    return {str(r.stack_key): code_frames([f for f in str(r.frames).split("\n") if f]) for r in stacks.itertuples()}


def _groups(snaps: pd.DataFrame) -> list[tuple[int, str | None, str]]:
    """(pid, library, kind) to judge: anonymous mappings per library; the malloc heap per process, whole
    (one pool: the libraries it records are the callers of malloc sampled at its growth)."""
    out: list[tuple[int, str | None, str]] = []
    for (pid, library, kind), _g in snaps.groupby(["pid", "library", "kind"]):
        if kind == "anon":
            out.append((int(pid), str(library), "anon"))
    for pid in sorted(snaps.loc[snaps["kind"] == "heap", "pid"].unique()):
        out.append((int(pid), None, "heap"))
    return out


def _heap_callers(mine: pd.DataFrame, snaps: pd.DataFrame, pid: int, since: float | None = None) -> tuple[str, list[str]]:
    """The library named for a process's heap growth (the first caller outside the C runtime with the most
    bytes, else the top one) and the evidence of the split between callers. ``since``: the rate is that of
    the growth after a warm-up ending then, so the callers are weighed by what each grew after it (the
    warm-up's arenas are another caller's, whose growth stopped)."""
    after = _grown_since(snaps, pid, since) if since is not None else None
    if after is not None:
        by_lib, how = after, f"after the warm-up (from t={since:.0f} s)"
    elif not mine.empty:
        by_lib, how = mine.groupby("library")["size"].sum().sort_values(ascending=False), "since attach"
    else:
        last = _last_tick(snaps[(snaps["pid"] == pid) & (snaps["kind"] == "heap")])
        by_lib = last.groupby("library")["outstanding_bytes"].sum().sort_values(ascending=False)
        how = "since attach"
    libs = [str(k) for k in by_lib.index]
    foreign = [lib for lib in libs if not LIBC_LIBRARY.match(lib)]
    library = (foreign or libs or ["?"])[0]
    total = float(by_lib.sum()) or 1.0
    split = ", ".join(f"{lib} {v / total:.0%} ({int(v):,} B)" for lib, v in by_lib.head(4).items())
    return library, [f"the heap's growth {how} by the caller of malloc at each growth (brk of the main heap, mprotect "
                     f"of arena heaps, weighted by the bytes it grew): {split}"] if len(libs) > 1 or after is not None else []


def _grown_since(snaps: pd.DataFrame, pid: int, since: float) -> pd.Series | None:
    """library -> the bytes its heap rows grew from the first tick at or after ``since`` to the last (those
    that grew), most first; None when none grew."""
    heap = snaps[(snaps["pid"] == pid) & (snaps["kind"] == "heap")]
    if heap.empty:
        return None
    wide = heap.pivot_table(index="t", columns="library", values="outstanding_bytes", aggfunc="sum").fillna(0.0)
    from_t = wide.index[wide.index >= since]
    if len(from_t) < 2:
        return None
    grew = (wide.loc[from_t[-1]] - wide.loc[from_t[0]]).sort_values(ascending=False)
    grew = grew[grew > 0]
    return grew if not grew.empty else None


def _top_sites(mine: pd.DataFrame, library: str, frames: dict[str, list[str]], n: int = 3) -> list[dict[str, Any]]:
    """The call sites of ``library`` in ``mine`` (ledger regions) holding the most bytes, most first."""
    if mine.empty:
        return []
    mine = mine[mine["library"] == library]
    by_site = mine.groupby("stack_key")["size"].agg(["sum", "count"]).sort_values("sum", ascending=False)
    return [{"stack_key": key, "outstanding_bytes": int(row["sum"]), "regions": int(row["count"]),
             "stack": frames.get(key, [])} for key, row in by_site.head(n).iterrows()]


def _site_line(top: dict[str, Any], library: str, scanned: set[str]) -> str:
    """The evidence line of a library's top call site."""
    if top["stack_key"] in scanned:
        site = next((f for f in top["stack"] if library in f), top["stack_key"])
        return (f"{top['regions']} growth(s), {top['outstanding_bytes']:,} B called from {site}: found by scanning "
                f"the raw user stack at each growth for return addresses (no frame pointers needed); the first "
                f"frame outside libc/ld.so is the caller, of malloc or of the mapping call itself")
    stack = top["stack"]
    return f"{top['regions']} region(s), {top['outstanding_bytes']:,} B from call site {stack[1] if len(stack) > 1 else top['stack_key']}"


def _caller_rates(snaps: pd.DataFrame, pid: int, mine: pd.DataFrame, frames: dict[str, list[str]],
                  scanned: set[str]) -> list[dict[str, Any]]:
    """Each caller's own rate of a process's heap growth (its rows of the ledger), when more than one caller
    grew it: the heap is one pool, judged whole, but a steady caller beside one whose batches come and go is
    told apart by its own series (analysis/retention.py matches it to the growth of what malloc holds)."""
    heap = snaps[(snaps["pid"] == pid) & (snaps["kind"] == "heap")]
    if heap["library"].nunique() < 2:
        return []
    wide = heap.pivot_table(index="t", columns="library", values="outstanding_bytes", aggfunc="sum").fillna(0.0)
    out = []
    for library in wide.columns:
        r = rate(wide.index.to_numpy(dtype=float), wide[library].to_numpy(dtype=float), warmup_s=0.0)
        out.append({"library": str(library), "mb_per_min": r.steady_mb_per_min, "confidence": r.confidence,
                    "outstanding_bytes": int(wide[library].iloc[-1]),
                    "lower_mb_per_min": r.lower_mb_per_min, "sites": _top_sites(mine, str(library), frames)})
        out[-1]["site_line"] = _site_line(out[-1]["sites"][0], str(library), scanned) if out[-1]["sites"] else None
    return out


def native_culprits(reader: TableSource, min_span_s: float = 8.0) -> list[dict[str, Any]]:
    """Growing (pid, library, kind) of the ledger. A process that exited after less than ``min_span_s`` of
    tracing is rated from what exists (its snapshots; with only two, its growth over its life, the birth
    times of what it held at exit saying how steady), and its evidence says so."""
    snaps = reader.table("ledger_snapshots")
    if snaps.empty:
        return []
    exits = reader.table("ledger_exits")
    exit_t = {int(r.pid): float(r.t) for r in exits.itertuples()} if not exits.empty else {}
    counters = reader.table("bpf_counters")
    ticks = np.unique(np.concatenate([snaps["t"].to_numpy(dtype=float),
                                      counters["t"].to_numpy(dtype=float) if not counters.empty else []]))
    regions = reader.table("ledger_regions")
    frames = stack_frames(reader)
    stacks = reader.table("bpf_stacks")
    scanned = set(stacks.loc[stacks["method"] == "stack-scan", "stack_key"].astype(str)) if not stacks.empty else set()
    lost = int(counters.sort_values("t").iloc[-1].get("lost_events", 0)) if not counters.empty else 0
    work = requests_by_pid(reader)  # a leak per request slows with the traffic: no plateau (growth.rate)
    replaced: dict[int, pd.DataFrame] = {}
    out: list[dict[str, Any]] = []
    for pid, group_library, kind in _groups(snaps):
        t, y = _series(snaps, ticks, pid, group_library, kind)
        if not len(t) or y[-1] <= 0:
            continue
        short = pid in exit_t and t[-1] - t[0] < min_span_s
        gone_by = no_release
        if kind == "anon" and group_library is not None and len(t) >= 3:
            if pid not in replaced:
                replaced[pid] = replaced_preexisting(reader, pid)
            gone_by = released_by(replaced[pid], group_library, float(t[-1]))
        net, gone = y - gone_by(t), float(gone_by(t[-1:])[0])
        if len(t) >= 3:
            r = rate(t, net, warmup_s=0.0, work=work.get(pid))
            how = (f"{'mean increment' if r.estimator == 'mean-increment' else 'Theil-Sen'} over {r.n} snapshots, "
                   f"{r.span_s:.0f} s")
            if r.confidence < HELD_SWITCH_CONFIDENCE and pid not in exit_t:
                held = _birth_series(regions, pid, group_library, kind, float(t[0]), float(t[-1]) - HELD_YOUNG_S,
                                     at_exit=False)
                rh = rate(held[0], held[1] - gone_by(held[0]), warmup_s=0.0) if held is not None else None
                # What was born and is still held must also show as a rise of the outstanding total: a pool
                # of long-lived buffers replaced in turn (a ring) holds young ones at the end without growing.
                fifth = max(1, len(y) // 5)
                rose = float(np.median(net[-fifth:]) - np.median(net[:fifth]))
                if (rh is not None and rh.per_s > 0 and rh.confidence > r.confidence
                        and rose >= HELD_MIN_RISE_SHARE * float(held[1][-1])):
                    how = (f"the outstanding bytes swing (confidence {r.confidence:.2f} over {r.n} snapshots: "
                           f"short-lived mappings come and go through this call path), so rated from the "
                           f"{held[2]} region(s) born during the hunt and still held at its end, by birth time "
                           f"(births in its last {HELD_YOUNG_S:.0f} s left out), Theil-Sen over {rh.span_s:.0f} s")
                    r = rh
        elif short and len(t) == 2 and t[1] > t[0]:
            # Two snapshots (attach, exit): the growth over its traced life; the birth times of what it
            # held at exit say whether that growth was steady.
            births = _birth_series(regions, pid, group_library, kind, float(t[0]), float(t[1]))
            conf = theil_sen(births[0], births[1])[1] if births is not None else 0.0
            r = Rate((y[1] - y[0]) / (t[1] - t[0]), conf, 2, float(t[1] - t[0]), rise=float(y[1] - y[0]))
            how = (f"growth between its first snapshot and its exit, {r.span_s:.1f} s; confidence from the birth "
                   "times of what it held then")
        else:
            continue
        if r.per_s <= 0:
            continue
        mine = pd.DataFrame()
        if not regions.empty:
            mine = regions[(regions["pid"] == pid) & (regions["kind"] == kind) & ~regions["preexisting"].astype(bool)]
        callers: list[dict[str, Any]] = []
        if group_library is None:
            since = float(r.shape.t_split) if r.shape is not None and r.shape.kind == "warm-up" else None
            library, split = _heap_callers(mine, snaps, pid, since)
            callers = _caller_rates(snaps, pid, mine, frames, scanned)
            what = f"the malloc heap of pid {pid} (grown since attach)"
        else:
            library, split = group_library, []
            what = f"{library} mappings of pid {pid}"
        stack: list[str] = []
        method = "frame-pointer"
        evidence = [f"eBPF ledger: {int(y[-1]):,} B outstanding in {what} "
                    f"(caller return address at the syscall; raw syscalls included)",
                    f"grew {r.mb_per_min:.2f} MB/min ({how}, confidence {r.confidence:.2f})", *split]
        if short:
            evidence.append(f"short-lived: traced {r.span_s:.1f} s until it exited, less than the {min_span_s:.0f} s "
                            "a steady rate normally needs: a verdict from what exists, with lower confidence than a "
                            "longer hunt's")
        if r.step:
            evidence.append(f"the rise is one step of {r.step_bytes / MB:.1f} MB, not a steady growth")
        if gone:
            evidence.append(f"net of {gone / MB:.1f} MB of pre-existing anonymous memory it unmapped during the hunt "
                            "(mappings replaced, not added, are no growth)")
        stopped = stop_evidence(r)
        shape = shape_evidence(r)
        if stopped:
            evidence.append(stopped)
        elif shape:
            evidence.append(shape)
        top_sites = _top_sites(mine, library, frames)
        site_line = _site_line(top_sites[0], library, scanned) if top_sites else None
        if top_sites and site_line:
            stack = top_sites[0]["stack"]
            method = "stack-scan" if top_sites[0]["stack_key"] in scanned else method
            evidence.append(site_line)
        evidence.append(f"{lost} event(s) lost" if lost else "0 events lost: the ledger is exact")
        out.append({"kind": CULPRIT_KINDS[kind], "library": library, "pid": pid,
                    "mb_per_min": r.steady_mb_per_min, "raw_mb_per_min": r.mb_per_min,
                    "outstanding_bytes": int(y[-1]), "stack": stack, "evidence": evidence,
                    "confidence": r.confidence, "step": r.step, "decelerating": r.decelerating, "sites": top_sites, "short_lived": short,
                    "lower_mb_per_min": r.lower_mb_per_min, "stopping": r.stop is not None and not r.bounded,
                    "stop_evidence": stopped,
                    "stack_method": method, **({"callers": callers, "site_line": site_line} if callers else {})})
    out.sort(key=lambda c: (-c["mb_per_min"], -c["outstanding_bytes"]))
    return out
