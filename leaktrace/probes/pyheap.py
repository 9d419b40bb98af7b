"""The pyheap probe (``hunt --pyheap``, opt-in): Python GC state of Python targets, read from outside.

What it tells: per generation the GC count (``gc.get_count()``), threshold, number of tracked objects and
collection statistics (``gc.get_stats()``), whether GC is enabled, and the frozen object count
(``gc.get_freeze_count()``: is the start-up heap frozen, as vLLM's API server, EngineCore and workers
freeze it?). Growth of tracked objects, or of the frozen set, points at Python-level growth; flat ones
with growing RSS point at native memory.

Why this way (the safety choice): the usual in-process query — gdb ``call PyGILState_Ensure()`` then
``PyRun_SimpleString`` — stops the process and runs code inside it; if a thread was stopped inside
malloc or holding the GIL's mutex the injected call deadlocks or corrupts the target, and Python 3.11 has
no ``sys.remote_exec`` (3.14). So we run no code in the target and never stop it: we read the
interpreter's ``_PyRuntime → interpreters.main → gc`` state through ``/proc/PID/mem``. Structure
offsets come from the interpreter library's own DWARF (``gdb -batch`` on the *file*, not the process;
pyenv and Debian's -dbg builds have it), else from a built-in table for CPython 3.11 on x86-64. Counters
are exact reads of ints; the tracked-object counts walk the GC lists while the target runs, so they are
approximate (bounded walk, ``approximate: true``). Collection *times* are not kept by CPython 3.11 and are
not measurable from outside (vLLM's ``VLLM_GC_DEBUG`` logs them in-process).
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
from functools import lru_cache
from typing import Any

from leaktrace import procfs
from leaktrace.elf import elf_info
from leaktrace.errors import LeaktraceError
from leaktrace.probes import HuntContext, HuntOptions
from leaktrace.procmem import ProcMem, load_bias

PY_LIB_RE = re.compile(r"(^|/)(libpython3\.\d+[a-z]*\.so[.\d]*|python3(\.\d+)?)$")
MAX_WALK = 3_000_000

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


@lru_cache(maxsize=16)
def _offsets_from_dwarf(path: str, mtime_ns: int) -> dict[str, int] | None:
    gdb = shutil.which("gdb")
    if not gdb:
        return None
    args = [gdb, "-nx", "-batch"]
    for expr in _DWARF_EXPRS.values():
        args += ["-ex", f"p (long)({expr})"]
    try:
        out = subprocess.run(args + [path], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    vals = [int(m.group(1)) for m in re.finditer(r"^\$\d+ = (-?\d+)$", out, re.M)]
    if len(vals) != len(_DWARF_EXPRS):
        return None
    return dict(zip(_DWARF_EXPRS, vals, strict=True))


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


def read_python_heap(pid: int, walk: bool = True) -> dict[str, Any]:
    """GC state of a live CPython process without stopping it (see the module docstring)."""
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
    rt = elf_info(path).symbols["_PyRuntime"][0]
    out: dict[str, Any] = {"pid": pid, "python": True, "version": version, "offsets_source": source}
    with ProcMem(pid) as mem:
        interp = mem.read_ptr(bias + rt + offs["interp_main"]) if bias is not None else None
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
            # gc.get_freeze_count(): hundreds of thousands of objects in vLLM (~1 µs each to walk) and
            # stable once frozen, so walked with the other lists, not on every tick.
            out["frozen"] = _walk(mem, gc + offs["permanent"])
            tracked = [_walk(mem, h) for h in heads]
            out.update({f"gen{g}_tracked": n for g, n in enumerate(tracked)})
            out["tracked"] = sum(n for n in tracked if n >= 0)
            out["approximate"] = True
    return out


def _walk(mem: ProcMem, head: int) -> int:
    """Length of a PyGC_Head list (``_gc_next`` chain back to its head); -1 when the walk broke."""
    n = 0
    node = mem.read_ptr(head)
    while node is not None and node != head:
        node &= ~0x3  # low bits of _gc_next are flags during a collection
        if node == head:
            break
        if node == 0 or n >= MAX_WALK:
            return -1
        node = mem.read_ptr(node)
        n += 1
    return n if node is not None else -1


class PyHeapProbe:
    name = "pyheap"

    def __init__(self, options: HuntOptions, every: int = 30) -> None:
        self.options = options
        self.every = every
        self.ctx: HuntContext | None = None
        self.python_pids: dict[int, bool] = {}
        self.last: dict[int, dict[str, Any]] = {}
        self._ticks = 0

    def start(self, ctx: HuntContext) -> None:
        self.ctx = ctx
        self._sample(walk=True)
        n = sum(1 for v in self.python_pids.values() if v)
        ctx.log(f"pyheap: {n} Python process(es), GC state read from memory (no code run in the targets)")

    def _sample(self, walk: bool) -> None:
        assert self.ctx is not None
        rows = []
        for pid in self.ctx.targets.live():
            if self.python_pids.get(pid) is False:
                continue
            try:
                st = read_python_heap(pid, walk=walk)
            except (LeaktraceError, OSError, ValueError, KeyError, struct.error):
                continue
            self.python_pids[pid] = bool(st.get("python"))
            if not st.get("python"):
                continue
            st["t"] = self.ctx.session.now()
            if "frozen" not in st and "frozen" in self.last.get(pid, {}):
                st["frozen"] = self.last[pid]["frozen"]  # as of the last walk
            if "error" in st and pid not in self.last:
                self.ctx.warn(f"pyheap: pid {pid}: {st['error']}")
            self.last[pid] = st
            rows.append(st)
        self.ctx.session.append("pyheap", rows)

    def tick(self, now: float) -> None:
        self._ticks += 1
        # Counters every tick are cheap; walking the GC lists (~1 µs per object) only now and then.
        self._sample(walk=self._ticks % self.every == 0)

    def stop(self) -> None:
        if self.ctx is not None:
            self._sample(walk=True)

    def summary(self) -> dict[str, Any]:
        keep = ("version", "gc_enabled", "frozen", "tracked", "gen0_count", "gen1_count", "gen2_count",
                "gen2_collections", "error")
        return {str(pid): {k: s.get(k) for k in keep if k in s} for pid, s in self.last.items()}
