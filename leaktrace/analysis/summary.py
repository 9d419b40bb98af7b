"""From a session to the report model (a plain dict: report.json is its serialisation).

Contract: ../shared/DESIGN.md "report.json". Reporters render this dict; nothing here renders.
Works on any subset of tables: watcher only, with or without the eBPF ledger, gdb, pyheap, metrics, and
on a session whose writer was killed (no end time, no final snapshot).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from leaktrace.analysis import load
from leaktrace.analysis.calibration import leak_probability
from leaktrace.analysis.candidates import THRESHOLDS, plateau_evidence, process_info, ucx_settings
from leaktrace.analysis.culprits import find_culprits
from leaktrace.analysis.exits import process_exits
from leaktrace.analysis.first_named import first_named
from leaktrace.analysis.growth import MB
from leaktrace.analysis.growth_tables import class_rate_table, class_rates, process_rates
from leaktrace.analysis.host import add_host_culprit, host_block, host_memory
from leaktrace.analysis.ledger import ledger_summary
from leaktrace.analysis.reasons import facts_of, fastest_line, leak_reason
from leaktrace.analysis.regions import region_chains, shm_segments, top_regions
from leaktrace.analysis.report_types import Report
from leaktrace.analysis.retention import allocator_of
from leaktrace.session import TableSource

REPORT_SCHEMA = "leaktrace.report/1"

__all__ = ["REPORT_SCHEMA", "THRESHOLDS", "build_report", "process_table"]


def process_table(reader: TableSource, info: dict[int, dict[str, Any]] | None = None) -> pd.DataFrame:
    rollup = reader.table("rollup")
    if rollup.empty:
        return pd.DataFrame(columns=["pid", "ppid", "label", "title", "t_first", "t_last"])
    rates = process_rates(rollup)
    info = info if info is not None else process_info(reader)
    rates["ppid"] = [info.get(p, {}).get("ppid", -1) for p in rates["pid"]]
    rates["label"] = [info.get(p, {}).get("label", "other") for p in rates["pid"]]
    rates["title"] = [info.get(p, {}).get("title", "?") for p in rates["pid"]]
    rates["comm"] = [info.get(p, {}).get("comm", "") for p in rates["pid"]]
    exited = reader.meta.get("exited", {}) or {}
    rates["exited_s"] = [exited.get(str(p)) for p in rates["pid"]]
    return rates


def _ledger_block(reader: TableSource, warnings: list[str], exits: dict[int, dict[str, Any]]) -> dict[str, Any]:
    ledger: dict[str, Any] = {"outstanding_bytes": 0, "events": 0, "lost_events": 0, "available": False}
    if not any(t.startswith("ledger") for t in reader.tables()):
        return ledger
    try:
        ledger.update(ledger_summary(reader) or {})
        ledger["available"] = True
    except Exception as e:  # a failing optional analysis must not lose the report
        warnings.append(f"ledger summary failed: {e.__class__.__name__}: {e}")
    for ex in ledger.get("exits", []):
        ex["exit"] = exits.get(ex["pid"])
    return ledger


def _exits(reader: TableSource, warnings: list[str]) -> dict[int, dict[str, Any]]:
    try:
        return process_exits(reader)
    except Exception as e:  # how a process ended is a nicety; the findings stand without it
        warnings.append(f"exit analysis failed: {e.__class__.__name__}: {e}")
        return {}


def _unsampled(info: dict[int, dict[str, Any]], exits: dict[int, dict[str, Any]], listed: set[int],
               inst_of: dict[int, Any]) -> list[dict[str, Any]]:
    """Targets that ended before the watcher sampled them once: listed all the same, with how they ended."""
    rows = []
    for pid in sorted(set(exits) - listed):
        pi = info.get(pid, {})
        rows.append({"pid": pid, "ppid": int(pi.get("ppid", -1)), "label": str(pi.get("label", "other")),
                     "title": str(pi.get("title", "?")), "comm": str(pi.get("comm", "")),
                     "rss_mb_per_min": 0.0, "anon_mb_per_min": 0.0, "uss_mb_per_min": 0.0, "pss_mb_per_min": 0.0,
                     "rss_confidence": 0.0, "anon_confidence": 0.0, "rss_step": False, "rss_first_mb": 0.0,
                     "rss_last_mb": 0.0, "samples": 0, "exited_s": exits[pid].get("t"), "exit": exits[pid], "leaking": False,
                     "instance": inst_of.get(pid)})
    return rows


def _load_blocks(reader: TableSource, warnings: list[str]) -> dict[str, Any]:
    """``instances`` and ``load`` from the vLLM/metrics analysis, when it exists and has data."""
    out: dict[str, Any] = {}
    for name, fn in (("instances", load.instances), ("load", load.load)):
        try:
            val = fn(reader)
        except Exception as e:
            warnings.append(f"{name} analysis failed: {e.__class__.__name__}: {e}")
            continue
        if val:
            out[name] = val
    return out


def _instance_of(instances: Any) -> dict[int, Any]:
    """pid -> instance id, from the ``instances`` block (list of {"instance"/"id", "pids"/"processes"})."""
    out: dict[int, Any] = {}
    if not isinstance(instances, list):
        return out
    for inst in instances:
        if not isinstance(inst, dict):
            continue
        iid = inst.get("instance", inst.get("id"))
        pids = inst.get("pids") or [p.get("pid") if isinstance(p, dict) else p for p in inst.get("processes", [])]
        for p in pids or []:
            if p is not None:
                out[int(p)] = iid
    return out


def _plateaus(procs: pd.DataFrame, skip: set[int] | None = None) -> str:
    """"; pid P: growth decelerating: …" for each process whose growth at the leak rate is a plateau forming
    (but those in ``skip``: named leaking by another measurement)."""
    out = []
    for _, p in procs.iterrows():
        if skip and int(p["pid"]) in skip:
            continue
        ev = plateau_evidence(p)
        if ev:
            out.append(f"; pid {int(p['pid'])}: {ev}")
    return "".join(out)


def _unwritten(leaks: list[dict[str, Any]]) -> str:
    """"; pid P: LIB maps X MB/min it never writes …" for each culprit whose address space grows at the leak
    rate while what of it is resident does not."""
    th = THRESHOLDS
    return "".join(f"; pid {c['pid']}: {c.get('library') or c['kind']} maps {c['mapped_mb_per_min']:.2f} MB/min "
                   f"but only {c['mb_per_min']:.2f} MB/min of it is resident (mapped, not written): the address "
                   "space leaks, RAM follows only when the pages are written"
                   for c in leaks if c.get("mapped_mb_per_min", 0.0) >= th["leak_mb_per_min"] > c["mb_per_min"])


def _verdict(procs: pd.DataFrame, findings: Any, span: float) -> tuple[str, str]:
    th = THRESHOLDS
    # Free memory an allocator keeps is never a leak on its own: said, beside whatever else the hunt found.
    kept = [c for c in findings.culprits if c["kind"] == "allocator-retention"]
    leaks = [c for c in findings.culprits if c["kind"] != "allocator-retention"]
    retained = "".join(f"; pid {c['pid']}: its heap grows {c['mb_per_min']:.2f} MB/min of free memory malloc keeps "
                       f"(in use {c.get('live_mb_per_min', 0.0):+.2f} MB/min): allocator retention, not a leak"
                       for c in kept)
    leaking = set(findings.leaking_pids) - {c["pid"] for c in kept}
    if leaks and (leaking or any(c["source"] != "watcher" for c in leaks)):
        return "leak", (leak_reason(procs, leaks, th) + _plateaus(procs, {c["pid"] for c in findings.culprits})
                        + retained + _unwritten(leaks))
    untouched = "".join(f"; pid {pid}: {line}" for pid, line in sorted((getattr(findings, "in_use_flat", {}) or {}).items()))
    retained += untouched
    if kept:
        return "no-leak", "nothing in use grows at the leak rate" + retained
    plateaus = _plateaus(procs)
    stopping = getattr(findings, "stopping", {}) or {}
    if stopping and findings.doubtful_pids:
        return "inconclusive", (f"pid(s) {sorted(findings.doubtful_pids)} grew ≥ {th['leak_mb_per_min']} MB/min but the "
                                "growth stopped shortly before the end of the hunt: hunt longer to tell a plateau from "
                                "a pause" + "".join(f"; pid {p}: {line}" for p, line in sorted(stopping.items()))
                                + facts_of(procs, findings.doubtful_pids) + plateaus)
    if findings.doubtful_pids and plateaus:
        return "inconclusive", (f"pid(s) {sorted(findings.doubtful_pids)} grow ≥ {th['leak_mb_per_min']} MB/min "
                                "but the growth is slowing down or stopped late in the hunt: hunt longer to tell a plateau from a leak"
                                + facts_of(procs, findings.doubtful_pids) + plateaus)
    if findings.doubtful_pids:
        return "inconclusive", (f"pid(s) {sorted(findings.doubtful_pids)} grow ≥ {th['leak_mb_per_min']} MB/min "
                                f"but with confidence below {th['min_confidence']} or over too short a span: "
                                "hunt longer" + facts_of(procs, findings.doubtful_pids))
    if span >= th["no_leak_span_s"]:
        return "no-leak", (f"no process grows ≥ {th['leak_mb_per_min']} MB/min steadily over {span:.0f} s "
                           "of observation" + fastest_line(procs) + plateaus + untouched)
    return "inconclusive", (f"only {span:.0f} s observed; a no-leak verdict needs ≥ {th['no_leak_span_s']:.0f} s")


def _observed_s(procs: pd.DataFrame, leaking: set[int], span: float) -> float:
    """Seconds the verdict's evidence covers: the longest observed of the processes called leaking, else the
    hunt's span."""
    mine = procs[procs["pid"].isin(leaking)] if leaking and not procs.empty else procs.iloc[0:0]
    return float((mine["t_last"] - mine["t_first"]).max()) if not mine.empty else span


