"""A thread's Python frames, read from the interpreter's memory without running code in the process.

thread state (matched on the thread's native id, from ``_PyRuntime``'s interpreters) → its current
interpreter frame → the chain of ``previous`` frames → each frame's code object: file name, function name
and line (the code's location table at the frame's last instruction). CPython 3.11, 3.12 and 3.13 (the
``_PyInterpreterFrame`` layout), and 3.10 (``PyFrameObject`` chains, PEP 626's line table; its thread states are
matched on the thread's pthread_t, which the caller gives: gdb reads it as the stopped thread's fs base).

Memory comes through any object with ``read(addr, size) -> bytes | None``: :class:`leaktrace.procmem.ProcMem`
in leaktrace's own process, gdb's reader of its inferior inside the gdb sampler (gdb_scripts/sampler.py loads
this file by path, in gdb's own Python: so it imports nothing but the standard library). The structure
offsets come from the interpreter's DWARF or the built-in tables here (leaktrace.probes.pyheap.frames).

Read while the thread is stopped (at a gdb stop) the chain is the thread's own and stable; read while it
runs, a frame may be popped under the walk: the walk stops at the first frame that does not read back as one
(bounded by ``max_frames``), never loops.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Protocol

# Offsets in bytes, x86-64, from the DWARF of pyenv's CPython 3.10.13, 3.11.7, 3.12.1 and 3.13.0 (FRAME_EXPRS).
OFFSETS: dict[str, dict[str, int]] = {
    "3.10": {"interp_main": 40, "interp_head": 32, "interp_next": 0, "threads_head": 8, "ts_next": 8,
             "ts_thread_id": 176, "ts_frame": 24, "f_back": 24, "f_code": 32, "f_lasti": 96, "co_filename": 104,
             "co_name": 112, "co_firstlineno": 40, "co_linetable": 120, "ascii_size": 48, "compact_size": 72,
             "bytes_sval": 32},
    "3.11": {"interp_main": 48, "interp_head": 40, "interp_next": 0, "threads_head": 16, "ts_next": 8,
             "ts_native_tid": 160, "ts_cframe": 56, "cframe_current": 8, "if_code": 32, "if_previous": 48,
             "if_instr": 56, "if_owner": 69, "co_filename": 112, "co_name": 120, "co_qualname": 128,
             "co_firstlineno": 72, "co_linetable": 136, "co_code_adaptive": 184, "ascii_size": 48,
             "compact_size": 72, "bytes_sval": 32},
    "3.12": {"interp_main": 48, "interp_head": 40, "interp_next": 0, "threads_head": 72, "ts_next": 8,
             "ts_native_tid": 144, "ts_cframe": 56, "cframe_current": 0, "if_code": 0, "if_previous": 8,
             "if_instr": 56, "if_owner": 70, "co_filename": 112, "co_name": 120, "co_qualname": 128,
             "co_firstlineno": 68, "co_linetable": 136, "co_code_adaptive": 192, "ascii_size": 40,
             "compact_size": 56, "bytes_sval": 32},
    "3.13": {"interp_main": 640, "interp_head": 632, "interp_next": 7264, "threads_head": 7344, "ts_next": 8,
             "ts_native_tid": 160, "ts_current_frame": 72, "if_code": 0, "if_previous": 8, "if_instr": 56,
             "if_owner": 70, "co_filename": 112, "co_name": 120, "co_qualname": 128, "co_firstlineno": 68,
             "co_linetable": 136, "co_code_adaptive": 200, "ascii_size": 40, "compact_size": 56,
             "bytes_sval": 32},
}
_COMMON_EXPRS = {
    "interp_main": "&((_PyRuntimeState*)0)->interpreters.main",
    "interp_head": "&((_PyRuntimeState*)0)->interpreters.head",
    "interp_next": "&((PyInterpreterState*)0)->next",
    "threads_head": "&((PyInterpreterState*)0)->threads.head",
    "ts_next": "&((PyThreadState*)0)->next",
    "ts_native_tid": "&((PyThreadState*)0)->native_thread_id",
    "if_previous": "&((_PyInterpreterFrame*)0)->previous",
    "if_owner": "&((_PyInterpreterFrame*)0)->owner",
    "co_filename": "&((PyCodeObject*)0)->co_filename",
    "co_name": "&((PyCodeObject*)0)->co_name",
    "co_qualname": "&((PyCodeObject*)0)->co_qualname",
    "co_firstlineno": "&((PyCodeObject*)0)->co_firstlineno",
    "co_linetable": "&((PyCodeObject*)0)->co_linetable",
    "co_code_adaptive": "&((PyCodeObject*)0)->co_code_adaptive",
    "ascii_size": "sizeof(PyASCIIObject)",
    "compact_size": "sizeof(PyCompactUnicodeObject)",
    "bytes_sval": "&((PyBytesObject*)0)->ob_sval",
}
# The fields that moved: the current frame behind a _PyCFrame up to 3.12, in the thread state from 3.13; the
# code object and the instruction pointer of a frame renamed in 3.12 / 3.13.
FRAME_EXPRS: dict[str, dict[str, str]] = {
    "3.11": {**_COMMON_EXPRS, "ts_cframe": "&((PyThreadState*)0)->cframe",
             "cframe_current": "&((_PyCFrame*)0)->current_frame", "if_code": "&((_PyInterpreterFrame*)0)->f_code",
             "if_instr": "&((_PyInterpreterFrame*)0)->prev_instr"},
    "3.13": {**_COMMON_EXPRS, "ts_current_frame": "&((PyThreadState*)0)->current_frame",
             "if_code": "&((_PyInterpreterFrame*)0)->f_executable",
             "if_instr": "&((_PyInterpreterFrame*)0)->instr_ptr"},
}
FRAME_EXPRS["3.12"] = FRAME_EXPRS["3.11"]
# 3.10: PyFrameObject chains (f_back), the instruction index in f_lasti, the line table of PEP 626 (pairs of
# bytecode and line deltas); its thread states know their pthread_t (the thread's fs base), not the thread id.
FRAME_EXPRS["3.10"] = {
    **{k: _COMMON_EXPRS[k] for k in ("interp_main", "interp_head", "interp_next", "ts_next", "co_filename",
                                      "co_name", "co_firstlineno", "co_linetable", "ascii_size", "compact_size",
                                      "bytes_sval")},
    "threads_head": "&((PyInterpreterState*)0)->tstate_head", "ts_thread_id": "&((PyThreadState*)0)->thread_id",
    "ts_frame": "&((PyThreadState*)0)->frame", "f_back": "&((PyFrameObject*)0)->f_back",
    "f_code": "&((PyFrameObject*)0)->f_code", "f_lasti": "&((PyFrameObject*)0)->f_lasti",
}
FRAME_OWNED_BY_CSTACK = 3  # 3.12+: a shim frame the C stack owns (an entry into the interpreter), no Python code
MAX_THREADS = 100_000  # a thread-state list longer than this is not one (a torn read)
MAX_STRING = 4096
PAGE = 4096


class Memory(Protocol):
    def read(self, addr: int, size: int) -> bytes | None: ...


def line_at(linetable: bytes, firstlineno: int, lasti: int) -> int | None:
    """The line of code unit ``lasti`` in a 3.11+ location table (Objects/locations.md); None where the table
    says the instruction has no line."""
    if lasti < 0:
        return firstlineno
    line = firstlineno
    addr = 0
    i = 0
    n = len(linetable)

    def varint() -> int:
        nonlocal i
        b = linetable[i]
        i += 1
        val = b & 63
        shift = 0
        while b & 64 and i < n:
            b = linetable[i]
            i += 1
            shift += 6
            val |= (b & 63) << shift
        return val

    def svarint() -> int:
        v = varint()
        return -(v >> 1) if v & 1 else v >> 1

    while i < n:
        first = linetable[i]
        i += 1
        code = (first >> 3) & 15
        length = (first & 7) + 1
        if code == 15:  # no location
            this: int | None = None
        elif code == 14:  # long form: line delta, end line delta, column, end column
            line += svarint()
            varint()
            varint()
            varint()
            this = line
        elif code == 13:  # no column
            line += svarint()
            this = line
        elif code in (11, 12, 10):  # one-line forms: the line moves by code - 10, then two column bytes
            line += code - 10
            i += 2
            this = line
        else:  # short forms: same line, one column byte
            i += 1
            this = line
        if addr <= lasti < addr + length:
            return this
        addr += length
    return None


def line_at_310(linetable: bytes, firstlineno: int, lasti: int) -> int | None:
    """The line of instruction ``lasti`` in a 3.10 line table (Objects/lnotab_notes.txt: pairs of an
    unsigned bytecode delta and a signed line delta, -128 for no line)."""
    if lasti < 0:
        return firstlineno
    addr = lasti * 2
    line = firstlineno
    end = 0
    for i in range(0, len(linetable) - 1, 2):
        start = end
        end += linetable[i]
        ldelta = linetable[i + 1] - 256 if linetable[i + 1] > 127 else linetable[i + 1]
        this = None if ldelta == -128 else line + ldelta
        if this is not None:
            line = this
        if start <= addr < end:
            return this
    return None


class PythonStacks:
    """Python stacks of the threads of one process: ``stack(tid)`` → ["file:function:line", …] innermost
    first. Code objects' names and line tables are cached (checked against the object at every read: a code
    object freed and another allocated at its address is read anew)."""

    def __init__(self, mem: Memory, runtime: int, version: str, offsets: dict[str, int] | None = None,
                 max_frames: int = 64) -> None:
        self.mem = mem
        self.runtime = runtime
        self.version = version
        self.o = offsets or OFFSETS[version]
        self.max_frames = max_frames
        self.tstates: dict[int, int] = {}
        self.codes: dict[int, tuple[bytes, str, str, int, bytes, dict[int, str]]] = {}
        self._pages: dict[int, bytes] = {}
        fields = [self.o[k] for k in ("co_filename", "co_name", "co_firstlineno", "co_linetable")]
        self._key_lo, self._code_span = min(fields), max(fields) + 8
        self._frame_span = max(self.o.get(k, 0) for k in ("if_code", "if_previous", "if_instr", "if_owner")) + 8

    def _read(self, addr: int, size: int) -> bytes | None:
        """``size`` bytes at ``addr`` through a cache of whole pages kept for one :meth:`stack`: a read costs
        its call more than its bytes (gdb's reader: ~2.5 µs), and a thread's frames lie together in its data
        stack, a code object's fields and names often in a page already read."""
        out = b""
        while size > 0:
            page = addr & ~(PAGE - 1)
            buf = self._pages.get(page)
            if buf is None:
                buf = self._pages[page] = self.mem.read(page, PAGE) or b""
            chunk = buf[addr - page:addr - page + size]
            if not chunk:
                break
            out += chunk
            addr += len(chunk)
            size -= len(chunk)
        return out if size <= 0 else None

    def _ptr(self, addr: int) -> int:
        b = self._read(addr, 8)
        return struct.unpack("<Q", b)[0] if b and len(b) == 8 else 0

    def thread_state(self, tid: int, ident: int = 0) -> int:
        """The PyThreadState of native thread ``tid`` (0: none: a thread the interpreter does not know). 3.10
        keeps no thread id: there ``ident``, the thread's pthread_t (its fs base), is matched instead."""
        field, want = ("ts_native_tid", tid) if "ts_native_tid" in self.o else ("ts_thread_id", ident)
        if not want:
            return 0
        cached = self.tstates.get(tid)
        if cached and self._ptr(cached + self.o[field]) == want:
            return cached
        interp = self._ptr(self.runtime + self.o["interp_head"]) or self._ptr(self.runtime + self.o["interp_main"])
        seen = 0
        while interp and seen < MAX_THREADS:
            ts = self._ptr(interp + self.o["threads_head"])
            while ts and seen < MAX_THREADS:
                seen += 1
                if self._ptr(ts + self.o[field]) == want:
                    self.tstates[tid] = ts
                    return ts
                ts = self._ptr(ts + self.o["ts_next"])
            interp = self._ptr(interp + self.o["interp_next"])
        return 0

    def current_frame(self, ts: int) -> int:
        if "ts_frame" in self.o:
            return self._ptr(ts + self.o["ts_frame"])
        if "ts_current_frame" in self.o:
            return self._ptr(ts + self.o["ts_current_frame"])
        cframe = self._ptr(ts + self.o["ts_cframe"])
        return self._ptr(cframe + self.o["cframe_current"]) if cframe else 0

    def stack(self, tid: int, ident: int = 0) -> list[str]:
        """Thread ``tid``'s Python stack (``ident``: its pthread_t, needed for 3.10 only)."""
        self._pages = {}  # what other threads change between two stacks is read anew
        try:
            ts = self.thread_state(tid, ident)
            if not ts:
                return []
            frame = self.current_frame(ts)
            return self.frames_310(frame) if "ts_frame" in self.o else self.frames(frame)
        finally:
            self._pages = {}

    def frames_310(self, frame: int) -> list[str]:
        out: list[str] = []
        o = self.o
        seen: set[int] = set()
        while frame and frame not in seen and len(out) < self.max_frames:
            seen.add(frame)
            code = self._ptr(frame + o["f_code"])
            raw = self._read(frame + o["f_lasti"], 4)
            frame = self._ptr(frame + o["f_back"])
            info = self.code(code)
            if info is None or raw is None:
                break
            out.append(self._text(info, struct.unpack("<i", raw)[0], line_at_310))
        return out

    def frames(self, frame: int) -> list[str]:
        out: list[str] = []
        o = self.o
        at_code, at_instr, at_owner, at_prev = o["if_code"], o["if_instr"], o["if_owner"], o["if_previous"]
        first_unit = o["co_code_adaptive"]
        span = self._frame_span
        unpack = struct.unpack_from
        seen: set[int] = set()
        while frame and frame not in seen and len(out) < self.max_frames:
            seen.add(frame)
            raw = self._read(frame, span)
            if not raw:
                break
            code = unpack("<Q", raw, at_code)[0]
            instr = unpack("<Q", raw, at_instr)[0]
            owner = raw[at_owner]
            frame = unpack("<Q", raw, at_prev)[0]
            if owner == FRAME_OWNED_BY_CSTACK:  # 3.12+ only (3.11's owners are 0-2)
                continue
            info = self.code(code)
            if info is None:
                break
            out.append(self._text(info, (instr - code - first_unit) // 2, line_at))
        return out

    @staticmethod
    def _text(info: tuple[bytes, str, str, int, bytes, dict[int, str]], lasti: int,
              line_of: Callable[[bytes, int, int], int | None]) -> str:
        """"file:function:line" of instruction ``lasti`` of a code object, cached per code object."""
        text = info[5].get(lasti)
        if text is None:
            line = line_of(info[4], info[3], lasti)
            text = f"{info[1]}:{info[2]}:{line if line is not None else info[3]}"
            if len(info[5]) < 4096:
                info[5][lasti] = text
        return text

    def code(self, code: int) -> tuple[bytes, str, str, int, bytes, dict[int, str]] | None:
        """(key, file name, function name, first line, location table, {instruction: "file:function:line"})
        of a code object, else None. The key is the object's fields from the first line to the location table:
        set at its creation, so another code object allocated at a freed one's address differs there."""
        o = self.o
        raw = self._read(code, self._code_span) if code else None
        if not raw:
            return None
        key = raw[self._key_lo:self._code_span]
        hit = self.codes.get(code)
        if hit is not None and hit[0] == key:
            return hit
        filename = self.string(struct.unpack_from("<Q", raw, o["co_filename"])[0])
        name = self.string(struct.unpack_from("<Q", raw, o["co_name"])[0])
        firstlineno = struct.unpack_from("<i", raw, o["co_firstlineno"])[0]
        table = self.bytes_object(struct.unpack_from("<Q", raw, o["co_linetable"])[0])
        if filename is None or name is None or table is None:
            return None
        info = (key, filename, name, firstlineno, table, {})
        if len(self.codes) < 50_000:
            self.codes[code] = info
        return info

    def string(self, addr: int) -> str | None:
        """A compact str object's text (None: not readable as one)."""
        o = self.o
        head = self._read(addr, 40) if addr else None
        if not head or len(head) < 40:
            return None
        length = struct.unpack_from("<q", head, 16)[0]
        state = struct.unpack_from("<I", head, 32)[0]
        kind, compact, ascii_ = (state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1
        if not compact or kind not in (1, 2, 4) or not 0 <= length <= MAX_STRING:
            return None
        data = self._read(addr + (o["ascii_size"] if ascii_ else o["compact_size"]), length * kind)
        if data is None or len(data) < length * kind:
            return None
        return data.decode({1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}[kind], "replace")

    def bytes_object(self, addr: int) -> bytes | None:
        head = self._read(addr, self.o["bytes_sval"]) if addr else None
        if not head or len(head) < self.o["bytes_sval"]:
            return None
        size = struct.unpack_from("<q", head, 16)[0]
        if not 0 <= size <= 1 << 20:
            return None
        return self._read(addr + self.o["bytes_sval"], size) if size else b""


def describe(stacks: PythonStacks) -> dict[str, Any]:
    """The reader's cache sizes (the sampler's end record)."""
    return {"codes": len(stacks.codes), "lines": sum(len(c[5]) for c in stacks.codes.values()),
            "threads": len(stacks.tstates)}
