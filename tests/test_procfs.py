"""/proc parsers: recorded files (extra) and the live path (main)."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import pytest

from leaktrace import procfs, redact
from leaktrace.errors import NoSuchProcess, ProcessGone
from leaktrace.memclass import classify, classify_all

DATA = Path(__file__).parent / "data" / "proc"


def test_parse_recorded_maps_and_smaps_agree():
    maps = procfs.parse_maps((DATA / "python.maps").read_text())
    smaps = procfs.parse_smaps((DATA / "python.smaps").read_text())
    assert [(m.start, m.end, m.path) for m in maps] == [(m.start, m.end, m.path) for m in smaps]
    heap = [m for m in smaps if m.path == "[heap]"]
    assert len(heap) == 1 and heap[0].rss > 0 and heap[0].size >= heap[0].rss
    rollup = procfs.parse_smaps_rollup((DATA / "python.smaps_rollup").read_text())
    # Per-mapping sums equal the rollup's totals (same snapshot moment is not guaranteed: ±2%).
    assert abs(sum(m.rss for m in smaps) - rollup["Rss"]) <= 0.02 * rollup["Rss"]
    assert abs(sum(m.anonymous for m in smaps) - rollup["Anonymous"]) <= 0.02 * rollup["Anonymous"] + 65536


def test_mapped_inodes_of_recorded_maps():
    for name in ("python.maps", "leaker.maps"):
        text = (DATA / name).read_text()
        want = {m.inode for m in procfs.parse_maps(text) if m.inode}
        assert want and procfs.mapped_inodes(text) == want, name


def test_recorded_status():
    st = procfs.parse_status((DATA / "leaker.status").read_text())
    assert st["Name"] == "leaker"
    assert procfs.status_kb(st, "VmRSS") > 0


def test_status_numbers_and_owner():
    st = procfs.parse_status((DATA / "leaker.status").read_text())
    assert procfs.status_int(st, "TracerPid") == 0 and procfs.status_int(st, "Missing") == 0
    assert procfs.status_int(st, "CapEff", 16) == 0x1fffeffffff  # CapEff:\t000001fffeffffff
    assert procfs.status_int(procfs.read_self_status(), "Pid") == os.getpid()
    assert procfs.read_owner_uid(os.getpid()) == os.geteuid()
    assert procfs.read_sysctl("kernel/pid_max").isdigit() and procfs.read_sysctl("no/such/knob") is None
    import subprocess

    p = subprocess.Popen(["true"])
    p.wait()
    with pytest.raises(ProcessGone):
        procfs.read_owner_uid(p.pid)


def test_stat_field_counts_after_comm():
    text = "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 7 0 0 0 1 2 0 0 20 0 1 0 99 12345 67 " + " ".join(
        str(k) for k in range(25, 53))
    assert procfs.stat_field(text, 1) == "4242" and procfs.stat_field(text, 2) == "a) b (c)"
    assert procfs.stat_field(text, 3) == "S" and procfs.stat_field(text, 4) == "1"
    assert procfs.stat_field(text, 22) == "99" and procfs.stat_field(text, 47) == "47"
    with pytest.raises(procfs.ParseError):
        procfs.stat_field(text, 53)
    with pytest.raises(procfs.ParseError):
        procfs.stat_field("garbage", 3)
    live = procfs.read_proc_text(os.getpid(), "stat")
    assert procfs.stat_field(live, 1) == str(os.getpid())
    assert procfs.stat_field(live, 22) == str(procfs.parse_stat(live)["starttime"])
    assert int(procfs.stat_field(live, 47)) > 0  # start_brk of a process reading its own stat


def test_maps_line_with_spaces_and_deleted():
    line = "7f0000000000-7f0000001000 rw-s 00000000 00:1b 42          /dev/shm/a b (deleted)"
    m = procfs.parse_maps_line(line)
    assert m.path == "/dev/shm/a b (deleted)" and m.size == 4096 and m.perms == "rw-s"
    anon = procfs.parse_maps_line("7f0000000000-7f0000001000 rw-p 00000000 00:00 0 ")
    assert anon.path == ""
    with pytest.raises(procfs.ParseError):
        procfs.parse_maps_line("garbage")
    with pytest.raises(procfs.ParseError):
        procfs.parse_smaps("Rss: 4 kB\n")


def test_live_smaps_sees_new_mapping():
    before = {m.start for m in procfs.read_smaps(os.getpid())}
    mm = mmap.mmap(-1, 8 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    mm.write(b"x" * (8 << 20))
    after = procfs.read_smaps(os.getpid())
    new = [m for m in after if m.start not in before and m.size >= 8 << 20]
    assert new and new[0].rss >= 8 << 20 and classify(new[0].path, new[0].perms) == "anon"
    mm.close()


def test_gone_process_is_typed_error():
    import subprocess

    p = subprocess.Popen(["true"])
    p.wait()
    with pytest.raises(ProcessGone):
        procfs.read_smaps_rollup(p.pid)
    with pytest.raises(NoSuchProcess):
        procfs.require_pid(p.pid)


def test_environ_redaction_allow_list():
    raw = b"UCX_TLS=tcp\0HF_TOKEN=hf_abc\0VLLM_API_KEY=zz\0VLLM_PORT=8000\0SECRET=s\0PATH=/bin\0MY_VAR=x\0"
    env = redact.redact_environ(procfs.parse_environ(raw))
    assert env["UCX_TLS"] == "tcp" and env["VLLM_PORT"] == "8000" and env["PATH"] == "/bin"
    for k in ("HF_TOKEN", "VLLM_API_KEY", "SECRET", "MY_VAR"):
        assert env[k] == redact.REDACTED
    assert procfs.parse_environ(b"\0" * 64) == {}


def test_cmdline_redaction():
    argv = ["vllm", "serve", "m", "--api-key", "sk-123", "--hf-token=hf_x", "http://u:pw@host/x", "--port", "8000"]
    out = redact.redact_cmdline(argv)
    joined = " ".join(out)
    assert "sk-123" not in joined and "hf_x" not in joined and "pw@" not in joined
    assert out[-2:] == ["--port", "8000"]


@pytest.mark.parametrize("path,perms,expected", [
    ("[heap]", "rw-p", "heap"), ("[stack]", "rw-p", "stack"), ("", "rw-p", "anon"),
    ("[anon:ucx]", "rw-p", "anon"), ("/dev/shm/psm_1a2b", "rw-s", "shm"), ("/SYSV00000000 (deleted)", "rw-s", "shm"),
    ("/memfd:x (deleted)", "rw-s", "shm"), ("/usr/lib/x86_64-linux-gnu/libc.so.6", "r-xp", "lib"),
    ("/x/nixl_cu12.libs/libucp-b39b3ed9.so.0.0.0", "r--p", "lib"), ("/dev/nvidia0", "rw-s", "driver"),
    ("/dev/infiniband/uverbs0", "rw-s", "driver"), ("[vdso]", "r-xp", "special"), ("[vvar]", "r--p", "special"),
    ("/var/data/model.safetensors", "r--p", "file"), ("/dev/zero (deleted)", "rw-s", "shm"),
])
def test_memclass(path, perms, expected):
    assert classify(path, perms) == expected


def test_glibc_arena_detected_in_threaded_process():
    """A real glibc arena: threads that malloc get 64 MiB-aligned reservations."""
    import subprocess
    import sys

    code = ("import ctypes,threading,sys\nlibc=ctypes.CDLL(None)\nlibc.malloc.restype=ctypes.c_void_p\n"
            "def f():\n    [libc.malloc(1000) for _ in range(100)]\n"
            "ts=[threading.Thread(target=f) for _ in range(4)]\n[t.start() for t in ts]\n[t.join() for t in ts]\n"
            "print('ready',flush=True)\nsys.stdin.read()\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().startswith("ready")
        maps = procfs.read_maps(p.pid)
        classes = classify_all(maps)
        assert "arena" in classes
    finally:
        p.kill()
        p.wait()


def test_compact_smaps_parser_agrees_with_full_parser():
    for name in ("python.smaps", "leaker.smaps"):
        text = (DATA / name).read_text()
        full = procfs.parse_smaps(text)
        compact = procfs.parse_smaps_compact(text)
        assert [(m.start, m.end, m.perms, m.path, m.rss, m.anonymous) for m in full] == compact


def test_pagemap_entries_decode_present_and_swapped_bits():
    """Bit 63 present, bit 62 swapped, the low bits (PFN, soft-dirty, exclusive) ignored."""
    import struct

    from leaktrace.procfs.pagemap import count_present

    entries = [1 << 63 | 0x1234, 0, 1 << 62 | 0x77, 1 << 63 | 1 << 55, 1 << 61, 1 << 63]
    raw = struct.pack(f"<{len(entries)}Q", *entries)
    assert count_present(raw) == (3, 1)
    assert count_present(raw + b"\xff\xff") == (3, 1)  # a partial entry is no page
    assert count_present(b"") == (0, 0)


def test_pagemap_counts_the_pages_a_process_touched():
    """A live mapping of 64 pages of which every third is written: exactly those are present; a process
    gone is ProcessGone, not an empty figure."""
    import ctypes
    import subprocess
    import sys

    from leaktrace.procfs.pagemap import Pagemap, resident_bytes

    page = procfs.PAGE_SIZE
    m = mmap.mmap(-1, 64 * page, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    buf = (ctypes.c_char * 1).from_buffer(m)
    addr = ctypes.addressof(buf)
    del buf
    touched = range(0, 64, 3)
    for i in touched:
        m[i * page] = 1
    try:
        assert resident_bytes(os.getpid(), [(addr, addr + 64 * page), (addr, addr + page // 2),
                                            (addr + page, addr + 3 * page)]) == [len(touched) * page, page, 0]
    finally:
        m.close()
    p = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    pm = Pagemap(p.pid)  # open while it lives, read after it exits: the race a hunt's stop meets
    p.kill()
    p.wait()
    with pm, pytest.raises(ProcessGone):
        pm.resident(0x400000, 0x400000 + page)
    with pytest.raises(ProcessGone):
        Pagemap(p.pid)
