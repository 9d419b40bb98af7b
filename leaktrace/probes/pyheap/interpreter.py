"""Reading a CPython process's GC state from outside, for the pyheap probe (see leaktrace.probes.pyheap.probe
for what is read and why this way): where the interpreter lives (:func:`locate`: its maps, the ELF symbols,
the structure offsets from DWARF or a built-in table) and one read of the GC state with the walk of its
lists (:func:`read_python_heap`)."""

from __future__ import annotations

import os
import re
import struct
import time
from dataclasses import dataclass
from typing import Any

from leaktrace import procfs
from leaktrace.dwarf import dwarf_offsets
from leaktrace.elf import elf_info
from leaktrace.probes.pyheap.walk import WALK_BUDGET_S, type_names, walk_retry
from leaktrace.procmem import ProcMem, load_bias

# A frozen set whose ends did not move is walked again after this long (objects of it that died: a count
# drifting slowly); ~0.8 µs an object, vLLM freezes ~660k in each process.
FROZEN_REWALK_S = 60.0

PY_LIB_RE = re.compile(r"(^|/)(libpython3\.\d+[a-z]*\.so[.\d]*|python3(\.\d+)?)$")

# CPython 3.11, x86-64, measured from pyenv 3.11.7's DWARF (see _offsets_from_dwarf).
OFFSETS_311 = {
    "interp_main": 48, "gc": 648, "enabled": 12, "generations": 24, "gen_size": 24,
    "permanent": 104, "stats": 128, "stats_size": 24, "collecting": 200,
}
_DWARF_EXPRS = {
    "interp_main": "&((_PyRuntimeState*)0)->interpreters.main",
    "gc": "&((PyInterpreterState*)0)->gc",
    "enabled": "&((struct _gc_runtime_state*)0)->enabled",
    "generations": "&((struct _gc_runtime_state*)0)->generations",
    "gen_size": "sizeof(struct gc_generation)",
    "permanent": "&((struct _gc_runtime_state*)0)->permanent_generation",
    "stats": "&((struct _gc_runtime_state*)0)->generation_stats",
    "stats_size": "sizeof(struct gc_generation_stats)",
    "collecting": "&((struct _gc_runtime_state*)0)->collecting",
}


def _offsets_from_dwarf(path: str, mtime_ns: int) -> dict[str, int] | None:
    return dwarf_offsets(path, mtime_ns, tuple(_DWARF_EXPRS.items()))



def _python_image(maps: list[procfs.Mapping]) -> tuple[str, str] | None:
    """(file that holds _PyRuntime, python version) for a Python process, else None."""
    for m in maps:
        if m.path and m.offset == 0 and PY_LIB_RE.search(m.path) and os.path.exists(m.path):
            try:
                if "_PyRuntime" in elf_info(m.path).symbols:
                    v = re.search(r"python(3\.\d+)", os.path.basename(m.path))
                    return m.path, v.group(1) if v else "?"
            except (OSError, ValueError):
                continue
    return None


@dataclass(frozen=True)
class Interpreter:
    """Where a process's interpreter state lives: found once per process (its maps, the file's symbols and
    DWARF), then every read goes straight to memory."""

    path: str
    version: str
    runtime: int  # address of _PyRuntime in the process
    offs: dict[str, int]
    source: str


def locate(pid: int) -> Interpreter | dict[str, Any]:
    """The interpreter of ``pid``, or the row that says why there is none (not Python, no offsets)."""
    maps = procfs.read_maps(pid)
    img = _python_image(maps)
    if img is None:
        return {"pid": pid, "python": False}
    path, version = img
    st = os.stat(path)
    offs = _offsets_from_dwarf(path, st.st_mtime_ns)
    source = f"DWARF of {os.path.basename(path)}"
    if offs is None:
        if version != "3.11":
            return {"pid": pid, "python": True, "version": version,
                    "error": f"no debug info in {os.path.basename(path)} and no built-in offsets for {version}"}
        offs, source = OFFSETS_311, "built-in CPython 3.11 x86-64 offsets"
    bias = load_bias(maps, path)
    if bias is None:
        return {"pid": pid, "python": True, "version": version, "error": f"{path} not placed in the maps"}
    return Interpreter(path, version, bias + elf_info(path).symbols["_PyRuntime"][0], offs, source)


