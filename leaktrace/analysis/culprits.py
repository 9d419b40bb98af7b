"""Culprits: what grows, who maps it, and the rule that explains it (rules.toml: match → finding →
evidence → remedy).

Pipeline: *candidates* come from the measurements — the eBPF ledger (library + stack, when that probe
ran), the watcher (a leaking process and the memory class that grows), the Python heap probe — and each
is explained by the first rule of ``rules.toml`` that matches it. Nothing here invents a cause: a candidate
no rule explains keeps its numbers and stack under the ``unknown`` rule.

Candidates live in ``candidates``, rules in ``rules``, ``first_named_s`` in ``first_named``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from leaktrace.analysis.attribution import join_by_address, sites_for
from leaktrace.analysis.candidates import (
    LIBC_LIBRARY,
    THRESHOLDS,
    Candidate,
    allocating_library,
    is_doubtful,
    is_leaking,
    ledger_candidates,
    process_info,
    pyheap_growth,
    python_candidates,
    summarize_paths,
    ucx_effective,
    ucx_settings,
    watcher_candidates,
)
from leaktrace.analysis.gdbjoin import gdb_python_stack_for, gdb_samples, gdb_stack_for, python_stack_of
from leaktrace.analysis.growth import MB
from leaktrace.analysis.heldfiles import held_candidates
from leaktrace.analysis.ledger import stack_frames
from leaktrace.analysis.pinned import recognise as recognise_pinned
from leaktrace.analysis.pyobjects import fold_native, type_growth
from leaktrace.analysis.resident import add_figures as add_resident_figures
from leaktrace.analysis.retention import in_use_flat
from leaktrace.analysis.retention import recognise as recognise_retention
from leaktrace.analysis.rules import Rule, load_rules, render_template
from leaktrace.analysis.threadstacks import recognise as recognise_thread_stacks
from leaktrace.analysis.touch import joined_holds_growth, touch_candidates
from leaktrace.session import TableSource


def explain(c: Candidate, rules: list[Rule], reader: TableSource) -> dict[str, Any]:
    # The calling library decides first, unless it is libc itself (the syscall wrapper of everyone):
    # then the stack says more, and rules are tried in file order.
    by_library = c.library and not LIBC_LIBRARY.match(c.library.rsplit("/", 1)[-1])
    rule = (next((r for r in rules if r.matches_library(c)), None) if by_library else None) \
        or next((r for r in rules if r.matches(c)), None)
    fields = {
        "library": c.library, "pid": c.pid, "label": c.title, "mb_per_min": f"{c.mb_per_min:.2f}",
        "outstanding_mb": f"{c.outstanding_bytes / MB:.1f}" if c.outstanding_bytes else None, "cls": c.cls,
        "resident_mb": f"{c.extra['outstanding_resident_bytes'] / MB:.1f}"
        if c.extra.get("outstanding_resident_bytes") is not None else None,
        "paths": summarize_paths(c.paths) if c.paths else None,
        "owner": f"pid {c.pid} ({c.title})", "allocating_library": allocating_library(c.stack) or c.library,
        "ucx_effective": ucx_effective(reader, c.pid) if rule is not None and rule.id.startswith("ucx") else None,
        **c.extra.get("rule_fields", {}),
    }
    evidence = list(c.evidence)
    finding = remedy = ""
    kind = c.kind
    if rule is not None:
        finding = render_template(rule.text.get("finding", ""), fields) or ""
        remedy = render_template(rule.text.get("remedy", ""), fields) or ""
        evidence += [e for e in (render_template(t, fields, drop_if_missing=True) for t in rule.text.get("evidence", []))
                     if e]
        kind = rule.text.get("kind", kind)
    if c.source == "watcher" and (rule is None or rule.id != "unknown"):
        remedy += (" " if remedy else "") + "(Watcher only: run the hunt as root with the eBPF probe to name "\
            "the calling library and its stack.)"
    out: dict[str, Any] = {
        "kind": kind, "library": c.library, "pid": c.pid, "process_label": c.label, "process_title": c.title,
        "mb_per_min": round(c.mb_per_min, 4), "outstanding_bytes": int(c.outstanding_bytes),
        "outstanding_resident_bytes": int(c.extra.get("outstanding_resident_bytes", c.outstanding_bytes)),
        "mapped_mb_per_min": round(float(c.extra.get("mapped_mb_per_min", c.mb_per_min)), 4),
        "stack": c.stack, "python_stack": list(c.extra.get("python_stack") or []), "evidence": evidence,
        "remedy": remedy, "finding": finding,
        "rule": rule.id if rule else None, "rule_title": rule.title if rule else None,
        "source": c.source, "cls": c.cls,
    }
    if rule is not None and rule.settings:
        now = (ucx_settings(reader, c.pid) or {}).get("settings", {})
        out["remedy_settings"] = {k: now.get(k) for k in rule.settings}  # effective in the process, at the end
    if "measured_kind" in c.extra:
        out["measured_kind"] = c.extra["measured_kind"]  # what the ledger measured before it was named
    if kind != c.kind:
        out["measured_kind"] = c.kind  # what the probe saw, before the rule re-labelled it
    for k in ("instance", "first_named_s", "python", "stacks_kept",
              "touched_by", "mapped_before_attach", "region", "held_by", "live_mb_per_min", "retained_mb_per_min",
              "locked_by"):
        if k in c.extra:
            out[k] = c.extra[k]
    return out


# A share that makes one source the explanation of a growth (ledger rate vs /proc rate; one library's
# share of the ledger bytes in a growing class).
COVERED_SHARE = 0.5


@dataclass
class Findings:
    culprits: list[dict[str, Any]]
    candidates: list[Candidate]
    ledger_ran: bool
    leaking_pids: set[int]
    doubtful_pids: set[int]
    pyheap: dict[int, dict[str, Any]]
    stopping: dict[int, str] = field(default_factory=dict)  # pid -> a ledger growth that stopped too late to tell
    in_use_flat: dict[int, str] = field(default_factory=dict)  # pid -> why its RSS growth is no leak (retention.py)


def _slowing(c: Candidate) -> bool:
    """Growth whose rate keeps falling (JIT code, allocator caches warming): a plateau forming."""
    return bool(c.extra.get("decelerating"))


def _evidence(c: Candidate) -> float:
    """Rate and probability together: the rate weighted by the confidence of its steadiness."""
    return c.mb_per_min * float(c.extra.get("confidence", 1.0) or 0.0)


def _order(cands: list[Candidate]) -> list[Candidate]:
    """Most important first, by evidence (rate times confidence), never by rate alone: memory malloc keeps
    free (allocator retention, no leak) ranks after every leak, and growth that is slowing down after every
    steady growth, whatever its rate; processes by their strongest steady evidence; within one, attributed
    (library named) candidates before /proc-only ones; then by evidence and outstanding bytes."""
    top: dict[int, float] = {}
    for c in cands:
        if not _slowing(c) and c.kind != "allocator-retention":
            top[c.pid] = max(top.get(c.pid, 0.0), _evidence(c))
    return sorted(cands, key=lambda c: (c.kind == "allocator-retention", _slowing(c), -top.get(c.pid, 0.0),
                                        c.source == "watcher", -_evidence(c), -c.mb_per_min,
                                        -(c.outstanding_bytes or 0)))


def _window_rate(c: Candidate) -> float:
    """A ledger candidate's rate over the whole window (its raw rate; the steady one when that is all)."""
    return max(c.mb_per_min, float(c.extra.get("raw_mb_per_min") or 0.0))


