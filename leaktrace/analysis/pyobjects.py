"""Python objects or native memory? The Python heap probe's walks (objects counted by type, frozen ones
apart) against the process's growth.

:func:`type_growth` gives, per Python process, the types whose object counts grow most between the
first and the last walk, and the gc.freeze state (frozen objects, and whether the growth is frozen).
:func:`explains` decides whether that growth is the process's growth: objects grow steadily and the
process's growth per new object stays plausible for Python objects (a native leak in a Python process
that also makes a few objects is not called Python). :func:`fold_native` then folds the interpreter's /
libc's malloc and the /proc-only candidates of the same memory into the ``python-heap`` culprit, and
leaves every candidate that names another library (a C extension, a ctypes library) a culprit of its own.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from leaktrace.analysis.growth import MB, rate
from leaktrace.session import TableSource

TOP_TYPES = 10
# Python growth explains the process's growth when objects grow at least this fast ...
MIN_OBJECTS_PER_MIN = 600.0
# ... steadily (fraction of pairwise slopes agreeing, over >= 3 walks) ...
MIN_CONFIDENCE = 0.75
# ... and the process grows by at most this much per new GC-tracked object (the object and what it holds
# that the collector does not track: strings, bytes, buffers). Above it, the objects are a side show.
MAX_BYTES_PER_OBJECT = 256 * 1024
_INTERPRETER_LIB = re.compile(r"(^|/)(lib)?python[0-9.]*[a-z]*(\.so[0-9.]*)?$")
_LIBC_LIB = re.compile(r"(^|/)(libc|libpthread|ld-linux)[.-]")
_LIB_IN_FRAME = re.compile(r"([A-Za-z0-9_.+-]+\.so(?:[.-][A-Za-z0-9_.-]*)?)")


def type_growth(reader: TableSource) -> dict[int, dict[str, Any]]:
    """Per pid with at least two complete walks: ``{"window_s": [t0, t1], "walks": n, "objects_delta",
    "objects_per_min", "confidence", "types": [{"type", "count_first", "count_last", "count_delta",
    "per_min", "frozen_delta"}...], "frozen": {...}}``. A type absent from a walk had fewer objects than
    the probe keeps (counted 0)."""
    ty = reader.table("pyheap_types")
    out: dict[int, dict[str, Any]] = {}
    if ty.empty:
        return out
    for pid, g in ty.groupby("pid"):
        times = np.sort(g["t"].unique())
        if len(times) < 2:
            continue
        counts = g.pivot_table(index="t", columns="type", values="count", aggfunc="sum").reindex(times).fillna(0)
        frozen = g.pivot_table(index="t", columns="type", values="frozen", aggfunc="sum").reindex(times).fillna(0)
        total = counts.sum(axis=1).to_numpy(dtype=float)
        span = float(times[-1] - times[0])
        if len(times) >= 3:
            r = rate(times, total, warmup_s=0.0)
            per_min, conf = r.per_s * 60.0, r.confidence
        else:
            per_min = (total[-1] - total[0]) / max(span, 1e-9) * 60.0
            conf = 1.0 if total[-1] > total[0] else 0.0
        delta = counts.iloc[-1] - counts.iloc[0]
        fdelta = frozen.iloc[-1] - frozen.iloc[0]
        types = []
        for name in delta.sort_values(ascending=False).index[:TOP_TYPES]:
            d = int(delta[name])
            if d <= 0 or name == "(other)":
                continue
            types.append({"type": str(name), "count_first": int(counts[name].iloc[0]),
                          "count_last": int(counts[name].iloc[-1]), "count_delta": d,
                          "per_min": round(d / max(span, 1e-9) * 60.0, 1), "frozen_delta": int(fdelta[name])})
        state: dict[str, Any] = {
            "window_s": [round(float(times[0]), 3), round(float(times[-1]), 3)], "walks": len(times),
            "objects_first": int(total[0]), "objects_last": int(total[-1]),
            "objects_delta": int(total[-1] - total[0]), "objects_per_min": round(float(per_min), 1),
            "confidence": round(float(conf), 3), "types": types,
        }
        # the frozen objects of each walk, counted in the same walk as the types (all types summed)
        first, last = int(frozen.iloc[0].sum()), int(frozen.iloc[-1].sum())
        fz: dict[str, Any] = {"count_first": first, "count_last": last, "count_delta": last - first}
        grown = max(state["objects_delta"], 1)
        fz["growing"] = fz["count_delta"] > 0 and fz["count_delta"] >= 0.5 * grown
        fz["share_of_growth"] = round(max(fz["count_delta"], 0) / grown, 3) if state["objects_delta"] > 0 else 0.0
        state["frozen"] = fz
        out[int(pid)] = state
    return out


def explains(tg: dict[str, Any] | None, process_mb_per_min: float) -> bool:
    """Does the Python objects' growth explain a process growing ``process_mb_per_min``?"""
    if not tg or tg.get("objects_per_min", 0.0) < MIN_OBJECTS_PER_MIN or not tg.get("types"):
        return False
    if tg.get("walks", 0) >= 3 and tg.get("confidence", 0.0) < MIN_CONFIDENCE:
        return False
    per_object = process_mb_per_min * MB / max(tg["objects_per_min"], 1e-9)
    return per_object <= MAX_BYTES_PER_OBJECT


