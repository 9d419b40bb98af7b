"""A static flame graph of outstanding bytes by call path, as inline SVG: report.html carries it, folded
away, beside the interactive one, for readers that run no script."""

from __future__ import annotations

import html
import zlib
from typing import Any

from leaktrace.analysis.figures import Stacks
from leaktrace.analysis.growth import MB


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
