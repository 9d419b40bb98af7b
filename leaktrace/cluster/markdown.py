"""The merged cluster report as Markdown."""

from __future__ import annotations

from typing import Any

from leaktrace.report.markdown import table


def render_markdown(report: dict[str, Any]) -> str:
    lines = [f"# leaktrace cluster report — verdict: **{report['verdict']}**", "",
             f"Ray at `{report.get('address')}`, targets `{report.get('targets')}`; "
             f"{report['stop_reason']}; longest node hunt {report['duration_s']:.1f} s.", "",
             "## Nodes", "", *table(["node", "IP", "node id", "status", "verdict", "top culprit", "reason"], "lllllll",
                                    (_node_row(n) for n in report["nodes"]))]
    if report["roles"]:
        lines += ["", "## vLLM instances by role (prefill vs decode)", "", *table(
            ["role", "node", "instance", "pids", "RSS MB/min", "anon MB/min", "USS MB/min"], "llllrrr",
            ([role, i["hostname"], i.get("instance"), ", ".join(map(str, i["pids"])), f"{i['rss_mb_per_min']:.2f}",
              f"{i['anon_mb_per_min']:.2f}", f"{i['uss_mb_per_min']:.2f}"]
             for role, insts in report["roles"].items() for i in insts))]
    if report["recurring_culprits"]:
        lines += ["", "## Culprits recurring across nodes", ""]
        for r in report["recurring_culprits"]:
            lines.append(f"- {r['kind']} {r.get('library') or '(library unknown, ' + str(r['process_label']) + ')'}"
                         f" on {', '.join(r['nodes'])}: {r['mb_per_min_total']:.2f} MB/min in total")
    lines += ["", "## Processes", "", *table(
        ["node", "pid", "label", "RSS MB/min", "anon MB/min", "USS MB/min"], "lrlrrr",
        ([p["hostname"], p["pid"], p["label"], f"{p['rss_mb_per_min']:.2f}", f"{p['anon_mb_per_min']:.2f}",
          f"{p['uss_mb_per_min']:.2f}"] for p in report["processes"]))]
    lines += ["", "## Culprits", ""]
    if not report["culprits"]:
        lines.append("None.")
    for i, c in enumerate(report["culprits"], 1):
        lines.append(f"### {i}. {c['hostname']}: {c['kind']} — {c.get('library') or 'unknown library'} "
                     f"(pid {c['pid']}, {c.get('process_label') or '?'}): {c['mb_per_min']:.2f} MB/min")
        lines += [f"- {e}" for e in c.get("evidence", [])]
        if c.get("stack"):
            lines += ["", "```", *c["stack"], "```"]
        if c.get("remedy"):
            lines += ["", f"**Remedy:** {c['remedy']}"]
        lines.append("")
    failed = [n for n in report["nodes"] if n["status"] == "failed"]
    if failed:
        lines += ["", "## Failed nodes", ""]
        lines += [f"- {n['hostname']} (`{str(n['node_id'])[:12]}`): {n['reason']}" for n in failed]
    lines += ["", "Per-node sessions: `nodes/<node>/` (re-render one with `leaktrace report`)."]
    return "\n".join(lines) + "\n"


def _node_row(n: dict[str, Any]) -> list[Any]:
    top = n["culprits"][0] if n["culprits"] else None
    top_s = f"{top['kind']} {top.get('library') or ''} pid {top['pid']} {top['mb_per_min']:.2f} MB/min" if top else "—"
    status = "nothing to hunt" if n.get("no_targets") else n["status"]
    reason = "; ".join([n["reason"] or "", *n.get("notes", [])]).strip("; ")
    return [n["hostname"], n.get("ip") or "", f"`{str(n['node_id'])[:12]}`", status, n["verdict"] or "—", top_s, reason]
