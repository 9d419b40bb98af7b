"""Culprit candidates from the measurements: the eBPF ledger (library + stack), the watcher (a leaking
process and the class that grows), the Python heap probe; the thresholds that decide what leaks."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from leaktrace.analysis.growth import MB
from leaktrace.analysis.growth_tables import class_rate_table

# The verdict's thresholds and per-process rules (analysis/leaking.py), re-exported where candidates are made.
from leaktrace.analysis.leaking import (  # noqa: F401
    THRESHOLDS,
    clears,
    is_doubtful,
    is_leaking,
    is_short_lived,
    plateau_evidence,
)
from leaktrace.analysis.ledger import native_culprits
from leaktrace.analysis.pyobjects import explains, names_other_library, type_evidence
from leaktrace.memclass import KIND_OF_CLASS, LIBC_LIBRARY
from leaktrace.session import TableSource
from leaktrace.vllm.labels import LABELS, classify_argv, is_python

_LIB_IN_FRAME = re.compile(r"([A-Za-z0-9_.+-]+\.so(?:[.-][A-Za-z0-9_.-]*)?)")



@dataclass
class Candidate:
    kind: str
    pid: int
    mb_per_min: float
    source: str  # ledger | watcher | pyheap
    library: str | None = None
    stack: list[str] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    outstanding_bytes: int = 0
    cls: str = "anon"
    paths: list[str] = field(default_factory=list)
    python: bool = False
    label: str = "other"  # the ps vocabulary (api-server, engine-core, worker, …)
    title: str = "?"  # what the process calls itself (VLLM::Worker_TP0, comm)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple[Any, ...]:
        if self.library:
            return (self.pid, self.library)
        return (self.pid, self.source, self.cls)


def path_pattern(path: str) -> str:
    """A name pattern: runs of hex digits/digits (ids, pids, random suffixes) become '*'."""
    base = re.sub(r" \(deleted\)$", "", path)
    return re.sub(r"(?<=[_.\-/])[0-9a-fA-F]{4,}|[0-9]+", "*", base)


def summarize_paths(paths: list[str], sizes: list[int] | None = None, n: int = 4) -> str:
    groups: dict[str, list[int]] = {}
    for i, p in enumerate(paths):
        groups.setdefault(path_pattern(p), []).append(sizes[i] if sizes else 0)
    items = sorted(groups.items(), key=lambda kv: (-sum(kv[1]), -len(kv[1])))[:n]
    return ", ".join(f"{len(v)} × {k}" + (f" ({sum(v) / MB:.1f} MB)" if sizes else "") for k, v in items)


def frame_library(frame: str) -> str:
    """The library part of a frame as the ledger writes it (``lib!symbol+0x..`` or ``lib+0x..``)."""
    return frame.split("!", 1)[0].split("+0x", 1)[0]


def allocating_library(stack: list[str]) -> str | None:
    """The first library in the stack (innermost first) that is not libc / the dynamic loader."""
    for frame in stack:
        for lib in _LIB_IN_FRAME.findall(frame):
            if not LIBC_LIBRARY.match(lib):
                return lib
    return None


def process_label(recorded: str | None, comm: str, cmdline: str) -> tuple[str, str]:
    """(label in the ps vocabulary, title) of a recorded process. Sessions record what the hunt knew:
    a vocabulary word (vLLM discovery), a title (``VLLM::Worker_TP0``) or the comm; the command line
    decides the rest, as ``leaktrace ps`` does (a retitled process's command line is its title)."""
    try:
        argv = [str(a) for a in json.loads(cmdline or "[]")]
    except (ValueError, TypeError):
        argv = []
    label, title = classify_argv(argv)
    if recorded in LABELS and recorded != "other":
        label = recorded
    elif recorded and recorded not in LABELS:
        title = title or recorded
    return label, title or comm or "?"


def process_info(reader: TableSource) -> dict[int, dict[str, Any]]:
    procs = reader.table("processes")
    labels = reader.meta.get("labels", {}) or {}
    info: dict[int, dict[str, Any]] = {}
    if not procs.empty:
        seen = procs[procs["event"] == "seen"].drop_duplicates("pid", keep="first")
        for r in seen.itertuples():
            label, title = process_label(labels.get(str(r.pid)) or r.label, r.comm, r.cmdline)
            info[int(r.pid)] = {"ppid": int(r.ppid), "comm": r.comm, "exe": r.exe, "cmdline": r.cmdline,
                                "label": label, "title": title,
                                "python": is_python(r.exe, r.comm)}
    return info


# The UCX settings the probe reads from the live process (report name, ucx_state column).
UCX_SETTINGS = (("UCX_MEM_MMAP_HOOK_MODE", "hook_mode"), ("UCX_RCACHE_MAX_UNRELEASED", "rcache_max_unreleased"),
                ("UCX_RCACHE_ENABLE", "rcache_enable"))


def _value(r: pd.Series, col: str) -> Any:
    v = r[col]
    return None if v is None or (not isinstance(v, (list, dict)) and pd.isna(v)) else v


def ucx_settings(reader: TableSource, pid: int) -> dict[str, Any] | None:
    """The effective UCX state of a process at the end of the hunt (its last ``ucx_state`` row): each
    setting's value and where it came from, whether the memory hooks are on, the UCX version."""
    st = reader.table("ucx_state")
    if st.empty:
        return None
    rows = st[st["pid"] == pid]
    if rows.empty:
        return None
    r = rows.iloc[-1]
    out: dict[str, Any] = {"settings": {}, "sources": {}}
    for key, col in UCX_SETTINGS:
        if _value(r, col) is not None:
            out["settings"][key] = str(r[col])
            if _value(r, f"{col}_source") is not None:
                out["sources"][key] = str(r[f"{col}_source"])
    hooks, version = _value(r, "hooks_active"), _value(r, "ucx_version")
    out["hooks_active"] = bool(hooks) if hooks is not None else None
    out["version"] = str(version) if version is not None else None
    return out


def ucx_effective(reader: TableSource, pid: int) -> str | None:
    """``ucx_settings`` as one line for a culprit's evidence and remedy."""
    st = ucx_settings(reader, pid)
    if st is None:
        return None
    parts = [f"{k}={v}" + (f" ({st['sources'][k]})" if k in st["sources"] else "") for k, v in st["settings"].items()]
    if st["hooks_active"] is not None:
        parts.append(f"memory hooks {'active' if st['hooks_active'] else 'inactive'}")
    if st["version"] is not None:
        parts.append(f"UCX {st['version']}")
    return "; ".join(parts) or None


def ledger_candidates(reader: TableSource, info: dict[int, dict[str, Any]], warnings: list[str],
                      th: dict[str, float] = THRESHOLDS,
                      stopping: dict[int, str] | None = None) -> tuple[list[Candidate], bool]:
    """(candidates named by the eBPF ledger, whether the ledger ran). A growth at the leak rate whose rate
    does not clear the threshold with its uncertainty is none; one that stopped too late in the window to
    tell goes into ``stopping`` (pid -> its evidence line), for an inconclusive verdict."""
    if not any(t.startswith("ledger") for t in reader.tables()):
        return [], False
    try:
        found = native_culprits(reader, th["min_span_s"]) or []
    except Exception as e:  # the ledger analysis failing must not lose the report
        warnings.append(f"ledger analysis failed: {e.__class__.__name__}: {e}")
        return [], False
    out = []
    for c in found:
        mbm = float(c.get("mb_per_min") or 0.0)
        if c.get("stopping") and stopping is not None:
            raw = float(c.get("raw_mb_per_min") or 0.0)
            if raw >= th["ledger_mb_per_min"]:
                stopping.setdefault(int(c.get("pid", -1)), f"{c.get('library')}: {c.get('stop_evidence')}")
        significant = c.get("short_lived") or clears(c.get("lower_mb_per_min"), th["ledger_mb_per_min"])
        if mbm < th["ledger_mb_per_min"] or float(c.get("confidence", 1.0)) < th["min_confidence"] or not significant:
            continue
        pid = int(c.get("pid", -1))
        p = info.get(pid, {})
        kind = c.get("kind") or "native-mmap"
        out.append(Candidate(
            kind=kind, pid=pid, mb_per_min=mbm, source="ledger", library=c.get("library"),
            stack=[str(f) for f in (c.get("stack") or [])], evidence=[str(e) for e in (c.get("evidence") or [])],
            outstanding_bytes=int(c.get("outstanding_bytes") or 0),
            cls="heap" if kind == "malloc-heap" else "anon", python=p.get("python", False),
            label=p.get("label", "other"), title=p.get("title", "?"),
            extra={k: v for k, v in c.items() if k not in ("kind", "pid", "mb_per_min", "library", "stack",
                                                           "evidence", "outstanding_bytes")}))
    return out, True


def watcher_candidates(reader: TableSource, procs: pd.DataFrame, info: dict[int, dict[str, Any]],
                       shm: pd.DataFrame | None, th: dict[str, float] = THRESHOLDS) -> list[Candidate]:
    """The growing memory classes of each leaking process (no library: /proc alone cannot name it)."""
    cu = reader.table("class_usage")
    ctab = class_rate_table(cu) if not cu.empty else class_rate_table(pd.DataFrame())
    out: list[Candidate] = []
    for _, p in procs.iterrows():
        if not is_leaking(p, th):
            continue
        pid = int(p["pid"])
        pi = info.get(pid, {})
        mine = ctab[(ctab["pid"] == pid) & (ctab["mb_per_min"] >= th["class_mb_per_min"])
                    & (ctab["confidence"] >= th["class_confidence"]) & (~ctab["step"].astype(bool))
                    & (~ctab["decelerating"].astype(bool))]
        classes = [(str(r.cls), float(r.mb_per_min), float(r.confidence)) for r in mine.itertuples()]
        if not classes:
            cls = "anon" if p["anon_mb_per_min"] >= th["leak_mb_per_min"] else "other"
            classes = [(cls, float(max(p["anon_mb_per_min"], p["rss_mb_per_min"])), float(p["rss_confidence"]))]
        for cls, mbm, conf in classes:
            if cls == "anon" and len(classes) == 1:
                # The rollup's anonymous figure is sampled every tick (class usage every N ticks).
                mbm, conf = float(p["anon_mb_per_min"]), float(p["anon_confidence"])
            ev = [f"RSS {p['rss_mb_per_min']:.2f} MB/min (confidence {p['rss_confidence']:.2f}), anonymous "
                  f"{p['anon_mb_per_min']:.2f} MB/min over {p['t_last'] - p['t_first']:.0f} s; "
                  f"class '{cls}' grows {mbm:.2f} MB/min (confidence {conf:.2f})"]
            paths: list[str] = []
            if cls == "shm" and shm is not None and not shm.empty:
                mine_shm = shm[(shm["pid"] == pid)]
                new = mine_shm[mine_shm["new"]] if mine_shm["new"].any() else mine_shm
                paths = list(new["path"])
                ev.append(f"segments mapped: {summarize_paths(paths, list(new['rss']))}")
            if is_short_lived(p, th):
                ev.append(f"short-lived: it exited after {p['t_last'] - p['t_first']:.1f} s of samples, less than the "
                          f"{th['min_span_s']:.0f} s a steady rate normally needs: a verdict from what exists, with "
                          "lower confidence than a longer hunt's")
            if pi.get("python") and cls in ("anon", "heap", "arena"):
                ev.append("the process is a Python interpreter: the eBPF probe (calling library) or the Python heap "
                          "probe (objects by type; on unless --no-pyheap) tells Python objects from native memory")
            out.append(Candidate(kind=KIND_OF_CLASS.get(cls, "other"), pid=pid, mb_per_min=mbm, source="watcher",
                                 cls=cls, evidence=ev, paths=paths, python=pi.get("python", False),
                                 label=pi.get("label", "other"), title=pi.get("title", "?"), extra={"confidence": conf}))
    return out


def pyheap_growth(reader: TableSource) -> dict[int, dict[str, Any]]:
    """Per pid: the Python heap probe's last state and the rate of its object count, when that ran."""
    ph = reader.table("pyheap")
    if ph.empty:
        return {}
    ph = ph.copy()
    # objects the collector tracks, plus those gc.freeze() moved out of its sight (vLLM freezes
    # its start-up heap; objects frozen later still grow memory)
    ph["_objects"] = ph["tracked"].clip(lower=0).fillna(0) + ph["frozen"].clip(lower=0).fillna(0)
    from leaktrace.analysis.growth import rate

    out: dict[int, dict[str, Any]] = {}
    for pid, g in ph.groupby("pid"):
        g = g.sort_values("t")
        last = {k: (v.item() if hasattr(v, "item") else v) for k, v in g.iloc[-1].items()
                if k not in ("pid", "_objects") and v is not None and not (isinstance(v, float) and pd.isna(v))}
        state: dict[str, Any] = {"last": last}
        gc_ = g[g["tracked"].notna()]  # the probe walks the GC lists only now and then
        if len(gc_) == 2:
            # two walks (typically first and last): a plain difference, stated as such
            (t0, n0), (t1, n1) = zip(gc_["t"], gc_["_objects"], strict=True)
            per_min = (n1 - n0) / max(t1 - t0, 1e-9) * 60.0
            grows = n1 - n0 >= 1000 and n1 >= 1.1 * n0
            state.update({"count_column": "tracked+frozen", "objects_per_min": round(float(per_min), 1),
                          "confidence": 1.0 if grows else 0.0, "step": False, "walks": 2})
        elif len(gc_) >= 3:
            r = rate(gc_["t"].to_numpy(dtype=float), gc_["_objects"].to_numpy(dtype=float))
            state.update({"count_column": "tracked+frozen", "walks": len(gc_),
                          "objects_per_min": round(r.per_s * 60.0, 1),
                          "confidence": round(r.confidence, 3), "step": r.step})
        out[int(pid)] = state
    return out


def python_candidates(procs: pd.DataFrame, info: dict[int, dict[str, Any]], pyheap: dict[int, dict[str, Any]],
                      ledger_ran: bool, ledger: list[Candidate], th: dict[str, float] = THRESHOLDS,
                      types: dict[int, dict[str, Any]] | None = None) -> list[Candidate]:
    """Python-level growth: the heap probe sees objects pile up (by type, when its walks counted types:
    ``analysis.pyobjects``), or RSS grows while the eBPF ledger sees no native mapping growing in that
    (Python) process and names no other library growing there."""
    types = types or {}
    out = []
    for _, p in procs.iterrows():
        pid = int(p["pid"])
        pi = info.get(pid, {})
        if not is_leaking(p, th) or not pi.get("python"):
            continue
        ev: list[str] = []
        rss = float(p["rss_mb_per_min"])
        # Growth a native library (not libc, not the interpreter) is named for is its own culprit.
        named = sum(c.mb_per_min for c in ledger if c.pid == pid and names_other_library(c))
        tg = types.get(pid)
        explained = explains(tg, rss - named) if named < rss else False
        ph = pyheap.get(pid, {})
        if explained:
            ev += type_evidence(tg, rss - named)  # type: ignore[arg-type]
        elif tg is None and ph.get("objects_per_min", 0) > 0 and ph.get("confidence", 0) >= th["min_confidence"] \
                and not ph.get("step"):
            # sessions whose probe counted no types: the object count alone
            ev.append(f"the Python heap probe counts +{ph['objects_per_min']:.0f} GC-tracked objects/min "
                      f"(confidence {ph['confidence']:.2f})")
        native_rate = sum(c.mb_per_min for c in ledger if c.pid == pid)
        if ledger_ran and native_rate < 0.1 * rss and named == 0:
            ev.append(f"RSS grows {p['rss_mb_per_min']:.2f} MB/min while the eBPF ledger attributes only "
                      f"{native_rate:.2f} MB/min to native mappings of this process")
        if not ev:
            continue
        extra: dict[str, Any] = {"explained": explained}
        if tg is not None:
            extra["python"] = {k: tg[k] for k in ("types", "frozen", "objects_per_min", "objects_first",
                                                  "objects_last", "window_s", "walks") if k in tg}
        out.append(Candidate(kind="python-heap", pid=pid, mb_per_min=rss - named if explained else rss,
                             source="pyheap" if ph or tg else "ledger-gap", library=None, cls="python", python=True,
                             label=pi.get("label", "other"), title=pi.get("title", "?"), evidence=ev, extra=extra))
    return out
