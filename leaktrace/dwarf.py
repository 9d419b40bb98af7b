"""What a file's debug information says, asked of gdb (``gdb -batch`` over the file, never a process): the
offsets of structure members, the sizes of types and the addresses of variables a layout needs, per file and
version of the file. Debug information comes with the file (pyenv's interpreters) or from the distribution's
debug packages that gdb finds by build id (Debian's libc6-dbg)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

# Answers per file (device, inode), version (mtime) and expressions. A node's processes map the same libc and
# interpreter, each seen through its own /proc/PID/root path: gdb reads a file's DWARF once for all of them
# (~0.4 s each, before the eBPF probe goes live).
_ANSWERS: dict[tuple[object, ...], dict[str, int] | None] = {}
_MAX_ANSWERS = 64


def dwarf_offsets(path: str, mtime_ns: int, exprs: tuple[tuple[str, str], ...]) -> dict[str, int] | None:
    """{name: value} of each (name, C expression) as gdb evaluates it over ``path``'s DWARF; None when gdb
    is missing or any of them has no value (no debug info, a field this version does not have)."""
    try:
        st = os.stat(path)
        key: tuple[object, ...] = (st.st_dev, st.st_ino, mtime_ns, exprs)
    except OSError:
        key = (path, mtime_ns, exprs)
    if key not in _ANSWERS:
        if len(_ANSWERS) >= _MAX_ANSWERS:
            _ANSWERS.clear()
        _ANSWERS[key] = _ask_gdb(path, exprs)
    return _ANSWERS[key]


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
