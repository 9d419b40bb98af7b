"""The gdb probe's session tables: rows decoded from the in-gdb sampler's records and from each run.

Session tables written by :class:`GdbProbe`:

``gdb_samples`` — one row per recorded syscall exit, or per stop at a growing call site (a breakpoint on the
path the eBPF ledger saw grow: syscall "mmap", addr the address the call returned, length 0, frames from the
stop out):
    t (s since hunt start), pid, tid, run (index of the gdb_runs row), syscall ("mmap" | "mremap" |
    "munmap"), addr (mmap/mremap: the returned address; munmap: the address unmapped; 0 on error),
    length (bytes mapped / new length / bytes unmapped), old_addr, old_length (mremap only, else 0),
    result (raw return value, signed), error (errno, 0 on success), stop_us (time this stop spent in
    the in-gdb handler, µs), frames (JSON list, innermost first, of {pc, library, path, symbol, offset,
    file_offset, python?}: ``library`` is the mapped file's name from /proc/PID/maps, so stripped
    frames still have one; ``symbol``/``offset`` when gdb knows them (debug info or ELF symbols);
    ``file_offset`` the pc as an offset in that file; ``python`` the Python frames run by a
    _PyEval_EvalFrameDefault frame, as [{func, file, line}]), stack (JSON list of
    "libfoo.so!func+0x12" strings, the same frames formatted), python (bool: Python frames present),
    python_stack (JSON list of "file.py:function:line", innermost first: the thread's Python frames read
    from the interpreter's memory while it was stopped; [] when none), python_us (µs that read took, part of
    stop_us).

``gdb_runs`` — one row per attach:
    t_start, t_end, pid, run, stops (catchpoint stops, 2 per syscall), samples (mmap/mremap
    recorded), paused_s (time stopped in handlers + a per-stop allowance for gdb's own work),
    handler_s, attach_s (whole-process stop during the attach), symbols_s (reading symbols afterwards,
    target running), threads, reason (why it ended:
    "samples", "time", "budget: …", "stopped", "interrupted", "target exited", "attach failed: …"),
    python (Python-frame support: "ok: …", "n/a: …", "unavailable: why"), state_after (/proc state
    letter after detach), tracer_after (TracerPid after), sigcont (bool: we had to resume it).
"""

from __future__ import annotations

import json
from typing import Any

from leaktrace.probes.gdb.budget import GdbRun


def frame_string(frame: dict[str, Any]) -> str:
    """'libfoo.so!func+0x12', or 'libfoo.so+0x1138' (offset in the file) when the symbol is unknown, or
    '[anon]@0x7f…' for code in memory no file backs (JIT)."""
    lib = frame.get("library") or "[anon]"
    sym = frame.get("symbol")
    if sym:
        off = frame.get("offset")
        return f"{lib}!{sym}+{off:#x}" if off else f"{lib}!{sym}"
    if frame.get("file_offset") is not None:
        return f"{lib}+{frame['file_offset']:#x}"
    return f"{lib}@{frame.get('pc', 0):#x}"


def stack_strings(frames: list[dict[str, Any]]) -> list[str]:
    out = []
    for fr in frames:
        out.append(frame_string(fr))
        for py in fr.get("python") or []:
            if "error" in py:
                out.append(f"python!<{py['error']}>")
            else:
                out.append(f"python!{py.get('func')} ({py.get('file')}:{py.get('line')})")
    return out


def sample_row(rec: dict[str, Any], t: float, run: int) -> dict[str, Any]:
    frames = rec.get("frames") or []
    result = int(rec.get("result") or 0)
    if result >= 1 << 63:
        result -= 1 << 64
    return {"t": t, "pid": int(rec["pid"]), "tid": int(rec.get("tid") or 0), "run": run,
            "syscall": rec.get("syscall", ""), "addr": int(rec.get("addr") or 0),
            "length": int(rec.get("length") or 0), "old_addr": int(rec.get("old_addr") or 0),
            "old_length": int(rec.get("old_length") or 0), "result": result,
            "error": int(rec.get("error") or 0), "stop_us": float(rec.get("stop_us") or 0.0),
            "frames": json.dumps(frames, separators=(",", ":")),
            "stack": json.dumps(stack_strings(frames)),
            "python": bool(rec.get("python_stack")) or any("python" in f for f in frames),
            "python_stack": json.dumps([str(f) for f in rec.get("python_stack") or []]),
            "python_us": float(rec.get("python_us") or 0.0)}


def run_row(run: GdbRun, index: int, t_of) -> dict[str, Any]:
    return {"t_start": t_of(run.t_start_mono) if run.t_start_mono else 0.0,
            "t_end": t_of(run.t_end_mono) if run.t_end_mono else 0.0, "pid": run.pid, "run": index,
            "stops": run.stops, "samples": run.samples, "paused_s": run.paused_s, "handler_s": run.handler_s,
            "attach_s": run.attach_s, "symbols_s": run.symbols_s, "threads": run.threads, "reason": run.reason, "python": run.python,
            "state_after": run.state_after or "", "tracer_after": int(run.tracer_after or 0),
            "sigcont": run.sigcont}
