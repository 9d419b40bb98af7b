"""Merge node reports into one report (schema leaktrace.report/1 plus ``nodes``); no Ray needed."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from leaktrace.atomic import atomic_write_text
from leaktrace.cluster.markdown import render_markdown
from leaktrace.cluster.request import CLUSTER_META, CLUSTER_SCHEMA
from leaktrace.errors import SessionError


def read_cluster_meta(path: Path) -> dict[str, Any]:
    meta_path = Path(path) / CLUSTER_META
    if not Path(path).is_dir():
        raise SessionError(f"no cluster session at {path}")
    try:
        meta = json.loads(meta_path.read_text())
    except FileNotFoundError as e:
        raise SessionError(f"{path} has no {CLUSTER_META}: not a cluster session",
                           "point at the --out directory of `leaktrace cluster hunt`") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SessionError(f"{meta_path} is corrupt ({e.__class__.__name__})") from e
    if not isinstance(meta, dict) or meta.get("schema") != CLUSTER_SCHEMA:
        raise SessionError(f"{meta_path} is not a {CLUSTER_SCHEMA} session")
    return meta


def _node_report(base: Path, entry: dict[str, Any], rerender: bool) -> tuple[dict[str, Any] | None, str | None]:
    """The node's report: re-rendered from its session (``cluster report``), or the one the node wrote."""
    if not entry.get("session"):
        return None, None
    d = Path(entry["session"])
    d = d if d.is_absolute() else base / d
    try:
        if rerender:
            from leaktrace.report import render_session

            return render_session(d), None
        return json.loads((d / "report.json").read_text()), None
    except (SessionError, OSError, json.JSONDecodeError) as e:
        return None, f"session {entry['session']} unreadable: {e}"


def render_cluster(path: str | os.PathLike[str], rerender: bool = False,
                   formats: tuple[str, ...] | list[str] = ("json", "md")) -> dict[str, Any]:
    base = Path(path)
    meta = read_cluster_meta(base)
    node_reports = []
    for entry in meta["nodes"]:
        rep, problem = _node_report(base, entry, rerender)
        entry = dict(entry)
        if problem and entry["status"] == "ok":
            entry["status"], entry["reason"] = "failed", problem
        node_reports.append((entry, rep))
    report = merge_reports(meta, node_reports)
    from leaktrace.report import json_report

    if "json" in formats:
        json_report.write(report, base)
    if "md" in formats:
        atomic_write_text(base / "report.md", render_markdown(report))
    return report


