"""Before/after: two hunts of the same service (before and after a remedy, or two versions) side by side,
and whether the remedy worked.

The unit of comparison is what survives a restart: not pids, but *culprits by library* (hashed wheel names
normalised: ``libucm-1a2b3c4d.so.0.0.0`` and ``libucm.so.0`` are one library), and *processes by role*
(the vLLM instance's P/D role and the process label, e.g. ``decode/worker``).

What changed between the hunts: a culprit whose rule names the settings its remedy changes carries their
effective values (``remedy_settings``), and each process its effective UCX state (``processes[].ucx``).
A before culprit whose settings differ in the after hunt's processes of the same role and label was
*addressed* by the change (``remedy_applied``: each setting, before → after); the verdict then judges the
change by those culprits, and lists the others that grow in both hunts apart, as not what it addressed
(a worker's own oneDNN JIT growth beside the UCX remedy).

Verdict (``compare.json``):
  ``fixed``         the before hunt leaked and the after hunt does not; or every culprit the change
                    addressed is gone; or (no addressed culprit known) every before culprit is gone and
                    whatever is new grows slower, all together, than they did (it is listed in the reason:
                    a worker's own warm-up beside a remedied leak is not the remedy's failure)
  ``regressed``     the after hunt leaks where the before did not, or a remaining culprit grows
                    ≥ REGRESS_FACTOR faster, or new culprits grow, all together, at least as fast as every
                    culprit of the before hunt did
  ``not-fixed``     a culprit the change addressed (or, none known, any before culprit) remains at
                    ≥ REMAIN_SHARE of its rate
  ``inconclusive``  either hunt is inconclusive, or nothing leaked before (an inconclusive after hunt
                    aside when the change addressed culprits of a leaking before hunt: those decide, and
                    the after hunt's doubt is stated in the reason)
``confidence`` (0–1) is the weaker hunt's support: its observed span over CONFIDENT_SPAN_S (capped at 1)
times the sign agreement of its rate (the Theil–Sen confidence of the process that leaks, or of the
fastest-growing one when none leaks).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from leaktrace.analysis.report_types import Culprit, Report
from leaktrace.errors import SessionError

COMPARE_SCHEMA = "leaktrace.compare/1"
# A remaining culprit counts as fixed below this share of its before rate (noise, warm-up) ...
REMAIN_SHARE = 0.25
# ... and as regressed at this factor above it.
REGRESS_FACTOR = 1.5
# A culprit slower than this (MB/min) is not a finding on either side.
MIN_MB_PER_MIN = 1.0
CONFIDENT_SPAN_S = 60.0

_HASH = re.compile(r"-[0-9a-f]{8}(?=\.so)")
_SO_VERSION = re.compile(r"(\.so)(\.[0-9]+)*$")


def normalise_library(name: str | None) -> str | None:
    """``libucm-1a2b3c4d.so.0.0.0`` → ``libucm.so``: a wheel's hash and the soname version dropped."""
    if not name:
        return None
    base = name.rsplit("/", 1)[-1]
    return _SO_VERSION.sub(r"\1", _HASH.sub("", base))


def load_report(path: str | Path) -> tuple[Report, Path]:
    """The report of a hunt directory: its report.json, or one built from its session when it has none."""
    d = Path(path)
    if not d.is_dir():
        raise SessionError(f"{d} is not a directory")
    rj = d / "report.json"
    if rj.is_file():
        try:
            report = json.loads(rj.read_text())
        except (OSError, ValueError) as e:
            raise SessionError(f"{rj} is not readable JSON: {e}") from e
        if not isinstance(report, dict) or "verdict" not in report or "culprits" not in report:
            raise SessionError(f"{rj} is not a leaktrace report")
        return report, d  # type: ignore[return-value]
    from leaktrace.analysis.summary import build_report
    from leaktrace.session import SessionReader

    return build_report(SessionReader(d)), d


def _roles(report: Report) -> dict[int, str]:
    """pid → the P/D role of its vLLM instance (``-`` outside one)."""
    out: dict[int, str] = {}
    for inst in report.get("instances") or []:
        for pid in inst.get("pids") or [p.get("pid") for p in inst.get("processes") or []]:
            if pid is not None:
                out[int(pid)] = str(inst.get("role") or "unknown")
    return out


def _culprit_key(c: Culprit, roles: dict[int, str]) -> tuple[str, str, str]:
    lib = normalise_library(c.get("library"))
    who = lib or f"({c.get('process_label') or 'process'})"
    return (roles.get(int(c["pid"]), "-"), str(c["kind"]), who)


def _culprits_by_key(report: Report) -> dict[tuple[str, str, str], list[Culprit]]:
    roles = _roles(report)
    out: dict[tuple[str, str, str], list[Culprit]] = {}
    for c in report.get("culprits") or []:
        if c.get("kind") == "allocator-retention":
            continue  # free memory an allocator keeps: never a leak to be fixed or to regress
        if float(c.get("mb_per_min") or 0.0) >= MIN_MB_PER_MIN:
            out.setdefault(_culprit_key(c, roles), []).append(c)
    return out


