"""The reporters of ``leaktrace compare``: compare.json, compare.md and compare.html (from a template),
rendering the dict built by leaktrace.analysis.compare; compare.html also shows the two hunts' flame graphs
side by side (leaktrace.report.flamegraph)."""

from __future__ import annotations

from typing import Any

from leaktrace.analysis.compare import describe_change
from leaktrace.report import flamegraph
from leaktrace.report.json_report import JsonReporter
from leaktrace.report.markdown import table
from leaktrace.report.reporter import TextReporter


def _mb(v: float) -> str:
    return f"{v:.2f}"


def remedy_applied(r: dict[str, Any]) -> str:
    """The settings a culprit's remedy changes that differ between the hunts, as ``K before → after``."""
    return describe_change(r.get("remedy_applied"))


def render_markdown(cmp: dict[str, Any]) -> str:
    b, a = cmp["before"], cmp["after"]
    lines = [f"## leaktrace compare: **{cmp['verdict']}** (confidence {cmp['confidence']:.2f})", "",
             cmp["verdict_reason"], "",
             "| | before | after |", "|---|---|---|",
             f"| hunt | `{b['path']}` | `{a['path']}` |",
             f"| verdict | {b['verdict']} | {a['verdict']} |",
             f"| duration s | {b['duration_s'] or 0:.1f} | {a['duration_s'] or 0:.1f} |",
             f"| RSS growth, all processes, MB/min | {_mb(b['total_rss_mb_per_min'])} | {_mb(a['total_rss_mb_per_min'])} |",
             f"| culprits | {b['culprits']} | {a['culprits']} |", "",
             "### Culprits", ""]
    if not cmp["culprits"]:
        lines.append("None on either side.")
    else:
        lines += table(["status", "role", "kind", "library", "before MB/min", "after MB/min", "before outstanding MB",
                        "after outstanding MB", "remedy setting changed"], "llllrrrrl",
                       ([r["status"] + (f" ({r['change']})" if r.get("change") else ""), r["role"], r["kind"], r["label"],
                         _mb(r["before_mb_per_min"]), _mb(r["after_mb_per_min"]),
                         f"{r['before_outstanding_bytes'] / 2**20:.1f}", f"{r['after_outstanding_bytes'] / 2**20:.1f}",
                         remedy_applied(r) or "-"] for r in cmp["culprits"]))
    lines += ["", "### Processes by role", "", *table(
        ["role/label", "before n", "after n", "before RSS MB/min", "after RSS MB/min"], "lrrrr",
        ([p["key"], p["before_count"], p["after_count"], _mb(p["before_rss_mb_per_min"]), _mb(p["after_rss_mb_per_min"])]
         for p in cmp["processes"]))]
    return "\n".join(lines) + "\n"


def render_html(cmp: dict[str, Any], hunts: dict[str, list[dict[str, Any]]] | None = None) -> str:
    """``hunts``: the flame graph views of "before" and "after" (leaktrace.report.flamegraph.views of each
    hunt's report and figures, built by the caller from the hunts: a reporter never reopens a session);
    without them the page has no flame graphs."""
    from jinja2 import Environment, PackageLoader, select_autoescape

    hunts = hunts or {}
    flames = {side: flamegraph.widget(f"flamegraph-{side}", hunts.get(side) or []) for side in ("before", "after")}
    env = Environment(loader=PackageLoader("leaktrace.report", "templates"),
                      autoescape=select_autoescape(["html", "j2"]))
    return env.get_template("compare.html.j2").render(
        c=cmp, mb=2**20, remedy_applied=remedy_applied, flames=flames,
        flame_assets=flamegraph.assets() if any(hunts.values()) else "")


JSON_REPORTER = JsonReporter("compare.json", "compare")
MARKDOWN_REPORTER = TextReporter("md", "compare.md", lambda cmp, _figures: render_markdown(cmp))
HTML_REPORTER = TextReporter("html", "compare.html", lambda cmp, hunts: render_html(cmp, hunts))