def uncovered_watcher(watcher: list[Candidate], ledger: list[Candidate], python: list[Candidate]) -> list[Candidate]:
    """The watcher candidates that attributed candidates do not already explain.

    A process whose growth is explained by attributed candidates keeps no duplicate /proc-only one of
    the same kind (anonymous growth named by the ledger is the same memory) — unless the ledger's rate
    explains less than half of what /proc sees grow: then the larger growth is not the ledger's.
    Like is compared with like: /proc's rate is the whole window's, so the ledger's is too, not the
    steady rate after a warm-up its culprit reports (the same memory read as 6 MB/min steady after a
    warm-up and as 17 MB/min over the window is one culprit, not a ledger one and a /proc duplicate)."""
    ledger_rate: dict[tuple[int, str], float] = {}
    for c in ledger:
        # anonymous memory to /proc; locked memory is what the ledger measured it as
        kind = "native-mmap" if c.kind == "thread-stacks" else c.extra.get("measured_kind", c.kind)
        ledger_rate[(c.pid, kind)] = ledger_rate.get((c.pid, kind), 0.0) + _window_rate(c)
    python_covered = {(c.pid, k) for c in python for k in ("native-mmap", "malloc-heap", "other")}
    # malloc's chunks above the mmap threshold are anonymous mappings to /proc: the ledger's malloc-heap
    # candidate explains the process's anonymous growth when its rate accounts for it
    heap_rate: dict[int, float] = {}
    for c in ledger:
        if c.extra.get("measured_kind", c.kind) == "malloc-heap":
            heap_rate[c.pid] = heap_rate.get(c.pid, 0.0) + _window_rate(c)
    return [c for c in watcher if (c.pid, c.kind) not in python_covered
            and ledger_rate.get((c.pid, c.kind), 0.0) < COVERED_SHARE * c.mb_per_min
            and not (c.kind == "native-mmap" and c.mb_per_min <= 1.25 * heap_rate.get(c.pid, -1.0))]


