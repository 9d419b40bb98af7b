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

import os
import re
from dataclasses import dataclass
from typing import Any

from leaktrace.analysis.figures import Figures, Stacks, clean_frame
from leaktrace.analysis.growth import MB
from leaktrace.analysis.report_types import Report


def collect_stacks(report: Report, figures: Figures | None = None) -> tuple[Stacks, str]:
    """(stacks, source) where source is "ledger", "culprits" or "watcher-classes"; a culprit's Python frames
    above the native frames of its growing call site (:func:`sites`)."""
    stacks: Stacks = []
    if figures is not None and figures.ledger_stacks:
        found, _ = sites(report, figures)
        labels = process_names(report)
        merged: dict[tuple[str, ...], int] = {}
        for x in found:
            key = (labels.get(x.pid, f"pid {x.pid}") if x.pid is not None else "?", *x.frames)
            merged[key] = merged.get(key, 0) + x.bytes
        return [(list(k), n) for k, n in merged.items()], "ledger"
    for c in report.get("culprits", []):
        if c.get("stack") and c.get("outstanding_bytes"):
            frames = [f"{c.get('process_label') or '?'} ({c['pid']})", *python_frames(c)]
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


# The interpreter's own frames in a native stack (its eval loop, the ctypes call machinery): under the Python
# frames, the call path shown starts below the innermost of them.
_INTERPRETER_FRAME = re.compile(r"^((lib)?python3[0-9.]*[a-z]*(\.so[0-9.]*)?|python[0-9.]*)[!+]")
_OFFSET = re.compile(r"\+0x[0-9a-f]+$")


def python_frames(c: dict[str, Any]) -> list[str]:
    """A culprit's Python frames, root first, as stack frames (``path/file.py:function:line``)."""
    return [clean_frame(f) for f in reversed(c.get("python_stack") or [])]


def call_path(c: dict[str, Any], max_native: int = 8) -> str:
    """The call path, caller first, from the innermost Python frame to the frame that maps: ``host.py:send:42 →
    libffi.so.8 → libxfer_demo.so!xfer_send → raw_map`` (library offsets dropped, consecutive unnamed frames
    of one library as the library's name, a function of the same library as the one before by its name); ""
    without a Python frame."""
    py = c.get("python_stack") or []
    if not py:
        return ""
    file, function, line = (str(py[0]).rsplit(":", 2) + ["", ""])[:3]
    parts = [f"{os.path.basename(file)}:{function}:{line}"]
    native = [str(f) for f in reversed(c.get("stack") or [])]
    last_interp = max((i for i, f in enumerate(native) if _INTERPRETER_FRAME.match(f)), default=-1)
    native = native[last_interp + 1:]
    shown: list[str] = []
    prev_lib = None
    for f in native:
        lib, bang, sym = f.partition("!")
        if not bang:
            lib = _OFFSET.sub("", f)
            if lib != prev_lib:
                shown.append(lib)
        else:
            sym = _OFFSET.sub("", sym)
            shown.append(sym if lib == prev_lib else f"{lib}!{sym}")
        prev_lib = lib
    if len(shown) > max_native:
        shown = [*shown[:2], "…", *shown[-(max_native - 3):]]
    return " → ".join(parts + shown)


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
                                [*python_frames(c), *(clean_frame(f) for f in reversed(c["stack"]))],
                                int(c["outstanding_bytes"]), None, float(c.get("mb_per_min") or 0.0) * MB, i))
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
        py = python_frames(c)
        for x in mine:
            x.culprit = i
            x.growth_per_min = float(c.get("mb_per_min") or 0.0) * MB * x.bytes / total if total else 0.0
            if py and _through_call_site(c, x):
                x.frames = [*py, *x.frames]
    return out, source


def _through_call_site(c: dict[str, Any], site: Site) -> bool:
    """Whether a ledger site is the call path the culprit's stack (and so its Python frames) was taken on: its
    innermost frame in the culprit's library (any library when it names none) is a frame of that stack."""
    stack = set(c.get("stack") or [])
    lib = c.get("library")
    for f in reversed(site.frames):
        if not lib or f.startswith((f"{lib}!", f"{lib}+")):
            return f in stack
    return False
