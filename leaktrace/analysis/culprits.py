"""Culprits: what grows, who maps it, and the rule that explains it (rules.toml: match → finding →
evidence → remedy).

Pipeline: *candidates* come from the measurements — the eBPF ledger (library + stack, when that probe
ran), the watcher (a leaking process and the memory class that grows), the Python heap probe — and each
is explained by the first rule of ``rules.toml`` that matches it. Nothing here invents a cause: a candidate
no rule explains keeps its numbers and stack under the ``unknown`` rule.

``first_named_s`` is found by re-running the naming step on prefixes of the session (every table cut at
``t <= T``), binary-searching the earliest tick at which each culprit would already have been named.
"""

from __future__ import annotations

import json
import re
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from leaktrace.analysis.gdbjoin import gdb_samples, gdb_stack_for
from leaktrace.analysis.growth import MB, class_rate_table, process_rates
from leaktrace.analysis.ledger import native_culprits
from leaktrace.discover import LABELS, classify_argv

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

RULES_FILE = Path(__file__).with_name("rules.toml")

# Verdict thresholds (stated in the report so a reader can judge the verdict).
THRESHOLDS: dict[str, float] = {
    "leak_mb_per_min": 1.0,        # a process growing at least this fast (RSS or anonymous) ...
    "min_confidence": 0.75,        # ... with this fraction of pairwise slopes agreeing in sign ...
    "min_span_s": 8.0,             # ... over at least this many seconds (after the warm-up cut),
                                   # and not one step (a step is an allocation, not a leak)
    "no_leak_span_s": 15.0,        # a clean verdict needs at least this much observation
    "inconclusive_confidence": 0.6,  # growth above the rate with confidence between this and min_confidence
    "class_mb_per_min": 0.5,       # a memory class of a leaking process counts from this rate ...
    "class_confidence": 0.6,       # ... and this confidence
    "ledger_mb_per_min": 1.0,      # a library named by the eBPF ledger counts from this rate
}

KIND_OF_CLASS = {"anon": "native-mmap", "arena": "malloc-heap", "heap": "malloc-heap", "shm": "shm",
                 "file": "file", "driver": "other", "stack": "other", "lib": "file", "other": "other"}
_PYTHON_EXE = re.compile(r"(^|/)python[0-9.]*$")
_LIB_IN_FRAME = re.compile(r"([A-Za-z0-9_.+-]+\.so(?:[.-][A-Za-z0-9_.-]*)?)")
_LIBC = re.compile(r"^(libc|libpthread|ld-linux)[.-]")


# --------------------------------------------------------------------------- rules