def _tag(item: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    return {**item, "node_id": entry["node_id"], "hostname": entry["hostname"]}


def _culprit_key(c: dict[str, Any]) -> str:
    # Same kind and library on several nodes is the same bug; without a library, the same kind in the
    # same kind of process (label) is the best available match.
    return f"{c.get('kind')}|{c.get('library') or 'label:' + str(c.get('process_label') or '?')}"


def _with_contract_fields(c: dict[str, Any]) -> dict[str, Any]:
    """A node's culprit with the fields a node of an earlier leaktrace does not write: no Python frames, and
    its one figure named both mapped and resident."""
    return {"python_stack": [], "outstanding_resident_bytes": int(c.get("outstanding_bytes") or 0),
            "mapped_mb_per_min": float(c.get("mb_per_min") or 0.0), **c}


def merge_reports(meta: dict[str, Any], node_reports: list[tuple[dict[str, Any], dict[str, Any] | None]]
                  ) -> dict[str, Any]:
    nodes_out, processes, culprits, instances, warnings = [], [], [], [], []
    growth: dict[str, float] = {}
    ledger = {"outstanding_bytes": 0, "events": 0, "lost_events": 0, "available": False}
    durations, attach = [], []
    for entry, rep in node_reports:
        ok = entry["status"] == "ok" and rep is not None
        # No process to hunt there (no vLLM server, nothing matched): an answer, not a failure.
        idle = bool(entry.get("no_targets")) and rep is None and entry["status"] in ("ok", "failed")
        node = {"node_id": entry["node_id"], "hostname": entry["hostname"], "ip": entry.get("ip"),
                "status": "ok" if ok or idle else "failed",
                "reason": entry.get("reason") if not ok else None,
                "verdict": rep.get("verdict") if ok else None,
                "confidence": rep.get("confidence") if ok else None,
                # a node running an older leaktrace wrote no python_stack: none known there
                "culprits": [_with_contract_fields(_tag(c, entry)) for c in rep.get("culprits", [])] if ok else [],
                "no_targets": idle, "notes": list(entry.get("notes") or []), "leaktrace": entry.get("leaktrace"),
                "session": entry.get("session"), "targets": entry.get("targets", []),
                "duration_s": rep.get("duration_s") if rep else None,
                "stop_reason": rep.get("stop_reason") if rep else None}
        if not ok and node["reason"] is None:
            node["reason"] = "no report came back"
        nodes_out.append(node)
        if not ok:
            continue
        processes += [_tag(p, entry) for p in rep.get("processes", [])]
        culprits += node["culprits"]
        for inst in rep.get("instances", []) or []:
            instances.append(_tag(inst, entry))
        for cls, v in (rep.get("growth_by_class") or {}).items():
            growth[cls] = round(growth.get(cls, 0.0) + float(v or 0.0), 4)
        led = rep.get("ledger") or {}
        for k in ("outstanding_bytes", "events", "lost_events"):
            ledger[k] += int(led.get(k) or 0)
        ledger["available"] = ledger["available"] or bool(led.get("available"))
        warnings += [f"{entry['hostname']}: {w}" for w in [*node["notes"], *rep.get("warnings", [])]]
        if rep.get("duration_s") is not None:
            durations.append(float(rep["duration_s"]))
        if rep.get("attach_s") is not None:
            attach.append(float(rep["attach_s"]))
    culprits.sort(key=lambda c: (-(c.get("mb_per_min") or 0.0), -(c.get("outstanding_bytes") or 0)))

    verdicts = [n["verdict"] for n in nodes_out if n["status"] == "ok" and not n["no_targets"]]
    # A node with nothing to hunt (no vLLM there, no match) does not make a clean cluster doubtful; a node
    # whose hunt failed does.
    hunted = [n for n in nodes_out if not n["no_targets"]]
    if "leak" in verdicts:
        verdict = "leak"
    elif verdicts and len(verdicts) == len(hunted) and all(v == "no-leak" for v in verdicts):
        verdict = "no-leak"
    else:
        verdict = "inconclusive"
    failed = [n for n in nodes_out if n["status"] == "failed"]
    # the most likely leak among the nodes whose verdict is the cluster's (a node's growth is a leak at least
    # that often); none when no node's report carried one
    sure = [float(n["confidence"]) for n in nodes_out if n["verdict"] == verdict and n.get("confidence") is not None]
    return {
        "schema": "leaktrace.report/1",
        "kind": "cluster",
        "verdict": verdict,
        **({"confidence": max(sure)} if sure else {}),
        "duration_s": round(max(durations), 3) if durations else 0.0,
        "attach_s": round(max(attach), 3) if attach else None,
        "stop_reason": (f"{meta['stop_reason']}; " if meta.get("stop_reason", "completed") != "completed" else "")
        + f"cluster: {len(hunted) - len(failed)} node(s) ok, {len(failed)} failed"
        + (f", {len(nodes_out) - len(hunted)} with nothing to hunt" if len(nodes_out) > len(hunted) else ""),
        "address": meta.get("address"),
        "targets": meta.get("targets"),
        "processes": processes,
        "growth_by_class": growth,
        "culprits": culprits,
        "ledger": ledger,
        "instances": instances,
        "roles": _roles(instances, processes),
        "recurring_culprits": _recurring(culprits),
        "nodes": nodes_out,
        "warnings": warnings,
    }


def _recurring(culprits: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for c in culprits:
        groups.setdefault(_culprit_key(c), []).append(c)
    out = []
    for cs in groups.values():
        hosts = sorted({c["hostname"] for c in cs})
        if len(hosts) < 2:
            continue
        out.append({"kind": cs[0].get("kind"), "library": cs[0].get("library"),
                    "process_label": cs[0].get("process_label"), "nodes": hosts,
                    "mb_per_min_total": round(sum(c.get("mb_per_min") or 0.0 for c in cs), 4),
                    "occurrences": len(cs)})
    return sorted(out, key=lambda r: (-len(r["nodes"]), -r["mb_per_min_total"]))


def _instance_pids(inst: dict[str, Any]) -> list[int]:
    pids = inst.get("pids")
    if pids is None:
        pids = [p.get("pid") if isinstance(p, dict) else p for p in inst.get("processes", []) or []]
    return [int(p) for p in pids if p is not None]


def _roles(instances: list[dict[str, Any]], processes: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """vLLM instances grouped by role (prefill, decode, both, unknown), each with its growth summed over
    its processes, so the two sides of a P/D deployment read side by side."""
    by_node_pid = {(p["node_id"], p["pid"]): p for p in processes}
    roles: dict[str, list[dict[str, Any]]] = {}
    for inst in instances:
        procs = [by_node_pid[(inst["node_id"], pid)] for pid in _instance_pids(inst)
                 if (inst["node_id"], pid) in by_node_pid]
        roles.setdefault(str(inst.get("role") or "unknown"), []).append({
            "node_id": inst["node_id"], "hostname": inst["hostname"], "instance": inst.get("instance"),
            "port": inst.get("port"), "pids": _instance_pids(inst),
            "rss_mb_per_min": round(sum(p.get("rss_mb_per_min") or 0.0 for p in procs), 4),
            "anon_mb_per_min": round(sum(p.get("anon_mb_per_min") or 0.0 for p in procs), 4),
            "uss_mb_per_min": round(sum(p.get("uss_mb_per_min") or 0.0 for p in procs), 4),
        })
    order = {"prefill": 0, "decode": 1, "both": 2}
    return dict(sorted(roles.items(), key=lambda kv: order.get(kv[0], 9)))


