"""Outstanding bytes by stack: folded stacks (FlameGraph / speedscope input) and an inline SVG flame graph.

Stacks come, best first, from the eBPF ledger's per-stack outstanding bytes (``outstanding_by_stack``
in leaktrace.analysis.ledger, when that exists), else from the culprits' stacks, else — watcher only —
from growth by process and memory class (then the frames are ``process;[class]``, not call paths, and
the report says so).
"""

from __future__ import annotations

import html
import zlib
from typing import Any

from leaktrace.analysis.figures import Figures, Stacks, clean_frame
from leaktrace.analysis.growth import MB
from leaktrace.analysis.report_types import Report
from leaktrace.report.formats import TextReporter


def collect_stacks(report: Report, figures: Figures | None = None) -> tuple[Stacks, str]:
    """(stacks, source) where source is "ledger", "culprits" or "watcher-classes"."""
    stacks = list(figures.ledger_stacks) if figures is not None else []
    if stacks:
        labels = {f"pid {p['pid']}": f"{p['label']} ({p['pid']})" for p in report.get("processes", [])}
        return [([labels.get(fr[0], fr[0]), *fr[1:]], n) for fr, n in stacks], "ledger"
    for c in report.get("culprits", []):
        if c.get("stack") and c.get("outstanding_bytes"):
            frames = [f"{c.get('process_label') or '?'} ({c['pid']})"]
            frames += [clean_frame(f) for f in reversed(c["stack"])]
            stacks.append((frames, int(c["outstanding_bytes"])))
    if stacks:
        return stacks, "culprits"
    dur_min = max(float(report.get("duration_s") or 0.0), 1.0) / 60.0
    for p in report.get("processes", []):
        for cls, mbm in (p.get("growth_by_class") or {}).items():
            grown = int(mbm * dur_min * MB)
            if grown > 0:
                stacks.append(([f"{p['label']} ({p['pid']})", f"[{cls}]"], grown))
    return stacks, "watcher-classes"


def folded_text(stacks: Stacks) -> str:
    merged: dict[str, int] = {}
    for frames, size in stacks:
        key = ";".join(frames)
        merged[key] = merged.get(key, 0) + size
    return "".join(f"{k} {v}\n" for k, v in sorted(merged.items(), key=lambda kv: -kv[1]))


def render_folded(report: Report, figures: Figures | None = None) -> str:
    return folded_text(collect_stacks(report, figures)[0])


REPORTER = TextReporter("folded", "outstanding.folded", render_folded)


def _tree(stacks: Stacks) -> dict[str, Any]:
    root: dict[str, Any] = {"name": "all", "value": 0, "children": {}}
    for frames, size in stacks:
        node = root
        node["value"] += size
        for f in frames:
            node = node["children"].setdefault(f, {"name": f, "value": 0, "children": {}})
            node["value"] += size
    return root


_PALETTE = ["#e8743b", "#f2a541", "#e0573a", "#f0c75e", "#d9603b", "#eb8f4b", "#f3b65a"]


def flame_svg(stacks: Stacks, width: int = 1100, row_h: int = 18, max_depth: int = 40) -> str:
    """A static flame graph (root at the bottom, width ∝ outstanding bytes); each box has a <title>
    tooltip with its bytes. No script: it renders anywhere an SVG does."""
    root = _tree(stacks)
    total = root["value"]
    if total <= 0:
        return ""
    boxes: list[str] = []
    depth_max = 0

    def walk(node: dict[str, Any], x: float, depth: int) -> None:
        nonlocal depth_max
        depth_max = max(depth_max, depth)
        w = node["value"] / total * width
        if w < 0.5 or depth > max_depth:
            return
        boxes.append((x, depth, w, node["name"], node["value"]))  # type: ignore[arg-type]
        cx = x
        for child in sorted(node["children"].values(), key=lambda n: -n["value"]):
            walk(child, cx, depth + 1)
            cx += child["value"] / total * width

    walk(root, 0.0, 0)
    height = (depth_max + 1) * row_h + 4
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="flame" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-family="monospace" font-size="11">']
    for i, (x, depth, w, name, value) in enumerate(boxes):  # type: ignore[misc]
        y = height - (depth + 1) * row_h
        color = "#c9c9c9" if depth == 0 else _PALETTE[zlib.crc32(name.encode()) % len(_PALETTE)]
        label = f"{name} — {value / MB:.2f} MB ({100 * value / total:.1f}%)"
        chars = int(w / 7)
        text = name if len(name) <= chars else (name[: max(chars - 2, 0)] + "..")
        parts.append(f'<g><title>{html.escape(label)}</title><rect x="{x:.1f}" y="{y}" width="{max(w - 0.5, 0.5):.1f}" '
                     f'height="{row_h - 1}" fill="{color}" rx="2"/>'
                     + (f'<text x="{x + 3:.1f}" y="{y + row_h - 5}">{html.escape(text)}</text>' if chars >= 3 else "")
                     + "</g>")
        if i > 4000:  # enough boxes for a readable picture; the folded file has everything
            break
    parts.append("</svg>")
    return "".join(parts)
