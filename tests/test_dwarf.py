"""Structure offsets from a file's DWARF (leaktrace.dwarf): gdb's answers over a real compiled file, the same
as the compiler's own offsetof, kept on disk so a later process does not run gdb again for the same file,
and asked again when the file changes, when the kept answers are torn, or when the file has no debug info."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from leaktrace import dwarf

SRC = r"""
#include <stddef.h>
#include <stdio.h>
struct inner { char tag; long count; };
struct books { int flags; struct inner slots[3]; void *next; };
struct books the_books;
int main(void) {
    printf("%zu %zu %zu\n", offsetof(struct books, slots), offsetof(struct books, next), sizeof(struct inner));
    return 0;
}
"""
EXPRS = (("slots", "&((struct books*)0)->slots"), ("next", "&((struct books*)0)->next"),
         ("inner_size", "sizeof(struct inner)"))


def _build(tmp_path: Path, debug: bool) -> tuple[Path, dict[str, int]]:
    src = tmp_path / "books.c"
    src.write_text(SRC)
    exe = tmp_path / ("books" if debug else "books_nodebug")
    subprocess.run(["gcc", "-O0", *(["-g"] if debug else []), str(src), "-o", str(exe)], check=True)
    slots, nxt, size = map(int, subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split())
    return exe, {"slots": slots, "next": nxt, "inner_size": size}


@pytest.fixture
def fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache directory of its own, and no answer kept in this process."""
    monkeypatch.setenv("LEAKTRACE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(dwarf, "_ANSWERS", {})
    return tmp_path / "cache" / "dwarf.json"


def _ask(exe: Path) -> dict[str, int] | None:
    dwarf._ANSWERS.clear()  # as a new process would: only the disk remembers
    return dwarf.dwarf_offsets(str(exe), os.stat(exe).st_mtime_ns, EXPRS)


def test_offsets_are_the_compilers_and_are_kept_for_the_next_process(
        tmp_path: Path, fresh: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exe, truth = _build(tmp_path, debug=True)
    assert _ask(exe) == truth
    assert list(json.loads(fresh.read_text()).values()) == [truth]
    path = os.environ["PATH"]
    monkeypatch.setenv("PATH", str(tmp_path / "no-gdb-here"))
    assert _ask(exe) == truth  # from the disk: no gdb to ask
    os.utime(exe, ns=(os.stat(exe).st_atime_ns, os.stat(exe).st_mtime_ns + 10**9))
    assert _ask(exe) is None  # a changed file is asked again, and here nothing can answer
    monkeypatch.setenv("PATH", path)
    fresh.write_text('{"torn')
    assert _ask(exe) == truth
    kept = json.loads(fresh.read_text())
    assert list(kept.values()) == [truth]
    fresh.write_text(json.dumps({k: {"slots": 1} for k in kept}))  # an answer to other questions
    assert _ask(exe) == truth
    assert list(json.loads(fresh.read_text()).values()) == [truth]


def test_a_file_without_debug_info_is_not_kept(tmp_path: Path, fresh: Path) -> None:
    exe, _truth = _build(tmp_path, debug=False)
    assert _ask(exe) is None
    assert not fresh.exists()