@dataclass
class Rule:
    id: str
    title: str
    match: dict[str, Any]
    text: dict[str, Any]
    _res: dict[str, re.Pattern[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for key in ("library", "stack", "path"):
            if key in self.match:
                self._res[key] = re.compile(self.match[key])

    def matches_library(self, c: Candidate) -> bool:
        return "library" in self._res and bool(c.library) and self._prereq(c) \
            and bool(self._res["library"].search(c.library or ""))

    def _prereq(self, c: Candidate) -> bool:
        m = self.match
        if "kind" in m and c.kind not in m["kind"]:
            return False
        if "cls" in m and c.cls not in m["cls"]:
            return False
        return not (m.get("python") and not c.python)

    def matches(self, c: Candidate) -> bool:
        m = self.match
        if "kind" in m and c.kind not in m["kind"]:
            return False
        if "cls" in m and c.cls not in m["cls"]:
            return False
        if m.get("python") and not c.python:
            return False
        if not self._res:
            return True
        if "library" in self._res and c.library and self._res["library"].search(c.library):
            return True
        if "stack" in self._res and any(self._res["stack"].search(f) for f in c.stack):
            return True
        if "path" in self._res and any(self._res["path"].search(p) for p in c.paths):
            return True
        return False


def load_rules(path: Path | None = None) -> list[Rule]:
    with open(path or RULES_FILE, "rb") as f:
        data = tomllib.load(f)
    return [Rule(r["id"], r.get("title", r["id"]), r.get("match", {}), r.get("text", {})) for r in data["rule"]]


class _Fields(string.Formatter):
    """Missing values render as "unknown" and are counted (an evidence line made only of unknowns is
    dropped: evidence states what was measured)."""

    def __init__(self) -> None:
        self.missing = 0

    def get_value(self, key: Any, args: Any, kwargs: Any) -> Any:
        v = kwargs.get(key)
        if v is None or v == "":
            self.missing += 1
            return "unknown"
        return v


def _render(template: str, fields: dict[str, Any], drop_if_missing: bool = False) -> str | None:
    fmt = _Fields()
    try:
        text = fmt.vformat(template, (), fields)
    except (ValueError, IndexError, KeyError) as e:  # a bad template in a user-edited rules file
        return f"{template} [template error: {e}]"
    return None if drop_if_missing and fmt.missing else text


# --------------------------------------------------------------------------- candidates

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


def allocating_library(stack: list[str]) -> str | None:
    """The first library in the stack (innermost first) that is not libc / the dynamic loader."""
    for frame in stack:
        for lib in _LIB_IN_FRAME.findall(frame):
            if not _LIBC.match(lib):
                return lib
    return None


def _is_python(exe: str, comm: str, cmdline: str) -> bool:
    return bool(_PYTHON_EXE.search(exe or "")) or (comm or "").startswith("python")


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


def process_info(reader: Any) -> dict[int, dict[str, Any]]:
    procs = reader.table("processes")
    labels = reader.meta.get("labels", {}) or {}
    info: dict[int, dict[str, Any]] = {}
    if not procs.empty:
        seen = procs[procs["event"] == "seen"].drop_duplicates("pid", keep="first")
        for r in seen.itertuples():
            label, title = process_label(labels.get(str(r.pid)) or r.label, r.comm, r.cmdline)
            info[int(r.pid)] = {"ppid": int(r.ppid), "comm": r.comm, "exe": r.exe, "cmdline": r.cmdline,
                                "label": label, "title": title,
                                "python": _is_python(r.exe, r.comm, r.cmdline)}
    return info


def is_leaking(row: Any, th: dict[str, float] = THRESHOLDS) -> bool:
    span = row["t_last"] - row["t_first"]
    for col in ("rss", "anon"):
        if (row[f"{col}_mb_per_min"] >= th["leak_mb_per_min"] and row[f"{col}_confidence"] >= th["min_confidence"]
                and span >= th["min_span_s"] and not row[f"{col}_step"]):
            return True
    return False


def is_doubtful(row: Any, th: dict[str, float] = THRESHOLDS) -> bool:
    """Growth above the leak rate but without the confidence (or span) to call it."""
    for col in ("rss", "anon"):
        if (row[f"{col}_mb_per_min"] >= th["leak_mb_per_min"] and not row[f"{col}_step"]
                and row[f"{col}_confidence"] >= th["inconclusive_confidence"]):
            return True
    return False


def ucx_effective(reader: Any, pid: int) -> str | None:
    if "ucx_state" not in reader.tables():
        return None
    st = reader.table("ucx_state")
    if st.empty or "pid" not in st.columns:
        return None
    rows = st[st["pid"] == pid]
    if rows.empty:
        return None
    r = rows.iloc[-1]
    parts = []
    for key, col in (("UCX_MEM_MMAP_HOOK_MODE", "hook_mode"), ("UCX_RCACHE_MAX_UNRELEASED", "rcache_max_unreleased"),
                     ("UCX_RCACHE_ENABLE", "rcache_enable")):
        if col in r.index and r[col] is not None and not pd.isna(r[col]):
            src = r.get(f"{col}_source")
            parts.append(f"{key}={r[col]}" + (f" ({src})" if src is not None and not pd.isna(src) else ""))
    if "hooks_active" in r.index and r["hooks_active"] is not None and not pd.isna(r["hooks_active"]):
        parts.append(f"memory hooks {'active' if r['hooks_active'] else 'inactive'}")
    if "ucx_version" in r.index and r["ucx_version"] is not None and not pd.isna(r["ucx_version"]):
        parts.append(f"UCX {r['ucx_version']}")
    return "; ".join(parts) or None


def ledger_candidates(reader: Any, info: dict[int, dict[str, Any]], warnings: list[str],
                      th: dict[str, float] = THRESHOLDS) -> tuple[list[Candidate], bool]:
    """(candidates named by the eBPF ledger, whether the ledger ran)."""
    if not any(t.startswith("ledger") for t in reader.tables()):
        return [], False
    try:
        found = native_culprits(reader) or []
    except Exception as e:  # noqa: BLE001 - the ledger analysis failing must not lose the report
        warnings.append(f"ledger analysis failed: {e.__class__.__name__}: {e}")
        return [], False
    out = []
    for c in found:
        mbm = float(c.get("mb_per_min") or 0.0)
        if mbm < th["ledger_mb_per_min"] or float(c.get("confidence", 1.0)) < th["min_confidence"]:
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


def watcher_candidates(reader: Any, procs: pd.DataFrame, info: dict[int, dict[str, Any]],
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
                    & (ctab["confidence"] >= th["class_confidence"]) & (~ctab["step"].astype(bool))]
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
            if pi.get("python") and cls in ("anon", "heap", "arena"):
                ev.append("the process is a Python interpreter: the eBPF probe (calling library) or --pyheap "
                          "(GC-tracked objects) tells Python objects from native memory")
            out.append(Candidate(kind=KIND_OF_CLASS.get(cls, "other"), pid=pid, mb_per_min=mbm, source="watcher",
                                 cls=cls, evidence=ev, paths=paths, python=pi.get("python", False),
                                 label=pi.get("label", "other"), title=pi.get("title", "?"), extra={"confidence": conf}))
    return out


_PYHEAP_COUNT_COLUMNS = ("gc_objects", "tracked_objects", "gc_tracked", "objects", "gc_count_total")


def pyheap_growth(reader: Any) -> dict[int, dict[str, Any]]:
    """Per pid: the Python heap probe's last state and the rate of its object count, when that ran."""
    if "pyheap" not in reader.tables():
        return {}
    ph = reader.table("pyheap")
    if ph.empty or "pid" not in ph.columns or "t" not in ph.columns:
        return {}
    ph = ph.copy()
    if "tracked" in ph.columns:
        # objects the collector tracks, plus those gc.freeze() moved out of its sight (vLLM freezes
        # its start-up heap; objects frozen later still grow memory)
        ph["_objects"] = ph["tracked"].clip(lower=0).fillna(0)
        if "frozen" in ph.columns:
            ph["_objects"] += ph["frozen"].clip(lower=0).fillna(0)
    col = next((c for c in ("_objects", *_PYHEAP_COUNT_COLUMNS) if c in ph.columns), None)
    from leaktrace.analysis.growth import rate

    out: dict[int, dict[str, Any]] = {}
    for pid, g in ph.groupby("pid"):
        g = g.sort_values("t")
        last = {k: (v.item() if hasattr(v, "item") else v) for k, v in g.iloc[-1].items()
                if k not in ("pid", "_objects") and v is not None and not (isinstance(v, float) and pd.isna(v))}
        state: dict[str, Any] = {"last": last}
        name = "tracked+frozen" if col == "_objects" else col
        gc_ = g.dropna(subset=[col]) if col is not None else g.iloc[0:0]
        if col == "_objects" and "tracked" in g.columns:
            gc_ = g[g["tracked"].notna()]  # the probe walks the GC lists only now and then
        if len(gc_) == 2:
            # two walks (typically first and last): a plain difference, stated as such
            (t0, n0), (t1, n1) = zip(gc_["t"], gc_[col], strict=True)
            per_min = (n1 - n0) / max(t1 - t0, 1e-9) * 60.0
            grows = n1 - n0 >= 1000 and n1 >= 1.1 * n0
            state.update({"count_column": name, "objects_per_min": round(float(per_min), 1),
                          "confidence": 1.0 if grows else 0.0, "step": False, "walks": 2})
        elif len(gc_) >= 3:
            r = rate(gc_["t"].to_numpy(dtype=float), gc_[col].to_numpy(dtype=float))
            state.update({"count_column": name, "walks": len(gc_), "objects_per_min": round(r.per_s * 60.0, 1),
                          "confidence": round(r.confidence, 3), "step": r.step})
        out[int(pid)] = state
    return out


def python_candidates(procs: pd.DataFrame, info: dict[int, dict[str, Any]], pyheap: dict[int, dict[str, Any]],
                      ledger_ran: bool, ledger: list[Candidate], th: dict[str, float] = THRESHOLDS) -> list[Candidate]:
    """Python-level growth: the heap probe sees objects pile up, or RSS grows while the eBPF ledger
    sees no native mapping growing in that (Python) process."""
    out = []
    for _, p in procs.iterrows():
        pid = int(p["pid"])
        pi = info.get(pid, {})
        if not is_leaking(p, th) or not pi.get("python"):
            continue
        ev = []
        ph = pyheap.get(pid, {})
        if ph.get("objects_per_min", 0) > 0 and ph.get("confidence", 0) >= th["min_confidence"] and not ph.get("step"):
            ev.append(f"the Python heap probe counts +{ph['objects_per_min']:.0f} GC-tracked objects/min "
                      f"(confidence {ph['confidence']:.2f})")
        native_rate = sum(c.mb_per_min for c in ledger if c.pid == pid)
        if ledger_ran and native_rate < 0.1 * float(p["rss_mb_per_min"]):
            ev.append(f"RSS grows {p['rss_mb_per_min']:.2f} MB/min while the eBPF ledger attributes only "
                      f"{native_rate:.2f} MB/min to native mappings of this process")
        if ev:
            out.append(Candidate(kind="python-heap", pid=pid, mb_per_min=float(p["rss_mb_per_min"]), source="pyheap"
                                 if ph else "ledger-gap", library=None, cls="python", python=True,
                                 label=pi.get("label", "other"), title=pi.get("title", "?"), evidence=ev))
    return out


# --------------------------------------------------------------------------- explanation

def explain(c: Candidate, rules: list[Rule], reader: Any) -> dict[str, Any]:
    # The calling library decides first, unless it is libc itself (the syscall wrapper of everyone):
    # then the stack says more, and rules are tried in file order.
    by_library = c.library and not _LIBC.match(c.library.rsplit("/", 1)[-1])
    rule = (next((r for r in rules if r.matches_library(c)), None) if by_library else None) \
        or next((r for r in rules if r.matches(c)), None)
    fields = {
        "library": c.library, "pid": c.pid, "label": c.title, "mb_per_min": f"{c.mb_per_min:.2f}",
        "outstanding_mb": f"{c.outstanding_bytes / MB:.1f}" if c.outstanding_bytes else None, "cls": c.cls,
        "paths": summarize_paths(c.paths) if c.paths else None,
        "owner": f"pid {c.pid} ({c.title})", "allocating_library": allocating_library(c.stack) or c.library,
        "ucx_effective": ucx_effective(reader, c.pid) if rule is not None and rule.id.startswith("ucx") else None,
    }
    evidence = list(c.evidence)
    finding = remedy = ""
    kind = c.kind
    if rule is not None:
        finding = _render(rule.text.get("finding", ""), fields) or ""
        remedy = _render(rule.text.get("remedy", ""), fields) or ""
        evidence += [e for e in (_render(t, fields, drop_if_missing=True) for t in rule.text.get("evidence", []))
                     if e]
        kind = rule.text.get("kind", kind)
    if c.source == "watcher" and (rule is None or rule.id != "unknown"):
        remedy += (" " if remedy else "") + "(Watcher only: run the hunt as root with the eBPF probe to name "\
            "the calling library and its stack.)"
    out: dict[str, Any] = {
        "kind": kind, "library": c.library, "pid": c.pid, "process_label": c.label, "process_title": c.title,
        "mb_per_min": round(c.mb_per_min, 4), "outstanding_bytes": int(c.outstanding_bytes),
        "stack": c.stack, "evidence": evidence, "remedy": remedy, "finding": finding,
        "rule": rule.id if rule else None, "rule_title": rule.title if rule else None,
        "source": c.source, "cls": c.cls,
    }
    if kind != c.kind:
        out["measured_kind"] = c.kind  # what the probe saw, before the rule re-labelled it
    for k in ("instance", "first_named_s"):
        if k in c.extra:
            out[k] = c.extra[k]
    return out


@dataclass
class Findings:
    culprits: list[dict[str, Any]]
    candidates: list[Candidate]
    ledger_ran: bool
    leaking_pids: set[int]
    doubtful_pids: set[int]
    pyheap: dict[int, dict[str, Any]]


def _order(culprits: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Most important first: processes by their largest rate; within one, attributed (library named)
    culprits before /proc-only ones; then by rate and outstanding bytes."""
    top: dict[int, float] = {}
    for c in culprits:
        top[c["pid"]] = max(top.get(c["pid"], 0.0), c["mb_per_min"])
    return sorted(culprits, key=lambda c: (-top[c["pid"]], c["source"] == "watcher", -c["mb_per_min"],
                                           -(c["outstanding_bytes"] or 0)))


def find_culprits(reader: Any, procs: pd.DataFrame, info: dict[int, dict[str, Any]] | None = None,
                  shm: pd.DataFrame | None = None, warnings: list[str] | None = None,
                  rules: list[Rule] | None = None, th: dict[str, float] = THRESHOLDS) -> Findings:
    info = info if info is not None else process_info(reader)
    warnings = warnings if warnings is not None else []
    rules = rules if rules is not None else load_rules()
    ledger, ledger_ran = ledger_candidates(reader, info, warnings, th)
    _add_gdb_stacks(reader, ledger, warnings)
    pyheap = pyheap_growth(reader)
    python = python_candidates(procs, info, pyheap, ledger_ran, ledger, th)
    watcher = watcher_candidates(reader, procs, info, shm, th)
    # A process whose growth is explained by attributed candidates keeps no duplicate /proc-only one of
    # the same kind (anonymous growth named by the ledger is the same memory).
    covered = {(c.pid, c.kind) for c in ledger} | {(c.pid, k) for c in python
                                                     for k in ("native-mmap", "malloc-heap", "other")}
    watcher = [c for c in watcher if (c.pid, c.kind) not in covered]
    cands = ledger + python + watcher
    culprits = _order([explain(c, rules, reader) for c in cands])
    leaking = {int(p["pid"]) for _, p in procs.iterrows() if is_leaking(p, th)}
    doubtful = {int(p["pid"]) for _, p in procs.iterrows() if is_doubtful(p, th)} - leaking
    return Findings(culprits, cands, ledger_ran, leaking, doubtful, pyheap)


def _gdb_stacks_through(reader: Any, pid: int, site: str) -> list[list[str]]:
    """gdb stacks of ``pid``'s successful mapping syscalls that pass through the ledger's call site."""
    df = gdb_samples(reader)
    if df.empty or "stack" not in df.columns:
        return []
    df = df[df["pid"] == pid]
    if "error" in df.columns:
        df = df[df["error"] == 0]
    if "syscall" in df.columns:
        df = df[df["syscall"].isin(("mmap", "mremap"))]
    return [[str(f) for f in st] for st in df["stack"] if st is not None and site in [str(f) for f in st]]


def _add_gdb_stacks(reader: Any, cands: list[Candidate], warnings: list[str]) -> None:
    """Fuller call paths from gdb (DWARF unwinding, no frame pointers needed). With a ledger stack, only a
    gdb stack through the same call site is used: other samples of the library may be innocent paths
    (the same .so also maps and unmaps at once elsewhere)."""
    if "gdb_samples" not in reader.tables():
        return
    for c in cands:
        try:
            if len(c.stack) >= 2:
                matching = _gdb_stacks_through(reader, c.pid, c.stack[1])
                if not matching:
                    continue
                counts: dict[tuple[str, ...], int] = {}
                for st in matching:
                    counts[tuple(st)] = counts.get(tuple(st), 0) + 1
                frames = list(max(counts, key=lambda k: counts[k]))
            else:
                frames = [str(f) for f in gdb_stack_for(reader, c.pid, c.library)]
        except Exception as e:  # noqa: BLE001
            warnings.append(f"gdb join failed: {e.__class__.__name__}: {e}")
            return
        if frames:
            # gdb unwinds with DWARF: through the same call site its stack beats the frame-pointer walk,
            # whose tail past a function built without frame pointers is noise ("?@0x…").
            known = [f for f in c.stack if not f.startswith("?@")]
            if len(frames) >= len(known):
                c.extra["ledger_stack"] = c.stack
                c.stack = frames
            c.evidence.append("gdb sampled this call path at the mmap syscall: " + " ← ".join(frames[:6]))


# --------------------------------------------------------------------------- first_named_s

_SNAPSHOT_KIND = {"native-mmap": "anon", "malloc-heap": "heap"}


def _first_named_from_snapshots(snaps: pd.DataFrame, c: dict[str, Any], th: dict[str, float]) -> float | None:
    """The ledger's per-tick outstanding bytes of (pid, library): the earliest tick at which the rate
    over the snapshots so far passes the ledger thresholds (the naming rule of ledger_candidates).
    None when the table lacks what is needed (the caller then re-runs the analysis on prefixes)."""
    from leaktrace.analysis.growth import rate

    if snaps.empty or not {"t", "pid", "library", "outstanding_bytes"} <= set(snaps.columns):
        return None
    mine = snaps[(snaps["pid"] == c["pid"]) & (snaps["library"] == c["library"])]
    kind = _SNAPSHOT_KIND.get(c.get("measured_kind") or c["kind"])
    if kind is not None and "kind" in mine.columns and (mine["kind"] == kind).any():
        mine = mine[mine["kind"] == kind]
    if mine.empty:
        return None
    series = mine.groupby("t")["outstanding_bytes"].sum().sort_index()
    t, y = series.index.to_numpy(dtype=float), series.to_numpy(dtype=float)

    def named(i: int) -> bool:  # first i+1 snapshots
        if i < 2:
            return False
        r = rate(t[: i + 1], y[: i + 1], warmup_s=0.0)
        return r.steady_mb_per_min >= th["ledger_mb_per_min"] and r.confidence >= th["min_confidence"]

    lo, hi = 0, len(t) - 1
    if not named(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if named(mid):
            hi = mid
        else:
            lo = mid + 1
    return float(t[lo])


class PrefixReader:
    """A read-only view of a session cut at ``t <= t_max`` (what the analysis knew at that moment)."""

    def __init__(self, reader: Any, t_max: float) -> None:
        self._base = reader
        self.t_max = t_max
        self.path = reader.path
        self.meta = reader.meta
        self.skipped_parts: list[str] = []
        self.complete = False

    def tables(self) -> list[str]:
        return self._base.tables()

    def table(self, name: str) -> pd.DataFrame:
        df = self._base.table(name)
        if "t" in df.columns and not df.empty:
            return df[df["t"] <= self.t_max]
        return df


def culprit_key(c: dict[str, Any]) -> tuple[Any, ...]:
    if c.get("library"):
        return (c["pid"], c["library"])
    return (c["pid"], c.get("source"), c.get("cls"))


def first_named(reader: Any, culprits: list[dict[str, Any]], th: dict[str, float] = THRESHOLDS,
                max_culprits: int = 8) -> None:
    """Sets ``first_named_s`` (seconds from attach) on each culprit: the earliest watcher tick at which
    re-running the naming step on the session prefix names it (binary search; naming is monotone in
    practice, since rates firm up as samples accumulate)."""
    rollup = reader.table("rollup")
    if rollup.empty or not culprits:
        return
    attach = float(reader.meta.get("attach_s") or 0.0)
    ticks = sorted(t for t in rollup["t"].unique() if t >= attach)
    if not ticks:
        return
    info = process_info(reader)
    memo: dict[int, set[tuple[Any, ...]]] = {}
    by_pid = {pid: g for pid, g in rollup.groupby("pid")}

    def named_at(i: int, pid: int, want_ledger: bool) -> set[tuple[Any, ...]]:
        t_max = ticks[i]
        keys: set[tuple[Any, ...]] = set()
        if want_ledger:
            if i not in memo:
                cands, _ = ledger_candidates(PrefixReader(reader, t_max), info, [], th)
                memo[i] = {c.key for c in cands}
            keys |= memo[i]
        g = by_pid.get(pid)
        if g is not None:
            pr = process_rates(g[g["t"] <= t_max])
            if not pr.empty and is_leaking(pr.iloc[0], th):
                keys |= {("leaking", pid)}
        return keys

    snaps = reader.table("ledger_snapshots") if "ledger_snapshots" in reader.tables() else pd.DataFrame()
    for c in culprits[:max_culprits]:
        if c.get("first_named_s") is not None:
            continue
        key = culprit_key(c)
        via_ledger = c.get("source") == "ledger"
        if via_ledger:
            t_named = _first_named_from_snapshots(snaps, c, th)
            if t_named is not None:
                c["first_named_s"] = round(max(t_named - attach, 0.0), 2)
                continue

        def ok(i: int, key: tuple[Any, ...] = key, c: dict[str, Any] = c, via_ledger: bool = via_ledger) -> bool:
            keys = named_at(i, c["pid"], via_ledger)
            return key in keys if via_ledger else ("leaking", c["pid"]) in keys

        lo, hi = 0, len(ticks) - 1
        if not ok(hi):
            continue
        while lo < hi:
            mid = (lo + hi) // 2
            if ok(mid):
                hi = mid
            else:
                lo = mid + 1
        c["first_named_s"] = round(ticks[lo] - attach, 2)
