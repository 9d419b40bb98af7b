"""Outstanding bytes by stack, as the stack-drawing formats take them: :func:`collect_stacks` (frames and
bytes: the folded file and the static flame graph) and :func:`sites` (bytes, regions, culprit and its growth
share by process and stack: the interactive flame graph, leaktrace.report.flamegraph, and the pprof profile,
leaktrace.report.pprof).

Stacks come, best first, from the eBPF ledger's outstanding regions by stack (``ledger_stacks`` and
``ledger_sites`` in leaktrace.analysis.figures), else from the culprits' stacks, else — watcher only —
from growth by process and memory class (then the frames are ``process;[class]``, not call paths, and
the report says so).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from leaktrace.analysis.figures import Figures, Stacks, clean_frame
from leaktrace.analysis.growth import MB
from leaktrace.analysis.report_types import Report


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
