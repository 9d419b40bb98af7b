"""From a session to the report model (a plain dict: report.json is its serialisation).

Contract: ../shared/DESIGN.md "report.json". Reporters render this dict; nothing here renders.
"""

from __future__ import annotations

import importlib
from typing import Any

import pandas as pd

from leaktrace.analysis.growth import MB, class_rates, process_rates
from leaktrace.session import SessionReader

REPORT_SCHEMA = "leaktrace.report/1"

# Verdict thresholds (stated in the report so a reader can judge the verdict).
THRESHOLDS = {
    "leak_mb_per_min": 1.0,       # a process growing at least this fast (RSS or anonymous) ...
    "min_confidence": 0.75,       # ... with this fraction of pairwise slopes agreeing ...
    "min_span_s": 8.0,            # ... over at least this many seconds of samples
    "no_leak_span_s": 15.0,       # a clean verdict needs at least this much observation
}


def _optional(module: str, func: str):
    try:
        return getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError):
        return None


def process_table(reader: SessionReader) -> pd.DataFrame:
    rollup = reader.table("rollup")
    procs = reader.table("processes")
    if rollup.empty:
        return pd.DataFrame(columns=["pid", "ppid", "label"])
    rates = process_rates(rollup)
    seen = procs[procs["event"] == "seen"].drop_duplicates("pid", keep="first") if not procs.empty else procs
    labels = reader.meta.get("labels", {})
    info = {int(r.pid): r for r in seen.itertuples()} if not seen.empty else {}
    rates["ppid"] = [int(info[p].ppid) if p in info else -1 for p in rates["pid"]]
    rates["label"] = [labels.get(str(p)) or (info[p].label if p in info else "?") for p in rates["pid"]]
    rates["comm"] = [info[p].comm if p in info else "" for p in rates["pid"]]
    exited = reader.meta.get("exited", {})
    rates["exited_s"] = [exited.get(str(p)) for p in rates["pid"]]
    return rates


def _is_leaking(row: Any) -> bool:
    th = THRESHOLDS
    span = row["t_last"] - row["t_first"]
    for col in ("rss", "anon"):
        if row[f"{col}_mb_per_min"] >= th["leak_mb_per_min"] and row[f"{col}_confidence"] >= th["min_confidence"] \
                and span >= th["min_span_s"]:
            return True
    return False


def watcher_culprits(reader: SessionReader, procs: pd.DataFrame) -> list[dict[str, Any]]:
    """Culprits from /proc alone (no library attribution): the growing memory class of each leaking
    process. Library-level culprits come from the eBPF ledger and gdb when those probes ran."""
    cu = reader.table("class_usage")
    out: list[dict[str, Any]] = []
    kind_of = {"anon": "native-mmap", "arena": "malloc-heap", "heap": "malloc-heap", "shm": "shm", "file": "file"}
    for _, p in procs.iterrows():
        if not _is_leaking(p):
            continue
        rates = class_rates(cu[cu["pid"] == p["pid"]]) if not cu.empty else {}
        top = max(rates.items(), key=lambda kv: kv[1]) if rates else ("anon", p["anon_mb_per_min"])
        cls, mbm = top
        out.append({
            "kind": kind_of.get(cls, "other"), "library": None, "pid": int(p["pid"]),
            "process_label": p["label"], "mb_per_min": round(float(max(mbm, p["rss_mb_per_min"])), 4),
            "outstanding_bytes": 0, "stack": [],
            "evidence": [f"RSS {p['rss_mb_per_min']:.2f} MB/min (confidence {p['rss_confidence']:.2f}), "
                         f"anonymous {p['anon_mb_per_min']:.2f} MB/min; class '{cls}' grows {mbm:.2f} MB/min"],
            "remedy": "run with the eBPF probe (root) to name the library and call path",
            "source": "watcher",
        })
    return out


def build_report(reader: SessionReader) -> dict[str, Any]:
    meta = reader.meta
    procs = process_table(reader)
    cu = reader.table("class_usage")
    processes = []
    for _, p in procs.iterrows():
        processes.append({
            "pid": int(p["pid"]), "ppid": int(p["ppid"]), "label": str(p["label"]),
            "rss_mb_per_min": round(float(p["rss_mb_per_min"]), 4),
            "anon_mb_per_min": round(float(p["anon_mb_per_min"]), 4),
            "uss_mb_per_min": round(float(p["uss_mb_per_min"]), 4),
            "rss_confidence": round(float(p["rss_confidence"]), 3),
            "rss_first_mb": round(float(p["rss_first_mb"]), 2), "rss_last_mb": round(float(p["rss_last_mb"]), 2),
            "samples": int(p["samples"]),
            "exited_s": p["exited_s"] if p["exited_s"] is not None and not pd.isna(p["exited_s"]) else None,
        })
    growth_by_class = class_rates(cu)

    culprits: list[dict[str, Any]] = []
    ledger: dict[str, Any] = {"outstanding_bytes": 0, "events": 0, "lost_events": 0, "available": False}
    ledger_summary = _optional("leaktrace.analysis.ledger", "ledger_summary")
    native = _optional("leaktrace.analysis.ledger", "native_culprits")
    if ledger_summary is not None and "ledger_snapshots" in reader.tables():
        ledger = {**ledger_summary(reader), "available": True}
        if native is not None:
            culprits.extend(native(reader))
    leaking_pids = {int(p["pid"]) for _, p in procs.iterrows() if _is_leaking(p)}
    named = {c["pid"] for c in culprits}
    culprits.extend(c for c in watcher_culprits(reader, procs) if c["pid"] not in named)

    span = float(procs["t_last"].max() - procs["t_first"].min()) if not procs.empty else 0.0
    if leaking_pids or any(c.get("kind") == "native-mmap" and c.get("library") for c in culprits):
        verdict = "leak"
    elif span >= THRESHOLDS["no_leak_span_s"]:
        verdict = "no-leak"
    else:
        verdict = "inconclusive"
    if verdict == "no-leak":
        culprits = []
    culprits.sort(key=lambda c: (-(c.get("mb_per_min") or 0.0), -(c.get("outstanding_bytes") or 0)))

    report: dict[str, Any] = {
        "schema": REPORT_SCHEMA,
        "verdict": verdict,
        "duration_s": round(float(meta.get("duration_s") or span), 3),
        "attach_s": meta.get("attach_s"),
        "stop_reason": meta.get("stop_reason", "unknown (session not finalized: the hunt was killed)"),
        "session_complete": reader.complete,
        "target": meta.get("target", {}),
        "host": meta.get("host", {}),
        "thresholds": THRESHOLDS,
        "processes": processes,
        "growth_by_class": growth_by_class,
        "culprits": culprits,
        "ledger": ledger,
        "warnings": list(meta.get("warnings", [])) + [f"skipped unreadable part {p}" for p in reader.skipped_parts],
        "total_rss_mb": round(float(procs["rss_last_mb"].sum()), 2) if not procs.empty else 0.0,
        "mb": MB,
    }
    report.pop("mb")
    return report
