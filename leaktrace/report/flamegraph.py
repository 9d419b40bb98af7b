"""The interactive flame graph (an icicle: roots on top) of outstanding bytes by call path, in report.html,
compare.html and the notebook: one view for all processes, one per culprit, one per process; searchable,
hover for bytes and regions, click to zoom.

Drawn by d3-flame-graph and the d3 modules it needs, shipped in leaktrace/report/vendor/ (versions and
licences in its README.md) and inlined in the page, so a report works offline and as a copied file.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

from markupsafe import Markup, escape

from leaktrace.analysis.figures import Figures
from leaktrace.analysis.report_types import Report
from leaktrace.report.stacks import Site, process_names, sites

# Loading order: each d3 module extends the global ``d3`` with what the ones after it use.
VENDOR_JS = ("d3-array", "d3-color", "d3-interpolate", "d3-format", "d3-time", "d3-time-format", "d3-scale",
             "d3-selection", "d3-dispatch", "d3-timer", "d3-ease", "d3-transition", "d3-hierarchy")
FLAMEGRAPH_JS = "d3-flamegraph.umd.min.js"
FLAMEGRAPH_CSS = "d3-flamegraph.css"
MIN_SHARE = 1e-3  # call paths under this share of a view are merged into one "[smaller call paths]" box
MAX_PROCESS_VIEWS = 40  # the processes holding most; the "all processes" view has every one


def _read(folder: str, name: str) -> str:
    """A file of the package's ``folder`` (vendor/, templates/: data folders, not Python packages)."""
    return resources.files("leaktrace.report").joinpath(folder, name).read_text(encoding="utf-8")


@cache
def assets() -> Markup:
    """The style and scripts a page needs once, before any :func:`widget`: the vendored library and
    leaktrace's own flamegraph.js, inlined."""
    js = [_read("vendor", f"{m}.min.js") for m in VENDOR_JS] + [_read("vendor", FLAMEGRAPH_JS),
                                                                _read("templates", "flamegraph.js")]
    for text in js:
        if "</script" in text.lower():
            raise ValueError("a vendored script cannot be inlined: it holds '</script'")
    css = _read("vendor", FLAMEGRAPH_CSS) + _OWN_CSS
    return Markup(f"<style>{css}</style>\n" + "".join(f"<script>{t}\n</script>\n" for t in js))


_OWN_CSS = """
.flamegraph-view { margin: 8px 0 16px; }
.flamegraph-view .controls { display: flex; gap: 8px; align-items: center; flex-wrap: wrap; font-size: 0.88em; }
.flamegraph-view .controls input[type=search] { width: 18em; }
.flamegraph-view .details { min-height: 1.4em; font-family: monospace; font-size: 0.85em; color: #333;
  white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
.flamegraph-view .chart { width: 100%; min-height: 40px; }
"""


class _Node:
    __slots__ = ("name", "value", "regions", "children")

    def __init__(self, name: str) -> None:
        self.name, self.value, self.regions, self.children = name, 0, 0, {}

    def add(self, frames: list[str], size: int, regions: int | None) -> None:
        node = self
        node.value += size
        node.regions = None if regions is None or node.regions is None else node.regions + regions
        for f in frames:
            node = node.children.setdefault(f, _Node(f))
            node.value += size
            node.regions = None if regions is None or node.regions is None else node.regions + regions

    def to_json(self, floor: float) -> dict[str, Any]:
        kids = sorted(self.children.values(), key=lambda n: -n.value)
        big = [k.to_json(floor) for k in kids if k.value >= floor]
        small = [k for k in kids if k.value < floor]
        if small:
            rest = {"name": f"[{len(small)} smaller call path{'s' if len(small) > 1 else ''}]",
                    "value": sum(k.value for k in small), "children": []}
            if all(k.regions is not None for k in small):
                rest["regions"] = sum(k.regions for k in small)
            big.append(rest)
        out: dict[str, Any] = {"name": self.name, "value": self.value, "children": big}
        if self.regions is not None:
            out["regions"] = self.regions
        return out


def _tree(root: str, found: list[Site], names: dict[int, str], by_process: bool) -> dict[str, Any]:
    top = _Node(root)
    for x in found:
        proc = [names.get(x.pid, f"pid {x.pid}")] if by_process and x.pid is not None else []
        top.add(proc + x.frames, x.bytes, x.regions)
    return top.to_json(top.value * MIN_SHARE)


def views(report: Report, figures: Figures | None = None) -> list[dict[str, Any]]:
    """[{"id", "title", "tree"}]: all processes, then each culprit holding something, then each process."""
    found, source = sites(report, figures)
    found = [x for x in found if x.bytes > 0]
    if not found:
        return []
    names = process_names(report)
    what = {"ledger": "outstanding", "culprits": "outstanding (culprits' stacks)",
            "watcher-classes": "grown (no stacks: memory classes)"}[source]
    out = [{"id": "all", "title": f"All processes: {_mb(found)} {what}",
            "tree": _tree("all processes", found, names, True)}]
    for i, c in enumerate(report.get("culprits", [])):
        mine = [x for x in found if x.culprit == i]
        if mine:
            name = f"#{i + 1} {c.get('library') or c.get('kind')} — {names.get(c.get('pid'), c.get('pid'))}"
            out.append({"id": f"culprit-{i + 1}", "title": f"Culprit {name}: {_mb(mine)}",
                        "tree": _tree(name, mine, names, False)})
    by_pid: dict[int, list[Site]] = {}
    for x in found:
        if x.pid is not None:
            by_pid.setdefault(x.pid, []).append(x)
    ranked = sorted(by_pid.items(), key=lambda kv: -sum(x.bytes for x in kv[1]))[:MAX_PROCESS_VIEWS]
    for pid, mine in ranked:
        name = names.get(pid, f"pid {pid}")
        out.append({"id": f"pid-{pid}", "title": f"Process {name}: {_mb(mine)}", "tree": _tree(name, mine, names, False)})
    return out


def _mb(found: list[Site]) -> str:
    return f"{sum(x.bytes for x in found) / 2**20:.1f} MB"


def _json_for_script(data: Any) -> str:
    """JSON safe inside a <script> element (no "</", no HTML-significant characters)."""
    text = json.dumps(data, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def widget(element_id: str, found: list[dict[str, Any]], height_hint: str = "") -> Markup:
    """The controls (view, search, reset), the chart in ``<div id=element_id>`` and its data; the page must
    hold :func:`assets` before it. Empty when there is nothing to draw."""
    if not found:
        return Markup("")
    eid = escape(element_id)
    options = "".join(f'<option value="{i}">{escape(v["title"])}</option>' for i, v in enumerate(found))
    return Markup(
        f'<div class="flamegraph-view">'
        f'<div class="controls"><label>view <select id="{eid}-view">{options}</select></label>'
        f'<input type="search" id="{eid}-search" placeholder="search frames (library, function)">'
        f'<button type="button" id="{eid}-reset">reset zoom</button>'
        f'<span id="{eid}-match"></span></div>'
        f'<div class="details" id="{eid}-details">{escape(height_hint)}</div>'
        f'<div class="chart" id="{eid}"></div>'
        f'<script type="application/json" id="{eid}-data">{_json_for_script(found)}</script>'
        f'<script>leaktraceFlame({json.dumps(element_id)});</script></div>')


def page_fragment(report: Report, figures: Figures | None = None, element_id: str = "flamegraph") -> Markup:
    """Assets and widget in one piece, for a page of its own (the notebook's HTML output)."""
    found = views(report, figures)
    return Markup(assets() + widget(element_id, found)) if found else Markup("")
