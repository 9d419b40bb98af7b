"""report.md: pasteable into a GitHub issue."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def render(report: dict[str, Any]) -> str:
    lines = [f"# leaktrace report — verdict: **{report['verdict']}**", ""]
    lines.append(f"Duration {report['duration_s']:.1f} s; stop: {report.get('stop_reason')}.")
    lines += ["", "## Processes", "", "| pid | ppid | label | RSS MB/min | anon MB/min | USS MB/min |",
              "|---:|---:|---|---:|---:|---:|"]
    for p in report["processes"]:
        lines.append(f"| {p['pid']} | {p['ppid']} | {p['label']} | {p['rss_mb_per_min']:.2f} | "
                     f"{p['anon_mb_per_min']:.2f} | {p['uss_mb_per_min']:.2f} |")
    lines += ["", "## Culprits", ""]
    if not report["culprits"]:
        lines.append("None.")
    for i, c in enumerate(report["culprits"], 1):
        lines.append(f"### {i}. {c['kind']} — {c.get('library') or 'unknown library'} (pid {c['pid']}): "
                     f"{c['mb_per_min']:.2f} MB/min")
        for e in c.get("evidence", []):
            lines.append(f"- {e}")
        if c.get("stack"):
            lines += ["", "```", *c["stack"], "```"]
        if c.get("remedy"):
            lines += ["", f"**Remedy:** {c['remedy']}"]
        lines.append("")
    return "\n".join(lines) + "\n"


def write(report: dict[str, Any], out_dir: Path) -> Path:
    path = Path(out_dir) / "report.md"
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text(render(report))
    os.replace(tmp, path)
    return path