def build_report(reader: TableSource, with_first_named: bool = True) -> Report:
    meta = reader.meta
    warnings: list[str] = list(meta.get("warnings", []) or [])
    info = process_info(reader)
    procs = process_table(reader, info)
    cu = reader.table("class_usage")
    ctab = class_rate_table(cu)
    span = float(procs["t_last"].max() - procs["t_first"].min()) if not procs.empty else 0.0

    chains = region_chains(reader.table("region_events"))
    regions = top_regions(chains, span)
    shm = shm_segments(reader.table("regions"), chains)

    findings = find_culprits(reader, procs, info=info, shm=shm, warnings=warnings)
    verdict, why = _verdict(procs, findings, span)
    host = host_memory(reader, procs)  # memory the host loses that no hunted process holds
    verdict, why = add_host_culprit(findings, host, reader, verdict, why)
    # No leak: no culprit, but free memory an allocator keeps, named so it is not mistaken for one.
    culprits = findings.culprits if verdict == "leak" else [
        c for c in findings.culprits if c["kind"] == "allocator-retention"]
    if with_first_named and culprits:
        try:
            first_named(reader, culprits)
        except Exception as e:  # timing is a nicety; the findings stand without it
            warnings.append(f"first_named_s not computed: {e.__class__.__name__}: {e}")

    short = sorted({c["pid"] for c in culprits if any(str(e).startswith("short-lived") for e in c["evidence"])})
    if short:
        why += (f"; pid(s) {short} exited after less than {THRESHOLDS['min_span_s']:.0f} s of observation: "
                "judged on what exists, with lower confidence")
    exits = _exits(reader, warnings)
    missed = sorted(p for p, ex in exits.items() if ex.get("before_ebpf"))
    if missed and verdict != "leak":
        why += "".join(f"; pid {p} {exits[p]['note']}" for p in missed)

    extra = _load_blocks(reader, warnings)
    inst_of = _instance_of(extra.get("instances"))
    role_of = {i.get("instance"): i.get("role") for i in extra.get("instances") or [] if isinstance(i, dict)}
    for c in culprits:
        c.setdefault("instance", inst_of.get(c["pid"]))
        if role_of.get(c["instance"]):
            c["role"] = role_of[c["instance"]]  # the vLLM instance's P/D role (prefill, decode, both)
    if extra.get("load"):
        load.leak_per_load(extra["load"], culprits)

    processes = []
    allocators = allocator_of(reader)
    for _, p in procs.iterrows():
        pid = int(p["pid"])
        row: dict[str, Any] = {
            "pid": pid, "ppid": int(p["ppid"]), "label": str(p["label"]), "title": str(p["title"]),
            "comm": str(p.get("comm", "")),
            "rss_mb_per_min": round(float(p["rss_mb_per_min"]), 4),
            "anon_mb_per_min": round(float(p["anon_mb_per_min"]), 4),
            "uss_mb_per_min": round(float(p["uss_mb_per_min"]), 4),
            "pss_mb_per_min": round(float(p["pss_mb_per_min"]), 4),
            "rss_confidence": round(float(p["rss_confidence"]), 3),
            "anon_confidence": round(float(p["anon_confidence"]), 3),
            "rss_step": bool(p["rss_step"]),
            "rss_first_mb": round(float(p["rss_first_mb"]), 2), "rss_last_mb": round(float(p["rss_last_mb"]), 2),
            "samples": int(p["samples"]),
            "exited_s": p["exited_s"] if p["exited_s"] is not None and not pd.isna(p["exited_s"]) else None,
            "exit": exits.get(pid),
            "leaking": pid in findings.leaking_pids,
            "instance": inst_of.get(pid),
        }
        if p.get("rss_shape") in ("decelerating", "warm-up"):
            row["rss_shape"] = str(p["rss_shape"])  # steady or too short to tell: not stated
        mine = ctab[ctab["pid"] == pid]
        if not mine.empty:
            row["growth_by_class"] = {str(r.cls): round(float(r.mb_per_min), 4) for r in mine.itertuples()}
        if pid in findings.pyheap:
            row["python"] = findings.pyheap[pid]
        if pid in allocators:
            row["allocator"] = allocators[pid]  # who serves malloc: glibc (its books read) or one in its place
        ucx = ucx_settings(reader, pid)
        if ucx is not None:
            row["ucx"] = ucx  # effective UCX settings: compare tells from them what a remedy changed
        processes.append(row)
    processes += _unsampled(info, exits, {r["pid"] for r in processes}, inst_of)
    processes.sort(key=lambda r: -r["rss_mb_per_min"])

    report: Report = {
        "schema": REPORT_SCHEMA,
        "verdict": verdict,
        "verdict_reason": why,
        "confidence": leak_probability(verdict == "leak", _observed_s(procs, findings.leaking_pids, span)),
        "duration_s": round(float(meta.get("duration_s") or span), 3),
        "attach_s": meta.get("attach_s"),
        "stop_reason": meta.get("stop_reason", "unknown (session not finalized: the hunt was killed)"),
        "session_complete": reader.complete,
        "session_id": meta.get("id"),
        "target": meta.get("target", {}),
        "host": {**meta.get("host", {}), **host_block(host)},
        "probes": meta.get("probes", []),
        "thresholds": THRESHOLDS,
        "processes": processes,
        "growth_by_class": class_rates(cu, table=ctab),
        "culprits": culprits,
        "ledger": _ledger_block(reader, warnings, exits),
        "regions": regions,
        "total_rss_mb": round(float(procs["rss_last_mb"].sum()), 2) if not procs.empty else 0.0,
        "warnings": warnings + [f"skipped unreadable part {p}" for p in reader.skipped_parts],
    }
    if not shm.empty:
        report["shm_segments"] = [{"pid": int(r.pid), "path": r.path, "mb": round(r.rss / MB, 3), "new": bool(r.new)}
                                  for r in shm.itertuples()][:50]
    if "demo" in meta:
        report["demo"] = meta["demo"]
    if meta.get("tick_costs"):
        report["tick_costs"] = meta["tick_costs"]  # what each probe's ticks cost, how late ticks ran
    if meta.get("probe_attach_s"):
        report["probe_attach_s"] = meta["probe_attach_s"]  # what each probe's start took
    report.update(extra)
    return report