def read_python_heap(pid: int, walk: bool = True, types_too: bool = True,
                     where: Interpreter | None = None, frozen_cache: dict[str, Any] | None = None,
                     budget: float = WALK_BUDGET_S, frozen_max_age: float = FROZEN_REWALK_S) -> dict[str, Any]:
    """GC state of a live CPython process without stopping it (see the module docstring). With ``walk``
    the GC lists are walked (object counts) and, with ``types_too``, ``types``: {type name: (objects,
    frozen objects)} of a complete walk (absent when a list changed under the walk). ``where``: the
    process's interpreter as :func:`locate` found it (else found now). ``frozen_cache``: a dict kept by the
    caller for this process, where the frozen set's walk is kept and reused while the set's ends are
    the same and it is younger than ``frozen_max_age`` (``frozen_walked``: False when reused). ``budget``:
    seconds the walk may take (a list not walked through by then counts -1)."""
    if where is None:
        found = locate(pid)
        if not isinstance(found, Interpreter):
            return found
        where = found
    offs = where.offs
    out: dict[str, Any] = {"pid": pid, "python": True, "version": where.version, "offsets_source": where.source}
    with ProcMem(pid) as mem:
        interp = mem.read_ptr(where.runtime + offs["interp_main"])
        if not interp:
            return {**out, "error": "interpreter state not readable (not initialised yet?)"}
        gc = interp + offs["gc"]
        size = max(offs["stats"] + 3 * offs["stats_size"], offs["collecting"] + 4)
        raw = mem.read(gc, size)
        if not raw or len(raw) < size:
            return {**out, "error": "GC state not readable"}
        out["gc_enabled"] = bool(struct.unpack_from("<i", raw, offs["enabled"])[0])
        out["collecting"] = bool(struct.unpack_from("<i", raw, offs["collecting"])[0])
        heads = []
        for g in range(3):
            base = offs["generations"] + g * offs["gen_size"]
            _next, _prev, threshold, count = struct.unpack_from("<QQii", raw, base)
            out[f"gen{g}_count"] = count
            out[f"gen{g}_threshold"] = threshold
            heads.append(gc + base)
            s = offs["stats"] + g * offs["stats_size"]
            cols, collected, uncollectable = struct.unpack_from("<qqq", raw, s)
            out[f"gen{g}_collections"] = cols
            out[f"gen{g}_collected"] = collected
            out[f"gen{g}_uncollectable"] = uncollectable
        if walk:
            # gc.get_freeze_count(): hundreds of thousands of objects in vLLM (~0.8 µs each to walk) and
            # stable once frozen, so walked with the other lists, not on every tick. Each object's type is
            # counted on the way (the same one read per object: the PyGC_Head and the object's header).
            stops = {*heads, gc + offs["permanent"]}
            w0 = time.perf_counter()
            # Each list walked again (3 tries) when the target changed it under the walk. The young
            # generations change all the time in a busy target (a collection every 700 allocations): a
            # young list that never walks through is counted as -1 and its few objects left out of the
            # types; the old generation and the frozen set, where leaked objects end up, change slowly.
            types: dict[int, int] = {}
            frozen_types: dict[int, int] = {}
            deadline = time.monotonic() + budget
            tracked = [walk_retry(mem, h, stops, types, deadline=deadline) for h in heads]
            perm = gc + offs["permanent"]
            # The frozen set's ends (_gc_next, _gc_prev of its head): gc.freeze() appends at the end,
            # gc.unfreeze() empties it; between those it only loses the frozen objects that die.
            ends = (interp, mem.read_ptr(perm), mem.read_ptr(perm + 8))
            kept = frozen_cache or {}
            if (kept.get("ends") == ends and kept.get("n", -1) >= 0
                    and time.monotonic() - kept.get("at", 0.0) < frozen_max_age):
                out["frozen"], frozen_types = kept["n"], dict(kept["types"])
                out["frozen_walked"] = False
            else:
                out["frozen"] = walk_retry(mem, perm, stops, frozen_types, deadline=deadline)
                if frozen_cache is not None:
                    # a walk cut short (its budget, a cancel) leaves a walk of the same set in place
                    if out["frozen"] >= 0 or kept.get("ends") != ends:
                        frozen_cache.clear()
                    if out["frozen"] >= 0:
                        frozen_cache.update(ends=ends, n=out["frozen"], types=dict(frozen_types),
                                            at=time.monotonic())
                    out["frozen_walked"] = True
            out.update({f"gen{g}_tracked": n for g, n in enumerate(tracked)})
            out["tracked"] = sum(n for n in tracked if n >= 0)
            out["approximate"] = True
            if types_too and out["frozen"] >= 0 and tracked[2] >= 0:
                out["types"] = type_names(mem, types, frozen_types)
            out["walk_ms"] = round((time.perf_counter() - w0) * 1000, 3)
    return out