def find_culprits(reader: TableSource, procs: pd.DataFrame, info: dict[int, dict[str, Any]] | None = None,
                  shm: pd.DataFrame | None = None, warnings: list[str] | None = None,
                  rules: list[Rule] | None = None, th: dict[str, float] = THRESHOLDS) -> Findings:
    info = info if info is not None else process_info(reader)
    warnings = warnings if warnings is not None else []
    rules = rules if rules is not None else load_rules()
    stopping: dict[int, str] = {}
    ledger, ledger_ran = ledger_candidates(reader, info, warnings, th, stopping)
    _add_gdb_stacks(reader, ledger, warnings)
    ledger = recognise_thread_stacks(reader, ledger, warnings, th["ledger_mb_per_min"])
    ledger, pinned = recognise_pinned(reader, ledger, info, th)  # locked or pinned: the ledger's, or alone
    ledger = recognise_retention(reader, ledger, th, warnings)  # a heap's growth in use, or free memory malloc keeps
    pyheap = pyheap_growth(reader)
    types = type_growth(reader)
    python = python_candidates(procs, info, pyheap, ledger_ran, ledger, th, types)
    watcher = watcher_candidates(reader, procs, info, shm, th)
    _attribute_by_address(reader, watcher, warnings)
    touch = touch_candidates(reader, info, th)  # growth by touching pages of a region mapped before attach
    # Python objects that explain a process's growth take in the allocator's candidates of that process
    # (libc / interpreter malloc, /proc-only): the same memory, not separate leaks.
    ledger = fold_native(python, ledger, types)
    watcher = uncovered_watcher(fold_native(python, watcher, types), ledger + touch, python)
    flat = in_use_flat(reader, procs, info, _other_growth(ledger), th) if ledger_ran else {}
    watcher = [c for c in watcher if c.pid not in flat]  # RSS growth that nothing the process holds makes
    held = held_candidates(reader, info, th)  # memory held by descriptors: in no RSS, so in no other candidate
    cands = ledger + touch + pinned + python + watcher + held
    add_resident_figures(reader, cands)  # mapped and resident, named, on every culprit
    culprits = [explain(c, rules, reader) for c in _order(cands)]
    leaking = {int(p["pid"]) for _, p in procs.iterrows() if is_leaking(p, th)} - set(flat)
    doubtful = ({int(p["pid"]) for _, p in procs.iterrows() if is_doubtful(p, th)} - set(flat)
                | set(stopping)) - leaking
    return Findings(culprits, cands, ledger_ran, leaking, doubtful, pyheap, stopping, flat)


def _other_growth(ledger: list[Candidate]) -> dict[int, float]:
    """pid -> MB/min of the ledger's candidates outside malloc's heap (what malloc's books do not count)."""
    out: dict[int, float] = {}
    for c in ledger:
        if c.kind not in ("malloc-heap", "allocator-retention"):
            out[c.pid] = out.get(c.pid, 0.0) + _window_rate(c)
    return out


def _attribute_by_address(reader: TableSource, cands: list[Candidate], warnings: list[str]) -> None:
    """Watcher candidates (a class that grows, no library) take the library, call site and outstanding
    bytes of the ledger regions that lie in that class's mappings (analysis/attribution.py), when one
    library holds most of them. libc as the mapper of the malloc heap names nobody: left to the ledger's
    own heap attribution."""
    if not cands or "ledger_regions" not in reader.tables() or "regions" not in reader.tables():
        return
    try:
        joined = join_by_address(reader.table("regions"), reader.table("ledger_regions"))
    except Exception as e:  # a failed join must not lose the report
        warnings.append(f"address join failed: {e.__class__.__name__}: {e}")
        return
    if joined.empty:
        return
    frames = stack_frames(reader)
    for c in cands:
        sites = sites_for(joined, c.pid, c.cls)
        by_lib: dict[str, int] = {}
        for s in sites:
            by_lib[s.library] = by_lib.get(s.library, 0) + s.bytes
        total = sum(by_lib.values())
        if not total:
            continue
        lib = max(by_lib, key=lambda k: by_lib[k])
        if by_lib[lib] < COVERED_SHARE * total or LIBC_LIBRARY.match(lib) or lib.startswith(("?", "(")):
            continue
        if not joined_holds_growth(reader, c.pid, lib, by_lib[lib], c.mb_per_min):
            continue  # what it holds there is balanced churn, not what grew
        top = next(s for s in sites if s.library == lib)
        c.library, c.outstanding_bytes, c.source = lib, by_lib[lib], "watcher+ledger"
        c.stack = frames.get(top.stack_key, [])
        site = c.stack[1] if len(c.stack) > 1 else top.stack_key
        where = f" ({summarize_paths(list(top.paths))})" if top.paths and c.cls != "anon" else ""
        c.evidence.append(f"eBPF ledger, joined by address: {by_lib[lib]:,} B of the process's '{c.cls}' mappings"
                          f"{where} were mapped since attach by {lib} ({by_lib[lib] / total:.0%} of those the "
                          f"ledger holds there), {top.regions} region(s) from call site {site}")