def _settings_by_key(report: Report) -> dict[str, dict[str, set[str]]]:
    """role/label → each UCX setting → the effective values in the processes of that key."""
    roles = _roles(report)
    out: dict[str, dict[str, set[str]]] = {}
    for p in report.get("processes") or []:
        for k, v in ((p.get("ucx") or {}).get("settings") or {}).items():
            out.setdefault(_process_key(p, roles), {}).setdefault(k, set()).add(str(v))
    return out


def _remedy_applied(culprits: list[Culprit], before: Report, after: Report) -> dict[str, dict[str, str]] | None:
    """The remedy settings of ``culprits`` (before) whose effective value differs in the after hunt's
    processes of the same role and label: {setting: {"before", "after"}}; None when none is known to differ."""
    b_roles, a_set = _roles(before), _settings_by_key(after)
    changed: dict[str, dict[str, str]] = {}
    for c in culprits:
        key = _process_key({"pid": c["pid"], "label": c.get("process_label")}, b_roles)
        for k, v in (c.get("remedy_settings") or {}).items():
            after_values = a_set.get(key, {}).get(k)
            if v is not None and after_values and str(v) not in after_values:
                changed[k] = {"before": str(v), "after": ", ".join(sorted(after_values))}
    return changed or None


def _process_key(p: dict[str, Any], roles: dict[int, str]) -> str:
    return f"{roles.get(int(p['pid']), '-')}/{p.get('label') or 'other'}"


def _processes_by_role(report: Report) -> dict[str, dict[str, float]]:
    roles = _roles(report)
    out: dict[str, dict[str, float]] = {}
    for p in report.get("processes") or []:
        row = out.setdefault(_process_key(p, roles), {"count": 0, "rss_mb_per_min": 0.0, "anon_mb_per_min": 0.0})
        row["count"] += 1
        row["rss_mb_per_min"] += float(p.get("rss_mb_per_min") or 0.0)
        row["anon_mb_per_min"] += float(p.get("anon_mb_per_min") or 0.0)
    return out


def support(report: Report) -> float:
    """How much a hunt's verdict can be trusted, 0–1 (see the module docstring)."""
    span = float(report.get("duration_s") or 0.0)
    procs = report.get("processes") or []
    leaking = [p for p in procs if p.get("leaking")]
    pick = max(leaking or procs, key=lambda p: float(p.get("rss_mb_per_min") or 0.0), default=None)
    agree = float(pick.get("rss_confidence", 1.0)) if pick is not None else 0.0
    return round(min(1.0, span / CONFIDENT_SPAN_S) * agree, 3)


def _side(report: Report, path: Path) -> dict[str, Any]:
    culprits = report.get("culprits") or []
    return {"path": str(path), "verdict": report["verdict"], "duration_s": report.get("duration_s"),
            "session_id": report.get("session_id"), "support": support(report),
            "total_rss_mb_per_min": round(sum(float(p.get("rss_mb_per_min") or 0.0)
                                              for p in report.get("processes") or []), 4),
            "culprits": len(culprits),
            "top_culprit": ({k: culprits[0].get(k) for k in ("kind", "library", "mb_per_min", "pid")}
                            if culprits else None)}


def compare_reports(before: Report, after: Report, before_path: Path, after_path: Path) -> dict[str, Any]:
    b, a = _culprits_by_key(before), _culprits_by_key(after)
    rows = []
    for key in sorted(set(b) | set(a)):
        role, kind, who = key
        bs, as_ = b.get(key, []), a.get(key, [])
        b_rate = round(sum(float(c["mb_per_min"]) for c in bs), 4)
        a_rate = round(sum(float(c["mb_per_min"]) for c in as_), 4)
        if bs and (not as_ or a_rate < REMAIN_SHARE * b_rate):
            status = "gone"
        elif as_ and not bs:
            status = "new"
        else:
            status = "remains"
        ref = (bs or as_)[0]
        rows.append({
            "library": normalise_library(ref.get("library")), "kind": kind, "role": role,
            "process_label": ref.get("process_label"),
            "libraries_as_mapped": sorted({str(c.get("library")) for c in bs + as_ if c.get("library")}),
            "before_mb_per_min": b_rate, "after_mb_per_min": a_rate,
            "before_outstanding_bytes": sum(int(c.get("outstanding_bytes") or 0) for c in bs),
            "after_outstanding_bytes": sum(int(c.get("outstanding_bytes") or 0) for c in as_),
            "status": status, "label": who,
            "remedy_applied": _remedy_applied(bs, before, after) if bs else None,
            "change": "faster" if status == "remains" and a_rate >= REGRESS_FACTOR * b_rate else (
                "slower" if status == "remains" and a_rate < b_rate else None),
        })
    rows.sort(key=lambda r: ({"new": 0, "remains": 1, "gone": 2}[r["status"]], -max(r["before_mb_per_min"],
                                                                                   r["after_mb_per_min"])))
    verdict, why = _verdict(before, after, rows)
    bp, ap = _processes_by_role(before), _processes_by_role(after)
    processes = [{"key": k, "before_count": int(bp.get(k, {}).get("count", 0)),
                  "after_count": int(ap.get(k, {}).get("count", 0)),
                  "before_rss_mb_per_min": round(bp.get(k, {}).get("rss_mb_per_min", 0.0), 4),
                  "after_rss_mb_per_min": round(ap.get(k, {}).get("rss_mb_per_min", 0.0), 4),
                  "before_anon_mb_per_min": round(bp.get(k, {}).get("anon_mb_per_min", 0.0), 4),
                  "after_anon_mb_per_min": round(ap.get(k, {}).get("anon_mb_per_min", 0.0), 4)}
                 for k in sorted(set(bp) | set(ap))]
    return {"schema": COMPARE_SCHEMA, "verdict": verdict, "verdict_reason": why,
            "confidence": min(support(before), support(after)),
            "before": _side(before, before_path), "after": _side(after, after_path),
            "culprits": rows, "processes": processes,
            "thresholds": {"remain_share": REMAIN_SHARE, "regress_factor": REGRESS_FACTOR,
                           "min_mb_per_min": MIN_MB_PER_MIN, "confident_span_s": CONFIDENT_SPAN_S}}


