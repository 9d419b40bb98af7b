"""report.md: pasteable into a GitHub issue (verdict, processes, top culprits with stacks and remedy)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from leaktrace.analysis.exits import describe as describe_exit
from leaktrace.analysis.report_types import Report
from leaktrace.report.culprit_figures import held, rates
from leaktrace.report.reporter import TextReporter
from leaktrace.report.stacks import call_path

MAX_CULPRITS = 5
MAX_STACK = 20


def _f(v: Any, fmt: str = ".2f") -> str:
    return "" if v is None else format(v, fmt)


def table(heads: Sequence[str], align: str, rows: Iterable[Sequence[Any]]) -> list[str]:
    """A Markdown table as lines: the header, its rule (``align``: one letter a column, ``l`` for text,
    ``r`` for numbers, right-aligned) and one line a row, each cell as ``str()`` writes it."""
    rule = {"l": "---", "r": "---:"}
    return [_row(heads), "|" + "|".join(rule[a] for a in align) + "|", *(_row(r) for r in rows)]


def _row(cells: Sequence[Any]) -> str:
    return "| " + " | ".join(map(str, cells)) + " |"


def render(report: Report) -> str:
    lines = [f"## leaktrace: **{report['verdict']}**", "", f"{report.get('verdict_reason', '')}", ""]
    if report.get("confidence") is not None:
        lines += [f"Probability that the judged growth is a leak: {report['confidence']:.2f} (the share of leaks "
                  "among the labelled corpus's windows of this verdict and length: docs/verdicts.md).", ""]
    probes = ", ".join(report.get("probes") or []) or "?"
    lines.append(f"Duration {report['duration_s']:.1f} s, probes: {probes}"
                 + (f" (live after {report['attach_s']:.2f} s)" if report.get("attach_s") is not None else "")
                 + f"; stop: {report.get('stop_reason')}.")
    if report.get("probe_attach_s"):
        lines.append("Attach per probe: " + ", ".join(f"{k} {v:.2f} s" for k, v in report["probe_attach_s"].items())
                     + ".")
    if not report.get("session_complete", True):
        lines.append("**The session was not finalized (the hunt was killed); figures cover what was written.**")
    led = report.get("ledger") or {}
    if led.get("available"):
        lines.append(f"eBPF ledger: {led.get('events', 0)} syscalls traced, "
                     f"{(led.get('outstanding_bytes') or 0) / 2**20:.1f} MB outstanding, "
                     f"{led.get('lost_events', 0)} events lost.")
    lines += ["", "### Culprits", ""]
    culprits = report.get("culprits") or []
    if not culprits:
        lines.append("None.")
    for i, c in enumerate(culprits[:MAX_CULPRITS], 1):
        py_types = [t["type"] for t in ((c.get("python") or {}).get("types") or [])[:3]]
        where = c.get("library") or ("Python objects: " + ", ".join(py_types) if py_types else "library not named")
        (rate, mapped), amounts = rates(c), held(c)
        lines.append(f"**{i}. {c.get('rule_title') or c['kind']} — `{where}`** (pid {c['pid']} "
                     f"{c.get('process_title') or c.get('process_label') or ''}{_instance(c)}): **{rate}**"
                     + (f", {mapped}" if mapped else "") + (f"; {amounts}" if amounts else "")
                     + (f", named {c['first_named_s']:.1f} s after attach" if c.get("first_named_s") is not None
                        else ""))
        lines.append("")
        if c.get("finding"):
            lines += [c["finding"], ""]
        for e in c.get("evidence", []):
            lines.append(f"- {e}")
        path = call_path(c)
        if path:
            lines += ["", f"Call path: `{path}`"]
        if c.get("stack"):
            stack = list(c["stack"])
            more = len(stack) - MAX_STACK
            lines += ["", "```", *stack[:MAX_STACK], *([f"... {more} more frames"] if more > 0 else [])]
            py = list(c.get("python_stack") or [])
            if py:
                more = len(py) - MAX_STACK
                lines += ["Python:", *py[:MAX_STACK], *([f"... {more} more frames"] if more > 0 else [])]
            lines.append("```")
        if c.get("remedy"):
            lines += ["", f"**Remedy:** {c['remedy']}"]
        lines.append("")
    if len(culprits) > MAX_CULPRITS:
        lines += [f"({len(culprits) - MAX_CULPRITS} more in report.json)", ""]
    lines += ["### Processes", "", *table(
        ["pid", "ppid", "label", "title", "RSS MB/min", "anon MB/min", "USS MB/min", "confidence", "RSS MB"], "rrllrrrrr",
        ([p["pid"], p["ppid"], p["label"], p.get("title", ""), f"{p['rss_mb_per_min']:.2f}", f"{p['anon_mb_per_min']:.2f}",
          f"{p['uss_mb_per_min']:.2f}", _f(p.get("rss_confidence")), _f(p.get("rss_last_mb"), ".1f")]
         for p in report["processes"]))]
    lines += _ended(report)
    gbc = report.get("growth_by_class") or {}
    if gbc:
        lines += ["", "### Growth by memory class (MB/min)", "",
                  *table(["class", "MB/min"], "lr", ([k, f"{v:.2f}"] for k, v in gbc.items()))]
    regs = (report.get("regions") or {}).get("growing") or []
    if regs:
        lines += ["", "### Top growing regions", "", *table(
            ["pid", "start", "path", "class", "MB grown", "moves"], "rlllrr",
            ([r["pid"], f"`{r['start']}`", r["path"], r["cls"], f"{r['growth_mb']:.2f}", r["moves"]] for r in regs[:10]))]
    th = report.get("thresholds") or {}
    if th:
        lines += ["", "<details><summary>Thresholds</summary>", "",
                  ", ".join(f"{k} = {v}" for k, v in th.items()), "", "</details>"]
    tc = report.get("tick_costs")
    if tc:
        lines += ["", "<details><summary>What the hunt's ticks cost</summary>", "",
                  f"{tc['ticks']} ticks, {tc['late_ticks']} started more than an interval late (the latest "
                  f"{tc['max_late_s']:.1f} s late, at {_f(tc.get('max_late_at_s'), '.1f')} s). leaktrace used "
                  f"{_f(tc.get('process_cpu_s'), '.1f')} CPU s in all, its helpers "
                  f"{_f(tc.get('children_cpu_s'), '.1f')}.", "",
                  *table(["probe", "ticks", "wall s", "CPU s", "slowest tick s", "at s"], "lrrrrr",
                         ([k, d["ticks"], f"{d['wall_s']:.2f}", f"{d['cpu_s']:.2f}", f"{d['max_wall_s']:.2f}",
                           f"{d['max_wall_at_s']:.1f}"] for k, d in tc["probes"].items())), "", "</details>"]
    if report.get("warnings"):
        lines += ["", "Warnings:", *[f"- {w}" for w in report["warnings"]]]
    return "\n".join(lines) + "\n"


def _ended(report: Report) -> list[str]:
    """How each target that ended during the hunt ended, and what it held then (eBPF ledger)."""
    held = {e["pid"]: e for e in (report.get("ledger") or {}).get("exits", [])}
    ended = [p for p in report["processes"] if p.get("exit")]
    if not ended:
        return []
    lines = ["", "### Ended during the hunt", ""]
    for p in ended:
        h = held.get(p["pid"])
        at_exit = (f"; held {h['outstanding_bytes'] / 2**20:.1f} MB in {h['regions']} traced mapping(s) then"
                   if h else "")
        lines.append(f"- pid {p['pid']} ({p.get('title', '')}): {describe_exit(p['exit'])}{at_exit}")
    return lines


REPORTER = TextReporter("md", "report.md", lambda report, _figures: render(report))


def _instance(c: dict[str, Any]) -> str:
    """", vLLM instance 4242 (decode)" for a culprit inside a vLLM server, else ""."""
    if c.get("instance") is None:
        return ""
    return f", vLLM instance {c['instance']}" + (f" ({c['role']})" if c.get("role") else "")
