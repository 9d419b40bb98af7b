"""Where a process's Python frames are, for leaktrace.pyframes: the interpreter's ``_PyRuntime`` (its maps and
ELF symbols, as the heap probe finds it) and the frame structures' offsets (the interpreter's DWARF, else
the built-in table of its version). Found once per process, before gdb attaches: the reads themselves happen
at each gdb stop (gdb_scripts/sampler.py) or here (:func:`read_stacks`)."""

from __future__ import annotations

import os
import re
import struct
from typing import Any

from leaktrace import procfs, pyframes
from leaktrace.dwarf import dwarf_offsets
from leaktrace.elf import elf_info
from leaktrace.errors import LeaktraceError
from leaktrace.probes.pyheap.interpreter import _python_image
from leaktrace.procmem import ProcMem, load_bias
from leaktrace.pyframes import FRAME_EXPRS, OFFSETS, PythonStacks

PYFRAMES_MODULE = os.path.abspath(pyframes.__file__)  # what the gdb sampler loads, by path


def _version(path: str, named: str, bias: int, pid: int) -> str:
    """"3.X" from the file's name, else from its ``Py_Version`` (PY_VERSION_HEX, exported since 3.11)."""
    if named != "?":
        return named
    sym = elf_info(path).symbols.get("Py_Version")
    if not sym:
        return named
    with ProcMem(pid) as mem:
        raw = mem.read(bias + sym[0], 4)
    if not raw or len(raw) < 4:
        return named
    hexversion = struct.unpack("<I", raw)[0]
    return f"{hexversion >> 24}.{(hexversion >> 16) & 0xFF}"


def frames_config(pid: int) -> dict[str, Any]:
    """{"runtime", "version", "offsets", "source"} of ``pid``'s interpreter, or {"error": why} ("n/a: not a
    Python process", "unavailable: …")."""
    try:
        return _frames_config(pid)
    except (LeaktraceError, OSError, ValueError, KeyError) as e:
        return {"error": f"unavailable: {e.__class__.__name__}: {e}"}


def _frames_config(pid: int) -> dict[str, Any]:
    maps = procfs.read_maps(pid)
    img = _python_image(maps)
    if img is None:
        return {"error": "n/a: not a Python process"}
    path, named = img
    bias = load_bias(maps, path)
    if bias is None:
        return {"error": f"unavailable: {path} not placed in the maps"}
    version = _version(path, named, bias, pid)
    exprs = FRAME_EXPRS.get(version)
    if exprs is None:
        return {"error": f"unavailable: Python {version} (frames are read for 3.10-3.13)"}
    offsets = dwarf_offsets(path, os.stat(path).st_mtime_ns, tuple(exprs.items()))
    source = f"DWARF of {os.path.basename(path)}"
    if offsets is None:
        offsets, source = OFFSETS[version], f"built-in CPython {version} x86-64 offsets"
    runtime = bias + elf_info(path).symbols["_PyRuntime"][0]
    return {"runtime": runtime, "version": version, "offsets": offsets, "source": source}


def read_stacks(pid: int, tids: list[int] | None = None, config: dict[str, Any] | None = None,
                idents: dict[int, int] | None = None) -> dict[int, list[str]]:
    """{tid: Python stack} of ``pid``'s threads (all of them by default) read now, the process running: a
    frame popped under the walk ends that thread's stack early (the gdb sampler reads them stopped).
    ``idents``: {tid: pthread_t}, which CPython 3.10's thread states are matched on."""
    config = config or frames_config(pid)
    if "error" in config:
        return {}
    if tids is None:
        tids = [int(t) for t in os.listdir(f"{procfs.PROC}/{pid}/task") if re.fullmatch(r"\d+", t)]
    with ProcMem(pid) as mem:
        stacks = PythonStacks(mem, config["runtime"], config["version"], config["offsets"])
        return {tid: stacks.stack(tid, (idents or {}).get(tid, 0)) for tid in tids}