def _verdict(before: Report, after: Report, rows: list[dict[str, Any]]) -> tuple[str, str]:
    bv, av = before["verdict"], after["verdict"]
    new = [r for r in rows if r["status"] == "new"]
    faster = [r for r in rows if r["change"] == "faster"]
    remains = [r for r in rows if r["status"] == "remains"]
    gone = [r for r in rows if r["status"] == "gone"]
    addressed = [r for r in rows if r["remedy_applied"]]
    if bv == "inconclusive":
        return "inconclusive", "the before hunt is inconclusive"
    if av == "inconclusive":
        # The change is still judged by what it addressed: those culprits' ledger rates are exact in the after
        # hunt too, while its doubt is about other growth (e.g. a control worker's own oneDNN warm-up,
        # ~1.7 MB/min at a sign agreement just under the 0.75 bar). The doubt goes into the reason and the
        # confidence.
        if bv == "leak" and addressed:
            verdict, why = _verdict_of_change(addressed, remains, new)
            return verdict, f"{why}; beside it, the after hunt is inconclusive: {after.get('verdict_reason', '')}"
        return "inconclusive", "the after hunt is inconclusive"
    before_total = sum(r["before_mb_per_min"] for r in rows)
    new_total = sum(r["after_mb_per_min"] for r in new)
    if av == "leak" and (bv == "no-leak" or (new and new_total >= before_total) or faster):
        what = ", ".join(f"{r['label']} ({r['status'] if r['status'] == 'new' else 'faster'})" for r in new + faster)
        return "regressed", ("the after hunt leaks" + (f": {what}" if what else " where the before hunt did not"))
    if bv == "no-leak":
        return "inconclusive", "nothing leaked in the before hunt: there was nothing to fix"
    if addressed:
        return _verdict_of_change(addressed, remains, new)
    if av == "no-leak" or (gone and not remains):
        also = "; new, slower than what was fixed: " + ", ".join(
            f"{r['label']} {r['after_mb_per_min']:.1f} MB/min" for r in new) if new else ""
        return "fixed", ("the after hunt does not leak" if av == "no-leak" else
                         f"every culprit of the before hunt is gone ({', '.join(r['label'] for r in gone)})") + also
    return "not-fixed", "still growing after: " + ", ".join(
        f"{r['label']} {r['before_mb_per_min']:.1f} → {r['after_mb_per_min']:.1f} MB/min" for r in remains)


def describe_change(settings: dict[str, dict[str, str]] | None) -> str:
    """``remedy_applied`` as text: ``K before → after``, by setting name."""
    return ", ".join(f"{k} {v['before']} → {v['after']}" for k, v in sorted((settings or {}).items()))


def _verdict_of_change(addressed: list[dict[str, Any]], remains: list[dict[str, Any]],
                       new: list[dict[str, Any]]) -> tuple[str, str]:
    change = describe_change({k: v for r in addressed for k, v in r["remedy_applied"].items()})
    rates = ", ".join(f"{r['label']} {r['before_mb_per_min']:.1f} → {r['after_mb_per_min']:.1f} MB/min" for r in addressed)
    if any(r["status"] != "gone" for r in addressed):
        return "not-fixed", f"the change ({change}) did not stop what it addresses: {rates}"
    others = [r for r in remains if not r["remedy_applied"]] + new
    also = ("; growing in both hunts or new, not what that change addresses: " + ", ".join(
        f"{r['kind']} {r['label']} {r['before_mb_per_min']:.1f} → {r['after_mb_per_min']:.1f} MB/min" for r in others)) if others else ""
    return "fixed", f"the change ({change}) removed what it addresses: {rates}{also}"


def compare_dirs(before: str | Path, after: str | Path) -> dict[str, Any]:
    b, bp = load_report(before)
    a, ap = load_report(after)
    return compare_reports(b, a, bp, ap)