def type_evidence(tg: dict[str, Any], process_mb_per_min: float) -> list[str]:
    """Evidence lines: the growing types with their counts, the gc.freeze state."""
    t0, t1 = tg["window_s"]
    top = ", ".join(f"{t['type']} +{t['count_delta']:,} ({t['count_first']:,} → {t['count_last']:,})"
                    for t in tg["types"][:5])
    ev = [f"Python objects grow {tg['objects_per_min']:+,.0f}/min ({tg['objects_first']:,} → {tg['objects_last']:,} "
          f"objects in the GC lists, frozen ones included, over {t1 - t0:.0f} s, {tg['walks']} walks); growing types: "
          f"{top}"]
    if tg["objects_per_min"] > 0 and process_mb_per_min > 0:
        ev.append(f"the process grows {process_mb_per_min * MB / tg['objects_per_min']:,.0f} bytes per new object "
                  "(the object and what it holds that the collector does not track: strings, bytes, buffers)")
    fz = tg.get("frozen")
    if fz and (fz["count_last"] or fz["count_delta"]):
        if fz["growing"]:
            ev.append(f"gc.freeze: the growth is frozen — {fz['count_first']:,} → {fz['count_last']:,} frozen objects "
                      f"(+{fz['count_delta']:,}, {fz['share_of_growth']:.0%} of the new objects): gc.freeze() keeps "
                      "moving new objects out of the collector's sight (gc.get_freeze_count() grows); they are never "
                      "collected and gc.get_objects() does not list them")
        else:
            ev.append(f"gc.freeze: {fz['count_last']:,} objects frozen ({fz['count_delta']:+,} during the hunt); "
                      "the growth is in objects the collector tracks")
    return ev


def names_other_library(c: Any) -> bool:
    """A candidate whose library, or a frame of its stack, is neither libc nor the interpreter."""
    libs = [c.library] if c.library else []
    libs += [lib for f in c.stack for lib in _LIB_IN_FRAME.findall(str(f))]
    return any(not (_LIBC_LIB.search(lib) or _INTERPRETER_LIB.search(lib)) for lib in libs)


def fold_native(python: list[Any], others: list[Any], types: dict[int, dict[str, Any]]) -> list[Any]:
    """Candidates left once each explained ``python-heap`` candidate took in the interpreter's / libc's
    and the /proc-only candidates of its process (the same memory: the allocator under the objects),
    named in its evidence. Candidates naming another library stay on their own; in a Python process whose
    objects do not explain the growth, they say so."""
    explained = {c.pid: c for c in python if c.extra.get("explained")}
    kept = []
    for c in others:
        py = explained.get(c.pid)
        if py is None or c.kind not in ("malloc-heap", "native-mmap", "other") or names_other_library(c):
            tg = types.get(c.pid)
            if py is None and tg is not None and c.python:
                # malloc's heap grows by whichever allocation crosses its top: there a flat count of objects
                # says the memory is native (pymalloc's arenas hold only objects, counted by the GC or not)
                if c.kind == "malloc-heap" and not explains(tg, c.mb_per_min):
                    c.extra["python_objects_explain"] = False
                c.evidence.append(f"Python objects do not explain it: {tg['objects_per_min']:+,.0f} objects/min "
                                  f"in the GC lists ({tg['objects_first']:,} → {tg['objects_last']:,} over "
                                  f"{tg['window_s'][1] - tg['window_s'][0]:.0f} s): native memory")
            kept.append(c)
            continue
        where = f"{c.kind} in {c.library}" if c.library else f"{c.kind} ({c.cls}, /proc)"
        site = f"; call site {c.stack[1] if len(c.stack) > 1 else c.stack[0]}" if c.stack else ""
        py.evidence.append(f"the same memory as seen by the {c.source}: {where} {c.mb_per_min:.2f} MB/min"
                           + (f", {c.outstanding_bytes / MB:.1f} MB outstanding" if c.outstanding_bytes else "")
                           + f"{site} — the allocator under the Python objects, not a separate leak")
        py.extra.setdefault("folded", []).append({"kind": c.kind, "library": c.library, "source": c.source,
                                                  "mb_per_min": round(c.mb_per_min, 4)})
        py.outstanding_bytes = max(py.outstanding_bytes, c.outstanding_bytes)
    return kept
