"""Python frames read from a live interpreter's memory (leaktrace.pyframes), checked against what the
interpreter itself says of its threads, for every CPython 3.11+ on this machine (the venv's, and pyenv's)."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import types

import pytest
from conftest import REPO

from leaktrace.probes.pyheap.frames import frames_config, read_stacks
from leaktrace.pyframes import OFFSETS, line_at

TARGET = REPO / "tests" / "fixtures" / "py_frames_target.py"


def _interpreters() -> list[str]:
    """The venv's interpreter and every other CPython 3.10+ found (PATH, pyenv), one per version."""
    found = {f"{sys.version_info[0]}.{sys.version_info[1]}": sys.executable}
    candidates = [shutil.which(f"python3.{m}") for m in range(10, 14)]
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[0-9]*/bin/python3.1[0-9]")))
    for c in candidates:
        if not c or not os.access(c, os.X_OK):
            continue
        r = subprocess.run([c, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True,
                           text=True, timeout=30)
        if r.returncode == 0:
            found.setdefault(r.stdout.strip(), c)
    return [found[v] for v in sorted(found)]


def _code_objects(code: types.CodeType):
    yield code
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from _code_objects(c)


def test_line_table_gives_the_interpreters_lines():
    """Every instruction of this module's, json's and threading's code objects: the location table decoded
    here gives the line co_lines() gives."""
    import json.decoder
    import threading

    checked = 0
    for mod in (json.decoder, threading, sys.modules[__name__]):
        with open(mod.__file__) as f:
            top = compile(f.read(), mod.__file__, "exec")
        for code in _code_objects(top):
            for start, end, line in code.co_lines():
                for unit in range(start // 2, end // 2):
                    assert line_at(code.co_linetable, code.co_firstlineno, unit) == line, (code, unit)
                    checked += 1
    assert checked > 5000


@pytest.mark.parametrize("python", _interpreters())
def test_stacks_read_from_memory_are_the_interpreters_own(python, spawn):
    """Each thread's stack read from outside (no code run in the target, not stopped) is the one the thread
    printed of itself on the line where it blocks; the same with the built-in offsets instead of DWARF."""
    p = spawn([python, TARGET], ready=None)
    said, idents = {}, {}
    for _ in range(2):
        rec = json.loads(p.popen.stdout.readline())
        said[rec["tid"]], idents[rec["tid"]] = rec["stack"], rec["ident"]
    config = frames_config(p.pid)
    assert "error" not in config, config
    assert config["offsets"] == OFFSETS[config["version"]] or not config["source"].startswith("DWARF"), config
    got = read_stacks(p.pid, list(said), config, idents)
    assert got == said
    line = next(i for i, t in enumerate(TARGET.read_text().splitlines(), 1) if "the stack said" in t)
    assert got[p.pid][0] == f"{TARGET}:send_batch:{line}" and len(got[p.pid]) == 5
    builtin = read_stacks(p.pid, list(said), {**config, "offsets": OFFSETS[config["version"]]}, idents)
    assert builtin == said


def test_a_process_that_is_not_python_has_no_frames(spawn):
    p = spawn(["sleep", "60"], ready=None)
    assert frames_config(p.pid) == {"error": "n/a: not a Python process"}
    assert read_stacks(p.pid) == {}
