"""The eBPF probe's /proc side on names that trip hand-written readers. Its view of a process's mappings
keeps file names whole when they hold characters that str.splitlines() would break a line on (\\x0c,
\\u2028 ...): only "\\n" ends a /proc/PID/maps line (the kernel escapes it in paths). A process whose
name (comm) is not UTF-8 is followed through a fork like any other."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from conftest import is_root

from leaktrace.probes.bpf.layout import EV_FORK, Event
from leaktrace.probes.bpf.probe import BpfProbe

# Form feed and LINE SEPARATOR split a line for str.splitlines(), and a space for good measure.
NAME = "lt map\x0cform-feed\u2028line-sep.bin"

# Maps the file, prints "ready" then the mapping's address, and waits to be killed.
CHILD = r"""
import ctypes, mmap, sys, time
f = open(sys.argv[1], "r+b")
mm = mmap.mmap(f.fileno(), 2 * mmap.PAGESIZE, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
print("ready", flush=True)
print(ctypes.addressof(ctypes.c_char.from_buffer(mm)), flush=True)
while True:
    time.sleep(60)
"""


def mapping_child(tmp_path: Path, spawn) -> tuple[int, int, Path]:
    """(pid, address inside the mapping, file) of a process that maps a file named NAME."""
    path = tmp_path / NAME
    path.write_bytes(b"\0" * 8192)
    child = spawn([sys.executable, "-c", CHILD, path])
    addr = int(child.popen.stdout.readline())
    return child.pid, addr, path


def test_maps_view_keeps_names_with_line_separators(tmp_path, spawn) -> None:
    pid, addr, path = mapping_child(tmp_path, spawn)
    probe = BpfProbe()  # nothing loaded: only its /proc side runs
    probe.seeds.seed(pid)
    assert probe.symbols.frame(pid, addr).library == path.name
    seeded = [iv for iv in probe.ledger.intervals(pid) if iv.start <= addr < iv.end]
    assert len(seeded) == 1 and seeded[0].origin.preexisting
    assert seeded[0].origin.path == str(path)
    assert probe.libraries.of(pid, seeded[0].origin) == path.name


@pytest.mark.bpf
@pytest.mark.skipif(not is_root(), reason="BPF needs root")
def test_preexisting_region_named_with_line_separators(tmp_path, spawn) -> None:
    from fixtures.bpf_harness import Traced

    pid, addr, path = mapping_child(tmp_path, spawn)
    tr = Traced(tmp_path / "s", [pid])
    tr.tick()
    reader = tr.stop()
    reg = reader.table("ledger_regions")
    mine = reg[(reg["pid"] == pid) & (reg["start"] <= addr) & (reg["end"] > addr)]
    assert len(mine) == 1 and bool(mine["preexisting"].iloc[0]), mine
    assert mine["path"].iloc[0] == str(path)
    assert mine["library"].iloc[0] == path.name


# Renames itself (its comm, as /proc/PID/stat and status show it) to bytes that are not UTF-8.
NAMED_CHILD = r"""
import ctypes, time
ctypes.CDLL(None).prctl(15, b"lt\xffname", 0, 0, 0)  # PR_SET_NAME
print("ready", flush=True)
while True:
    time.sleep(60)
"""


def test_fork_of_a_process_whose_name_is_not_utf8(spawn) -> None:
    child = spawn([sys.executable, "-c", NAMED_CHILD])
    assert Path(f"/proc/{child.pid}/comm").read_bytes() == b"lt\xffname\n"
    probe = BpfProbe()  # nothing loaded: the FORK event is applied by hand
    probe._apply(Event(type=EV_FORK, tgid=os.getpid(), aux_pid=child.pid), {}, set())
    assert child.pid in probe._known and probe.symbols.has_maps(child.pid)
    start_brk = int(Path(f"/proc/{child.pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[47 - 3])
    assert probe.ledger.space(child.pid).heap_start == start_brk
