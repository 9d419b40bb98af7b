"""Outstanding bytes by stack: folded stacks (FlameGraph / speedscope input), an inline SVG flame graph, and
the sites (:func:`sites`: bytes, regions, culprit and its growth share by process and stack) that the
interactive flame graph (leaktrace.report.flamegraph) and the pprof profile (leaktrace.report.pprof) draw on.

Stacks come, best first, from the eBPF ledger's outstanding regions by stack (``ledger_stacks`` and
``ledger_sites`` in leaktrace.analysis.figures), else from the culprits' stacks, else — watcher only —
from growth by process and memory class (then the frames are ``process;[class]``, not call paths, and
the report says so).
"""

from __future__ import annotations

import html
import zlib
from dataclasses import dataclass
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


@dataclass
class Site:
    """One sample of the flame graphs and the pprof profile: outstanding bytes of a process by call stack."""

    pid: int | None
    library: str | None
    kind: str | None  # the ledger's kind (anon, heap, ...), or the memory class of a watcher-only sample
    frames: list[str]  # root first, without the process
    bytes: int
    regions: int | None  # None where not counted (no eBPF ledger)
    growth_per_min: float = 0.0  # bytes a minute: its culprit's rate shared by bytes among the culprit's sites
    culprit: int | None = None  # index in report["culprits"]


def process_names(report: Report) -> dict[int, str]:
    return {int(p["pid"]): f"{p['label']} ({p['pid']})" for p in report.get("processes", [])}


def _belongs(c: dict[str, Any], site: Site, source: str) -> bool:
    """Whether a ledger (or watcher) site is part of culprit ``c``: same process, and its library (a
    malloc-heap culprit: the process's whole heap; a watcher one: its memory class)."""
    if site.pid != c.get("pid"):
        return False
    if source == "watcher-classes":
        return not c.get("cls") or site.kind == c.get("cls")
    if c.get("kind") == "malloc-heap":
        return site.kind == "heap"
    return site.library == c.get("library") and site.kind != "heap"


def sites(report: Report, figures: Figures | None = None) -> tuple[list[Site], str]:
    """(sites, source): the same sources, in the same order of preference, as :func:`collect_stacks`, each
    site tied to the culprit it is part of and given its share of that culprit's growth rate."""
    culprits = report.get("culprits", [])
    out: list[Site] = []
    if figures is not None and figures.ledger_sites:
        source = "ledger"
        out = [Site(x.pid, x.library, x.kind, list(x.frames), x.bytes, x.regions) for x in figures.ledger_sites]
    else:
        source = "culprits"
        for i, c in enumerate(culprits):
            if c.get("stack") and c.get("outstanding_bytes"):
                out.append(Site(int(c["pid"]), c.get("library"), c.get("cls"),
                                [clean_frame(f) for f in reversed(c["stack"])], int(c["outstanding_bytes"]), None,
                                float(c.get("mb_per_min") or 0.0) * MB, i))
        if not out:
            source = "watcher-classes"
            dur_min = max(float(report.get("duration_s") or 0.0), 1.0) / 60.0
            for p in report.get("processes", []):
                for cls, mbm in (p.get("growth_by_class") or {}).items():
                    grown = int(mbm * dur_min * MB)
                    if grown > 0:
                        out.append(Site(int(p["pid"]), None, str(cls), [f"[{cls}]"], grown, None))
        if source == "culprits":
            return out, source
    for i, c in enumerate(culprits):
        mine = [x for x in out if x.culprit is None and _belongs(c, x, source)]
        total = sum(x.bytes for x in mine)
        for x in mine:
            x.culprit = i
            x.growth_per_min = float(c.get("mb_per_min") or 0.0) * MB * x.bytes / total if total else 0.0
    return out, source


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
