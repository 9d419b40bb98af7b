"""What a file's debug information says, asked of gdb (``gdb -batch`` over the file, never a process): the
offsets of structure members, the sizes of types and the addresses of variables a layout needs, per file and
version of the file. Debug information comes with the file (pyenv's interpreters) or from the distribution's
debug packages that gdb finds by build id (Debian's libc6-dbg).

Answers are kept on disk (``dwarf.json`` under leaktrace.cachedir), per file identity (device, inode, size,
mtime) and expressions: gdb reading libpython's DWARF costs ~0.8 s of CPU, paid by every hunt of a Python
process before its probes go live. Only answers with values are kept: a file without debug information is
asked again, so a debug package installed later is found."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess

from leaktrace.atomic import atomic_write_text
from leaktrace.cachedir import cache_root

# Answers per file (device, inode), version (mtime) and expressions. A node's processes map the same libc and
# interpreter, each seen through its own /proc/PID/root path: gdb reads a file's DWARF once for all of them
# (~0.4 s each, before the eBPF probe goes live).
_ANSWERS: dict[tuple[object, ...], dict[str, int] | None] = {}
_MAX_ANSWERS = 64
_MAX_KEPT = 256  # answers on disk; the oldest go first


def dwarf_offsets(path: str, mtime_ns: int, exprs: tuple[tuple[str, str], ...]) -> dict[str, int] | None:
    """{name: value} of each (name, C expression) as gdb evaluates it over ``path``'s DWARF; None when gdb
    is missing or any of them has no value (no debug info, a field this version does not have)."""
    try:
        st: os.stat_result | None = os.stat(path)
    except OSError:
        st = None
    key: tuple[object, ...] = (st.st_dev, st.st_ino, mtime_ns, exprs) if st else (path, mtime_ns, exprs)
    if key not in _ANSWERS:
        if len(_ANSWERS) >= _MAX_ANSWERS:
            _ANSWERS.clear()
        disk_key = _disk_key(st, mtime_ns, exprs)
        answer = _kept(disk_key, exprs)
        if answer is None:
            answer = _ask_gdb(path, exprs)
            if answer is not None:
                _keep(disk_key, answer)
        _ANSWERS[key] = answer
    return _ANSWERS[key]


def _disk_key(st: os.stat_result | None, mtime_ns: int, exprs: tuple[tuple[str, str], ...]) -> str | None:
    if st is None:
        return None
    asked = hashlib.sha256(json.dumps(exprs).encode()).hexdigest()[:16]
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{mtime_ns}:{asked}"


def _read_kept() -> dict[str, dict[str, int]]:
    try:
        kept = json.loads((cache_root() / "dwarf.json").read_text())
    except (OSError, ValueError):
        return {}  # none yet, unreadable or torn by hand: asked again, written whole
    return kept if isinstance(kept, dict) else {}


def _kept(disk_key: str | None, exprs: tuple[tuple[str, str], ...]) -> dict[str, int] | None:
    if disk_key is None:
        return None
    answer = _read_kept().get(disk_key)
    if not isinstance(answer, dict) or set(answer) != {name for name, _ in exprs}:
        return None
    return answer if all(type(v) is int for v in answer.values()) else None


def _keep(disk_key: str | None, answer: dict[str, int]) -> None:
    if disk_key is None:
        return
    kept = _read_kept()
    kept.pop(disk_key, None)
    kept[disk_key] = answer
    while len(kept) > _MAX_KEPT:
        kept.pop(next(iter(kept)))
    try:
        cache_root().mkdir(parents=True, exist_ok=True)
        atomic_write_text(cache_root() / "dwarf.json", json.dumps(kept))
    except OSError:
        pass  # a read-only or full cache directory: the answer is still used, asked again next time


def _ask_gdb(path: str, exprs: tuple[tuple[str, str], ...]) -> dict[str, int] | None:
    gdb = shutil.which("gdb")
    if not gdb:
        return None
    args = [gdb, "-nx", "-batch"]
    for _name, expr in exprs:
        args += ["-ex", f"p (long)({expr})"]
    try:
        out = subprocess.run(args + [path], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    vals = [int(m.group(1)) for m in re.finditer(r"^\$\d+ = (-?\d+)$", out, re.M)]
    if len(vals) != len(exprs):
        return None
    return dict(zip((name for name, _ in exprs), vals, strict=True))