def _gdb_stacks_through(reader: TableSource, pid: int, site: str, then: str | None = None,
                        ledger: list[str] | None = None) -> list[tuple[list[str], list[str]]]:
    """(native stack, Python stack) of ``pid``'s successful mapping syscalls, oldest first, whose gdb stack
    passes through the ledger's call site and, when ``then`` is given, its caller there after it; and of those
    gdb took stopped at a frame of the ``ledger`` stack past the site (a breakpoint on the path that grows),
    under the ledger's frames below that one."""
    df = gdb_samples(reader)
    if df.empty:
        return []
    df = df[(df["pid"] == pid) & (df["error"] == 0) & df["syscall"].isin(("mmap", "mremap"))].sort_values("t")
    out = []
    for st, py in zip(df["stack"], df["python_stack"], strict=True):
        frames = [str(f) for f in st] if st is not None else []
        if site in frames and (then is None or then in frames[frames.index(site) + 1:]):
            out.append((frames, py))
        elif ledger and site in ledger and frames and frames[0] in ledger[ledger.index(site) + 1:]:
            out.append((ledger[:ledger.index(frames[0])] + frames, py))
    return out


def _add_gdb_stacks(reader: TableSource, cands: list[Candidate], warnings: list[str]) -> None:
    """Fuller call paths from gdb (DWARF unwinding, no frame pointers needed). With a ledger stack, only a
    gdb stack through the same call site is used: other samples of the library may be innocent paths
    (the same .so also maps and unmaps at once elsewhere)."""
    if "gdb_samples" not in reader.tables():
        return
    for c in cands:
        # a stack found by scanning the raw stack: matched on its caller frame (its libc frames are
        # unnamed offsets, its tail may hold stale words), and gdb's unwound stack replaces it
        scanned = c.extra.get("stack_method") == "stack-scan"
        site = next((f for f in c.stack if c.library and f.startswith(c.library)), None) if scanned \
            else (c.stack[1] if len(c.stack) >= 2 else None)
        # ... and through the site's caller too, when the ledger knows it: a site shared by unrelated
        # paths (UCX's raw-mmap trampoline maps the rcache's chunks and, through its hook, everyone's
        # malloc chunks) would otherwise take the most frequent path's stack, not this culprit's.
        at = c.stack.index(site) if site in c.stack else -1
        then = c.stack[at + 1] if 0 <= at < len(c.stack) - 1 and not c.stack[at + 1].startswith("?") else None
        try:
            if site is not None:
                matching = _gdb_stacks_through(reader, c.pid, site, then, c.stack)
                if not matching:
                    continue
                counts: dict[tuple[str, ...], int] = {}
                for st, _py in matching:
                    counts[tuple(st)] = counts.get(tuple(st), 0) + 1
                frames = list(max(counts, key=lambda k: counts[k]))
                python = python_stack_of(matching, frames)
            else:
                frames = [str(f) for f in gdb_stack_for(reader, c.pid, c.library)]
                python = gdb_python_stack_for(reader, c.pid, frames)
        except Exception as e:
            warnings.append(f"gdb join failed: {e.__class__.__name__}: {e}")
            return
        if python:
            c.extra["python_stack"] = python
        if frames:
            # gdb unwinds with DWARF: through the same call site its stack beats the frame-pointer walk,
            # whose tail past a function built without frame pointers is noise ("?@0x…").
            known = [f for f in c.stack if not f.startswith("?@")]
            if scanned or len(frames) >= len(known):
                c.extra["ledger_stack"] = c.stack
                c.stack = frames
            shown = frames[max(0, frames.index(site) - 2):] if scanned and site in frames else frames
            c.evidence.append(("gdb (DWARF unwinding) confirms the caller found by the stack scan, at the mmap "
                               "syscall: " if scanned else "gdb sampled this call path at the mmap syscall: ")
                              + " ← ".join(shown[:6]))


